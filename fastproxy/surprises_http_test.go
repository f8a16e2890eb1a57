package fastproxy_test

import (
	"testing"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
)

// Issue 33's surprises: what a new operator met in front of a fleet the
// project did not write.

// vllm_router_retries_total counts retries, not attempts: a request that
// every one of three workers pushed back (429) was tried 3 times and
// retried twice, even with attempts to spare (--retry-max-retries 5).
func TestRetriesCountRetriesNotAttempts(t *testing.T) {
	var urls []string
	for range 3 {
		up := startEcho(t, []byte(`{"error":"busy"}`), nil, 0)
		up.status = 429
		urls = append(urls, up.url)
	}
	r := startRouter(t, urls, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) { c.RetryMaxRetries = 5 })
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
	if resp.StatusCode != 429 {
		t.Fatalf("every worker pushed back: %d %s", resp.StatusCode, body)
	}
	if got := r.counter(`vllm_router_upstream_errors_total{kind="backpressure"}`); got != 3 {
		t.Errorf("attempts pushed back %d, want 3", got)
	}
	if got := r.counter("vllm_router_retries_total"); got != 2 {
		t.Errorf("vllm_router_retries_total %d after 3 attempts, want 2", got)
	}
}
