package fastproxy_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/route"
)

func decisionCount(r *testRouter, label string) uint64 {
	return r.counter(`vllm_router_cache_aware_decisions_total{decision="` + label + `"}`)
}

func snapshotDecisions(r *testRouter) map[string]uint64 {
	m := map[string]uint64{}
	for _, l := range route.CacheAwareLabels {
		m[l] = decisionCount(r, l)
	}
	return m
}

// history builds a chat body whose serialized history grows with turns.
func history(model string, turns int, extra string) string {
	var b strings.Builder
	b.WriteString(`{"model":"` + model + `","messages":[{"role":"system","content":"` + strings.Repeat("You are an airline agent. ", 40) + `"}`)
	for i := 0; i < turns; i++ {
		b.WriteString(`,{"role":"user","content":"question ` + strings.Repeat("x", i+1) + `"},{"role":"assistant","content":"answer"}`)
	}
	b.WriteString(`,{"role":"user","content":"` + extra + `"}]}`)
	return b.String()
}

// TestDecisionHeaderAgreesWithCounter walks the router through every
// cache-aware label reachable over HTTP and checks, request by request, that
// the header names exactly the one label whose counter moved by one.
func TestDecisionHeaderAgreesWithCounter(t *testing.T) {
	_, urls := startSims(t, 2, fastSim())
	r := startRouterCA(t, urls, "cache_aware", route.CacheAwareConfig{Threshold: 0.3, BalanceAbs: 2, BalanceRel: 1.5, MaxTreeSize: 1 << 26}, nil)
	step := func(want, body string, hdr map[string]string) *http.Response {
		t.Helper()
		before := snapshotDecisions(r)
		resp, b := do(t, "POST", r.url+"/v1/chat/completions", body, hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d %s", want, resp.StatusCode, b)
		}
		got := resp.Header.Values("x-vllm-router-decision")
		if len(got) != 1 || got[0] != want {
			t.Fatalf("decision header %v, want exactly [%s]", got, want)
		}
		after := snapshotDecisions(r)
		for l, n := range after {
			d := n - before[l]
			if (l == want && d != 1) || (l != want && d != 0) {
				t.Fatalf("request labelled %s moved counter %s by %d", want, l, d)
			}
		}
		return resp
	}
	step(route.NoTreeRandom, chatBody("m", "warm up", false), nil)
	a := step(route.LowMatchMinLoad, history("m", 1, "first"), nil).Header.Get("x-vllm-router-worker")
	step(route.CacheAffinity, history("m", 1, "first"), map[string]string{"X-Request-Id": "r1"})
	step(route.CacheAffinity, history("m", 1, "first"), map[string]string{"X-Request-Id": "r2", "X-Trace-Id": "t"})
	step(route.EmptyHistoryMinLoad, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]}`, map[string]string{"X-Session-ID": "img"})
	s1 := step(route.FullHistoryMatch, history("m", 1, "first"), map[string]string{"X-Session-ID": "s1"}).Header.Get("x-vllm-router-worker")
	if s1 != a {
		t.Fatalf("full history match went to %s, history lives on %s", s1, a)
	}
	step(route.SessionIDMatch, history("m", 2, "second"), map[string]string{"X-Session-ID": "s1"})
	step(route.FullHistoryLowMatch, history("m", 0, strings.Repeat("unrelated ", 400)), map[string]string{"X-Session-ID": "s2"})
	// Body and header forms of one session are one key, escapes included.
	step(route.SessionIDMatch, strings.Replace(history("m", 3, "third"), `{"model":"m",`, `{"model":"m","session_params":{"session_id":"s\u0031"},`, 1), nil)
	step(route.SessionIDMatch, strings.Replace(history("m", 3, "third"), `{"model":"m",`, `{"model":"m","session_id":"s1",`, 1), nil)

	// Load gates: 3 slow requests in flight on the session's worker.
	held := make(chan struct{}, 3)
	for i := 0; i < 3; i++ {
		go func() {
			defer func() { held <- struct{}{} }()
			do(t, "POST", r.url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hold"}]}`,
				map[string]string{"X-Session-ID": "s1", "x-sim-fault": "slow=1500"})
		}()
	}
	waitLoad(t, r, a, 3)
	step(route.LoadBalance, history("m", 4, "fourth"), map[string]string{"X-Session-ID": "s1"})
	for i := 0; i < 3; i++ {
		<-held
	}

	// A text only one worker holds; that worker dies. Each fallback teaches
	// the live worker, so each case gets its own text.
	only := func(text string) string {
		x := step(route.LowMatchMinLoad, chatBody("m", text, false), nil).Header.Get("x-vllm-router-worker")
		r.reg.SetHealthy(r.reg.ByURL(x), false)
		return x
	}
	u1, u2 := strings.Repeat("a unique document ", 200), strings.Repeat("another long text ", 200)
	x := only(u1)
	step(route.FirstHealthyFallback, chatBody("m", u1+" other", false), nil)
	r.reg.SetHealthy(r.reg.ByURL(x), true)
	x = only(u2)
	step(route.StaleTenantFallback, chatBody("m", u2+" more", false), map[string]string{"X-Session-ID": "s9"})
	r.reg.SetHealthy(r.reg.ByURL(x), true)
	step(route.SessionIDMatch, chatBody("m", u2+" more", false), map[string]string{"X-Session-ID": "s9"})
}

func waitLoad(t *testing.T, r *testRouter, url string, n int64) {
	t.Helper()
	testwait.Until(t, fmt.Sprintf("%d in flight on %s", n, url), func() bool { return r.reg.ByURL(url).Load() >= n })
}

// TestRetryTeachesTheKey: forward drops a request's View once its first
// choice is made (dropView) and parses the body again for a retry
// (restoreView). The worker that serves the retry must learn the request's
// history key, as it would have without the drop.
func TestRetryTeachesTheKey(t *testing.T) {
	ws, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	ca := r.policy.(route.Summarizer)
	held := func(url string) int {
		w := r.reg.ByURL(url)
		if w == nil {
			t.Fatalf("worker %s not registered", url)
		}
		return ca.View(0).Workers[w.ID()].TreeChars
	}
	// The first turn teaches one worker the conversation; then that worker
	// answers 503, and the next turn, sent to it by its prefix, is retried
	// on the other.
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", history("m", 3, "first"), nil)
	first := resp.Header.Get("x-vllm-router-worker")
	if resp.StatusCode != 200 || first == "" {
		t.Fatalf("first turn: status %d from %q: %s", resp.StatusCode, first, body)
	}
	other := urls[0]
	for i, u := range urls {
		if u == first {
			ws[i].SetUnavailable(true)
		} else {
			other = u
		}
	}
	before, had := r.counter("vllm_router_retries_total"), held(other)
	resp, body = do(t, "POST", r.url+"/v1/chat/completions", history("m", 4, "second"), nil)
	if resp.StatusCode != 200 || resp.Header.Get("x-vllm-router-worker") != other {
		t.Fatalf("second turn: status %d from %q, want 200 from %s: %s", resp.StatusCode, resp.Header.Get("x-vllm-router-worker"), other, body)
	}
	if d := r.counter("vllm_router_retries_total") - before; d != 1 {
		t.Fatalf("second turn retried %d times, want once (first to %s, which holds its prefix)", d, first)
	}
	if n := held(other) - had; n < 1000 {
		t.Fatalf("the worker that served the retry learned %d characters of history, want the request's key (> 1000)", n)
	}
	waitIdle(t, r.reg)
}
