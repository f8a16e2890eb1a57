package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/bench"
	"github.com/warmroute/warmroute/simworker"
)

// TestQuick is make bench-overload QUICK=1 as a test: the real router
// binary ($WARMROUTE_BIN, else built from ./cmd/warmroute) in front of
// simulated workers at a light load and an overload, for every
// configuration the binary supports. It asserts structure, not speed:
// every request has exactly one outcome, checked from both ends; the
// configurations the binary lacks are skipped and said so; the report
// renders (markdown rows, a CSV line per run, well-formed SVG). Skipped
// under -short.
func TestQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the router binary")
	}
	o := defaultOptions()
	o.quick, o.bin, o.out = true, os.Getenv("WARMROUTE_BIN"), t.TempDir()
	o.traceDir = filepath.Join("..", "..", "..", "shared", "traces")
	o.applyQuick(map[string]bool{})
	rep, err := run(&o, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	queue := rep.bin.flags["queue-size"] && rep.bin.flags["queue-order"]
	checkConfigs(t, rep, queue)
	if len(rep.runs) != len(o.loads)*len(rep.configs) {
		t.Fatalf("%d runs, want %d loads × %d configurations", len(rep.runs), len(o.loads), len(rep.configs))
	}
	for _, r := range rep.runs {
		name := r.spec.config.name + " " + loadText(r.spec.load)
		if r.violations != 0 {
			t.Errorf("%s: %d requests broke the one-outcome rule: %v", name, r.violations, r.examples)
		}
		if len(r.records) == 0 {
			t.Errorf("%s: no requests", name)
		}
		for i := range r.records {
			if rec := &r.records[i]; rec.out == outServed && rec.engine == nil {
				t.Errorf("%s: served request %d/%d has no engine report", name, rec.session, rec.turn)
				break
			}
		}
		st := r.stats(&o, nil)
		sum := 0
		for _, n := range st.outcomes {
			sum += n
		}
		if sum != len(r.records) {
			t.Errorf("%s: outcomes sum to %d of %d requests", name, sum, len(r.records))
		}
		if r.spec.load == o.loads[0] && st.outcomes[outServed] == 0 {
			t.Errorf("%s: nothing served at the light load (%s)", name, r.outcomeLine())
		}
		queued := st.waited + st.outcomes[outFull] + st.outcomes[outTimeout]
		if r.spec.config.name != cfgPass && r.spec.load == o.loads[len(o.loads)-1] && queued == 0 {
			t.Errorf("%s: no request waited in the router's queue or was turned away by it: the overload does not reach the queue (%s)", name, r.outcomeLine())
		}
	}
	if err := rep.write(o.out); err != nil {
		t.Fatal(err)
	}
	checkFiles(t, o.out, rep)
}

// checkConfigs: pass-through always runs; fifo and new run exactly when the
// binary has the queue flags, and are reported as skipped otherwise.
func checkConfigs(t *testing.T, rep *report, queue bool) {
	t.Helper()
	var ran []string
	for _, c := range rep.configs {
		ran = append(ran, c.name)
	}
	want := []string{cfgPass}
	if queue {
		want = allConfigs
	}
	if !slices.Equal(ran, want) {
		t.Errorf("configurations %v, want %v (queue flags: %v)", ran, want, queue)
	}
	if !queue && len(rep.skipped) != 2 {
		t.Errorf("skipped %v, want fifo and new named", rep.skipped)
	}
	t.Logf("configurations %v; skipped %v", ran, rep.skipped)
}

