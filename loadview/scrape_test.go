package loadview

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/simworker"
)

// fakeVLLM is a worker over loopback: /health, /v1/models and a /metrics
// whose status and body the test sets.
type fakeVLLM struct {
	mu     sync.Mutex
	status int
	body   string
	auth   string // Authorization of the last /metrics request

	scrapes atomic.Int64 // /metrics requests answered
}

func (f *fakeVLLM) set(status int, body string) {
	f.mu.Lock()
	f.status, f.body = status, body
	f.mu.Unlock()
}

func (f *fakeVLLM) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	switch req.URL.Path {
	case "/health":
	case "/v1/models":
		io.WriteString(w, `{"data":[{"id":"m"}]}`) //nolint:errcheck
	case "/metrics":
		f.mu.Lock()
		status, body := f.status, f.body
		f.auth = req.Header.Get("Authorization")
		f.mu.Unlock()
		if status != 0 {
			w.WriteHeader(status)
		}
		f.scrapes.Add(1)
		io.WriteString(w, body) //nolint:errcheck
	default:
		http.NotFound(w, req)
	}
}

// lockedBuffer collects log lines from concurrent goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func gauges(running, waiting int, kv string) string {
	return "# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{model_name=\"m\"} " + strconv.Itoa(running) + "\n" +
		"vllm:num_requests_waiting{model_name=\"m\"} " + strconv.Itoa(waiting) + "\n" +
		"vllm:kv_cache_usage_perc{model_name=\"m\"} " + kv + "\n"
}

// scrapeFleet starts a fake worker and a registry that scrapes it every
// second of its fake clock.
func scrapeFleet(t *testing.T, cfg Config) (*Registry, *Worker, *fakeVLLM, *fakeClock, *lockedBuffer) {
	t.Helper()
	f := &fakeVLLM{}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	clk := newFakeClock()
	logs := &lockedBuffer{}
	cfg.Now = clk.Now
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	if cfg.LoadScrapeInterval == 0 {
		cfg.LoadScrapeInterval = time.Second
	}
	r := NewRegistry(cfg)
	ws, err := r.Add(context.Background(), srv.URL, nil)
	if err != nil || !ws[0].Healthy() {
		t.Fatalf("add: %v", err)
	}
	return r, ws[0], f, clk, logs
}

func TestLoadScrapeOneReplicaIsLocal(t *testing.T) {
	r, w, f, _, _ := scrapeFleet(t, Config{APIKey: "k"})
	if w.FleetLoad() != 0 || w.ReportedRunning() != -1 || w.KVCacheUsage() != -1 {
		t.Fatal("a report before any scrape")
	}
	for i := 0; i < 3; i++ {
		w.Acquire()
	}
	f.set(0, gauges(2, 1, "0.5")) // the worker sees exactly our 3 requests
	r.ScrapeLoadOnce(context.Background())
	if w.ReportedRunning() != 2 || w.ReportedWaiting() != 1 || w.KVCacheUsage() != 0.5 {
		t.Fatalf("reported %d/%d/%v", w.ReportedRunning(), w.ReportedWaiting(), w.KVCacheUsage())
	}
	if w.FleetLoad() != 3 || w.Load() != 3 {
		t.Fatalf("one replica: fleet load %d, local %d", w.FleetLoad(), w.Load())
	}
	w.Release() // finished here before the worker's next report: still local
	if w.FleetLoad() != 2 {
		t.Fatalf("fleet load %d after a release", w.FleetLoad())
	}
	f.mu.Lock()
	auth := f.auth
	f.mu.Unlock()
	if auth != "Bearer k" {
		t.Fatalf("authorization %q", auth)
	}
	w.Release()
	w.Release()
}

