package saar

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/VictoriaMetrics/metrics"
)

// gateWriter blocks every Write until open is closed; entered receives one
// value per Write call that has started.
type gateWriter struct {
	entered chan struct{}
	open    chan struct{}
	mu      sync.Mutex
	buf     bytes.Buffer
}

func (w *gateWriter) Write(p []byte) (int, error) {
	w.entered <- struct{}{}
	<-w.open
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

// within fails the test if f does not return in time (a deadlock guard, not
// a synchronization).
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s blocked", what)
	}
}

func metricValue(t *testing.T, r *Router, series string) string {
	t.Helper()
	var b bytes.Buffer
	r.WriteMetrics(&b)
	for _, line := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	t.Fatalf("series %s not written:\n%s", series, b.String())
	return ""
}

func TestReplayLogDoesNotBlockRequests(t *testing.T) {
	w := &gateWriter{entered: make(chan struct{}, 100), open: make(chan struct{})}
	r, _ := newRouter(t, demoConfig(t), Options{Replay: w, ReplayQueue: 8})

	r.Select(turn("s0", "hello").T(), allUp)
	<-w.entered // the writer holds record 1 and is stuck in Write; the queue is empty

	const queued, extra = 8, 5
	within(t, "Select with a stuck replay writer", func() {
		for i := 0; i < queued+extra; i++ {
			r.Select(turn(fmt.Sprintf("s%d", i%3), "prove the theorem").T(), allUp)
		}
	})
	if st := r.Stats(); st.ReplayDropped != extra || st.Selections != 1+queued+extra {
		t.Fatalf("stats %+v, want %d dropped", st, extra)
	}
	if v := metricValue(t, r, "vllm_router_saar_replay_dropped_total"); v != fmt.Sprint(extra) {
		t.Fatalf("dropped metric %s", v)
	}

	close(w.open)
	within(t, "Close", r.Close)
	r.Close() // idempotent
	recs, err := ReadRecords(bytes.NewReader(w.buf.Bytes()))
	if err != nil || len(recs) != 1+queued {
		t.Fatalf("written %d records, %v", len(recs), err)
	}
	for i, rec := range recs {
		if rec.Seq != uint64(i+1) || rec.ID != fmt.Sprintf("saar-%d", i+1) {
			t.Fatalf("record %d: seq %d id %s (out of order)", i, rec.Seq, rec.ID)
		}
	}
	if d := Replay(r.Config(), recs); len(d) != 0 {
		t.Fatalf("replay diffs %v", d)
	}

	// After Close a record is dropped and counted, and Select still works.
	if s := r.Select(turn("s0", "hello").T(), allUp); s.Model == "" {
		t.Fatal("Select after Close")
	}
	if st := r.Stats(); st.ReplayDropped != extra+1 {
		t.Fatalf("dropped after Close %d", st.ReplayDropped)
	}
}

func TestReplayLogConcurrentOrderAndClose(t *testing.T) {
	var mu sync.Mutex
	var buf bytes.Buffer
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
	r, _ := newRouter(t, demoConfig(t), Options{Replay: w, ReplayQueue: 1 << 14})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				r.Select(turn(fmt.Sprintf("g%d", g), []string{"hello", "prove it", "fix my func"}[i%3]).T(), allUp)
			}
		}(g)
	}
	wg.Wait()
	r.Close()
	recs, err := ReadRecords(bytes.NewReader(buf.Bytes()))
	if err != nil || len(recs) != 1600 || r.Stats().ReplayDropped != 0 {
		t.Fatalf("written %d, %v, %+v", len(recs), err, r.Stats())
	}
	// A session's records are written in turn order.
	last := map[string]uint64{}
	for _, rec := range recs {
		if rec.Seq <= last[rec.Session] {
			t.Fatalf("session %s: seq %d after %d", rec.Session, rec.Seq, last[rec.Session])
		}
		last[rec.Session] = rec.Seq
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestReplayLogWriteErrors(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{Replay: writerFunc(func([]byte) (int, error) { return 0, errors.New("disk full") })})
	for i := 0; i < 10; i++ {
		r.Select(turn("s", "hello").T(), allUp)
	}
	r.Close()
	if st := r.Stats(); st.ReplayWriteErrors != 10 {
		t.Fatalf("write errors %d", st.ReplayWriteErrors)
	}
	if v := metricValue(t, r, "vllm_router_saar_replay_write_errors_total"); v != "10" {
		t.Fatalf("write errors metric %s", v)
	}
	// Close without a Replay writer is a no-op.
	r2, _ := newRouter(t, demoConfig(t), Options{})
	r2.Close()
	r2.Close()
}

