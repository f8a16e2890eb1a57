package route

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadview"
)

// fixture is a tiny fleet of n workers (no network: health forced) under a
// cache-aware policy with a fake clock and a deterministic random source.
type fixture struct {
	t   *testing.T
	reg *loadview.Registry
	ws  []*loadview.Worker
	ca  *CacheAware
	now atomic.Int64 // read by background sweeps too
}

func newFixture(t *testing.T, n int, mod func(*CacheAwareConfig)) *fixture {
	t.Helper()
	f := &fixture{t: t}
	f.now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	f.reg = loadview.NewRegistry(loadview.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for i := 0; i < n; i++ {
		// Port 1 refuses at once: the probe fails fast, then health is forced.
		ws, err := f.reg.Add(context.Background(), fmt.Sprintf("http://127.0.0.%d:1", i+1), []string{"m"})
		if err != nil {
			t.Fatal(err)
		}
		f.reg.SetHealthy(ws[0], true)
		f.ws = append(f.ws, ws[0])
	}
	cfg := CacheAwareConfig{Threshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5, MaxTreeSize: 1 << 20,
		Now: f.now.Load}
	if mod != nil {
		mod(&cfg)
	}
	seq := uint64(0)
	f.ca = NewCacheAware(f.reg, cfg, func() uint64 { seq++; return seq * 0x9e3779b97f4a7c15 })
	// Warm the model state so that tests start past no_tree_random.
	if c := f.sel("", ""); c.Decision != NoTreeRandom {
		t.Fatalf("first selection of a model: %s, want %s", c.Decision, NoTreeRandom)
	}
	return f
}

func (f *fixture) sel(session, prefix string) Choice {
	f.t.Helper()
	c := f.ca.Select(&Request{Model: "m", Workers: f.reg.Workers(), Session: []byte(session), Prefix: []byte(prefix)})
	if c.Worker == nil {
		f.t.Fatalf("no worker chosen (%s)", c.Decision)
	}
	return c
}

// expect asserts the exact worker index and label of one selection.
func (f *fixture) expect(session, prefix string, worker int, label string) {
	f.t.Helper()
	c := f.sel(session, prefix)
	if c.Worker != f.ws[worker] || c.Decision != label {
		f.t.Fatalf("Select(%q, %.20q) = %s/%s, want %s/%s", session, prefix, c.Worker.URL(), c.Decision, f.ws[worker].URL(), label)
	}
}

func (f *fixture) load(worker int, n int) {
	for i := 0; i < n; i++ {
		f.ws[worker].Acquire()
	}
}

func (f *fixture) idx(w *loadview.Worker) int {
	for i, o := range f.ws {
		if o == w {
			return i
		}
	}
	return -1
}

const sys = "You are a helpful agent. Tools: search, open, edit. "

// A selection reads the clock once, whatever it touches: the session map,
// the tree's stamps, the estimate (a clock read costs about as much as a
// session hit's lookup). Each stamp it leaves is that reading.
func TestSelectReadsTheClockOnce(t *testing.T) {
	var reads, now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	f := newFixture(t, 4, func(c *CacheAwareConfig) {
		c.Now = func() int64 { reads.Add(1); return now.Load() }
	})
	history := sys + "user: the clock"
	for _, session := range []string{"s1", "s2"} {
		f.sel(session, history) // a new session, then one on a held history
		now.Add(int64(time.Second))
		reads.Store(0)
		f.sel(session, history) // a session hit
		if n := reads.Load(); n != 1 {
			t.Fatalf("%s: a selection read the clock %d times, want 1", session, n)
		}
	}
	var last int64
	f.ca.models.Range(func(_ string, st *modelState) bool {
		st.sessions.Range(func(key string, _ uint32, la int64) bool {
			if key == "s2" {
				last = la
			}
			return true
		})
		return true
	})
	if last != now.Load() {
		t.Fatalf("the session's last access is %d, want the selection's clock %d", last, now.Load())
	}
}

func TestRepeatedTextSticks(t *testing.T) {
	f := newFixture(t, 3, nil)
	first := f.sel("", sys+"user: fix the bug")
	if first.Decision != LowMatchMinLoad {
		t.Fatalf("first sight of a text: %s", first.Decision)
	}
	for i := 0; i < 5; i++ {
		f.expect("", sys+"user: fix the bug", f.idx(first.Worker), CacheAffinity)
	}
}

func TestSessionIDsAreExactNotPrefixes(t *testing.T) {
	f := newFixture(t, 2, nil)
	a := f.sel("session-1", "")
	if a.Decision != EmptyHistoryMinLoad {
		t.Fatalf("session-1: %s", a.Decision)
	}
	f.load(f.idx(a.Worker), 3) // session-1's worker is busy
	b := f.sel("session-12", "")
	if b.Worker == a.Worker || b.Decision != EmptyHistoryMinLoad {
		t.Fatalf("session-12 shares session-1's affinity: %s %s", b.Worker.URL(), b.Decision)
	}
	f.expect("session-1", "", f.idx(a.Worker), SessionIDMatch)
	f.expect("session-12", "", f.idx(b.Worker), SessionIDMatch)
}

func TestSessionHitIgnoresChangedHistory(t *testing.T) {
	f := newFixture(t, 2, nil)
	h := sys + "user: a history cached on one worker"
	wh := f.idx(f.sel("", h).Worker)
	f.load(wh, 1) // the new session lands on the other worker
	f.expect("s", "", 1-wh, EmptyHistoryMinLoad)
	f.expect("s", h, 1-wh, SessionIDMatch)
}

func TestNewSessionExtendingCachedHistoryGoesThere(t *testing.T) {
	f := newFixture(t, 3, nil)
	turn1 := sys + "user: plan the trip"
	w := f.sel("alpha", turn1).Worker
	f.load((f.idx(w)+1)%3, 0)
	f.expect("beta", turn1+" assistant: sure, where to?", f.idx(w), FullHistoryMatch)
}

func TestGrownHistoryFromSessionHitFoundWithoutSession(t *testing.T) {
	f := newFixture(t, 3, nil)
	turn1 := sys + "user: step one"
	w := f.idx(f.sel("s", turn1).Worker)
	turn2 := turn1 + " assistant: done user: step two with a lot more text to grow the key well past the first turn"
	f.expect("s", turn2, w, SessionIDMatch)
	// A client that forgot its session id still reaches the KV cache.
	f.expect("", turn2+" assistant: ok", w, CacheAffinity)
}

func TestImageOnlyTurnWithSession(t *testing.T) {
	f := newFixture(t, 2, nil)
	f.load(0, 2)
	f.expect("img", "", 1, EmptyHistoryMinLoad)
}

func TestRemovedWorkerSessionsMove(t *testing.T) {
	f := newFixture(t, 2, nil)
	turn := sys + "user: hello"
	w := f.sel("s", turn).Worker
	f.reg.Remove(w.URL())
	c := f.sel("s", turn+" more")
	if c.Worker == w || c.Decision == SessionIDMatch || c.Decision == FullHistoryMatch {
		t.Fatalf("removed worker still has affinity: %s %s", c.Worker.URL(), c.Decision)
	}
	f.expect("s", turn+" more", f.idx(c.Worker), SessionIDMatch)
}

func TestUnhealthyHolderIsStale(t *testing.T) {
	f := newFixture(t, 2, nil)
	turn := sys + "user: hello there"
	w := f.sel("s", turn).Worker
	f.reg.SetHealthy(w, false)
	other := 1 - f.idx(w)
	f.expect("new-session", turn+" and more", other, StaleTenantFallback)
	// The session's worker is dead: lazy drop, then the history the fallback
	// taught leads to the live worker, and the session sticks there.
	f.expect("s", turn+" and more", other, FullHistoryMatch)
	f.expect("s", turn+" and more", other, SessionIDMatch)
}

func TestSweepKeepsFreshAndNewest(t *testing.T) {
	f := newFixture(t, 2, func(c *CacheAwareConfig) { c.MaxSessions = 3; c.SessionTTL = time.Hour })
	for i := 0; i < 5; i++ {
		f.sel(fmt.Sprintf("old-%d", i), "")
	}
	f.now.Add(int64(2 * time.Hour))
	for i := 0; i < 5; i++ {
		f.now.Add(int64(time.Second))
		f.sel(fmt.Sprintf("new-%d", i), "")
	}
	f.ca.Sweep()
	got := map[string]bool{}
	for _, s := range f.ca.Summaries(100) {
		for _, e := range s.Recent {
			got[e.Session] = true
		}
	}
	want := map[string]bool{"new-2": true, "new-3": true, "new-4": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after sweep: %v, want %v", got, want)
	}
}

func TestImbalancedPathStillTeaches(t *testing.T) {
	f := newFixture(t, 2, nil)
	turn := sys + "user: heavy"
	w := f.idx(f.sel("", turn).Worker)
	f.load(w, 100)
	f.expect("", turn+" x", 1-w, LoadBalance)
	for i := 0; i < 100; i++ {
		f.ws[w].Release()
	}
	// The load-balanced worker learned the longer history: it now matches best.
	f.expect("", turn+" x y", 1-w, CacheAffinity)
}

func TestGatesIgnoreUnhealthyWorkers(t *testing.T) {
	f := newFixture(t, 3, nil)
	turn := sys + "user: gated"
	w := f.idx(f.sel("s", turn).Worker)
	o1, o2 := (w+1)%3, (w+2)%3
	f.load(w, 70)
	f.load(o1, 65)
	f.reg.SetHealthy(f.ws[o2], false) // idle but dead: must not count as min load 0
	f.expect("s", turn, w, SessionIDMatch)
	f.reg.SetHealthy(f.ws[o2], true) // alive and idle: now the gates fire
	f.expect("s", turn, o2, LoadBalance)
}

func TestMinLoadTiesNotAlwaysFirst(t *testing.T) {
	f := newFixture(t, 4, nil)
	seen := map[*loadview.Worker]bool{}
	for i := 0; i < 64; i++ {
		seen[MinLoad(f.ws, f.ca.rnd)] = true
	}
	if len(seen) < 3 {
		t.Fatalf("min-load ties went to %d of 4 idle workers", len(seen))
	}
}

func TestNoHealthyWorker(t *testing.T) {
	f := newFixture(t, 2, nil)
	for _, w := range f.ws {
		f.reg.SetHealthy(w, false)
	}
	if c := f.ca.Select(&Request{Model: "m", Workers: f.ws, Session: []byte("s"), Prefix: []byte("p")}); c.Worker != nil {
		t.Fatalf("chose %s with no healthy worker", c.Worker.URL())
	}
}

// hold makes worker i hold prefix in the tree, as if it had served it.
func (f *fixture) hold(i int, prefix string) {
	st, _ := f.ca.state("m")
	st.tree.Insert([]byte(prefix), f.ws[i].ID())
}

func TestMissPlacementAffinityMustPayForLoad(t *testing.T) {
	shared := strings.Repeat("You are an airline agent with tools. ", 60) // ~2 KB every session starts with
	withCost := func(c *CacheAwareConfig) { c.AffinityRule, c.AffinityCharsPerRequest = true, 32<<10 }

	// Only worker 0 holds the shared prompt and it is busier: a new session
	// is placed on the least-loaded worker, not piled onto worker 0.
	f := newFixture(t, 3, withCost)
	f.hold(0, shared)
	f.load(0, 1)
	f.load(2, 1)
	f.expect("new-1", shared+"user: book a flight", 1, LoadBalance)

	// Every worker holds it: the least-loaded one serves, with a hit label.
	f = newFixture(t, 3, withCost)
	for i := range f.ws {
		f.hold(i, shared)
	}
	f.load(0, 2)
	f.load(2, 2)
	f.expect("new-2", shared+"user: change my seat", 1, FullHistoryMatch)
	f.expect("", shared+"user: cancel", 1, CacheAffinity)

	// A conversation forked under a new session id: 64 KB of its own history
	// is worth one extra request in flight.
	f = newFixture(t, 2, withCost)
	long := shared + strings.Repeat("user: step. assistant: done. ", 2300)
	f.hold(0, long)
	f.hold(1, shared)
	f.load(0, 1)
	f.expect("fork", long+"user: next", 0, FullHistoryMatch)
	f.load(0, 2) // three extra requests cost more than 64 KB saves
	f.expect("fork-2", long+"user: next", 1, LoadBalance)

	// Disabled: threshold affinity alone, as the vLLM router does.
	f = newFixture(t, 2, func(c *CacheAwareConfig) { c.AffinityRule = true })
	f.hold(0, shared)
	f.load(0, 1)
	f.expect("new-3", shared+"user: hi", 0, FullHistoryMatch)
}

// A worker that stops serving a model (an adapter unloaded at run time)
// loses its sessions and tree entries in that model only.
func TestModelRemovedFromWorkerForgetsOnlyThatModel(t *testing.T) {
	reg := loadview.NewRegistry(loadview.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var ws []*loadview.Worker
	for i := 0; i < 2; i++ {
		w, err := reg.Add(context.Background(), fmt.Sprintf("http://127.0.0.%d:1", i+1), []string{"m", "lora"})
		if err != nil {
			t.Fatal(err)
		}
		reg.SetHealthy(w[0], true)
		ws = append(ws, w[0])
	}
	seq := uint64(0)
	ca := NewCacheAware(reg, CacheAwareConfig{Threshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5, MaxTreeSize: 1 << 20},
		func() uint64 { seq++; return seq * 0x9e3779b97f4a7c15 })
	sel := func(model, session string) Choice {
		return ca.Select(&Request{Model: model, Workers: ws, Session: []byte(session), Prefix: []byte(sys + "user: " + session)})
	}
	sel("m", "warm")
	sel("lora", "warm")
	bound := map[string]*loadview.Worker{"m": sel("m", "s").Worker, "lora": sel("lora", "s").Worker}
	for _, model := range []string{"m", "lora"} {
		if c := sel(model, "s"); c.Worker != bound[model] || c.Decision != SessionIDMatch {
			t.Fatalf("%s: session not bound: %s", model, c.Decision)
		}
	}
	ca.modelsChanged(loadview.ModelChange{Worker: bound["lora"], Removed: []string{"lora"}})
	st, _ := ca.state("lora")
	if _, ok := st.sessions.Get([]byte("s")); ok {
		t.Fatal("the session on the adapter's old worker survived its removal")
	}
	if m := st.tree.Match([]byte(sys+"user: s"), func(id uint32) bool { return id == bound["lora"].ID() }); m.Len != 0 {
		t.Fatalf("tree still holds %d characters on the worker for the removed model", m.Len)
	}
	if c := sel("m", "s"); c.Worker != bound["m"] || c.Decision != SessionIDMatch {
		t.Fatalf("another model's session moved: %s", c.Decision)
	}
}

// HolderOf answers the router's queue: a session bound to a healthy
// worker, or a session-less history half held, is held there; anything
// else is held nowhere.
func TestHolderOf(t *testing.T) {
	f := newFixture(t, 2, nil)
	history := sys + strings.Repeat("user: fix the failing test; tool: FAIL TestX ", 10)
	c := f.sel("s1", history)
	f.sel("", history) // a session-less conversation with the same history
	holder := func(session, prefix string) *loadview.Worker {
		return f.ca.HolderOf(&Request{Model: "m", Session: []byte(session), Prefix: []byte(prefix)})
	}
	if holder("s1", "") != c.Worker || holder("s2", "") != nil || holder("", "another history altogether") != nil ||
		holder("", history) == nil {
		t.Fatal("HolderOf misreads which histories are held where")
	}
	if f.ca.HolderOf(&Request{Model: "unknown", Session: []byte("s1")}) != nil {
		t.Fatal("a model with no state holds nothing")
	}
	f.reg.SetHealthy(c.Worker, false)
	if holder("s1", "") != nil {
		t.Fatal("an unhealthy worker holds nothing worth waiting for")
	}
}

func TestQueueSecondsLearned(t *testing.T) {
	f := newFixture(t, 1, nil)
	if _, ok := f.ca.QueueSeconds("m", f.ws[0]); ok {
		t.Fatal("a queue rate before any answer")
	}
	for i := range 20 {
		c := f.sel(fmt.Sprint("s", i), sys+fmt.Sprint(i))
		f.ca.Observe(c, &Served{TTFB: time.Duration(10+i) * time.Millisecond, Elapsed: 50 * time.Millisecond,
			Load: int64(i % 4), PromptTokens: 20, CachedTokens: -1, CompletionTokens: 5})
	}
	if q, ok := f.ca.QueueSeconds("m", f.ws[0]); !ok || q <= 0 {
		t.Fatalf("queue seconds %v %v after 20 answers", q, ok)
	}
}