func TestLoadScrapeCountsOtherReplicas(t *testing.T) {
	r, w, f, _, _ := scrapeFleet(t, Config{})
	for i := 0; i < 3; i++ {
		w.Acquire()
	}
	f.set(0, gauges(10, 4, "0.9")) // 14 in all, 3 of them ours
	r.ScrapeLoadOnce(context.Background())
	if rep, ok := w.LoadReport(); !ok || rep.Others != 11 || rep.Running != 10 || rep.Waiting != 4 || rep.KVCacheUsage != 0.9 {
		t.Fatalf("report %+v %v", rep, ok)
	}
	if w.FleetLoad() != 14 {
		t.Fatalf("fleet load %d, want 14", w.FleetLoad())
	}
	w.Acquire() // sent since the scrape
	if w.FleetLoad() != 15 {
		t.Fatalf("fleet load %d after one more request, want 15", w.FleetLoad())
	}
	for i := 0; i < 4; i++ {
		w.Release()
	}
	if w.FleetLoad() != 11 || w.Load() != 0 {
		t.Fatalf("fleet load %d with nothing of ours in flight, want 11", w.FleetLoad())
	}
	// The worker reports fewer than we have in flight (it has not seen our
	// newest yet): nobody else's load, not a negative one.
	w.Acquire()
	w.Acquire()
	f.set(0, gauges(1, 0, "0.1"))
	r.ScrapeLoadOnce(context.Background())
	if w.FleetLoad() != 2 {
		t.Fatalf("fleet load %d, want the local 2", w.FleetLoad())
	}
	w.Release()
	w.Release()
}

func TestLoadScrapeGoesStale(t *testing.T) {
	r, w, f, clk, _ := scrapeFleet(t, Config{LoadScrapeInterval: time.Second})
	f.set(0, gauges(5, 0, "0.2"))
	r.ScrapeLoadOnce(context.Background())
	clk.Advance(3 * time.Second)
	if w.FleetLoad() != 5 || w.ReportedRunning() != 5 {
		t.Fatalf("fresh at 3 intervals: fleet %d running %d", w.FleetLoad(), w.ReportedRunning())
	}
	clk.Advance(time.Nanosecond)
	if w.FleetLoad() != 0 || w.ReportedRunning() != -1 || w.ReportedWaiting() != -1 || w.KVCacheUsage() != -1 {
		t.Fatalf("stale report still used: fleet %d running %d", w.FleetLoad(), w.ReportedRunning())
	}
	if _, ok := w.LoadReport(); ok {
		t.Fatal("stale LoadReport")
	}
	var buf bytes.Buffer
	r.WriteMetrics(&buf)
	if strings.Contains(buf.String(), "reported_running") || !strings.Contains(buf.String(), "vllm_router_worker_fleet_load{") {
		t.Fatalf("metrics with a stale report:\n%s", buf.String())
	}
}

func TestLoadScrapeFailuresLeaveHealthAlone(t *testing.T) {
	r, w, f, _, logs := scrapeFleet(t, Config{FailureThreshold: 1})
	f.set(0, gauges(7, 0, "0.3"))
	r.ScrapeLoadOnce(context.Background())
	if w.FleetLoad() != 7 {
		t.Fatalf("fleet load %d", w.FleetLoad())
	}
	bad := []struct {
		name   string
		status int
		body   string
	}{
		{"absent", http.StatusNotFound, "not found"},
		{"not vllm", 0, "go_goroutines 12\nprocess_cpu_seconds_total 3\n"},
		{"garbage", 0, "vllm:num_requests_running NaN\n"},
		{"too large", 0, "vllm:num_requests_running 1\n# " + strings.Repeat("x", maxProbeBody) + "\n"},
	}
	for i, c := range bad {
		f.set(c.status, c.body)
		r.ScrapeLoadOnce(context.Background())
		if w.FleetLoad() != 0 || w.ReportedRunning() != -1 {
			t.Fatalf("%s: report kept: fleet %d", c.name, w.FleetLoad())
		}
		if got := w.LoadScrapeFailures(); got != uint64(i+1) {
			t.Fatalf("%s: %d failures counted", c.name, got)
		}
		r.CheckOnce(context.Background())
		if !w.Healthy() {
			t.Fatalf("%s: a failed scrape made the worker unhealthy", c.name)
		}
	}
	if n := logs.count("worker load scrape failed"); n != 1 {
		t.Fatalf("failure logged %d times, want once", n)
	}
	var buf bytes.Buffer
	r.WriteMetrics(&buf)
	if !strings.Contains(buf.String(), "vllm_router_worker_load_scrape_failures_total{worker=") {
		t.Fatalf("no failure counter:\n%s", buf.String())
	}
	f.set(0, gauges(1, 1, "0.1"))
	r.ScrapeLoadOnce(context.Background())
	if w.ReportedWaiting() != 1 || logs.count("worker load scrape works again") != 1 {
		t.Fatalf("no recovery: waiting %d", w.ReportedWaiting())
	}
	buf.Reset()
	r.WriteMetrics(&buf)
	for _, s := range []string{"vllm_router_worker_reported_running{", "vllm_router_worker_reported_waiting{", "vllm_router_worker_kv_cache_usage{"} {
		if !strings.Contains(buf.String(), s) {
			t.Errorf("no %s in\n%s", s, buf.String())
		}
	}
}

