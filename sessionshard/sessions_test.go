package sessionshard

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is an injectable clock in unix nanoseconds.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() int64              { return c.ns.Load() }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func newTestSessions(ttl time.Duration, capacity int) (*Sessions, *fakeClock) {
	c := &fakeClock{}
	c.ns.Store(int64(1_700_000_000) * int64(time.Second))
	return NewSessions(Config{TTL: ttl, Capacity: capacity, Now: c.Now}), c
}

// snapshot returns "key=worker" for every entry, sorted.
func snapshot(s *Sessions) []string {
	var out []string
	s.Range(func(k string, w uint32, _ int64) bool {
		out = append(out, k+"="+strconv.FormatUint(uint64(w), 10))
		return true
	})
	slices.Sort(out)
	return out
}

func assertSnapshot(t *testing.T, s *Sessions, want ...string) {
	t.Helper()
	got := snapshot(s)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Fatalf("entries: got %q, want %q", got, want)
	}
	if s.Len() != len(want) {
		t.Fatalf("Len: got %d, want %d", s.Len(), len(want))
	}
}

func assertGet(t *testing.T, s *Sessions, key string, wantW uint32, wantOK bool) {
	t.Helper()
	w, ok := s.Get([]byte(key))
	if w != wantW || ok != wantOK {
		t.Fatalf("Get(%q): got (%d, %v), want (%d, %v)", key, w, ok, wantW, wantOK)
	}
}

func TestSessionsGetSet(t *testing.T) {
	// op: "set key w", "del key"; then the expected entries.
	f := func(ops []string, want ...string) {
		t.Helper()
		s, _ := newTestSessions(0, 0)
		for _, op := range ops {
			var kind, key string
			var w uint32
			if _, err := fmt.Sscan(op, &kind, &key, &w); err != nil && kind != "del" {
				t.Fatalf("bad op %q: %v", op, err)
			}
			switch kind {
			case "set":
				s.Set([]byte(key), w)
			case "del":
				s.Delete([]byte(key))
			}
		}
		assertSnapshot(t, s, want...)
		for _, kw := range want {
			var key string
			var w uint32
			for i := len(kw) - 1; i >= 0; i-- {
				if kw[i] == '=' {
					key = kw[:i]
					n, _ := strconv.ParseUint(kw[i+1:], 10, 32)
					w = uint32(n)
					break
				}
			}
			assertGet(t, s, key, w, true)
		}
	}
	f(nil)
	f([]string{"set a 1"}, "a=1")
	f([]string{"set a 1", "set b 2"}, "a=1", "b=2")
	f([]string{"set a 1", "set a 2"}, "a=2")            // update in place
	f([]string{"set a 1", "set a 2", "set a 1"}, "a=1") // and back
	f([]string{"set a 1", "del a"})
	f([]string{"set a 1", "del a", "set a 3"}, "a=3")
	f([]string{"set a 1", "del b"}, "a=1")
	f([]string{"set session-1 1", "set session-12 2"}, "session-1=1", "session-12=2")
	f([]string{"set session-12 2", "set session-1 1"}, "session-1=1", "session-12=2")
	f([]string{"set session-1 1", "set session-12 2", "del session-1"}, "session-12=2")
}

func TestSessionsMiss(t *testing.T) {
	s, _ := newTestSessions(0, 0)
	assertGet(t, s, "a", 0, false)
	s.Set([]byte("session-1"), 7)
	assertGet(t, s, "session-12", 0, false)
	assertGet(t, s, "session-", 0, false)
	assertGet(t, s, "", 0, false)
	assertGet(t, s, "session-1", 7, true)
	s.Set(nil, 8) // the empty key is a key like any other
	assertGet(t, s, "", 8, true)
	assertGet(t, s, "session-1", 7, true)
}

