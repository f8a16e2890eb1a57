package radix

import (
	"strings"
	"testing"
)

func matchEach(tr *Tree, key string) map[uint32]int {
	got := map[uint32]int{}
	tr.MatchEach([]byte(key), 0, func(w uint32, n int) {
		if _, dup := got[w]; dup {
			panic("worker reported twice")
		}
		got[w] = n
	})
	return got
}

func TestMatchEachReportsEveryHolderOnce(t *testing.T) {
	tr := newTestTree(0, 0)
	tr.Insert([]byte("system prompt. user: a"), 1)
	tr.Insert([]byte("system prompt. user: b and more"), 2)
	tr.Insert([]byte("system"), 3)
	tr.Insert([]byte("other"), 4)
	want := map[uint32]int{1: 21, 2: 26, 3: 6} // 1 diverges inside its leaf
	got := matchEach(tr, "system prompt. user: b and")
	if len(got) != len(want) {
		t.Fatalf("MatchEach = %v, want %v", got, want)
	}
	for w, n := range want {
		if got[w] != n {
			t.Fatalf("MatchEach = %v, want %v", got, want)
		}
	}
	if got := matchEach(tr, "nothing"); len(got) != 0 {
		t.Fatalf("MatchEach on an unknown key = %v", got)
	}
	// Agrees with Match restricted to each worker.
	for _, key := range []string{"system prompt. user: a", "syst", "system prompt. user: b and more, and more", "oth"} {
		got := matchEach(tr, key)
		for w := uint32(1); w <= 4; w++ {
			if m := tr.Match([]byte(key), only(w)); m.Len != got[w] {
				t.Fatalf("key %q worker %d: MatchEach %d, Match %d", key, w, got[w], m.Len)
			}
		}
	}
}

func TestHoldReportsPriorHoldAndTouchesOnlyWhenFull(t *testing.T) {
	now, clock := counterClock()
	tr := New(Config{Now: now})
	tr.Insert([]byte("abcdef"), 1) // stamp 1
	stamp1 := clock.Load()
	held, at, full := tr.Hold([]byte("abcdefgh"), 1)
	if held != 6 || at != stamp1 || full {
		t.Fatalf("Hold(longer key) = %d, %d, %v; want 6, %d, false", held, at, full, stamp1)
	}
	if clock.Load() != stamp1 {
		t.Fatal("a partial hold read the clock (stamps refreshed)")
	}
	held, at, full = tr.Hold([]byte("abc"), 1)
	if held != 3 || at != stamp1 || !full {
		t.Fatalf("Hold(prefix) = %d, %d, %v; want 3, %d, true", held, at, full, stamp1)
	}
	refreshed := clock.Load()
	if _, at, _ = tr.Hold([]byte("abc"), 1); at != refreshed {
		t.Fatalf("the full hold did not refresh the stamp: %d, want %d", at, refreshed)
	}
	if held, at, full = tr.Hold([]byte("abc"), 2); held != 0 || at != 0 || full {
		t.Fatalf("Hold by a non-holder = %d, %d, %v", held, at, full)
	}
	if _, _, full = tr.Hold(nil, 2); !full {
		t.Fatal("the empty key is held by everyone")
	}
}

// InsertAt and HoldAt stamp with the caller's reading, never the clock.
func TestStampsAtTheCallersTime(t *testing.T) {
	now, clock := counterClock()
	tr := New(Config{Now: now})
	tr.InsertAt([]byte("abcdef"), 1, 1000)
	if _, at, _ := tr.Hold([]byte("abcdef"), 1); at != 1000 {
		t.Fatalf("InsertAt stamped %d, want 1000", at)
	}
	if _, _, full := tr.HoldAt([]byte("abc"), 1, 2000); !full {
		t.Fatal("setup")
	}
	if _, at, _ := tr.Hold([]byte("abc"), 1); at != 2000 {
		t.Fatalf("HoldAt stamped %d, want 2000", at)
	}
	before := clock.Load()
	tr.HoldAt([]byte("abcdef"), 1, 3000)
	tr.InsertAt([]byte("xyz"), 1, 3000)
	if clock.Load() != before {
		t.Fatal("HoldAt or InsertAt read the clock")
	}
}