func TestLoadScrapeTransportErrorKeepsReportUntilStale(t *testing.T) {
	f := &fakeVLLM{}
	srv := httptest.NewServer(f)
	clk := newFakeClock()
	r := NewRegistry(Config{LoadScrapeInterval: time.Second, Now: clk.Now, Logger: quiet()})
	ws, _ := r.Add(context.Background(), srv.URL, nil)
	w := ws[0]
	f.set(0, gauges(4, 0, "0.1"))
	r.ScrapeLoadOnce(context.Background())
	srv.Close() // refused from now on
	r.ScrapeLoadOnce(context.Background())
	if w.LoadScrapeFailures() != 1 || w.FleetLoad() != 4 {
		t.Fatalf("after a refused scrape: failures %d fleet %d", w.LoadScrapeFailures(), w.FleetLoad())
	}
	clk.Advance(3*time.Second + 1)
	if w.FleetLoad() != 0 {
		t.Fatalf("stale report used: %d", w.FleetLoad())
	}
}

func TestLoadScrapeDataParallel(t *testing.T) {
	r, _, f, _, _ := scrapeFleet(t, Config{DPSize: 2})
	ws := r.Workers()
	if len(ws) != 2 {
		t.Fatalf("%d workers", len(ws))
	}
	ws[0].Acquire()
	ws[1].Acquire()
	f.set(0, `vllm:num_requests_running{engine="0",model_name="m"} 4
vllm:num_requests_running{engine="1",model_name="m"} 1
vllm:num_requests_waiting{engine="0",model_name="m"} 0
vllm:num_requests_waiting{engine="1",model_name="m"} 0
`)
	r.ScrapeLoadOnce(context.Background())
	if ws[0].FleetLoad() != 4 || ws[1].FleetLoad() != 1 || ws[0].ReportedRunning() != 4 {
		t.Fatalf("by engine: %d %d", ws[0].FleetLoad(), ws[1].FleetLoad())
	}
	// Without engine labels the base URL's others are split between ranks.
	f.set(0, gauges(6, 1, "0.5"))
	r.ScrapeLoadOnce(context.Background())
	if ws[0].FleetLoad() != 4 || ws[1].FleetLoad() != 3 || ws[1].ReportedRunning() != 6 {
		t.Fatalf("split: %d %d", ws[0].FleetLoad(), ws[1].FleetLoad())
	}
	ws[0].Release()
	ws[1].Release()
}