func TestSessionsUpdateInPlace(t *testing.T) {
	s, c := newTestSessions(0, 0)
	s.Set([]byte("a"), 1)
	e1, _ := s.m.Load("a")
	c.Advance(time.Second)
	s.Set([]byte("a"), 2)
	e2, _ := s.m.Load("a")
	if e1 != e2 {
		t.Fatalf("Set on an existing key replaced the entry")
	}
	if got, want := e2.lastAccess.Load(), c.Now(); got != want {
		t.Fatalf("lastAccess: got %d, want %d", got, want)
	}
	assertGet(t, s, "a", 2, true)
}

// GetAt and SetAt work at the caller's time, not the clock's.
func TestSessionsAt(t *testing.T) {
	s, c := newTestSessions(time.Hour, 0)
	at := c.Now() - int64(time.Minute)
	s.SetAt([]byte("k"), 3, at)
	s.Range(func(_ string, w uint32, la int64) bool {
		if w != 3 || la != at {
			t.Fatalf("SetAt stored worker %d at %d, want 3 at %d", w, la, at)
		}
		return true
	})
	if _, ok := s.GetAt([]byte("k"), at+int64(time.Hour)+1); ok {
		t.Fatal("GetAt past the TTL of the caller's time found the entry")
	}
	if w, ok := s.GetAt([]byte("k"), at+int64(time.Hour)); !ok || w != 3 {
		t.Fatalf("GetAt within the TTL: %d, %v", w, ok)
	}
	s.Range(func(_ string, _ uint32, la int64) bool {
		if la != at+int64(time.Hour) {
			t.Fatalf("GetAt refreshed the entry to %d, want %d", la, at+int64(time.Hour))
		}
		return true
	})
}

func TestSessionsKeyCopied(t *testing.T) {
	s, _ := newTestSessions(0, 0)
	buf := []byte("session-1")
	s.Set(buf, 1)
	copy(buf, "XXXXXXXXX") // the caller reuses its request buffer
	assertGet(t, s, "session-1", 1, true)
	assertGet(t, s, "XXXXXXXXX", 0, false)
	assertSnapshot(t, s, "session-1=1")

	// Lookups and deletes do not retain the key either.
	buf = []byte("session-2")
	s.Set(buf, 2)
	s.Get(buf)
	s.Delete([]byte("nope"))
	copy(buf, "YYYYYYYYY")
	assertSnapshot(t, s, "session-1=1", "session-2=2")
}

func TestSessionsLastAccess(t *testing.T) {
	s, c := newTestSessions(time.Hour, 0)
	lastAccess := func(key string) int64 {
		t.Helper()
		var got int64 = -1
		s.Range(func(k string, _ uint32, la int64) bool {
			if k == key {
				got = la
			}
			return true
		})
		return got
	}
	t0 := c.Now()
	s.Set([]byte("a"), 1)
	if got := lastAccess("a"); got != t0 {
		t.Fatalf("after Set: lastAccess %d, want %d", got, t0)
	}
	c.Advance(time.Minute)
	s.Get([]byte("a"))
	if got := lastAccess("a"); got != t0+int64(time.Minute) {
		t.Fatalf("after Get: lastAccess %d, want %d", got, t0+int64(time.Minute))
	}
	// A miss does not refresh anything; an expired Get does not refresh.
	c.Advance(2 * time.Hour)
	assertGet(t, s, "a", 0, false)
	if got := lastAccess("a"); got != t0+int64(time.Minute) {
		t.Fatalf("after expired Get: lastAccess %d, want %d", got, t0+int64(time.Minute))
	}
	// Set revives an expired entry that no sweep has dropped yet.
	s.Set([]byte("a"), 3)
	assertGet(t, s, "a", 3, true)
}

