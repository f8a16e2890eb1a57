package fastproxy_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
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
	tr, _, bg := preemptionScene(t, cfg, func(fc *fastproxy.Config) {
		// One request may wait in the engine before the pool counts full,
		// so the urgent turn is not held in the router's queue: it reaches
		// the worker step, which sees that it would wait for a slot.
		fc.QueueHeadroom = -1
		fc.QueuePreempt = preempt
	})
	resp, raw := do(t, "POST", tr.url+chatPath, chatBody("m", "quick question", true), map[string]string{"X-Session-ID": "agent-1", "X-Request-Priority": "0"})
	urgentAt := time.Now()
	if u := readSSE(t, string(raw)); resp.StatusCode != 200 || u.text.Len() == 0 || u.dones != 1 {
		t.Fatalf("urgent: %d %s", resp.StatusCode, raw)
	}
	<-bg.done
	if n := tr.counter(`vllm_router_stream_preemptions_total{outcome="resumed"}`); n != map[bool]uint64{true: 1, false: 0}[preempt] {
		t.Fatalf("%d preempted streams resumed (not continuable %d, failed %d)", n,
			tr.counter(`vllm_router_stream_preemptions_total{outcome="not_continuable"}`), tr.counter(`vllm_router_stream_preemptions_total{outcome="failed"}`))
	}
	waitIdle(t, tr.reg)

	_, solo := startSims(t, 1, cfg)
	resp, raw = do(t, "POST", solo[0]+chatPath, longBackground, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("uninterrupted: %d %s", resp.StatusCode, raw)
	}
	return urgentAt.Before(bg.at), bg.body, string(raw)
}

// longBackground is the scene's background stream.
const longBackground = `{"model":"m","stream":true,"max_tokens":2500,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"write a long report"}]}`

// backgroundStream is the scene's background stream as its client reads
// it: cancel hangs up; done closes once it ended, with the whole body and
// when it ended.
type backgroundStream struct {
	cancel context.CancelFunc
	done   chan struct{}
	body   string
	at     time.Time
}

// preemptionScene starts a worker of cfg (one sequence slot) and a
// router with the queue on (mod sets more) that has learned the worker's
// capacity, and returns them with a long background stream of session
// agent-1 running alone there, its first event relayed to its client.
func preemptionScene(t *testing.T, cfg simworker.Config, mod func(*fastproxy.Config)) (*testRouter, *simworker.Worker, *backgroundStream) {
	t.Helper()
	sims, urls := startSims(t, 1, cfg)
	tr := startRouter(t, urls, "cache_aware", func(fc *fastproxy.Config, lc *loadview.Config) {
		fc.QueueSize, fc.QueueTimeout, fc.SaturationWaiting = 100, 10*time.Second, 1
		mod(fc)
		lc.LoadScrapeInterval = time.Hour // scraped by the scene, below
	})
	sim := sims[0]
	session := map[string]string{"X-Session-ID": "agent-1", "X-Request-Priority": "10"}

	// The worker's capacity is learned from a report with a request
	// waiting: a short background stream runs while the long one waits
	// behind it when the load is scraped.
	short := strings.Replace(longBackground, `"max_tokens":2500`, `"max_tokens":400`, 1)
	shortDone := make(chan struct{})
	go func() {
		defer close(shortDone)
		if resp, raw := do(t, "POST", tr.url+chatPath, short, session); resp.StatusCode != 200 {
			t.Errorf("short background: %d %s", resp.StatusCode, raw)
		}
	}()
	t.Cleanup(func() { <-shortDone })
	testwait.Until(t, "the short stream running", func() bool { return sim.Stats().Running == 1 })
	ctx, cancel := context.WithCancel(context.Background())
	bg := &backgroundStream{cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { cancel(); <-bg.done })
	relayed := make(chan struct{}) // the long stream's first event reached its client
	go func() {
		defer close(bg.done)
		req, _ := http.NewRequestWithContext(ctx, "POST", tr.url+chatPath, strings.NewReader(longBackground))
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
		bg.body, bg.at = first+string(rest), time.Now()
	}()
	testwait.Until(t, "the long stream waiting", func() bool { return sim.Stats().Waiting == 1 })
	tr.reg.ScrapeLoadOnce(context.Background())
	<-relayed
	testwait.Until(t, "the long stream running alone", func() bool {
		return sim.Stats().Running == 1 && sim.Stats().Waiting == 0 && tr.reg.Workers()[0].Load() == 1
	})
	return tr, sim, bg
}

// A preempted stream whose wait to go on ends without a release: its
// client hangs up (nothing more goes upstream, counted client_gone), or
// the router shuts down (its client reads the answer so far, then the
// stream_cut error event, counted failed). The queue keeps one slot of
// the pool for urgent turns, so the paused background stream waits while
// the urgent turn runs.
func TestPreemptedStreamWaitEnds(t *testing.T) {
	for _, end := range []string{"client gone", "shutdown"} {
		t.Run(end, func(t *testing.T) {
			cfg := simworker.Config{Models: []string{"m"}, TimeScale: 0.2, MaxNumSeqs: 1, OmitPromptTokensDetails: true}
			tr, sim, bg := preemptionScene(t, cfg, func(fc *fastproxy.Config) {
				fc.QueueHeadroom, fc.QueuePreempt = 1, true
			})
			urgent := strings.Replace(longBackground, "write a long report", "an urgent long answer", 1)
			urgentDone := make(chan struct{})
			go func() {
				defer close(urgentDone)
				do(t, "POST", tr.url+chatPath, urgent, map[string]string{"X-Session-ID": "agent-1", "X-Request-Priority": "0"}) //nolint:errcheck
			}()
			t.Cleanup(func() { <-urgentDone })
			waitQueued(t, tr, 1) // the paused background stream
			sent := sim.Stats().Requests
			var outcome string
			switch end {
			case "client gone":
				bg.cancel()
				outcome = "client_gone"
			case "shutdown":
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				tr.srv.Shutdown(ctx) //nolint:errcheck // the urgent turn is still in flight: the grace ends
				outcome = "failed"
			}
			testwait.Until(t, "the preemption counted "+outcome, func() bool {
				return tr.counter(`vllm_router_stream_preemptions_total{outcome="`+outcome+`"}`) == 1
			})
			<-bg.done
			if n := sim.Stats().Requests; n != sent {
				t.Fatalf("the worker got %d requests after the pause ended", n-sent)
			}
			if end == "shutdown" {
				b := readSSE(t, bg.body)
				if b.text.Len() == 0 || !strings.Contains(b.errors.String(), "stream_cut") || b.roles != 1 {
					t.Fatalf("background after the shutdown: %d roles, text %q, errors %q", b.roles, b.text.String(), b.errors.String())
				}
			}
		})
	}
}
