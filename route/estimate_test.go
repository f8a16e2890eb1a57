package route

import (
	"math"
	"strings"
	"testing"
	"time"
)

// sample is one synthetic response: load ahead, uncached tokens, decoded
// tokens (non-streamed answers) and the worker's true rates.
type truth struct {
	queue, prefill, decode float64 // seconds per request, per token, per token
}

func (tr truth) ttfb(load int64, uncached, decoded int) time.Duration {
	s := tr.queue*float64(load) + tr.prefill*float64(uncached) + tr.decode*float64(decoded)
	return time.Duration(s * float64(time.Second))
}

// lcg is a tiny deterministic generator for sample shapes.
type lcg uint64

func (l *lcg) next(n int) int {
	*l = *l*6364136223846793005 + 1442695040888963407
	return int(uint64(*l)>>33) % n
}

// train feeds worker i n samples drawn from tr: nothing cached, loads 0–7,
// 500–4500 uncached tokens, streamed unless decoded > 0.
func (f *fixture) train(i, n int, tr truth, g *lcg, nonStream bool) {
	st, _ := f.ca.state("m")
	for k := 0; k < n; k++ {
		load, u := int64(g.next(8)), 500+g.next(4000)
		dec := 0
		if nonStream {
			dec = 50 + g.next(450)
		}
		d := tr.ttfb(load, u, dec)
		f.ca.Observe(Choice{Worker: f.ws[i], st: st, keyLen: 4 * u},
			&Served{TTFB: d, Elapsed: d, Stream: !nonStream, Load: load, PromptTokens: u, CachedTokens: 0, CompletionTokens: dec})
	}
}

func (f *fixture) rates(i int) Rates {
	st, _ := f.ca.state("m")
	r, _ := st.rates.Load(f.ws[i].ID())
	return r.get()
}

func within(got, want, frac float64) bool { return math.Abs(got-want) <= frac*want }

// TestPriorsAreFloors: a fleet whose latency shows neither prefill nor
// queueing (zero-latency workers) leaves the rates at their priors, so the
// worker that holds the history still wins at equal load and with one
// request more in flight.
func TestPriorsAreFloors(t *testing.T) {
	f := newFixture(t, 3, nil)
	g := lcg(1)
	for i := range f.ws {
		f.train(i, 50, truth{}, &g, false)
		if r := f.rates(i); r.QueueSeconds != PriorQueueSeconds || r.PrefillSeconds != PriorPrefillSeconds || r.Samples != 50 {
			t.Fatalf("zero-latency worker %d learned %+v, want the priors", i, r)
		}
	}
	hist := strings.Repeat("turn of a conversation. ", 128) // 3 KB
	f.hold(1, hist)
	f.expect("", hist+"next question", 1, CacheAffinity)
	f.expect("new-session", hist+"next question", 1, FullHistoryMatch)
	f.load(1, 1)
	f.expect("", hist+"another question", 1, CacheAffinity)
	// A hold of one KV block stays; one shorter than a block saves nothing
	// and wins no tie (every key starts with the same few bytes: the
	// workers that served first would take every new conversation).
	f = newFixture(t, 2, nil)
	block := strings.Repeat("b", kvBlockTokens*PriorCharsPerToken)
	f.hold(0, block)
	for range 8 {
		f.expect("", block+"c", 0, CacheAffinity)
	}
	f.hold(0, "ab")
	seen := map[int]bool{}
	for range 16 {
		seen[f.idx(f.sel("", "abc").Worker)] = true
	}
	if !seen[0] || !seen[1] {
		t.Fatalf("a 2-character hold decided every tie: %v", seen)
	}
}