func TestSessionsTTL(t *testing.T) {
	// Keys set at the given offsets; then Get/Sweep at "at".
	f := func(ttl time.Duration, setAt map[string]time.Duration, at time.Duration, fresh ...string) {
		t.Helper()
		s, c := newTestSessions(ttl, 0)
		t0 := c.Now()
		keys := make([]string, 0, len(setAt))
		for k := range setAt {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b string) int { return int(setAt[a] - setAt[b]) })
		for i, k := range keys {
			c.ns.Store(t0 + int64(setAt[k]))
			s.Set([]byte(k), uint32(i+1))
		}
		c.ns.Store(t0 + int64(at))
		for i, k := range keys {
			want := slices.Contains(fresh, k)
			w := uint32(0)
			if want {
				w = uint32(i + 1)
			}
			assertGet(t, s, k, w, want)
		}
		if got, want := s.Sweep(nil), len(keys)-len(fresh); got != want {
			t.Fatalf("Sweep dropped %d, want %d", got, want)
		}
		var wantSnap []string
		for i, k := range keys {
			if slices.Contains(fresh, k) {
				wantSnap = append(wantSnap, k+"="+strconv.Itoa(i+1))
			}
		}
		slices.Sort(wantSnap)
		assertSnapshot(t, s, wantSnap...)
	}
	m := map[string]time.Duration{"a": 0, "b": 10 * time.Minute, "c": 30 * time.Minute}
	f(time.Hour, m, 0, "a", "b", "c")
	f(time.Hour, m, time.Hour, "a", "b", "c") // exactly TTL: not longer than TTL
	f(time.Hour, m, time.Hour+1, "b", "c")
	f(time.Hour, m, time.Hour+10*time.Minute+1, "c")
	f(time.Hour, m, 2*time.Hour)
	f(0, m, time.Hour+1, "b", "c") // default TTL is 1h
	f(time.Minute, m, 11*time.Minute, "b", "c")
}

func TestSessionsTTLRefreshedByGet(t *testing.T) {
	s, c := newTestSessions(time.Hour, 0)
	s.Set([]byte("a"), 1)
	s.Set([]byte("b"), 2)
	for range 5 {
		c.Advance(50 * time.Minute)
		assertGet(t, s, "a", 1, true)
	}
	if n := s.Sweep(nil); n != 1 {
		t.Fatalf("Sweep dropped %d, want 1", n)
	}
	assertSnapshot(t, s, "a=1")
}

func TestSessionsCapacity(t *testing.T) {
	// Keys k0..k(n-1) are set one second apart; then the keys in touch are
	// read (in order, one second apart); Sweep must keep exactly want.
	f := func(n, capacity int, touch []int, want ...string) {
		t.Helper()
		s, c := newTestSessions(time.Hour, capacity)
		for i := range n {
			c.Advance(time.Second)
			s.Set([]byte("k"+strconv.Itoa(i)), uint32(i))
		}
		for _, i := range touch {
			c.Advance(time.Second)
			assertGet(t, s, "k"+strconv.Itoa(i), uint32(i), true)
		}
		wantDropped := max(n-capacity, 0)
		if capacity == 0 {
			wantDropped = 0
		}
		if got := s.Sweep(nil); got != wantDropped {
			t.Fatalf("Sweep dropped %d, want %d", got, wantDropped)
		}
		slices.Sort(want)
		assertSnapshot(t, s, want...)
	}
	f(3, 0, nil, "k0=0", "k1=1", "k2=2") // unlimited
	f(3, 3, nil, "k0=0", "k1=1", "k2=2")
	f(3, 5, nil, "k0=0", "k1=1", "k2=2")
	// At most 2×capacity entries in every case: past that, Set starts a
	// background drop that would race the explicit Sweep.
	f(3, 2, nil, "k1=1", "k2=2")
	f(2, 1, nil, "k1=1")
	f(4, 2, []int{0}, "k0=0", "k3=3")
	f(4, 2, []int{1, 0}, "k0=0", "k1=1")
	f(5, 3, []int{3, 0, 3}, "k0=0", "k3=3", "k4=4")
	f(8, 4, []int{7, 2, 5, 6}, "k2=2", "k5=5", "k6=6", "k7=7")
}