// TestEvictOlderDropsWhatTheWorkerNoLongerHolds: the LRU correction drops
// w's nodes last used at or before the cutoff, keeps newer ones and shared
// ancestors touched later, and leaves other workers alone.
func TestEvictOlderDropsWhatTheWorkerNoLongerHolds(t *testing.T) {
	now, clock := counterClock()
	tr := New(Config{Now: now})
	sys := strings.Repeat("s", 100)
	tr.Insert([]byte(sys+"old session"), 1)
	tr.Insert([]byte(sys+"old session"), 2)
	cut := clock.Load()
	tr.Insert([]byte(sys+"new session"), 1)
	before := tr.WorkerChars(1)
	tr.EvictOlder(1, cut)
	checkTree(t, tr)
	if m := tr.Match([]byte(sys+"old session"), only(1)); m.Len != len(sys) {
		t.Fatalf("w1 still holds %d chars of the old session (want only the shared %d)", m.Len, len(sys))
	}
	if m := tr.Match([]byte(sys+"new session"), only(1)); m.Len != len(sys)+len("new session") {
		t.Fatalf("w1 lost the newer session: %d", m.Len)
	}
	if m := tr.Match([]byte(sys+"old session"), only(2)); m.Len != len(sys)+len("old session") {
		t.Fatalf("w2 lost its hold: %d", m.Len)
	}
	if got, want := tr.WorkerChars(1), before-len("old session"); got != want {
		t.Fatalf("w1 chars %d, want %d", got, want)
	}
	tr.EvictOlder(1, clock.Load())
	if tr.WorkerChars(1) != 0 || len(tr.Workers()) != 1 {
		t.Fatalf("everything older than now: w1 keeps %d chars, workers %v", tr.WorkerChars(1), tr.Workers())
	}
	checkTree(t, tr)
	tr.EvictOlder(9, clock.Load()) // unknown worker: nothing
}

// MatchEach's shared part: where the tree branches at least fanout ways,
// the key's own divergence counting as one way and a key running on past
// a leaf (the next turn of a stored conversation) as none.
func TestMatchEachSharedPart(t *testing.T) {
	tr := newTestTree(0, 0)
	const system = "system prompt. user: "
	for i, c := range []string{"alpha", "bravo", "charlie"} {
		tr.Insert([]byte(system+c+" first turn"), uint32(i+1))
	}
	shared := func(key string, fanout int) int {
		return tr.MatchEach([]byte(key), fanout, func(uint32, int) {})
	}
	for _, c := range []struct {
		key    string
		fanout int
		want   int
	}{
		{system + "delta new conversation", 4, len(system)}, // three stored ways and its own
		{system + "delta new conversation", 5, 0},           // not enough ways
		{system + "alpha first turn, second turn", 4, 0},    // the next turn of alpha: no way of its own
		{system + "alpha first turn, second turn", 3, len(system)},
		{system + "alpha fi", 1, len(system + "alpha fi")}, // fanout ≤ 1: the whole path held
		{"unrelated", 2, 0},
	} {
		if got := shared(c.key, c.fanout); got != c.want {
			t.Errorf("MatchEach(%q, fanout %d) shared = %d, want %d", c.key, c.fanout, got, c.want)
		}
	}
}

// A worker's own budget (the KV capacity its engine states): TrimWorker
// brings it to the budget less a 64th, oldest conversation first, the last
// one's tail cut and its head kept; a worker with no budget keeps all it
// holds, shared nodes included.
func TestTrimWorkerToItsBudget(t *testing.T) {
	now, _ := counterClock()
	tr := New(Config{Now: now})
	sys := strings.Repeat("s", 200)
	convs := make([]string, 5)
	for i := range convs {
		convs[i] = sys + strings.Repeat(string(rune('a'+i)), 1000)
		tr.Insert([]byte(convs[i]), 1)
		tr.Insert([]byte(sys+strings.Repeat(string(rune('A'+i)), 1000)), 2)
	}
	if tr.TrimWorker(1) {
		t.Fatal("trimmed a worker without a budget")
	}
	tr.SetWorkerBudget(1, 2560) // the system prompt and about two and a third conversations
	if tr.WorkerBudget(1) != 2560 || tr.WorkerBudget(2) != 0 {
		t.Fatal("budgets")
	}
	if !tr.TrimWorker(1) {
		t.Fatal("no trim over the budget")
	}
	checkTree(t, tr)
	want := 2560 - 2560/64
	if got := tr.WorkerChars(1); got != want {
		t.Fatalf("w1 holds %d chars, want exactly %d", got, want)
	}
	// Oldest first: a, b went; c is cut to its head; d, e are whole.
	held := []int{200, 200, 200 + want - 200 - 2000, 1200, 1200}
	for i, c := range convs {
		if m := tr.Match([]byte(c), only(1)); m.Len != held[i] {
			t.Errorf("w1 holds %d chars of conversation %d, want %d", m.Len, i, held[i])
		}
		if m := tr.Match([]byte(sys+strings.Repeat(string(rune('A'+i)), 1000)), only(2)); m.Len != len(c) {
			t.Errorf("w2 holds %d chars of its conversation %d, want all", m.Len, i)
		}
	}
	if tr.WorkerChars(2) != 200+5*1000 {
		t.Fatalf("w2 holds %d chars", tr.WorkerChars(2))
	}
	if tr.TrimWorker(1) {
		t.Fatal("trimmed again under the budget")
	}
	// Touching conversation a again makes it the newest: a new trim drops c's head, then d.
	tr.Insert([]byte(convs[0]), 1)
	tr.TrimWorker(1)
	checkTree(t, tr)
	if m := tr.Match([]byte(convs[0]), only(1)); m.Len != len(convs[0]) {
		t.Fatalf("the newest conversation went: %d", m.Len)
	}
	if got := tr.WorkerChars(1); got != want {
		t.Fatalf("w1 holds %d chars after the second trim, want %d", got, want)
	}
}
