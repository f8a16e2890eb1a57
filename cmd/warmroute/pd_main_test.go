package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/simworker"
)

// getAdmin GETs path on the router with the admin key and returns its body.
func getAdmin(t *testing.T, addr, path string, want int) string {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %d %s, want %d", path, resp.StatusCode, b, want)
	}
	return string(b)
}

// TestPDModeStartsWithRoles: the router started as the vLLM router's PD
// command line starts it (--vllm-pd-disaggregation --prefill URL PORT
// --decode URL, with data-parallel ranks and regular workers beside them)
// registers each worker in its role: /workers lists the roles, /metrics
// carries vllm_router_worker_role for each, /readiness counts each side.
func TestPDModeStartsWithRoles(t *testing.T) {
	var urls []string
	for i := 0; i < 3; i++ {
		w, u, err := simworker.Start(simworker.Config{Models: []string{"m"}, TimeScale: 0.01, Seed: int64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		urls = append(urls, u)
	}
	p, d, r := urls[0], urls[1], urls[2]
	ctx, cancel := context.WithCancel(context.Background())
	addr, code := startMain(t, ctx, "--admin-api-key", "k", "--intra-node-data-parallel-size", "2",
		"--vllm-pd-disaggregation", "--prefill", p, "9000", "--decode", d+"@1", "--worker-urls", r,
		"--prefill-policy", "cache_aware", "--decode-policy", "round_robin")
	defer func() {
		cancel()
		waitExit0(t, code)
	}()
	want := map[string]string{p + "@0": "prefill", p + "@1": "prefill", d + "@1": "decode", r + "@0": "regular", r + "@1": "regular"}
	var list struct {
		Workers []struct {
			URL     string `json:"url"`
			Role    string `json:"role"`
			Healthy bool   `json:"healthy"`
		} `json:"workers"`
	}
	if err := json.Unmarshal([]byte(getAdmin(t, addr, "/workers", 200)), &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, w := range list.Workers {
		got[w.URL] = w.Role
		if !w.Healthy {
			t.Errorf("%s not healthy", w.URL)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("/workers roles %v, want %v", got, want)
	}
	for u, role := range want {
		if got[u] != role {
			t.Errorf("/workers: %s is %q, want %q", u, got[u], role)
		}
	}
	metrics := getAdmin(t, addr, "/metrics", 200)
	for u, role := range want {
		if series := `vllm_router_worker_role{worker="` + u + `",role="` + role + `"} 1`; !strings.Contains(metrics, series) {
			t.Errorf("/metrics lacks %s", series)
		}
	}
	ready := getAdmin(t, addr, "/readiness", 200)
	if !strings.Contains(ready, `"roles":{"regular":{"healthy":2,"total":2},"prefill":{"healthy":2,"total":2},"decode":{"healthy":1,"total":1}}`) {
		t.Errorf("/readiness %s", ready)
	}
	if models := getAdmin(t, addr, "/v1/models", 200); !strings.Contains(models, `"id":"m"`) {
		t.Errorf("/v1/models %s", models)
	}
}