// TestRunLoadScrapes: the loop scrapes every interval, so what the worker
// reports (running, waiting, KV cache usage) reaches its load view and
// follows the worker's changes; it stops when its context ends, after the
// scrapes in flight, and scrapes no more; with no interval it returns at
// once.
func TestRunLoadScrapes(t *testing.T) {
	const interval = 10 * time.Millisecond
	// A fake clock: the reports stay fresh however slow the machine.
	r, w, f, _, _ := scrapeFleet(t, Config{LoadScrapeInterval: interval})
	w.Acquire() // one request of ours in flight
	defer w.Release()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := returned(func() { r.RunLoadScrapes(ctx) })
	for _, want := range []LoadReport{
		{Running: 9, Waiting: 2, KVCacheUsage: 0.4, Others: 9 + 2 - 1},
		{Running: 3, Waiting: 0, KVCacheUsage: 0.7, Others: 3 + 0 - 1},
	} {
		f.set(0, gauges(int(want.Running), int(want.Waiting), strconv.FormatFloat(want.KVCacheUsage, 'g', -1, 64)))
		var got LoadReport
		testwait.Until(t, fmt.Sprintf("the scraped report %+v", want), func() bool {
			got, _ = w.LoadReport()
			got.At = time.Time{}
			return got == want
		}, func() string { return fmt.Sprintf("last report %+v", got) })
		if w.ReportedRunning() != want.Running || w.ReportedWaiting() != want.Waiting ||
			w.KVCacheUsage() != want.KVCacheUsage || w.FleetLoad() != 1+want.Others {
			t.Fatalf("load view: running %d waiting %d kv %v fleet load %d; want %+v plus ours",
				w.ReportedRunning(), w.ReportedWaiting(), w.KVCacheUsage(), w.FleetLoad(), want)
		}
	}
	cancel()
	testwait.Until(t, "RunLoadScrapes to return after its context ended", done)
	n := f.scrapes.Load()
	time.Sleep(5 * interval) // a scenario: five ticks of a loop that had not stopped
	if m := f.scrapes.Load(); m != n {
		t.Fatalf("%d scrapes after RunLoadScrapes returned", m-n)
	}

	off := NewRegistry(Config{Logger: quiet()}) // no LoadScrapeInterval
	testwait.Until(t, "RunLoadScrapes without an interval to return", returned(func() { off.RunLoadScrapes(context.Background()) }))
}

// returned runs f in a goroutine and reports whether it has returned.
func returned(f func()) func() bool {
	var done atomic.Bool
	go func() {
		f()
		done.Store(true)
	}()
	return done.Load
}

// Backlog follows the worker's own queue: unknown until the worker shows
// its capacity (it ran N while others waited), then its report moved by
// the requests this replica sent and got answered since.
func TestBacklog(t *testing.T) {
	r, w, f, _, _ := scrapeFleet(t, Config{})
	f.set(0, gauges(3, 0, "0.2"))
	r.ScrapeLoadOnce(context.Background())
	if _, ok := w.Backlog(); ok || w.Full() {
		t.Fatal("a backlog, or full, before the worker showed its capacity")
	}
	for range 6 {
		w.Acquire()
	}
	f.set(0, gauges(4, 2, "0.9")) // 6 of ours: 4 run, 2 wait: it runs 4 at once
	r.ScrapeLoadOnce(context.Background())
	if n, ok := w.Backlog(); !ok || n != 2 {
		t.Fatalf("backlog %d %v, want the 2 reported", n, ok)
	}
	w.Acquire() // one more sent since the scrape: it waits too
	if n, _ := w.Backlog(); n != 3 {
		t.Fatalf("backlog %d after a send, want 3", n)
	}
	for range 5 {
		w.Release() // five answered: the queue drained into free slots
	}
	if n, _ := w.Backlog(); n != -2 || w.Full() {
		t.Fatalf("backlog %d after five answers, want -2 (two free slots), and not full", n)
	}
	w.Release()
	w.Release()
}

// The capacity is a congestion window: a report with requests waiting sets
// it to what ran, a report full at it with none waiting opens it by one.
func TestBacklogCapacityProbes(t *testing.T) {
	r, w, f, _, _ := scrapeFleet(t, Config{})
	f.set(0, gauges(4, 1, "0.5")) // shows a capacity of 4
	r.ScrapeLoadOnce(context.Background())
	f.set(0, gauges(4, 0, "0.5")) // full at 4, nothing waits: maybe 5
	r.ScrapeLoadOnce(context.Background())
	if n, ok := w.Backlog(); !ok || n != 4-5 {
		t.Fatalf("backlog %d %v, want -1 (capacity 5)", n, ok)
	}
	if !w.Full() { // the probe's slot is not one it has shown
		t.Fatal("not full at the 4 it last ran while others waited")
	}
	f.set(0, gauges(5, 0, "0.6")) // ran 5: maybe 6
	r.ScrapeLoadOnce(context.Background())
	if n, _ := w.Backlog(); n != 5-6 {
		t.Fatalf("backlog %d, want -1 (capacity 6)", n)
	}
	f.set(0, gauges(3, 2, "0.99")) // its cache filled: 3 run, 2 wait
	r.ScrapeLoadOnce(context.Background())
	if n, _ := w.Backlog(); n != 3+2-3 {
		t.Fatalf("backlog %d, want 2 (capacity down to 3)", n)
	}
	f.set(0, gauges(2, 0, "0.3")) // below capacity: no change
	r.ScrapeLoadOnce(context.Background())
	if n, _ := w.Backlog(); n != 2-3 || w.Full() {
		t.Fatalf("backlog %d, full %v; want -1, not full", n, w.Full())
	}
	// Full follows what it showed with a queue (3, while its cache was
	// short) only until it runs more with none waiting.
	f.set(0, gauges(6, 0, "0.5"))
	r.ScrapeLoadOnce(context.Background())
	f.set(0, gauges(5, 0, "0.5"))
	r.ScrapeLoadOnce(context.Background())
	if w.Full() {
		t.Fatal("full at 5 running after it ran 6 with none waiting")
	}
}

