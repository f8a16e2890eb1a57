package main

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/simworker"
)

// TestExposeWorkerHeadersFlag: the answers name their worker by default, as
// the vLLM router's do, and not with --expose-worker-headers=false.
func TestExposeWorkerHeadersFlag(t *testing.T) {
	w, url, err := simworker.Start(simworker.Config{Models: []string{"m"}, TimeScale: 0.01, MaxTokens: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for _, c := range []struct {
		flag string
		want string
	}{{"--expose-worker-headers", url}, {"--expose-worker-headers=false", ""}} {
		ctx, cancel := context.WithCancel(context.Background())
		addr, code := startMain(t, ctx, "--worker-urls", url, c.flag)
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		cancel()
		<-code
		if resp.StatusCode != 200 || resp.Header.Get("x-vllm-router-worker") != c.want || resp.Header.Get("x-vllm-router-decision") == "" {
			t.Errorf("%s: %d, worker %q (want %q), decision %q", c.flag, resp.StatusCode, resp.Header.Get("x-vllm-router-worker"), c.want,
				resp.Header.Get("x-vllm-router-decision"))
		}
	}
}
