package fastproxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/simworker"
)

// TestPreemptionGivesAnUrgentTurnTheSlot: a worker that runs one sequence
// at a time is busy with a long background stream when an urgent turn of
// a session it holds arrives. With --queue-preempt the urgent turn takes
// the slot: it is answered while the background stream pauses, and the
// background answer then goes on to read exactly as it does
// uninterrupted, with the same usage. Without it the urgent turn waits
// for the background answer to end.
func TestPreemptionGivesAnUrgentTurnTheSlot(t *testing.T) {
	for _, preempt := range []bool{true, false} {
		t.Run(map[bool]string{true: "preempt", false: "no preemption"}[preempt], func(t *testing.T) {
			urgentFirst, background, whole := preemptionRun(t, preempt)
			if urgentFirst != preempt {
				t.Fatalf("urgent turn answered before the background stream ended: %v, want %v", urgentFirst, preempt)
			}
			b, w := readSSE(t, background), readSSE(t, whole)
			if b.text.String() != w.text.String() || w.text.Len() == 0 || b.usage["completion_tokens"] != w.usage["completion_tokens"] ||
				b.usage["prompt_tokens"] != w.usage["prompt_tokens"] {
				t.Fatalf("background answer %q %v, uninterrupted %q %v", b.text.String(), b.usage, w.text.String(), w.usage)
			}
			if b.roles != 1 || b.dones != 1 || len(b.ids) != 1 || b.errors.Len() > 0 {
				t.Fatalf("background answer: %d roles, %d [DONE], ids %v, errors %q: want one answer", b.roles, b.dones, b.ids, b.errors.String())
			}
		})
	}
}

// preemptionRun runs the scene of TestPreemptionGivesAnUrgentTurnTheSlot
// and returns whether the urgent turn ended first, the background stream
// through the router, and the same answer from a worker of its own.
func preemptionRun(t *testing.T, preempt bool) (urgentFirst bool, background, whole string) {
	cfg := simworker.Config{Models: []string{"m"}, TimeScale: 0.2, MaxNumSeqs: 1, OmitPromptTokensDetails: true}
	sims, urls := startSims(t, 1, cfg)
	tr := startRouter(t, urls, "cache_aware", func(fc *fastproxy.Config, lc *loadview.Config) {
		// One request may wait in the engine before the pool counts full,
		// so the urgent turn is not held in the router's queue: it reaches
		// the worker step, which sees that it would wait for a slot.
		fc.QueueSize, fc.QueueTimeout, fc.QueueHeadroom, fc.SaturationWaiting = 100, 10*time.Second, -1, 1
		fc.QueuePreempt = preempt
		lc.LoadScrapeInterval = time.Hour // scraped by the test, below
	})
	sim := sims[0]
	const path = "/v1/chat/completions"
	long := `{"model":"m","stream":true,"max_tokens":2500,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"write a long report"}]}`
	session := map[string]string{"X-Session-ID": "agent-1", "X-Request-Priority": "10"}

	// The worker's capacity is learned from a report with a request
	// waiting: a short background stream runs while the long one waits
	// behind it when the load is scraped.
	var wg sync.WaitGroup
	var backgroundAt time.Time
	short := strings.Replace(long, `"max_tokens":2500`, `"max_tokens":400`, 1)
	wg.Go(func() {
		if resp, raw := do(t, "POST", tr.url+path, short, session); resp.StatusCode != 200 {
			t.Errorf("short background: %d %s", resp.StatusCode, raw)
		}
	})
	testwait.Until(t, "the short stream running", func() bool { return sim.Stats().Running == 1 })
	relayed := make(chan struct{}) // the long stream's first event reached its client
	wg.Go(func() {
		req, _ := http.NewRequest("POST", tr.url+path, strings.NewReader(long))
		for k, v := range session {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			close(relayed)
			return
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		first, err := br.ReadString('\n')
		close(relayed)
		rest, _ := io.ReadAll(br)
		if resp.StatusCode != 200 || err != nil {
			t.Errorf("background: %d %v %s", resp.StatusCode, err, rest)
		}
		background, backgroundAt = first+string(rest), time.Now()
	})
	testwait.Until(t, "the long stream waiting", func() bool { return sim.Stats().Waiting == 1 })
	tr.reg.ScrapeLoadOnce(context.Background())
	<-relayed
	testwait.Until(t, "the long stream running alone", func() bool {
		return sim.Stats().Running == 1 && sim.Stats().Waiting == 0 && tr.reg.Workers()[0].Load() == 1
	})

	resp, raw := do(t, "POST", tr.url+path, chatBody("m", "quick question", true), map[string]string{"X-Session-ID": "agent-1", "X-Request-Priority": "0"})
	urgentAt := time.Now()
	if u := readSSE(t, string(raw)); resp.StatusCode != 200 || u.text.Len() == 0 || u.dones != 1 {
		t.Fatalf("urgent: %d %s", resp.StatusCode, raw)
	}
	wg.Wait()
	if n := tr.counter(`vllm_router_stream_preemptions_total{outcome="resumed"}`); n != map[bool]uint64{true: 1, false: 0}[preempt] {
		t.Fatalf("%d preempted streams resumed (not continuable %d, failed %d)", n,
			tr.counter(`vllm_router_stream_preemptions_total{outcome="not_continuable"}`), tr.counter(`vllm_router_stream_preemptions_total{outcome="failed"}`))
	}
	waitIdle(t, tr.reg)

	_, solo := startSims(t, 1, cfg)
	resp, raw = do(t, "POST", solo[0]+path, long, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("uninterrupted: %d %s", resp.StatusCode, raw)
	}
	return urgentAt.Before(backgroundAt), background, string(raw)
}