// checkFiles reads the written report back.
func checkFiles(t *testing.T, dir string, rep *report) {
	t.Helper()
	md, err := os.ReadFile(filepath.Join(dir, "overload-quick.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.runs {
		row := "| " + r.spec.config.name + " | " + loadText(r.spec.load) + " |"
		want := 2 // the results and the outcomes tables, and the slowest requests' per class served
		for _, cs := range r.stats(rep.o, nil).class {
			if cs.served > 0 {
				want++
			}
		}
		if n := strings.Count(string(md), row); n != want {
			t.Errorf("markdown has %d rows %q, want %d", n, row, want)
		}
	}
	if strings.Contains(string(md), rep.tmp) {
		t.Error("markdown names the run's temporary directory")
	}
	f, err := os.Open(filepath.Join(dir, "overload-quick.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines, err := csv.NewReader(f).ReadAll() // also fails on a ragged line
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 1+len(rep.search)+len(rep.runs) {
		t.Errorf("csv has %d lines, want a header and %d runs", len(lines), len(rep.search)+len(rep.runs))
	}
	svg, err := os.ReadFile(filepath.Join(dir, "overload-quick.svg"))
	if err != nil {
		t.Fatal(err)
	}
	if err := wellFormed(svg); err != nil {
		t.Errorf("svg: %v", err)
	}
	if n := strings.Count(string(svg), "<polyline"); n != 2*len(rep.configs) {
		t.Errorf("svg has %d lines, want one per configuration in each of 2 panels (%d)", n, 2*len(rep.configs))
	}
}

func wellFormed(b []byte) error {
	d := xml.NewDecoder(bytes.NewReader(b))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestFairShares(t *testing.T) {
	for _, c := range []struct {
		demand []float64
		cap    float64
		want   []float64
	}{
		{[]float64{1.6, 0.4}, 1, []float64{0.6, 0.4}},     // 2×: the light tenant's whole demand, the rest to the heavy
		{[]float64{0.56, 0.14}, 1, []float64{0.56, 0.14}}, // below capacity: every demand
		{[]float64{3, 2}, 1, []float64{0.5, 0.5}},         // both above an even split
		{[]float64{0, 2}, 1, []float64{0, 1}},
	} {
		got := fairShares(c.demand, c.cap)
		for i := range got {
			if math.Abs(got[i]-c.want[i]) > 1e-12 {
				t.Errorf("fairShares(%v, %v) = %v, want %v", c.demand, c.cap, got, c.want)
				break
			}
		}
	}
}

func TestFairnessRatio(t *testing.T) {
	m := demandModel{perLoad: [2]float64{8, 2}}                                       // capacity 10 requests/s
	f := m.at(&runResult{spec: runSpec{load: 2}}, runStats{tenant: [2]float64{6, 3}}) // no arrivals: demand by load
	if f.demand != [2]float64{16, 4} || f.fair != [2]float64{6, 4} {
		t.Fatalf("demand %v fair %v, want [16 4] and [6 4]", f.demand, f.fair)
	}
	if r := f.ratio(0); r != 1 {
		t.Errorf("heavy: served 6 of fair 6: ratio %v", r)
	}
	if r := f.ratio(1); r != 0.75 {
		t.Errorf("light: served 3 of min(4, 4): ratio %v", r)
	}
}

// TestDemandFollowsTheArrivals: a tenant's demand in a run scales with the
// turns its sessions that arrived there ask for, not with the load: the
// tenant draws of the arrivals a heavier load adds differ by chance.
func TestDemandFollowsTheArrivals(t *testing.T) {
	sessions := func(tenant int, turns ...int) []arrival {
		var out []arrival
		for _, n := range turns {
			out = append(out, arrival{tenant: tenant, src: &bench.Session{Turns: make([]bench.Turn, n)}})
		}
		return out
	}
	yard := &runResult{spec: runSpec{load: 0.7}, arrivals: append(sessions(0, 40, 60), sessions(1, 50)...)}
	m := newDemandModel(yard, runStats{tenant: [2]float64{10, 5}}) // 0.1 req/s per turn asked, each
	// At 2×: the heavy tenant's sessions ask for 300 turns (3× the
	// yardstick's), the light one's for 60 (1.2×), where the load alone
	// would say 2.86× each.
	heavy := &runResult{spec: runSpec{load: 2}, arrivals: append(sessions(0, 100, 100, 100), sessions(1, 60)...)}
	f := m.at(heavy, runStats{tenant: [2]float64{12, 6}})
	if math.Abs(f.demand[0]-30) > 1e-9 || math.Abs(f.demand[1]-6) > 1e-9 {
		t.Fatalf("demand %v, want [30 6]", f.demand)
	}
	if r := f.ratio(1); math.Abs(r-1) > 1e-9 {
		t.Errorf("light served 6 of its demand 6: ratio %v", r)
	}
}

// TestLedgerCheck: a clean ledger passes; each way a request can break the
// one-outcome rule is caught.
func TestLedgerCheck(t *testing.T) {
	clean := func() *ledger {
		l := newLedger()
		l.send("a")
		l.dispatched("a", false)
		l.record("a", record{out: outServed, echoedID: "a"})
		l.send("b")
		l.record("b", record{out: outFull, retryAfter: true})
		l.send("c")
		l.dispatched("c", false)
		l.record("c", record{out: outGone})
		l.send("d")
		l.record("d", record{out: outCut})
		l.send("p") // served after a preemption: its answer continued once
		l.dispatched("p", false)
		l.dispatched("p", true)
		l.record("p", record{out: outServed, echoedID: "p"})
		return l
	}
	if n, list := clean().check(4); n != 0 {
		t.Fatalf("clean ledger: %d violations %v", n, list)
	}
	for _, c := range []struct {
		name    string
		break_  func(l *ledger)
		workers uint64
		want    string
	}{
		{"lost", func(l *ledger) { l.send("e") }, 4, "no outcome"},
		{"answered twice", func(l *ledger) { l.record("a", record{out: outServed, echoedID: "a"}) }, 4, "2 outcomes"},
		{"two workers", func(l *ledger) { l.dispatched("a", false) }, 5, "reached a worker 2 times"},
		{"rejected yet upstream", func(l *ledger) { l.dispatched("b", false) }, 5, "yet a worker received it"},
		{"served from nowhere", func(l *ledger) {
			l.send("e")
			l.record("e", record{out: outServed, echoedID: "e"})
		}, 4, "no worker received it"},
		{"another's answer", func(l *ledger) {
			l.send("e")
			l.dispatched("e", false)
			l.record("e", record{out: outServed, echoedID: "a"})
		}, 5, "answered with x-request-id a"},
		{"no Retry-After", func(l *ledger) {
			l.send("e")
			l.record("e", record{out: outTimeout})
		}, 4, "without Retry-After"},
		{"stray", func(l *ledger) { l.dispatched("zzz", false) }, 5, "unsent"},
		{"worker count", func(*ledger) {}, 7, "the workers counted 7"},
		{"continued, never sent", func(l *ledger) { l.dispatched("b", true) }, 5, "1 continuations after 0 receipts"},
	} {
		l := clean()
		c.break_(l)
		n, list := l.check(c.workers)
		if n == 0 || !strings.Contains(strings.Join(list, "\n"), c.want) {
			t.Errorf("%s: %d violations %v, want one saying %q", c.name, n, list, c.want)
		}
	}
}

func TestClassifyStatus(t *testing.T) {
	body := func(code string) []byte {
		return []byte(`{"error":{"message":"m","type":"t","param":null,"code":"` + code + `"}}`)
	}
	for _, c := range []struct {
		status int
		body   []byte
		want   outcome
	}{
		{429, body("router_busy"), outBusy},
		{429, body("queue_full"), outFull},
		{429, []byte("not json"), outFull},
		{503, body("queue_timeout"), outTimeout},
		{503, body("shutting_down"), outOther},
		{500, body("x"), outOther},
	} {
		if got, _ := classifyStatus(c.status, c.body); got != c.want {
			t.Errorf("%d %s: %s, want %s", c.status, c.body, got, c.want)
		}
	}
}

// TestArrivalsNested: every load replays the same sessions, closer
// together; the tenants' and classes' shares are about as stated.
func TestArrivalsNested(t *testing.T) {
	pools := []*pool{
		{name: "a", sessions: make([]bench.Session, 7)},
		{name: "b", sessions: make([]bench.Session, 5)},
	}
	slow := arrivals(3, 1, 4000, pools)
	fast := arrivals(3, 2, 2000, pools)
	if len(slow) < 3000 || len(slow) != len(fast) {
		t.Fatalf("%d and %d arrivals, want the same ~4000", len(slow), len(fast))
	}
	var tenants, classes [2]int
	for i := range slow {
		s, f := slow[i], fast[i]
		if s.tenant != f.tenant || s.class != f.class || s.src != f.src || math.Abs(s.at-2*f.at) > 1e-9 {
			t.Fatalf("arrival %d differs between loads: %+v vs %+v", i, s, f)
		}
		if s.pool != i%2 {
			t.Fatalf("arrival %d from pool %d: the pools alternate", i, s.pool)
		}
		tenants[s.tenant]++
		classes[s.class]++
	}
	share := func(n [2]int) float64 { return float64(n[0]) / float64(n[0]+n[1]) }
	if s := share(tenants); math.Abs(s-0.8) > 0.03 {
		t.Errorf("heavy tenant: %.3f of arrivals, want 0.8", s)
	}
	if s := share(classes); math.Abs(s-0.2) > 0.03 {
		t.Errorf("interactive: %.3f of arrivals, want 0.2", s)
	}
}

func TestPersonalize(t *testing.T) {
	sys := json.RawMessage(`{"role":"system","content":"policy"}`)
	src := bench.Session{ID: "x", Turns: []bench.Turn{
		{Messages: []json.RawMessage{sys, json.RawMessage(`{"role":"user","content":"hi"}`)}, Answer: 3},
		{Messages: []json.RawMessage{sys, json.RawMessage(`{"role":"user","content":"hi"}`), json.RawMessage(`{"role":"assistant","content":"yo"}`)}, Answer: 4},
	}}
	a, err := personalize(&src, "c1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := personalize(&src, "c2")
	if a.ID != "c1" || len(a.Turns) != 2 || a.Turns[1].Answer != 4 || len(a.Turns[1].Messages) != 3 {
		t.Fatalf("personalized session %+v", a)
	}
	var m struct{ Role, Content string }
	if err := json.Unmarshal(a.Turns[1].Messages[0], &m); err != nil || m.Role != "system" || m.Content != "policy [conversation c1]" {
		t.Errorf("first message %s (%v)", a.Turns[1].Messages[0], err)
	}
	if bytes.Equal(a.Turns[0].Messages[0], b.Turns[0].Messages[0]) {
		t.Error("two conversations share their first message")
	}
	if string(src.Turns[0].Messages[0]) != string(sys) {
		t.Error("the pool's session was modified")
	}
	if _, err := personalize(&bench.Session{Turns: []bench.Turn{{Messages: []json.RawMessage{json.RawMessage(`{"role":"user","content":[{"type":"text"}]}`)}}}}, "c"); err == nil {
		t.Error("non-string content accepted")
	}
}

func TestParseCPULine(t *testing.T) {
	c, ok := parseCPULine("cpu  100 5 50 800 40 3 2 0 7 0")
	if !ok || c.idle != 840 || c.total != 1000 {
		t.Errorf("parsed %+v %v, want idle 840 of 1000 (guest not counted twice)", c, ok)
	}
	if _, ok := parseCPULine("cpu0 1 2 3 4"); ok {
		t.Error("a per-CPU line accepted")
	}
	if v := idleShare(cpuTimes{100, 1000}, cpuTimes{400, 1500}); v != 0.6 {
		t.Errorf("idle share %v, want 0.6", v)
	}
}

func TestInterpolate(t *testing.T) {
	if v := interpolate(2, 0.02, 4, 0.1, 0.04); math.Abs(v-2.5) > 1e-12 {
		t.Errorf("interpolate = %v, want 2.5", v)
	}
	if v := interpolate(2, 0.02, 4, 0.01, 0.04); v != 2 {
		t.Errorf("a falling line: %v, want the lower rate", v)
	}
}

func TestConfigurations(t *testing.T) {
	o := defaultOptions()
	today := &binary{flags: map[string]bool{"port": true}}
	run, skipped := configurations(today, allConfigs, &o, []string{"--common"})
	if len(run) != 1 || run[0].name != cfgPass || !slices.Equal(run[0].args, []string{"--common"}) || len(skipped) != 2 {
		t.Errorf("without queue flags: %+v, skipped %v", run, skipped)
	}
	queued := &binary{flags: map[string]bool{"port": true, "queue-size": true, "queue-order": true, "queue-timeout-secs": true}}
	o.routerArgs, o.newArgs = []string{"--all"}, []string{"--new"}
	run, skipped = configurations(queued, allConfigs, &o, []string{"--common"})
	want := map[string]string{
		cfgPass: "--common --queue-size 0 --all",
		cfgFIFO: "--common --queue-order fifo --queue-timeout-secs 10 --all",
		cfgNew:  "--common --queue-order priority --queue-timeout-secs 10 --all --new",
	}
	if len(run) != 3 || len(skipped) != 0 {
		t.Fatalf("with queue flags: %+v, skipped %v", run, skipped)
	}
	for _, c := range run {
		if got := strings.Join(c.args, " "); got != want[c.name] {
			t.Errorf("%s: %q, want %q", c.name, got, want[c.name])
		}
	}
}

// fakeRun is a run of config at load whose window holds n served requests
// per (tenant, class), each with the given TTFT and hit rate.
func fakeRun(config string, load float64, ttft [2]float64, hit float64, served [2]int) *runResult {
	r := &runResult{spec: runSpec{config: routerConfig{name: config}, load: load, span: 100}}
	for t := range served {
		for i := range served[t] {
			class := i % 5 / 4 // one in five interactive
			r.records = append(r.records, record{tenant: t, class: class, sent: 50, out: outServed,
				ttft: ttft[class], prompt: 100, cached: int(100 * hit), queueMS: -1})
		}
	}
	return r
}

// TestCriteria: the bounds table reads the runs as issue 29 states them.
func TestCriteria(t *testing.T) {
	o := defaultOptions()
	o.warm = 0.25 // the window is the last 75 of 100 s
	rep := &report{o: &o, runs: []*runResult{
		fakeRun(cfgPass, 0.7, [2]float64{0.02, 0.02}, 0.9, [2]int{800, 200}),
		fakeRun(cfgNew, 0.7, [2]float64{0.02, 0.02}, 0.9, [2]int{800, 150}), // not the demand's measure: pass-through's is
		fakeRun(cfgPass, 2, [2]float64{1, 1}, 0.6, [2]int{1200, 300}),
		// interactive within 2× (0.039 ≤ 0.04), all good; the light tenant served
		// 500/75 of its min(demand, share) 2.67×2/0.7 = 7.62: 87 %; hit 88.5 % (1.5 points down)
		fakeRun(cfgNew, 2, [2]float64{0.039, 0.05}, 0.885, [2]int{1200, 500}),
	}}
	a := rep.analyze()
	got := map[string]string{}
	for _, c := range a.criteria() {
		got[strings.Fields(c.what)[0]+" "+strings.Fields(c.what)[1]] = verdictText(c)
	}
	want := map[string]string{
		"interactive TTFT": "pass",
		"goodput at":       "pass",
		"tenant heavy":     "pass",
		"tenant light":     "**fail**",
		"hit rate":         "pass",
	}
	if len(got) != len(want) {
		t.Fatalf("criteria %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s, want %s (all: %v)", k, got[k], v, got)
		}
	}
	if r, _ := a.find(cfgNew, 2); !math.IsInf(r.goodRel, 1) {
		t.Errorf("goodput over a pass-through without good requests: %v× (want +Inf)", r.goodRel)
	}
}

func TestEngineStats(t *testing.T) {
	o := defaultOptions()
	o.timeScale = 2
	full := &simworker.FirstToken{Queued: 300 * time.Millisecond, Running: 8, Slots: 8}
	free := &simworker.FirstToken{Queued: 0, Running: 3, Slots: 8}
	recs := []*record{
		{ttft: 0.02, queueMS: -1, engine: free},
		{ttft: 0.03, queueMS: -1, engine: full},
		{ttft: 0.40, queueMS: 200, engine: full}, // 0.1 s simulated in the router's queue
		{ttft: 0.35, queueMS: 600, engine: free}, // 0.3 s
		{ttft: 0.50, queueMS: -1},                // no engine report
	}
	atFull, tail := engineStats(recs, 0.35, &o)
	if atFull != 2 || tail.n != 3 || tail.atFull != 1 {
		t.Fatalf("at full %d, tail %+v: want 2 at a full engine; 3 slowest, 1 of them at a full engine", atFull, tail)
	}
	if tail.routerQueue != 0.1 || tail.engineQueue != 0.15 {
		t.Fatalf("tail waits: router %v, engine %v; want the p50s 0.1 s and 0.15 s", tail.routerQueue, tail.engineQueue)
	}
}