func TestSessionsCapacityTies(t *testing.T) {
	// All entries accessed at the same instant: exactly Capacity remain.
	s, _ := newTestSessions(time.Hour, 3)
	for i := range 6 {
		s.Set([]byte("k"+strconv.Itoa(i)), 1)
	}
	s.bg.Wait()
	if got := s.Sweep(nil); got != 3 {
		t.Fatalf("Sweep dropped %d, want 3", got)
	}
	if s.Len() != 3 || len(snapshot(s)) != 3 {
		t.Fatalf("Len %d, entries %q; want 3", s.Len(), snapshot(s))
	}
}

func TestSessionsCapacityDropOnSet(t *testing.T) {
	s, c := newTestSessions(time.Hour, 4)
	for i := range 8 { // 2×Capacity: no drop yet
		c.Advance(time.Second)
		s.Set([]byte("k"+strconv.Itoa(i)), uint32(i))
	}
	s.bg.Wait()
	if s.Len() != 8 {
		t.Fatalf("Len %d, want 8 (no drop up to 2×Capacity)", s.Len())
	}
	c.Advance(time.Second)
	s.Set([]byte("k8"), 8) // 9 > 2×Capacity: Set starts the drop
	s.bg.Wait()
	assertSnapshot(t, s, "k5=5", "k6=6", "k7=7", "k8=8")
}

// TestSessionsHeadroom: with Headroom set, Set starts the capacity drop as
// soon as the map exceeds Capacity+Headroom, not 2×Capacity.
func TestSessionsHeadroom(t *testing.T) {
	c := &fakeClock{}
	c.ns.Store(int64(1_700_000_000) * int64(time.Second))
	s := NewSessions(Config{TTL: time.Hour, Capacity: 8, Headroom: 2, Now: c.Now})
	for i := range 10 { // Capacity+Headroom: no drop yet
		c.Advance(time.Second)
		s.Set([]byte("k"+strconv.Itoa(i)), uint32(i))
	}
	s.bg.Wait()
	if s.Len() != 10 {
		t.Fatalf("Len %d, want 10 (no drop up to Capacity+Headroom)", s.Len())
	}
	c.Advance(time.Second)
	s.Set([]byte("k10"), 10) // 11 > 8+2: Set starts the drop down to 8
	s.bg.Wait()
	assertSnapshot(t, s, "k10=10", "k3=3", "k4=4", "k5=5", "k6=6", "k7=7", "k8=8", "k9=9")
}

// TestSessionsHardLimit: while the capacity drop cannot keep up (here: it
// is held back by the test), Set stores no new key past
// Capacity+2×Headroom, still updates existing ones, and counts the refusals.
func TestSessionsHardLimit(t *testing.T) {
	c := &fakeClock{}
	c.ns.Store(int64(1_700_000_000) * int64(time.Second))
	s := NewSessions(Config{TTL: time.Hour, Capacity: 8, Headroom: 2, Now: c.Now})
	s.sweepMu.Lock() // the background drop waits for this
	for i := range 20 {
		c.Advance(time.Second)
		s.Set([]byte("k"+strconv.Itoa(i)), uint32(i))
	}
	if s.Len() != 12 || s.Refused() != 8 {
		t.Fatalf("Len %d, Refused %d; want 12 and 8", s.Len(), s.Refused())
	}
	s.Set([]byte("k0"), 99) // existing key: updated, not refused
	if w, ok := s.Get([]byte("k0")); !ok || w != 99 || s.Refused() != 8 {
		t.Fatalf("update at the hard limit: %d %v, Refused %d", w, ok, s.Refused())
	}
	s.sweepMu.Unlock()
	s.bg.Wait()
	if s.Len() != 8 {
		t.Fatalf("after the drop: Len %d, want 8", s.Len())
	}
}