// TestOneOutlierDoesNotFlip: one answer 100× slower than the fit moves the
// worker's prefill estimate by at most an eighth and does not move the
// choice.
func TestOneOutlierDoesNotFlip(t *testing.T) {
	f := newFixture(t, 2, nil)
	g := lcg(2)
	tr := truth{queue: 0.010, prefill: 100e-6}
	f.train(0, 60, tr, &g, false)
	f.train(1, 60, tr, &g, false)
	before := f.rates(0)
	if !within(before.PrefillSeconds, tr.prefill, 0.15) {
		t.Fatalf("learned prefill %g, want about %g", before.PrefillSeconds, tr.prefill)
	}
	hist := strings.Repeat("turn of a conversation. ", 256) // 6 KB ≈ 1.5k tokens ≈ 150 ms
	f.hold(0, hist)
	f.load(0, 3) // 30 ms of queue, × R = 4 (turnsPerPlacement: 1 request, no placement, the prior) = 120 ms
	f.expect("", hist+"q1", 0, CacheAffinity)

	st, _ := f.ca.state("m")
	d := 100 * tr.ttfb(2, 2000, 0)
	f.ca.Observe(Choice{Worker: f.ws[0], st: st, keyLen: 8000}, &Served{TTFB: d, Elapsed: d, Stream: true, Load: 2, PromptTokens: 2000, CachedTokens: 0})
	after := f.rates(0)
	if after.PrefillSeconds > before.PrefillSeconds*1.0625+1e-9 || after.QueueSeconds > before.QueueSeconds*1.5 {
		t.Fatalf("one outlier moved the rates from %+v to %+v", before, after)
	}
	f.expect("", hist+"q2", 0, CacheAffinity)
}

// TestEstimatorRecovers: after a 4× step in a worker's prefill rate, up or
// down, the estimate is within 10 % of the new rate after RecoverySamples
// samples.
func TestEstimatorRecovers(t *testing.T) {
	for _, step := range []struct{ from, to float64 }{{50e-6, 200e-6}, {200e-6, 50e-6}} {
		f := newFixture(t, 1, nil)
		g := lcg(3)
		f.train(0, 60, truth{queue: 0.005, prefill: step.from}, &g, false)
		if r := f.rates(0); !within(r.PrefillSeconds, step.from, 0.1) {
			t.Fatalf("before the step: %g, want %g", r.PrefillSeconds, step.from)
		}
		f.train(0, RecoverySamples, truth{queue: 0.005, prefill: step.to}, &g, false)
		for k := RecoverySamples; k < 2*RecoverySamples; k++ { // and it stays there
			if r := f.rates(0); !within(r.PrefillSeconds, step.to, 0.1) {
				t.Fatalf("%g→%g: after %d samples the estimate is %g", step.from, step.to, k, r.PrefillSeconds)
			}
			f.train(0, 1, truth{queue: 0.005, prefill: step.to}, &g, false)
		}
	}
}

// TestNonStreamedDecodeIsNotPrefill: a worker answering non-streamed
// requests, whose time to first byte is mostly decode, learns the same
// prefill rate as an identical worker that streams.
func TestNonStreamedDecodeIsNotPrefill(t *testing.T) {
	f := newFixture(t, 2, nil)
	g := lcg(4)
	tr := truth{queue: 0.005, prefill: 100e-6, decode: 0.02}
	f.train(0, 400, tr, &g, true)
	f.train(1, 400, tr, &g, false)
	a, b := f.rates(0), f.rates(1)
	if !within(a.PrefillSeconds, b.PrefillSeconds, 0.25) || !within(a.PrefillSeconds, tr.prefill, 0.25) {
		t.Fatalf("non-streamed worker learned prefill %g, streaming one %g, truth %g", a.PrefillSeconds, b.PrefillSeconds, tr.prefill)
	}
	// Unknown completion tokens: a whole answer teaches nothing.
	st, _ := f.ca.state("m")
	f.ca.Observe(Choice{Worker: f.ws[0], st: st, keyLen: 400}, &Served{TTFB: time.Minute, PromptTokens: 100, CachedTokens: -1, CompletionTokens: -1})
	if r := f.rates(0); r.Samples != a.Samples {
		t.Fatalf("a non-streamed answer of unknown length was learned: %+v", r)
	}
}

