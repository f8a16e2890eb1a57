package fastproxy_test

import (
	"net/http"
	"testing"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/simworker"
)

// cbThreshold is the breaker threshold of these tests (the router flag's
// default).
const cbThreshold = 10

func withBreaker(_ *fastproxy.Config, lc *loadview.Config) { lc.CBFailureThreshold = cbThreshold }

// A model's only worker answering 500 to requests whose body makes it fail
// is not ejected for it: the other clients are still served (docs/design.md
// §8.2).
func TestAnswersNeverEjectTheLastWorker(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "round_robin", withBreaker)
	for range 3 * cbThreshold {
		resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "bad", false),
			map[string]string{simworker.FaultHeader: "error"})
		if resp.StatusCode < 500 || resp.StatusCode == http.StatusServiceUnavailable {
			t.Fatalf("faulty request: %d %s, want the worker's failure", resp.StatusCode, body)
		}
	}
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "good", false), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a normal request after %d answered failures: %d %s, want 200", 3*cbThreshold, resp.StatusCode, body)
	}
	if w := r.reg.Workers()[0]; w.BreakerState() != loadview.BreakerClosed || w.BreakerOpenings() != 0 {
		t.Fatalf("breaker %v, opened %d times; want closed, never opened", w.BreakerState(), w.BreakerOpenings())
	}
	waitIdle(t, r.reg)
}

// With a second worker the faulty one's answers still open its breaker,
// and the healthy one serves every request.
func TestAnswersEjectAWorkerWithAPeer(t *testing.T) {
	bad := fastSim()
	bad.ErrorRate = 1
	_, badURL := startSims(t, 1, bad)
	_, goodURL := startSims(t, 1, fastSim())
	r := startRouter(t, []string{badURL[0], goodURL[0]}, "round_robin", withBreaker)
	for i := range 4 * cbThreshold {
		resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s, want 200 from the healthy worker", i, resp.StatusCode, body)
		}
	}
	if n := r.reg.ByURL(badURL[0]).BreakerOpenings(); n == 0 {
		t.Error("the faulty worker's breaker never opened")
	}
	if n := r.reg.ByURL(goodURL[0]).BreakerOpenings(); n != 0 {
		t.Errorf("the healthy worker's breaker opened %d times", n)
	}
	waitIdle(t, r.reg)
}