func TestSessionsRemoveWorker(t *testing.T) {
	f := func(remove uint32, wantDropped int, want ...string) {
		t.Helper()
		s, _ := newTestSessions(0, 0)
		for i, w := range []uint32{1, 2, 1, 3, 1} {
			s.Set([]byte("k"+strconv.Itoa(i)), w)
		}
		if got := s.RemoveWorker(remove); got != wantDropped {
			t.Fatalf("RemoveWorker(%d) dropped %d, want %d", remove, got, wantDropped)
		}
		assertSnapshot(t, s, want...)
		if got := s.RemoveWorker(remove); got != 0 {
			t.Fatalf("second RemoveWorker(%d) dropped %d, want 0", remove, got)
		}
	}
	f(1, 3, "k1=2", "k3=3")
	f(2, 1, "k0=1", "k2=1", "k3=3", "k4=1")
	f(3, 1, "k0=1", "k1=2", "k2=1", "k4=1")
	f(4, 0, "k0=1", "k1=2", "k2=1", "k3=3", "k4=1")
}

func TestSessionsSweepValid(t *testing.T) {
	f := func(valid func(uint32) bool, wantDropped int, want ...string) {
		t.Helper()
		s, c := newTestSessions(time.Hour, 0)
		s.Set([]byte("old"), 1) // expires
		c.Advance(30 * time.Minute)
		for i, w := range []uint32{1, 2, 3, 2} {
			s.Set([]byte("k"+strconv.Itoa(i)), w)
		}
		c.Advance(31 * time.Minute)
		if got := s.Sweep(valid); got != wantDropped {
			t.Fatalf("Sweep dropped %d, want %d", got, wantDropped)
		}
		assertSnapshot(t, s, want...)
	}
	f(nil, 1, "k0=1", "k1=2", "k2=3", "k3=2")
	f(func(uint32) bool { return true }, 1, "k0=1", "k1=2", "k2=3", "k3=2")
	f(func(w uint32) bool { return w != 2 }, 3, "k0=1", "k2=3")
	f(func(w uint32) bool { return w == 1 }, 4, "k0=1")
	f(func(uint32) bool { return false }, 5)
}

func TestSessionsPerWorker(t *testing.T) {
	s, c := newTestSessions(time.Hour, 0)
	s.Set([]byte("old"), 9)
	c.Advance(time.Hour + 1) // "old" expired: not counted
	for i, w := range []uint32{1, 2, 1, 3, 1} {
		s.Set([]byte("k"+strconv.Itoa(i)), w)
	}
	got := s.PerWorker()
	want := map[uint32]int{1: 3, 2: 1, 3: 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("PerWorker: got %v, want %v", got, want)
	}
}

func TestSessionsRangeStops(t *testing.T) {
	s, _ := newTestSessions(0, 0)
	for i := range 100 {
		s.Set([]byte("k"+strconv.Itoa(i)), 1)
	}
	calls := 0
	s.Range(func(string, uint32, int64) bool {
		calls++
		return calls < 3
	})
	if calls != 3 {
		t.Fatalf("Range called f %d times after false, want 3", calls)
	}
}

func TestSessionsDefaults(t *testing.T) {
	s := NewSessions(Config{})
	if s.ttl != int64(time.Hour) || s.capacity != 0 {
		t.Fatalf("defaults: ttl %v capacity %d", time.Duration(s.ttl), s.capacity)
	}
	before := time.Now().UnixNano()
	s.Set([]byte("a"), 1)
	s.Range(func(_ string, _ uint32, la int64) bool {
		if la < before || la > time.Now().UnixNano() {
			t.Fatalf("wall clock lastAccess %d out of range", la)
		}
		return true
	})
	assertGet(t, s, "a", 1, true)
}