// TestSlowPrefillWorkerAvoided: new sessions that match nothing go to the
// worker with the faster learned prefill at equal load.
func TestSlowPrefillWorkerAvoided(t *testing.T) {
	f := newFixture(t, 2, nil)
	g := lcg(5)
	f.train(0, 40, truth{queue: 0.005, prefill: 100e-6}, &g, false)
	f.train(1, 40, truth{queue: 0.005, prefill: 50e-6}, &g, false)
	for i := range 10 {
		f.expect("s"+strings.Repeat("x", i), strings.Repeat("y", i)+"|long first prompt "+strings.Repeat("of a new session ", 400), 1, FullHistoryLowMatch)
	}
}

// TestCorrectionFromCachedTokens: a worker that reports fewer cached tokens
// than the tree predicted loses, in the tree, what it last used no later
// than the evicted hold; an unknown cached_tokens counts and corrects
// nothing.
func TestCorrectionFromCachedTokens(t *testing.T) {
	f := newFixture(t, 2, nil)
	tick := func() { f.now.Add(int64(time.Minute)) }
	old := "session Z " + strings.Repeat("z", 4000)
	x := "session X " + strings.Repeat("x", 4000)
	newer := "session Y " + strings.Repeat("y", 4000)
	f.hold(0, old)
	tick()
	f.hold(0, x)
	tick()
	f.hold(0, newer)
	tick()
	st, _ := f.ca.state("m")
	ch := f.sel("", x+" next turn")
	if ch.Worker != f.ws[0] || ch.held != len(x) {
		t.Fatalf("continuation of x: %s held %d, want worker 0 holding %d", ch.Worker.URL(), ch.held, len(x))
	}
	tick()
	served := func(cached int) *Served {
		return &Served{TTFB: 50 * time.Millisecond, Elapsed: time.Second, Stream: true, PromptTokens: 1010, CachedTokens: cached, CompletionTokens: 10}
	}
	// Unknown: no count, no correction.
	f.ca.Observe(ch, served(-1))
	if sum := f.ca.Summaries(0)[0]; sum.Workers[0].PredictedTokens != 0 || sum.Workers[0].Corrections != 0 {
		t.Fatalf("unknown cached_tokens counted: %+v", sum.Workers[0])
	}
	if m := st.tree.Match([]byte(old), nil); m.Len != len(old) {
		t.Fatal("unknown cached_tokens corrected the tree")
	}
	// Known and in line with the prediction: counted, nothing corrected.
	f.ca.Observe(ch, served(990))
	// Known and far short: what worker 0 used no later than x's hold goes.
	f.ca.Observe(ch, served(10))
	w0 := f.ca.Summaries(0)[0].Workers[0]
	if w0.Corrections != 1 || w0.ServedTokens != 1000 || w0.PredictedTokens < 1900 {
		t.Fatalf("counters after two known answers: %+v", w0)
	}
	if m := st.tree.Match([]byte(old), nil); m.Len == len(old) {
		t.Fatalf("the older session is still held: %d", m.Len)
	}
	for _, k := range []string{x + " next turn", newer} {
		if m := st.tree.Match([]byte(k), nil); m.Len != len(k) {
			t.Fatalf("lost a hold used after the evicted one: %d of %d", m.Len, len(k))
		}
	}
	f.ca.Observe(ch, served(10)) // the same evidence again: applied once
	if w0 := f.ca.Summaries(0)[0].Workers[0]; w0.Corrections != 1 {
		t.Fatalf("the same shortfall corrected twice: %+v", w0)
	}
	// A shortfall on a hold taught just before the request was sent is the
	// earlier request still prefilling: no correction.
	f2 := newFixture(t, 1, nil)
	f2.hold(0, x)
	ch = f2.sel("", x+" next")
	f2.ca.Observe(ch, &Served{TTFB: time.Second, Elapsed: time.Second, Stream: true, PromptTokens: 1010, CachedTokens: 0})
	if w := f2.ca.Summaries(0)[0].Workers[0]; w.Corrections != 0 {
		t.Fatalf("an in-flight prefill was taken for eviction: %+v", w)
	}
}

