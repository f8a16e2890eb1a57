package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/simworker"
)

// TestReplicasShareTenantLimits: two router processes started with one
// --client-api-keys file and one --redis-url count a tenant's requests
// together: past its rpm= both answer 429 with the rate-limit headers,
// while another tenant is served by both.
func TestReplicasShareTenantLimits(t *testing.T) {
	rd := redistest.Start(t, redistest.Options{})
	w, url, err := simworker.Start(simworker.Config{Models: []string{"m"}, TimeScale: 0.01, MaxTokens: 4, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	keys := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(keys, []byte("# tenants\nalpha:sk-alpha rpm=4\nbeta:sk-beta rpm=4\n"), 0o600) //nolint:errcheck
	rs := startReplicas(t, 2, rd.URL(), []string{url}, "--client-api-keys", keys)
	for _, r := range rs {
		testwait.Until(t, "replica up on redis", func() bool { return r.metric(t, "warmroute_redis_up") == 1 })
	}
	chat := func(r replica, key string) *http.Response {
		req, _ := http.NewRequest("POST", "http://"+r.addr+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		return resp
	}
	for i := 0; i < 4; i++ {
		resp := chat(rs[i%2], "sk-alpha")
		if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-remaining-requests") != string(rune('3'-i)) {
			t.Fatalf("alpha request %d: %d, remaining %q", i, resp.StatusCode, resp.Header.Get("x-ratelimit-remaining-requests"))
		}
	}
	for i, r := range rs {
		resp := chat(r, "sk-alpha")
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || resp.Header.Get("x-ratelimit-limit-requests") != "4" {
			t.Fatalf("replica %d, alpha over its limit: %d %v", i, resp.StatusCode, resp.Header)
		}
		if resp := chat(r, "sk-beta"); resp.StatusCode != 200 {
			t.Fatalf("replica %d, beta: %d", i, resp.StatusCode)
		}
		if n := r.metric(t, `vllm_router_tenant_limited_total{tenant="alpha",limit="requests"}`); n != 1 {
			t.Fatalf("replica %d counted %v limited", i, n)
		}
	}
}