// TestSessionsInterleavings replays, step by step, the interleavings that
// the removal protocol must get right (the stress tests below rarely hit
// these windows on a small machine).
func TestSessionsInterleavings(t *testing.T) {
	load := func(s *Sessions, key string) *entry {
		t.Helper()
		e, ok := s.m.Load(key)
		if !ok {
			t.Fatalf("%q not in the map", key)
		}
		return e
	}

	// RemoveWorker(1) reads the entry (worker 1), then Set(k, 2) rebinds it
	// at the same instant, then RemoveWorker tries to drop it: it must not.
	s, _ := newTestSessions(time.Hour, 0)
	s.Set([]byte("k"), 1)
	e := load(s, "k")
	la := e.lastAccess.Load()
	if e.worker.Load() != 1 {
		t.Fatal("setup")
	}
	s.Set([]byte("k"), 2)
	if s.kill("k", e, la) {
		t.Fatalf("a removal judged on worker 1 dropped the entry rebound to 2")
	}
	assertGet(t, s, "k", 2, true)

	// Sweep judges the entry expired, then Set refreshes it, then Sweep
	// tries to drop it: it must not.
	s, c := newTestSessions(time.Hour, 0)
	s.Set([]byte("k"), 1)
	c.Advance(time.Hour + 1)
	e = load(s, "k")
	la = e.lastAccess.Load()
	if !s.expired(la, c.Now()) {
		t.Fatal("setup")
	}
	s.Set([]byte("k"), 1)
	if s.kill("k", e, la) {
		t.Fatalf("a removal judged on an old access dropped the refreshed entry")
	}
	assertGet(t, s, "k", 1, true)

	// Set loads the entry, the sweep kills it (not yet removed from the
	// map), then Set updates: Set must notice and insert a fresh entry.
	s, _ = newTestSessions(time.Hour, 0)
	s.Set([]byte("k"), 1)
	e = load(s, "k")
	e.lastAccess.Store(dead) // killed, removal pending
	s.Set([]byte("k"), 2)
	if e2 := load(s, "k"); e2 == e {
		t.Fatalf("Set updated a dead entry in place")
	}
	assertGet(t, s, "k", 2, true)
	// The pending removal then finds the replacement and keeps it.
	s.remove("k", e)
	assertGet(t, s, "k", 2, true)
	if s.Len() != 1 {
		t.Fatalf("Len %d, want 1", s.Len())
	}

	// Get on a dead entry misses.
	s, _ = newTestSessions(time.Hour, 0)
	s.Set([]byte("k"), 1)
	load(s, "k").lastAccess.Store(dead)
	assertGet(t, s, "k", 0, false)
}

// TestSessionsRebindVsRemoveWorker races Set rebinding a key to worker 2
// against RemoveWorker(1): the rebound entry must always survive, even when
// the clock does not move.
func TestSessionsRebindVsRemoveWorker(t *testing.T) {
	s, _ := newTestSessions(time.Hour, 0)
	key := []byte("k")
	for i := range 2000 {
		s.Set(key, 1)
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; s.Set(key, 2) })
		wg.Go(func() { <-start; s.RemoveWorker(1) })
		close(start)
		wg.Wait()
		assertGet(t, s, "k", 2, true)
		if s.Len() != 1 {
			t.Fatalf("iteration %d: Len %d, want 1", i, s.Len())
		}
	}
}

// TestSessionsRefreshVsSweep races Set refreshing an expired entry against
// Sweep: whichever wins, the key must end up mapped (refreshed and kept, or
// dropped and inserted again), never lost.
func TestSessionsRefreshVsSweep(t *testing.T) {
	s, c := newTestSessions(time.Hour, 0)
	key := []byte("k")
	for i := range 2000 {
		s.Set(key, 1)
		c.Advance(time.Hour + 1) // expired
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; s.Set(key, 1) })
		wg.Go(func() { <-start; s.Sweep(nil) })
		close(start)
		wg.Wait()
		assertGet(t, s, "k", 1, true)
		if s.Len() != 1 {
			t.Fatalf("iteration %d: Len %d, want 1", i, s.Len())
		}
	}
}