// TestPrefixOnlyOneWorkerHoldsIsNotShared: a long prefix that several
// conversations share (a document asked about again and again, as in the
// Mooncake trace) but only one worker holds is that worker's: a new
// conversation extending it goes there while the worker runs one request
// more, instead of re-prefilling the document elsewhere. Once a second
// worker holds it, it counts as held by every worker and the least-loaded
// worker places the next one.
func TestPrefixOnlyOneWorkerHoldsIsNotShared(t *testing.T) {
	doc := "Read this report: " + strings.Repeat("revenue grew in every region but one. ", 220) // ~8 KB
	f := newFixture(t, 4, nil)
	f.hold(0, doc+"Q: summarize it")
	f.hold(0, doc+"Q: which region?") // the tree branches at the end of doc
	f.load(0, 1)
	f.expect("", doc+"Q: causes?", 0, CacheAffinity)
	f.expect("new", doc+"Q: and next year?", 0, FullHistoryMatch)

	f.hold(1, doc+"Q: in French")
	f.load(1, 1)
	c := f.sel("", doc+"Q: plot a chart")
	if i := f.idx(c.Worker); i != 2 && i != 3 {
		t.Fatalf("a prefix two workers hold went to worker %d (%s), want a least-loaded one", i, c.Decision)
	}
}

// TestNewConversationAvoidsReturningTurns: conversations a worker has just
// answered are between turns and come back to it, so they count as its
// load for a new conversation until their next turns arrive (they are in
// flight then) or a few request durations pass (returns.go).
func TestNewConversationAvoidsReturningTurns(t *testing.T) {
	f := newFixture(t, 2, nil)
	answer := func(c Choice) {
		f.ca.Observe(c, &Served{TTFB: 100 * time.Millisecond, Elapsed: time.Second, Stream: true,
			PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1})
	}
	turn := func(id string, n int) string { return sys + strings.Repeat(id+" asks. ", 40*n) }
	for n := 1; n <= 6; n++ { // one conversation of 6 turns, unanswered: the odds of a next turn
		f.sel("z", turn("z", n))
	}
	f.load(1, 1)
	var first []Choice
	for _, id := range []string{"a1", "a2", "a3", "a4"} { // four conversations on worker 0
		c := f.sel(id, turn(id, 1))
		if c.Worker != f.ws[0] {
			t.Fatalf("%s placed on the busier worker", id)
		}
		first = append(first, c)
	}
	for _, c := range first { // 10 requests, 5 placements: each answer comes back with odds 1/2
		answer(c)
	}
	st, _ := f.ca.state("m")
	r, _ := st.rates.Load(f.ws[0].ID())
	if got := r.back.get(f.now.Load(), st.elapsed.get()); !within(got, 2, 0.01) {
		t.Fatalf("worker 0 expects %.2f conversations back, want 2 (4 answers × odds 1/2)", got)
	}
	// Worker 1 runs one request, worker 0 none, but its conversations are
	// about to return: a new one goes to worker 1 (by requests in flight
	// alone it went to worker 0). It most likely replaces the conversation
	// of the latest answer, which stops counting.
	f.expect("b1", turn("b1", 1), 1, FullHistoryLowMatch)
	if got := r.back.get(f.now.Load(), st.elapsed.get()); !within(got, 1.5, 0.01) {
		t.Fatalf("after a new conversation worker 0 expects %.2f back, want 1.5", got)
	}
	f.ws[1].Release()
	// Their next turns arrive: in flight now, they no longer count twice.
	for _, id := range []string{"a1", "a2", "a3"} {
		f.expect(id, turn(id, 2), 0, SessionIDMatch)
		f.load(0, 1)
	}
	if got := r.back.get(f.now.Load(), st.elapsed.get()); got != 0 {
		t.Fatalf("all three came back, still %.2f expected", got)
	}
	// Answered again; a conversation that does not come back within a few
	// request durations (1 s here) stops counting.
	for i := 0; i < 3; i++ {
		f.ws[0].Release()
		answer(Choice{Worker: f.ws[0], st: st})
	}
	f.load(1, 1)
	f.expect("b2", turn("b2", 1), 1, FullHistoryLowMatch)
	f.now.Add(int64(10 * time.Second))
	f.expect("b3", turn("b3", 1), 0, FullHistoryLowMatch)
}

