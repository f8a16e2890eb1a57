package loadview

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
)

// fakeClock is an injected Config.Now that moves only when told.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Unix(1_700_000_000, 0).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestBreakerTransitions runs scripts of steps against one worker's breaker:
// F a failed request, S a successful one, +d the clock moves by d, =state the
// breaker must be in state (and Healthy must be false exactly when open),
// #n it must have opened n times.
func TestBreakerTransitions(t *testing.T) {
	cases := []struct{ name, script string }{
		{"opens after threshold consecutive failures", "F F =closed F =open #1"},
		{"a success resets the streak", "F F S F F =closed F =open"},
		{"failures outside the window are forgotten", "F +20s F +20s F =closed F =open"},
		{"spread-out failures never open", "F +16s F +16s F +16s F +16s F +16s F =closed"},
		{"open turns half-open lazily after the timeout", "F F F =open +9999ms =open +1ms =half"},
		{"half-open closes after the success threshold", "F F F +10s =half S =half S =closed #1"},
		{"half-open reopens on a failure", "F F F +10s S =half F =open #2 +9s =open +1s =half"},
		{"successes while open are ignored", "F F F S S S =open +10s =half S =half S =closed"},
		{"closed again: a fresh streak is needed", "F F F +10s S S =closed F F =closed F =open #2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newFakeClock()
			r, ws := fleet(t, 1, Config{
				CBFailureThreshold: 3, CBSuccessThreshold: 2,
				CBTimeoutDuration: 10 * time.Second, CBWindowDuration: 30 * time.Second,
				FailureThreshold: 1 << 20, // probes started on opening fail (refused port): keep health out of it
				Now:              clk.Now,
			})
			w := ws[0]
			defer r.probes.Wait()
			for i, step := range strings.Fields(c.script) {
				switch step[0] {
				case 'F':
					r.RecordFailure(w)
				case 'S':
					r.RecordSuccess(w)
				case '+':
					d, err := time.ParseDuration(step[1:])
					if err != nil {
						t.Fatal(err)
					}
					clk.Advance(d)
				case '#':
					if got := w.BreakerOpenings(); strings.TrimPrefix(step, "#") != itoa(got) {
						t.Fatalf("step %d: opened %d times, want %s", i, got, step[1:])
					}
				case '=':
					want := map[string]BreakerState{"closed": BreakerClosed, "open": BreakerOpen, "half": BreakerHalfOpen}[step[1:]]
					if got := w.BreakerState(); got != want {
						t.Fatalf("step %d (%s): state %v, want %v", i, step, got, want)
					}
					if w.Healthy() != (want != BreakerOpen) {
						t.Fatalf("step %d: Healthy() = %v in state %v", i, w.Healthy(), want)
					}
				}
			}
		})
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// runChecks runs RunHealthChecks until the returned stop is called; stop
// waits for it and for its probes to end.
func runChecks(r *Registry) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.RunHealthChecks(ctx); close(done) }()
	return func() { cancel(); <-done; r.probes.Wait() }
}

func TestBreakerDisabled(t *testing.T) {
	r, ws := fleet(t, 1, Config{})
	for i := 0; i < 100; i++ {
		r.RecordResult(ws[0], false)
	}
	if !ws[0].Healthy() || ws[0].BreakerState() != BreakerClosed {
		t.Fatal("CBFailureThreshold 0 must disable the breaker")
	}
}

func TestBreakerDoesNotTouchHealthChecks(t *testing.T) {
	clk := newFakeClock()
	r, ws := fleet(t, 1, Config{CBFailureThreshold: 1, FailureThreshold: 1 << 20, Now: clk.Now})
	defer r.probes.Wait()
	w := ws[0]
	r.RecordFailure(w)
	if w.Healthy() || !w.HealthCheckOK() {
		t.Fatalf("open breaker: Healthy %v HealthCheckOK %v", w.Healthy(), w.HealthCheckOK())
	}
	r.SetHealthy(w, false)
	if w.BreakerState() != BreakerClosed || w.Healthy() {
		t.Fatal("SetHealthy closes the breaker and sets the health-check state")
	}
	r.SetHealthy(w, true)
	r.Remove(w.URL())
	if w.Healthy() {
		t.Fatal("a removed worker is never healthy")
	}
}

// healthServer answers its health endpoint with a settable status and counts
// the probes by status.
type healthServer struct {
	*httptest.Server
	status atomic.Int32
	hits   sync.Map // status → *atomic.Int64
}