// TestSessionsConcurrentCapacity churns new keys past 2×Capacity from many
// goroutines (Set starts background drops) while Sweep runs too.
func TestSessionsConcurrentCapacity(t *testing.T) {
	const capacity = 50
	s, c := newTestSessions(time.Hour, capacity)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			key := make([]byte, 0, 16)
			for i := range 3000 {
				c.Advance(1)
				key = strconv.AppendInt(append(key[:0], byte('a'+g)), int64(i), 10)
				s.Set(key, uint32(g))
				s.Get(key)
				if i%500 == 0 {
					s.Sweep(nil)
				}
			}
		})
	}
	wg.Wait()
	s.bg.Wait()
	s.Sweep(nil)
	if s.Len() != capacity || len(snapshot(s)) != capacity {
		t.Fatalf("after final Sweep: Len %d, entries %d; want %d", s.Len(), len(snapshot(s)), capacity)
	}
}

func TestSessionsConcurrent(t *testing.T) {
	s, c := newTestSessions(time.Hour, 500)
	const (
		shared  = 64 // keys every goroutine writes, workers 1..8
		owners  = 4  // goroutines that own their keys, worker 100+g
		mixers  = 4
		rounds  = 2000
		ownKeys = 32
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Value

	// Mixers: Get/Set/Delete on shared keys with workers 1..8.
	for g := range mixers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			key := make([]byte, 0, 16)
			for range rounds {
				key = strconv.AppendInt(key[:0], int64(r.IntN(shared)), 10)
				switch r.IntN(4) {
				case 0, 1:
					if w, ok := s.Get(key); ok && (w < 1 || w > 8) {
						bad.Store(fmt.Sprintf("shared key %s has worker %d", key, w))
					}
				case 2:
					s.Set(key, uint32(1+r.IntN(8)))
				case 3:
					s.Delete(key)
				}
			}
		})
	}
	// Owners: a key only they write must read back exactly what they set,
	// whatever the sweeps and removals of workers 1..8 do around it.
	for g := range owners {
		wg.Go(func() {
			w := uint32(100 + g)
			key := make([]byte, 0, 16)
			for i := range rounds {
				key = append(strconv.AppendInt(append(key[:0], "own-"...), int64(g), 10), '-')
				key = strconv.AppendInt(key, int64(i%ownKeys), 10)
				s.Set(key, w)
				if got, ok := s.Get(key); !ok || got != w {
					bad.Store(fmt.Sprintf("owner %d: Get(%s) = (%d, %v) right after Set", g, key, got, ok))
				}
				if i%7 == 0 {
					s.Delete(key)
					if _, ok := s.Get(key); ok {
						bad.Store(fmt.Sprintf("owner %d: Get(%s) hit after Delete", g, key))
					}
				}
			}
		})
	}
	// Maintenance: sweeps with a filter that rejects worker 3, removals of
	// workers 1..8, a clock that moves, Len/Range/PerWorker readers.
	var maint sync.WaitGroup
	maint.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			c.Advance(time.Millisecond)
			s.Sweep(func(w uint32) bool { return w != 3 })
			s.RemoveWorker(uint32(1 + i%8))
			_ = s.Len()
			_ = s.PerWorker()
			s.Range(func(string, uint32, int64) bool { return true })
		}
	})
	wg.Wait()
	close(stop)
	maint.Wait()
	s.bg.Wait()
	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	// The count matches the map.
	n := 0
	s.Range(func(string, uint32, int64) bool { n++; return true })
	if n != s.Len() {
		t.Fatalf("Len %d, Range saw %d", s.Len(), n)
	}
	// After removing every shared worker only owner entries remain.
	for w := uint32(1); w <= 8; w++ {
		s.RemoveWorker(w)
	}
	for k, w := range s.PerWorker() {
		if k < 100 {
			t.Fatalf("worker %d still has %d entries", k, w)
		}
	}
}