// The capacity a real (simulated) vLLM worker states reaches the worker
// over loopback: num_gpu_blocks × block_size tokens, in the report and the
// metrics. A worker that states nothing reports 0, and a failed scrape
// keeps the last stated capacity.
func TestLoadScrapeReadsKVCapacity(t *testing.T) {
	r := NewRegistry(Config{LoadScrapeInterval: time.Second, Logger: quiet()})
	sw, url, err := simworker.Start(simworker.Config{Models: []string{"m"}, BlockTokens: 32, CacheBlocks: 1234, TimeScale: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	ws, err := r.Add(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := ws[0]
	if w.KVCapacityTokens() != 0 {
		t.Fatal("capacity before any scrape")
	}
	r.ScrapeLoadOnce(context.Background())
	if got := w.KVCapacityTokens(); got != 32*1234 {
		t.Fatalf("capacity %d, want %d", got, 32*1234)
	}
	if rep, ok := w.LoadReport(); !ok || rep.KVCapacityTokens != 32*1234 {
		t.Fatalf("report %+v %v", rep, ok)
	}
	var buf bytes.Buffer
	r.WriteMetrics(&buf)
	if want := `vllm_router_worker_kv_capacity_tokens{worker="` + url + `"} 39488`; !strings.Contains(buf.String(), want) {
		t.Fatalf("no %s in\n%s", want, buf.String())
	}

	// A fake engine: stated by SGLang's gauge, then nothing, then a failure.
	r2, w2, f, _, _ := scrapeFleet(t, Config{})
	f.set(0, "sglang:max_total_num_tokens{model_name=\"m\"} 161721.0\n")
	r2.ScrapeLoadOnce(context.Background())
	if got := w2.KVCapacityTokens(); got != 161721 {
		t.Fatalf("sglang capacity %d", got)
	}
	f.set(500, "")
	r2.ScrapeLoadOnce(context.Background())
	if got := w2.KVCapacityTokens(); got != 161721 {
		t.Fatalf("capacity %d after a failed scrape", got)
	}
	f.set(0, gauges(1, 0, "0.1"))
	r2.ScrapeLoadOnce(context.Background())
	if got := w2.KVCapacityTokens(); got != 0 {
		t.Fatalf("capacity %d from an exposition that states none", got)
	}
}

// Data-parallel ranks read their own engine's cache_config_info.
func TestLoadScrapeKVCapacityPerEngine(t *testing.T) {
	f := &fakeVLLM{}
	srv := httptest.NewServer(f)
	defer srv.Close()
	r := NewRegistry(Config{LoadScrapeInterval: time.Second, Logger: quiet()})
	ws, err := r.Add(context.Background(), srv.URL+"@0", nil)
	if err != nil {
		t.Fatal(err)
	}
	ws1, err := r.Add(context.Background(), srv.URL+"@1", nil)
	if err != nil {
		t.Fatal(err)
	}
	f.set(0, gauges(0, 0, "0")+
		`vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1`+"\n"+
		`vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="300"} 1`+"\n")
	r.ScrapeLoadOnce(context.Background())
	if a, b := ws[0].KVCapacityTokens(), ws1[0].KVCapacityTokens(); a != 1600 || b != 4800 {
		t.Fatalf("ranks' capacities %d, %d", a, b)
	}
}