// TestNewConversationAvoidsPendingPrefills: a new conversation's prefill
// delays the first token of every request on its worker not answered yet,
// and waits for theirs, so it goes to a worker whose requests are all
// decoding rather than to one with fewer requests that are still
// prefilling; once those have their first byte, the fewer requests win.
func TestNewConversationAvoidsPendingPrefills(t *testing.T) {
	f := newFixture(t, 2, nil)
	f.load(0, 3)
	for i := 0; i < 3; i++ {
		f.ws[0].FirstByte() // worker 0: three requests decoding
	}
	f.load(1, 2) // worker 1: two requests awaiting their first byte
	doc := func(id string) string { return sys + strings.Repeat(id+" reads the attached file. ", 320) }
	f.expect("n1", doc("n1"), 0, FullHistoryLowMatch)
	f.load(0, 1)
	f.ws[0].FirstByte() // n1 runs on worker 0, answered: four requests decoding
	f.ws[1].FirstByte()
	f.ws[1].FirstByte()
	f.expect("n2", doc("n2"), 1, FullHistoryLowMatch)
}

// TestSpeedsCountBeyondTheFleetsSpread: a decision reads speeds relative to
// the median worker and only beyond 2 median absolute deviations, so the
// drift of equal workers breaks no tie and a slower worker still counts.
func TestSpeedsCountBeyondTheFleetsSpread(t *testing.T) {
	f := newFixture(t, 4, nil)
	st, _ := f.ca.state("m")
	set := func(speeds ...float64) fleetSpeeds {
		for i, sp := range speeds {
			r, _ := st.rates.LoadOrCompute(f.ws[i].ID(), newRates)
			r.speed.Store(math.Float64bits(sp))
		}
		return st.fleetSpeeds(f.reg.Workers())
	}
	fs := set(0.8, 0.9, 1.0, 1.1) // 4 equal workers drifting ±15 %
	for _, sp := range []float64{0.8, 0.9, 1.0, 1.1} {
		if got := fs.of(sp); got != 1 {
			t.Fatalf("drift %.2f of equal workers reads %.3f, want 1", sp, got)
		}
	}
	fs = set(0.85, 0.9, 0.95, 2.0) // one prefills at half speed
	if got := fs.of(2.0); got < 1.5 {
		t.Fatalf("the slow worker reads %.3f, want it to stand out (≥ 1.5)", got)
	}
	if got := fs.of(0.9); got != 1 {
		t.Fatalf("an equal worker reads %.3f beside a slow one, want 1", got)
	}
	if fs.fresh != 1 {
		t.Fatalf("a worker not yet heard from reads %.3f, want the fastest known (1)", fs.fresh)
	}
}

// TestFixedRuleKeepsNoReturns: under --affinity-chars-per-request nothing
// reads returns, so answers keep none (no work on the response path).
func TestFixedRuleKeepsNoReturns(t *testing.T) {
	f := newFixture(t, 2, func(c *CacheAwareConfig) { c.AffinityRule = true })
	for n := 1; n <= 3; n++ {
		c := f.sel("s", sys+strings.Repeat("turn ", 20*n))
		f.ca.Observe(c, &Served{TTFB: time.Millisecond, Elapsed: time.Second, Stream: true,
			PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1})
	}
	st, _ := f.ca.state("m")
	st.rates.Range(func(_ uint32, r *rates) bool {
		if v := math.Float64frombits(r.back.v.Load()); v != 0 {
			t.Fatalf("fixed rule: a worker keeps %.2f returns", v)
		}
		return true
	})
	if st.elapsed.get() != 0 {
		t.Fatal("fixed rule: the request duration was learned")
	}
}