func TestRingBoundedAgainstHugeClientText(t *testing.T) {
	const ringBytes = 64 << 10
	big := strings.Repeat("prove ", 1<<20/6) // about 1 MB of user text
	bigSession := strings.Repeat("S", 1<<20)
	bigHeader := []byte(strings.Repeat("9", 1<<20))
	// MaxTextBytes above the message: the inputs hold all of it (worst case).
	r, clk := newRouter(t, demoConfig(t), Options{RingSize: 4096, RingBytes: ringBytes, MaxTextBytes: 2 << 20})
	const n = 100
	for i := 0; i < n; i++ {
		tr := turn(bigSession[:len(bigSession)-i%2], big).T()
		tr.Header = func(string) []byte { return bigHeader }
		tr.PreviousResponseID = bigHeader
		r.Select(tr, allUp)
		clk.Add(time.Second)
		n, b := r.ring.usage()
		if b > ringBytes {
			t.Fatalf("after %d selects the ring holds %d bytes (%d records) > %d", i+1, b, n, ringBytes)
		}
	}
	recs := r.Records("", 0)
	kept, used := r.ring.usage()
	t.Logf("ring: %d records, %d bytes (bound %d)", kept, used, ringBytes)
	if len(recs) == 0 || len(recs) >= n {
		t.Fatalf("ring kept %d records", len(recs))
	}
	for _, rec := range recs {
		if !rec.Clipped || len(rec.Inputs.Text) > DefaultRingTextBytes || len(rec.Session) > RingFieldBytes ||
			len(rec.Inputs.Headers) != 1 || len(rec.Inputs.Headers[0].Value) > RingFieldBytes ||
			len(rec.Inputs.PreviousResponseID) > RingFieldBytes {
			t.Fatalf("ring record not cut: text %d session %d clipped %v", len(rec.Inputs.Text), len(rec.Session), rec.Clipped)
		}
		if rec.Outcome.Decision != "reasoning" {
			t.Fatalf("decision %q", rec.Outcome.Decision)
		}
	}
	if got := r.Records(bigSession, 3); len(got) != 3 || got[2].Seq != recs[len(recs)-1].Seq {
		t.Fatalf("Records(long session) %d", len(got))
	}
	// The ring copy does not keep the request-sized string alive.
	rec := &Record{Seq: 1, Inputs: Inputs{Text: big}}
	c, size := r.ring.forRing(rec)
	if unsafe.StringData(c.Inputs.Text) == unsafe.StringData(big) || size > 4096 || len(rec.Inputs.Text) != len(big) {
		t.Fatalf("ring copy aliases the text (size %d)", size)
	}
	// The Replay log keeps what Decide saw (up to MaxTextBytes).
	var jsonl bytes.Buffer
	rl, _ := newRouter(t, demoConfig(t), Options{MaxTextBytes: 2 << 20, Replay: &jsonl})
	rl.Select(turn("s", big).T(), allUp)
	rl.Close()
	fromLog, err := ReadRecords(&jsonl)
	if err != nil || len(fromLog) != 1 || len(fromLog[0].Inputs.Text) != len(big) || fromLog[0].Clipped {
		t.Fatalf("log: %d records, %v", len(fromLog), err)
	}
	if got := rl.Records("", 0); len(got) != 1 || len(got[0].Inputs.Text) != DefaultRingTextBytes {
		t.Fatal("ring record of the logging router not cut")
	}
	// Unclipped records are shared, not copied.
	r2, _ := newRouter(t, demoConfig(t), Options{})
	small := &Record{Session: "s", Inputs: Inputs{Text: "hello"}}
	if c, _ := r2.ring.forRing(small); c != small || c.Clipped {
		t.Fatal("small record copied or marked clipped")
	}
}

func TestRingShardedKeepsLastRecordsInOrder(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{RingSize: 256})
	if len(r.ring.shards) != 16 {
		t.Fatalf("shards %d", len(r.ring.shards))
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 125; i++ {
				r.Select(turn(fmt.Sprintf("g%d", g), "hello").T(), allUp)
				if i%25 == 0 {
					r.Records("", 10)
				}
			}
		}(g)
	}
	wg.Wait()
	recs := r.Records("", 0)
	if len(recs) != 256 || recs[0].Seq != 1000-255 || recs[255].Seq != 1000 {
		t.Fatalf("kept %d, seq %d..%d", len(recs), recs[0].Seq, recs[len(recs)-1].Seq)
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Seq != recs[i-1].Seq+1 {
			t.Fatalf("gap at %d", i)
		}
	}
	if _, ok := r.Record("saar-1000"); !ok {
		t.Fatal("newest record not found")
	}
	if _, ok := r.Record("saar-1"); ok {
		t.Fatal("evicted record found")
	}
	if _, ok := r.Record("other-1000"); ok {
		t.Fatal("foreign prefix found")
	}
	if got := r.Records("g3", 5); len(got) > 5 || (len(got) > 0 && got[len(got)-1].Session != "g3") {
		t.Fatalf("Records(g3) %d", len(got))
	}
	// Odd sizes use one shard and keep exactly RingSize records.
	r3, _ := newRouter(t, demoConfig(t), Options{RingSize: 3})
	for i := 0; i < 10; i++ {
		r3.Select(turn("x", "hello").T(), allUp)
	}
	if got := r3.Records("", 0); len(r3.ring.shards) != 1 || len(got) != 3 || got[0].Seq != 8 {
		t.Fatalf("RingSize 3: %d records", len(got))
	}
}