func newHealthServer(t *testing.T, status int) *healthServer {
	h := &healthServer{}
	h.status.Store(int32(status))
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s := int(h.status.Load())
		n, _ := h.hits.LoadOrStore(s, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		w.WriteHeader(s)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *healthServer) count(status int) int64 {
	if n, ok := h.hits.Load(status); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

func TestUnhealthyWorkersAreReprobedSoon(t *testing.T) {
	sick := newHealthServer(t, http.StatusServiceUnavailable)
	ticker := newHealthServer(t, http.StatusServiceUnavailable) // stays sick: its probes count ticks
	r := NewRegistry(Config{
		HealthInterval: time.Hour, UnhealthyProbeInterval: 5 * time.Millisecond,
		FailureThreshold: 1, SuccessThreshold: 2, HealthTimeout: 2 * time.Second, Logger: quiet(),
	})
	ctx := context.Background()
	ws, err := r.Add(ctx, sick.URL, []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Add(ctx, ticker.URL, []string{"m"}); err != nil {
		t.Fatal(err)
	}
	w := ws[0]
	if w.Healthy() {
		t.Fatal("a worker answering 503 must start unhealthy")
	}
	stop := runChecks(r)
	defer stop()
	testwait.Until(t, "re-probes of the unhealthy worker", func() bool { return sick.count(503) >= 4 })
	sick.status.Store(http.StatusOK)
	testwait.Until(t, "the restarted worker to be healthy", w.Healthy)
	if n := sick.count(200); n < 2 {
		t.Fatalf("healthy after %d good probes, want SuccessThreshold = 2", n)
	}
	// Healthy now: probed every HealthInterval (an hour), not every tick.
	before := sick.count(200)
	t0 := ticker.count(503)
	testwait.Until(t, "20 more ticks", func() bool { return ticker.count(503) >= t0+20 })
	if n := sick.count(200) - before; n > 1 { // one probe may have been in flight
		t.Fatalf("healthy worker probed %d more times within 20 fast ticks", n)
	}
}

func TestRestartedWorkerLeavesOpenBreakerOnProbes(t *testing.T) {
	clk := newFakeClock() // never advances: only probes can end the open period
	srv := newHealthServer(t, http.StatusOK)
	r := NewRegistry(Config{
		CBFailureThreshold: 2, HealthInterval: time.Hour, UnhealthyProbeInterval: 5 * time.Millisecond,
		FailureThreshold: 3, SuccessThreshold: 2, Now: clk.Now, Logger: quiet(),
	})
	ctx := context.Background()
	ws, _ := r.Add(ctx, srv.URL, []string{"m"})
	w := ws[0]

	// Requests fail but /health passes: the breaker must stay open.
	r.RecordFailure(w)
	r.RecordFailure(w)
	r.probes.Wait() // the probe started on opening
	for i := 0; i < 3; i++ {
		r.CheckOnce(ctx)
	}
	if w.BreakerState() != BreakerOpen || w.Healthy() {
		t.Fatalf("health passing alone moved the breaker to %v", w.BreakerState())
	}

	// The worker goes down (probes fail), then comes back.
	srv.status.Store(http.StatusServiceUnavailable)
	stop := runChecks(r)
	defer stop()
	testwait.Until(t, "failed probes", func() bool { return srv.count(503) >= 1 })
	srv.status.Store(http.StatusOK)
	testwait.Until(t, "the breaker to go half-open", func() bool { return w.BreakerState() == BreakerHalfOpen })
	if !w.Healthy() {
		t.Fatal("half-open and health checks passing: must be routable")
	}
	r.RecordSuccess(w)
	r.RecordSuccess(w)
	r.RecordSuccess(w)
	if w.BreakerState() != BreakerClosed {
		t.Fatalf("state %v after CBSuccessThreshold successes", w.BreakerState())
	}
}

func TestProbeSoonCoalesces(t *testing.T) {
	var hits atomic.Int64
	var block atomic.Bool
	entered, release := make(chan struct{}, 16), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if block.Load() {
			hits.Add(1)
			entered <- struct{}{}
			<-release
		}
	}))
	defer srv.Close()
	r := NewRegistry(Config{DPSize: 2, Logger: quiet()})
	ws, err := r.Add(context.Background(), srv.URL, []string{"m"})
	if err != nil || len(ws) != 2 {
		t.Fatal(ws, err)
	}
	block.Store(true)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); r.ProbeSoon(ws[i%2]) }() // both ranks share one base URL
	}
	wg.Wait() // every call returned while the probe is still blocked: none blocks
	<-entered
	r.ProbeSoon(ws[0])
	close(release)
	r.probes.Wait()
	if n := hits.Load(); n != 1 {
		t.Fatalf("%d probes for 21 ProbeSoon calls while one was in flight", n)
	}
	r.ProbeSoon(ws[1])
	r.probes.Wait()
	if n := hits.Load(); n != 2 {
		t.Fatalf("%d probes after the first finished, want 2", n)
	}
}

