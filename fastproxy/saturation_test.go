package fastproxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// vllmGauges is a worker double whose /metrics reports what the test sets.
type vllmGauges struct {
	srv  *httptest.Server
	body atomic.Value // string
}

func newVLLMGauges(t *testing.T) *vllmGauges {
	t.Helper()
	g := &vllmGauges{}
	g.body.Store("")
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			io.WriteString(w, g.body.Load().(string)) //nolint:errcheck
		}
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *vllmGauges) report(running, waiting int, kv float64) {
	g.body.Store(fmt.Sprintf("vllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} %d\nvllm:kv_cache_usage_perc{model_name=\"m\"} %g\n",
		running, waiting, kv))
}

// fakeQueues is a policy's learned queue rate, per worker.
type fakeQueues map[*loadview.Worker]float64

func (f fakeQueues) QueueSeconds(_ string, w *loadview.Worker) (float64, bool) {
	q, ok := f[w]
	return q, ok
}

func (f fakeQueues) PrefillSeconds(string) (float64, bool) { return 1e-4, true }

// A pool's room follows what its workers report: unknown (no limit) until
// a worker has shown a queue, then the free slots it reports moved by the
// requests sent since, less the requests waiting in an engine past full
// (never below 0), none at the KV limit, none from an unhealthy worker,
// and, for a worker that reports nothing, the policy's learned queue rate.
func TestSaturationRoom(t *testing.T) {
	reg := loadview.NewRegistry(loadview.Config{LoadScrapeInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	a, b := newVLLMGauges(t), newVLLMGauges(t)
	wa, _ := reg.Add(context.Background(), a.srv.URL, []string{"m"})
	wb, _ := reg.Add(context.Background(), b.srv.URL, []string{"m"})
	reg.SetHealthy(wa[0], true)
	reg.SetHealthy(wb[0], true)
	s := &saturation{reg: reg, waiting: 0, kv: 0.95, queueSecs: 2}
	scrape := func(ra, wa, rb, wb int, kvb float64) {
		a.report(ra, wa, 0.5)
		b.report(rb, wb, kvb)
		reg.ScrapeLoadOnce(context.Background())
	}
	f := func(what string, want int) {
		t.Helper()
		if got := s.room("m"); got != want {
			t.Fatalf("%s: room %d, want %d", what, got, want)
		}
	}
	if s.room("unknown") != -1 {
		t.Fatal("a model no worker serves has a limit")
	}
	scrape(3, 0, 3, 0, 0.5)
	f("no worker has shown a queue", -1)
	scrape(4, 2, 6, 1, 0.5) // capacities 4 and 6, both full
	f("both queueing", 0)
	scrape(2, 0, 3, 0, 0.5) // 2 + 3 slots free
	f("free slots", 5)
	wa[0].Acquire() // sent since the scrape: one slot fewer
	f("a request sent since", 4)
	wa[0].Release()
	scrape(4, 2, 3, 0, 0.5) // a queues 2 in its engine: they count against b's 3 free slots
	f("a worker past full", 1)
	scrape(4, 5, 3, 0, 0.5)
	f("more queued in a than free in b", 0)
	scrape(2, 0, 3, 0, 0.97) // b's KV cache is full
	f("b at the KV limit", 2)
	reg.SetHealthy(wa[0], false)
	f("a unhealthy, b full", 0)
	reg.SetHealthy(wa[0], true)

	c := newVLLMGauges(t) // reports no load at all
	wc, _ := reg.Add(context.Background(), c.srv.URL, []string{"m"})
	reg.SetHealthy(wc[0], true)
	reg.ScrapeLoadOnce(context.Background())
	f("a worker that reports nothing sets no limit", -1)
	s.queues = fakeQueues{wc[0]: 0.5} // 2 s of queue at 0.5 s a request: 4 requests
	scrape(2, 0, 3, 0, 0.97)
	f("the learned queue rate", 2+0+4)
	wc[0].Acquire()
	f("a request in flight on the learned worker", 2+0+3)
	wc[0].Release()

	// The expected wait of a saturated pool: the mean learned queue rate
	// (0.5 s on c, the prior on a and b) times the requests in flight and
	// waiting ahead, plus this one, spread over the three workers.
	wc[0].Acquire()
	want := (0.5 + 2*route.PriorQueueSeconds) / 3 * float64(wa[0].FleetLoad()+wb[0].FleetLoad()+wc[0].FleetLoad()+4+1) / 3
	if got := s.wait("m", 4); math.Abs(got-want) > 1e-12 {
		t.Fatalf("wait %g, want %g", got, want)
	}
	wc[0].Release()
	if s.prefill("m") != 1e-4 || (&saturation{reg: reg}).prefill("m") != route.PriorPrefillSeconds {
		t.Fatal("prefill: learned, else the prior")
	}
}
