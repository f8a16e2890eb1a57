package fastproxy_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/saar"
)

// overflowConfig is a logical model over two models of one quality; m-a is
// the cheaper, so every session starts there.
const overflowConfig = `
models:
  - name: m-a
    quality_score: 0.8
    pricing: {prompt_per_1m: 1.0, cached_input_per_1m: 0.25, completion_per_1m: 4.0}
  - name: m-b
    quality_score: 0.8
    pricing: {prompt_per_1m: 2.0, cached_input_per_1m: 0.5, completion_per_1m: 8.0}
logical_models:
  - name: auto
    decisions:
      - name: default
        candidates: [m-a, m-b]
`

// A turn of a logical model whose model's pool is saturated (docs/design.md
// §9): an unlocked first turn overflows to the other model at once; a
// turn in a tool loop waits for its model; a turn whose model holds a long
// warm history waits too, the wait being shorter than its re-prefill.
func TestOverflowToAnotherModel(t *testing.T) {
	a, b := newGatedWorker(t), newGatedWorker(t)
	b.open()
	cfg, err := saar.ParseConfig([]byte(overflowConfig))
	if err != nil {
		t.Fatal(err)
	}
	models := saar.NewRouter(cfg, saar.Options{})
	tr := startRouter(t, nil, "cache_aware", func(fc *fastproxy.Config, lc *loadview.Config) {
		fc.Models, fc.QueueSize, fc.QueueTimeout = models, 100, 10*time.Second
		lc.LoadScrapeInterval = time.Hour // scraped by the test, below
	})
	t.Cleanup(a.open)
	for model, g := range map[string]*gatedWorker{"m-a": a, "m-b": b} {
		if _, err := tr.reg.Add(context.Background(), g.srv.URL, []string{model}); err != nil {
			t.Fatal(err)
		}
	}
	report := func(running, waiting int) {
		a.metrics.Store(fmt.Sprintf("vllm:num_requests_running %d\nvllm:num_requests_waiting %d\n", running, waiting))
		tr.reg.ScrapeLoadOnce(context.Background())
	}
	out := make(chan result, 5)
	answer := func(name string) result {
		t.Helper()
		r := <-out
		if r.name != name || r.status != 200 {
			t.Fatalf("%s: %d %s, want %s 200", r.name, r.status, r.code, name)
		}
		return r
	}
	hdr := func(session string) map[string]string { return map[string]string{"X-Session-ID": session} }
	user := `{"role":"user","content":"hello"}`
	chat := func(msgs ...string) string {
		return `{"model":"auto","messages":[` + strings.Join(msgs, ",") + `]}`
	}

	report(1, 1) // m-a has shown it runs one request at a time
	report(0, 0) // and has room for one

	// Two sessions start on m-a: one whose answer reports a long prompt, all
	// of it cached, and one that will be in a tool loop.
	a.usage.Store(`{"prompt_tokens":400000,"completion_tokens":1,"total_tokens":400001,"prompt_tokens_details":{"cached_tokens":400000}}`)
	send(tr.url, "warm-1", chat(user), hdr("warm"), out)
	a.releaseAll(t, 1)
	answer("warm-1")
	send(tr.url, "tool-1", chat(user), hdr("tool"), out)
	a.releaseAll(t, 2)
	if r := answer("tool-1"); r.hdr.Get("x-vsr-selected-model") != "m-a" {
		t.Fatalf("tool-1 on %q", r.hdr.Get("x-vsr-selected-model"))
	}

	// A third session's turn holds m-a's one slot: its pool is saturated
	// (counted by the router itself, exactly, not by a report to come).
	send(tr.url, "blocker", chat(user), hdr("blocker"), out)
	testwait.Until(t, "blocker at m-a", func() bool { return len(a.seen()) == 3 })
	send(tr.url, "fresh", chat(user), hdr("fresh"), out)
	r := answer("fresh")
	if m, act := r.hdr.Get("x-vsr-selected-model"), r.hdr.Get("x-vsr-session-action"); m != "m-b" || act != saar.ActionOverflow {
		t.Fatalf("fresh: model %q action %q, want m-b overflow", m, act)
	}
	if !slices.Contains(b.seen(), "fresh") || r.hdr.Get("X-Vllm-Router-Queue-Ms") != "" {
		t.Fatalf("fresh did not go to m-b at once: m-b saw %v, queue header %q", b.seen(), r.hdr.Get("X-Vllm-Router-Queue-Ms"))
	}
	_, rec := do(t, "GET", tr.adminURL(t)+"/v1/router_replay?session=fresh&limit=1", "", nil)
	if !strings.Contains(string(rec), `"reason":"queue_overflow"`) {
		t.Fatalf("replay record: %s", rec)
	}

	toolTurn := chat(user, `{"role":"assistant","tool_calls":[{"id":"call_zz","type":"function","function":{"name":"lookup","arguments":"{}"}}]}`,
		`{"role":"tool","tool_call_id":"call_zz","content":"42"}`)
	send(tr.url, "tool-2", toolTurn, hdr("tool"), out)
	waitQueued(t, tr, 1)
	send(tr.url, "warm-2", chat(user, `{"role":"assistant","content":"ok"}`, `{"role":"user","content":"and then?"}`), hdr("warm"), out)
	waitQueued(t, tr, 2)
	if len(b.seen()) != 1 {
		t.Fatalf("m-b saw %v: a locked or warm turn overflowed", b.seen())
	}

	a.releaseAll(t, 5) // the blocker, then the two that waited for m-a
	for range 3 {
		r := <-out
		if r.name == "blocker" {
			continue
		}
		want := map[string]string{"tool-2": saar.ActionHardLock, "warm-2": saar.ActionStay}[r.name]
		if r.status != 200 || r.hdr.Get("x-vsr-selected-model") != "m-a" || r.hdr.Get("x-vsr-session-action") != want ||
			r.hdr.Get("X-Vllm-Router-Queue-Ms") == "" {
			t.Fatalf("%s: %d on %q action %q (want m-a %s), queue header %q", r.name, r.status,
				r.hdr.Get("x-vsr-selected-model"), r.hdr.Get("x-vsr-session-action"), want, r.hdr.Get("X-Vllm-Router-Queue-Ms"))
		}
	}
	var m strings.Builder
	tr.srv.WriteMetrics(&m)
	if want := `vllm_router_saar_switches_total{from="m-a",to="m-b",reason="queue_overflow"} 1`; !strings.Contains(m.String(), want) {
		t.Fatalf("metrics lack %s", want)
	}
}