func TestMetricsPerRouter(t *testing.T) {
	cfg := demoConfig(t)
	r1, _ := newRouter(t, cfg, Options{})
	r2, _ := newRouter(t, cfg, Options{})
	for i := 0; i < 3; i++ {
		r1.Select(turn("", "hello").T(), allUp)
	}
	if v := metricValue(t, r1, `vllm_router_saar_selections_total{model="sim-small",action="first"}`); v != "3" {
		t.Fatalf("r1 %s", v)
	}
	if v := metricValue(t, r2, `vllm_router_saar_selections_total{model="sim-small",action="first"}`); v != "0" {
		t.Fatalf("r2 shares r1's counters: %s", v)
	}
	var global bytes.Buffer
	metrics.WritePrometheus(&global, false)
	if strings.Contains(global.String(), "vllm_router_saar_") {
		t.Fatal("router counters registered in the default set")
	}
	// A caller-supplied set is used.
	set := metrics.NewSet()
	r3, _ := newRouter(t, cfg, Options{Metrics: set})
	r3.Select(turn("", "hello").T(), allUp)
	if r3.Metrics() != set {
		t.Fatal("Options.Metrics not used")
	}
}

var labelRE = regexp.MustCompile(`(\w+)="((?:[^"\\]|\\.)*)"`)

func TestMetricsLabelsOnlyFromConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
models:
  - name: 'we"ird\model'
    quality_score: 0.5
    pricing: {prompt_per_1m: 1, completion_per_1m: 2}
  - name: plain
    quality_score: 0.9
    pricing: {prompt_per_1m: 5, completion_per_1m: 10}
logical_models:
  - name: auto
    decisions:
      - name: code
        signals: {keywords: [code]}
        candidates: [plain]
      - name: default
        candidates: ['we"ird\model']
`))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := newRouter(t, cfg, Options{})
	evil := "evil\"} injected_total 1\n{x=\"\\"
	// A client's model name reaches the indexes (NoteToolCalls, Observe),
	// then a tool result and a previous_response_id that point at it; the
	// logical model name itself is client-chosen too.
	r.NoteToolCalls(evil, "w", bs("call_evil"))
	r.Observe([]byte("s"), evil, "w", Observed{ResponseID: []byte("resp_evil"), ToolCallIDs: bs("call_evil2")})
	r.Select(turn("s", "hello").T(), allUp)
	r.Select(turn("s", "code").results("call_evil").T(), allUp)
	r.Select(turn("s", "code").prev("resp_evil").T(), allUp)
	r.Select(turn("s", "code").results("call_evil2").T(), allUp)
	r.Select(&Turn{Logical: []byte(evil), Session: []byte("s")}, allUp)
	r.Select(turn("s", "code").T(), allUp)
	r.Select(turn("t", "code").T(), allUp)
	r.Observe([]byte("t"), evil, "w", Observed{Lock: "plain"})
	r.Select(turn("t", "hello").T(), allUp)

	var b bytes.Buffer
	r.WriteMetrics(&b)
	out := b.String()
	if strings.Contains(out, "evil") || strings.Contains(out, "injected") {
		t.Fatalf("client name in metrics:\n%s", out)
	}
	if !strings.Contains(out, `model="we\"ird\\model"`) {
		t.Fatalf("config name not escaped:\n%s", out)
	}
	allowed := map[string]bool{"plain": true, `we\"ird\\model`: true, LockToolLoop: true, LockProviderState: true, "tool_call": true, "response": true, "reasoning": true}
	for _, a := range actions {
		allowed[a] = true
	}
	for reason := range reasons {
		allowed[reason] = true
	}
	for _, m := range labelRE.FindAllStringSubmatch(out, -1) {
		if !allowed[m[2]] {
			t.Fatalf("label %s=%q not from the config:\n%s", m[1], m[2], out)
		}
	}
	if !strings.Contains(out, "vllm_router_saar_switches_total{") {
		t.Fatalf("no switch counted:\n%s", out)
	}
	// switched itself refuses names outside the config.
	r.met.switched(evil, "plain", ReasonEconomics)
	r.met.switched("plain", evil, ReasonEconomics)
	r.met.switched("plain", `we"ird\model`, evil)
	b.Reset()
	r.WriteMetrics(&b)
	if strings.Contains(b.String(), "evil") || b.String() != out {
		t.Fatalf("switched created a series:\n%s", b.String())
	}
}