func TestBreakerConcurrent(t *testing.T) {
	r, ws := fleet(t, 2, Config{CBFailureThreshold: 2, CBSuccessThreshold: 1, CBTimeoutDuration: time.Millisecond})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				w := ws[(g+i)%2]
				r.RecordResult(w, (g+i)%3 != 0)
				_ = w.Healthy()
				_ = w.BreakerState()
			}
		}()
	}
	wg.Wait()
	r.probes.Wait()
}

// TestAnswerFailuresSpareTheLastHealthyWorker: failures a worker answered
// never open the breaker of the last healthy worker of a model it serves;
// failures without an answer still do, and answers still open the breaker
// of a worker that has a healthy peer for each of its models.
func TestAnswerFailuresSpareTheLastHealthyWorker(t *testing.T) {
	const threshold = 3
	clk := newFakeClock()
	setup := func(t *testing.T, models ...[]string) (*Registry, []*Worker) {
		t.Helper()
		r := NewRegistry(Config{
			CBFailureThreshold: threshold, CBTimeoutDuration: 10 * time.Second,
			FailureThreshold: 1 << 20, // probes started on opening fail (refused port): keep health out of it
			Now:              clk.Now, Logger: quiet(),
		})
		t.Cleanup(r.probes.Wait)
		var ws []*Worker
		for i, ms := range models {
			added, err := r.Add(context.Background(), "http://127.0.0."+strconv.Itoa(i+1)+":1", ms)
			if err != nil {
				t.Fatal(err)
			}
			r.SetHealthy(added[0], true)
			ws = append(ws, added[0])
		}
		return r, ws
	}
	answers := func(r *Registry, w *Worker, n int) {
		for range n {
			r.RecordAnswerFailure(w)
		}
	}
	state := func(t *testing.T, w *Worker, want BreakerState) {
		t.Helper()
		if got := w.BreakerState(); got != want {
			t.Fatalf("%s: breaker %v, want %v", w.URL(), got, want)
		}
	}

	t.Run("one worker: answers never open it, connect failures do", func(t *testing.T) {
		r, ws := setup(t, []string{"m"})
		answers(r, ws[0], 10*threshold)
		state(t, ws[0], BreakerClosed)
		r.RecordFailure(ws[0]) // the uncounted answers did not build a streak
		state(t, ws[0], BreakerClosed)
		for range threshold - 1 {
			r.RecordFailure(ws[0])
		}
		state(t, ws[0], BreakerOpen)
	})
	t.Run("two workers: the faulty one is ejected, then the other is the last", func(t *testing.T) {
		r, ws := setup(t, []string{"m"}, []string{"m"})
		answers(r, ws[0], threshold)
		state(t, ws[0], BreakerOpen)
		answers(r, ws[1], 10*threshold)
		state(t, ws[1], BreakerClosed)
	})
	t.Run("a peer whose health checks fail is no second opinion", func(t *testing.T) {
		r, ws := setup(t, []string{"m"}, []string{"m"})
		ws[1].healthy.Store(false)
		answers(r, ws[0], 10*threshold)
		state(t, ws[0], BreakerClosed)
	})
	t.Run("the last worker of one of its models", func(t *testing.T) {
		r, ws := setup(t, []string{"shared", "own"}, []string{"shared"})
		answers(r, ws[0], 10*threshold)
		state(t, ws[0], BreakerClosed)
		answers(r, ws[1], threshold) // ws[0] serves "shared" too
		state(t, ws[1], BreakerOpen)
	})
	t.Run("a worker of unknown models is last without another such worker", func(t *testing.T) {
		r, ws := setup(t, nil, []string{"m"})
		answers(r, ws[0], 10*threshold) // the only one for any model but "m"
		state(t, ws[0], BreakerClosed)
		answers(r, ws[1], threshold) // ws[0] serves "m" too
		state(t, ws[1], BreakerOpen)
	})
	t.Run("half-open last worker is not reopened by answers", func(t *testing.T) {
		r, ws := setup(t, []string{"m"})
		for range threshold {
			r.RecordFailure(ws[0])
		}
		state(t, ws[0], BreakerOpen)
		clk.Advance(10 * time.Second)
		state(t, ws[0], BreakerHalfOpen)
		answers(r, ws[0], 1)
		state(t, ws[0], BreakerHalfOpen)
		r.RecordFailure(ws[0])
		state(t, ws[0], BreakerOpen)
	})
}
