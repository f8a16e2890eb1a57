package radix

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// counterClock returns a clock that ticks by one per call, so stamps are
// unique and ordered by call.
func counterClock() (func() int64, *atomic.Int64) {
	var c atomic.Int64
	return func() int64 { return c.Add(1) }, &c
}

func newTestTree(maxChars, evictTo int) *Tree {
	now, _ := counterClock()
	return New(Config{MaxCharsPerWorker: maxChars, EvictToChars: evictTo, Now: now})
}

func only(ws ...uint32) func(uint32) bool {
	return func(w uint32) bool { return slices.Contains(ws, w) }
}

func TestMatchBasic(t *testing.T) {
	tr := newTestTree(0, 0)
	f := func(key string, eligible func(uint32) bool, want Match) {
		t.Helper()
		if got := tr.Match([]byte(key), eligible); got != want {
			t.Fatalf("Match(%q) = %+v; want %+v", key, got, want)
		}
		checkTree(t, tr)
	}
	f("abc", nil, Match{})
	f("", nil, Match{})

	tr.Insert([]byte("hello world"), 1)
	f("hello world", nil, Match{11, 1, 11, 1})
	f("hello there", nil, Match{6, 1, 6, 1}) // diverges mid-edge
	f("help", nil, Match{3, 1, 3, 1})
	f("hello world and more", nil, Match{11, 1, 11, 1})
	f("hello", nil, Match{5, 1, 5, 1})
	f("x", nil, Match{})
	f("", nil, Match{})
	f("hello world", only(2), Match{0, 0, 11, 1})
	f("hello world", only(1), Match{11, 1, 11, 1})
}

func TestInsertExtendingKeys(t *testing.T) {
	tr := newTestTree(0, 0)
	tr.Insert([]byte("abc"), 1)
	tr.Insert([]byte("abcdef"), 2)
	f := func(key string, eligible func(uint32) bool, want Match) {
		t.Helper()
		if got := tr.Match([]byte(key), eligible); got != want {
			t.Fatalf("Match(%q) = %+v; want %+v", key, got, want)
		}
	}
	f("abcdefg", nil, Match{6, 2, 6, 2})
	f("abcdefg", only(1), Match{3, 1, 6, 2})
	f("abcd", only(1), Match{3, 1, 4, 2})
	f("abc", nil, Match{3, 2, 3, 2}) // 2 refreshed "abc" last
	f("abc", only(1), Match{3, 1, 3, 2})
	wantChars(t, tr, 6, map[uint32]int{1: 3, 2: 6})

	// Growing one conversation turn by turn: one new leaf per turn.
	tr.Insert([]byte("abcdefghi"), 2)
	tr.Insert([]byte("abcdefghijkl"), 2)
	f("abcdefghijklmno", nil, Match{12, 2, 12, 2})
	wantChars(t, tr, 12, map[uint32]int{1: 3, 2: 12})
	checkTree(t, tr)
}

func TestDivergenceMidEdge(t *testing.T) {
	tr := newTestTree(0, 0)
	tr.Insert([]byte("abcdef"), 1)
	tr.Insert([]byte("abcxyz"), 2)
	wantChars(t, tr, 9, map[uint32]int{1: 6, 2: 6})
	f := func(key string, eligible func(uint32) bool, want Match) {
		t.Helper()
		if got := tr.Match([]byte(key), eligible); got != want {
			t.Fatalf("Match(%q) = %+v; want %+v", key, got, want)
		}
	}
	f("abcd", nil, Match{4, 1, 4, 1})
	f("abcx", nil, Match{4, 2, 4, 2})
	f("abc", nil, Match{3, 2, 3, 2}) // shared node: 2 is more recent
	f("ab", nil, Match{2, 2, 2, 2})
	f("abcxyz", only(1), Match{3, 1, 6, 2})
	f("abq", nil, Match{2, 2, 2, 2})
	// A key ending mid-edge splits it, without changing the characters held.
	tr.Insert([]byte("abcde"), 3)
	wantChars(t, tr, 9, map[uint32]int{1: 6, 2: 6, 3: 5})
	f("abcdef", nil, Match{6, 1, 6, 1})
	f("abcdeq", nil, Match{5, 3, 5, 3})
	checkTree(t, tr)
}

func TestMostRecentHolderWins(t *testing.T) {
	tr := newTestTree(0, 0)
	k := []byte("system prompt + tools")
	tr.Insert(k, 1)
	tr.Insert(k, 2)
	tr.Insert(k, 3)
	f := func(eligible func(uint32) bool, want uint32) {
		t.Helper()
		if got := tr.Match(k, eligible); got.Worker != want || got.Len != len(k) {
			t.Fatalf("Match = %+v; want worker %d len %d", got, want, len(k))
		}
	}
	f(nil, 3)
	f(only(1, 2), 2)
	if !tr.Touch(k, 1) {
		t.Fatal("Touch(k, 1) = false")
	}
	f(nil, 1)
	f(only(2, 3), 3)
	tr.Insert(k, 2) // already held: a refresh, like Touch
	f(nil, 2)
	if tr.Chars() != len(k) {
		t.Fatalf("Chars = %d; want %d", tr.Chars(), len(k))
	}

	// A split refreshes only the part of the edge the new key covers.
	tr = newTestTree(0, 0)
	tr.Insert([]byte("abcdef"), 1)
	tr.Insert([]byte("abcdef"), 2)
	tr.Insert([]byte("abcxyz"), 1)
	if got := tr.Match([]byte("abcdef"), nil); got != (Match{6, 2, 6, 2}) {
		t.Fatalf("split refreshed the tail: %+v", got)
	}
	if got := tr.Match([]byte("abc"), nil); got != (Match{3, 1, 3, 1}) {
		t.Fatalf("split did not refresh the head: %+v", got)
	}

	// Equal stamps: the lower id wins, whatever the insert order.
	tie := New(Config{Now: func() int64 { return 42 }})
	tie.Insert(k, 5)
	tie.Insert(k, 3)
	tie.Insert(k, 9)
	if got := tie.Match(k, nil); got.Worker != 3 || got.AnyWorker != 3 {
		t.Fatalf("tie: %+v; want worker 3", got)
	}
	if got := tie.Match(k, only(5, 9)); got.Worker != 5 {
		t.Fatalf("tie eligible: %+v; want worker 5", got)
	}
}

func TestEligibleDeepestEligibleNode(t *testing.T) {
	tr := newTestTree(0, 0)
	tr.Insert([]byte("sys|conv1|turn1"), 1)
	tr.Insert([]byte("sys|conv1|turn1|turn2"), 2)
	tr.Insert([]byte("sys|conv2"), 3)
	f := func(key string, eligible func(uint32) bool, want Match) {
		t.Helper()
		if got := tr.Match([]byte(key), eligible); got != want {
			t.Fatalf("Match(%q) = %+v; want %+v", key, got, want)
		}
	}
	q := "sys|conv1|turn1|turn2|turn3"
	f(q, nil, Match{21, 2, 21, 2})
	f(q, only(1), Match{15, 1, 21, 2})
	f(q, only(3), Match{8, 3, 21, 2})
	f(q, only(1, 3), Match{15, 1, 21, 2})
	f(q, only(4), Match{0, 0, 21, 2})
	f("sys|conv", only(1, 3), Match{8, 3, 8, 3})
}

func TestRemoveWorkerPrunes(t *testing.T) {
	tr := newTestTree(0, 0)
	tr.Insert([]byte("abcdef"), 1)
	tr.Insert([]byte("abcxyz"), 2)
	tr.Insert([]byte("abcxyz123"), 2)
	tr.RemoveWorker(2)
	checkTree(t, tr)
	wantChars(t, tr, 6, map[uint32]int{1: 6})
	if got := tr.Match([]byte("abcxyz"), nil); got != (Match{3, 1, 3, 1}) {
		t.Fatalf("after remove: %+v", got)
	}
	if got := tr.Workers(); !slices.Equal(got, []uint32{1}) {
		t.Fatalf("Workers = %v", got)
	}
	if tr.Touch([]byte("abcxyz"), 2) {
		t.Fatal("Touch of removed worker = true")
	}
	tr.RemoveWorker(2) // idempotent
	tr.RemoveWorker(7) // unknown
	tr.RemoveWorker(1)
	checkTree(t, tr)
	if tr.Chars() != 0 || len(tr.root.Load().children) != 0 || len(tr.Workers()) != 0 {
		t.Fatalf("not empty: chars %d children %d workers %v", tr.Chars(), len(tr.root.Load().children), tr.Workers())
	}
	// Usable again after emptying.
	tr.Insert([]byte("abc"), 1)
	if got := tr.Match([]byte("abcd"), nil); got != (Match{3, 1, 3, 1}) {
		t.Fatalf("reinsert: %+v", got)
	}
}

func TestTouch(t *testing.T) {
	tr := newTestTree(0, 0)
	tr.Insert([]byte("abcdef"), 1)
	tr.Insert([]byte("abcxyz"), 2)
	f := func(key string, w uint32, want bool) {
		t.Helper()
		if got := tr.Touch([]byte(key), w); got != want {
			t.Fatalf("Touch(%q, %d) = %v; want %v", key, w, got, want)
		}
	}
	f("abcdef", 1, true)
	f("abcde", 1, true) // mid-edge prefix of a held key
	f("abc", 1, true)
	f("abcdefg", 1, false) // extends past what is held
	f("abcxyz", 1, false)  // held by another worker only
	f("abd", 1, false)
	f("zzz", 1, false)
	f("", 1, true)
	f("abcxyz", 2, true)

	// A failed Touch changes no stamp; a successful one refreshes the path.
	if got := tr.Match([]byte("abc"), nil); got.Worker != 2 {
		t.Fatalf("before: %+v", got)
	}
	f("abcdefg", 1, false)
	if got := tr.Match([]byte("abc"), nil); got.Worker != 2 {
		t.Fatalf("failed Touch refreshed: %+v", got)
	}
	f("abcd", 1, true)
	if got := tr.Match([]byte("abc"), nil); got.Worker != 1 {
		t.Fatalf("Touch did not refresh the shared prefix: %+v", got)
	}
}

func TestInsertDoesNotAliasKey(t *testing.T) {
	tr := newTestTree(0, 0)
	buf := []byte("request body one")
	tr.Insert(buf, 1)
	copy(buf, "XXXXXXXXXXXXXXXX")
	if got := tr.Match([]byte("request body one"), nil); got.Len != 16 {
		t.Fatalf("tree aliases the caller's buffer: %+v", got)
	}
}

func TestEvictLRULeaves(t *testing.T) {
	tr := newTestTree(10, 10) // exact: evict until within budget
	tr.Insert([]byte("aaaa"), 1)
	tr.Insert([]byte("bbbb"), 1)
	tr.Insert([]byte("cccc"), 1) // 12 > 10: "aaaa" is the LRU leaf
	wantChars(t, tr, 8, map[uint32]int{1: 8})
	if tr.Touch([]byte("aaaa"), 1) || !tr.Touch([]byte("bbbb"), 1) {
		t.Fatal("wrong leaf evicted")
	}
	tr.Insert([]byte("dddd"), 1) // "cccc" is now the LRU leaf
	if tr.Touch([]byte("cccc"), 1) || !tr.Touch([]byte("bbbb"), 1) || !tr.Touch([]byte("dddd"), 1) {
		t.Fatal("wrong leaf evicted after Touch")
	}
	checkTree(t, tr)

	// Only leaves are evicted: an inner node and its child carry the same
	// stamp (a path is refreshed as a whole), and the child goes first.
	tr = newTestTree(6, 6)
	tr.Insert([]byte("abcd"), 1) // abcd: 1@1
	tr.Insert([]byte("abXY"), 2) // ab: 1@1 2@2 -> cd: 1@1, XY: 2@2
	tr.Insert([]byte("zzz"), 1)  // 7 > 6: w1 leaves cd@1, zzz@3 -> evict cd
	wantChars(t, tr, 7, map[uint32]int{1: 5, 2: 4})
	if got := tr.Match([]byte("abcd"), only(1)); got.Len != 2 || got.Worker != 1 {
		t.Fatalf("after evicting cd: %+v", got)
	}
	tr.Insert([]byte("pq"), 1) // 7 > 6: w1 leaves ab@1, zzz@3, pq@4 -> evict ab
	wantChars(t, tr, 9, map[uint32]int{1: 5, 2: 4})
	if tr.Touch([]byte("ab"), 1) || !tr.Touch([]byte("zzz"), 1) || !tr.Touch([]byte("abXY"), 2) {
		t.Fatal("wrong leaf evicted")
	}
	checkTree(t, tr)

	// Eviction is per worker: another holder keeps the node.
	tr = newTestTree(4, 4)
	tr.Insert([]byte("aaaa"), 1)
	tr.Insert([]byte("aaaa"), 2)
	tr.Insert([]byte("bbbb"), 1) // evicts w1's "aaaa"; w2 still holds it
	wantChars(t, tr, 8, map[uint32]int{1: 4, 2: 4})
	if got := tr.Match([]byte("aaaa"), nil); got != (Match{4, 2, 4, 2}) {
		t.Fatalf("shared node: %+v", got)
	}
	checkTree(t, tr)

	// A key longer than the budget evicts itself down to the budget: the
	// deepest nodes go first, the oldest turns stay.
	tr = newTestTree(5, 5)
	tr.Insert([]byte("abc"), 1)
	tr.Insert([]byte("abcdef"), 1)
	wantChars(t, tr, 3, map[uint32]int{1: 3})
	checkTree(t, tr)
}

func TestEvictToCharsDefault(t *testing.T) {
	tr := newTestTree(6400, 0) // default: down to 6400 - 100
	for i := 0; i < 300; i++ {
		tr.Insert(fmt.Appendf(nil, "%03d%061d", i, 0), 1)
		if c := tr.WorkerChars(1); c > 6400 {
			t.Fatalf("over budget: %d", c)
		}
	}
	if c := tr.WorkerChars(1); c < 6400-100-64 {
		t.Fatalf("evicted too much: %d", c)
	}
	checkTree(t, tr)
}

// TestSplitCompaction checks that dropping the tail of a split edge does not
// leave its bytes pinned by the surviving head.
func TestSplitCompaction(t *testing.T) {
	tr := newTestTree(0, 0)
	prefix := strings.Repeat("p", 1000)
	tr.Insert([]byte(prefix+strings.Repeat("x", 100000)), 1)
	tr.Insert([]byte(prefix+"yyyy"), 2) // splits w1's label: prefix | x...
	head := tr.root.Load().children[0]
	if len(head.label) != 1000 || cap(head.label) <= 1000 {
		t.Fatalf("expected a shared split label, got len %d cap %d", len(head.label), cap(head.label))
	}
	tr.RemoveWorker(1)
	head = tr.root.Load().children[0]
	if len(head.label) != 1000 || cap(head.label) != 1000 {
		t.Fatalf("head still pins the dropped tail: len %d cap %d", len(head.label), cap(head.label))
	}
	checkTree(t, tr)

	// A chain of three views of one buffer: dropping the lowest compacts both.
	tr = newTestTree(0, 0)
	tr.Insert([]byte("aaaabbbbcccc"), 1)
	tr.Insert([]byte("aaaaX"), 2)
	tr.Insert([]byte("aaaabbbbY"), 3)
	tr.RemoveWorker(1)
	checkTree(t, tr)
	var walk func(n *node)
	walk = func(n *node) {
		for _, c := range n.children {
			if cap(c.label) != len(c.label) && len(c.children) == 0 {
				t.Fatalf("leaf %q pins %d dead bytes", c.label, cap(c.label)-len(c.label))
			}
			walk(c)
		}
	}
	walk(tr.root.Load())
	if got := tr.Match([]byte("aaaabbbbY"), nil); got != (Match{9, 3, 9, 3}) {
		t.Fatalf("%+v", got)
	}
}

func TestCommonPrefix(t *testing.T) {
	naive := func(a, b []byte) int {
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		return i
	}
	base := bytes.Repeat([]byte("0123456789abcdef"), 100)
	for _, n := range []int{0, 1, 7, 8, 9, 63, 64, 255, 256, 257, 511, 1000, 1600} {
		for _, d := range []int{0, 1, 5, 7, 8, 100, 255, 256, 300, 999, 1599} {
			a := base[:n]
			b := slices.Clone(base)
			if d < len(b) {
				b[d] ^= 0xff
			}
			for _, bb := range [][]byte{b, b[:n/2]} {
				if got, want := commonPrefix(a, bb), naive(a, bb); got != want {
					t.Fatalf("n=%d d=%d: got %d want %d", n, d, got, want)
				}
				if got, want := matchEdge(a, bb), naive(a, bb); got != want {
					t.Fatalf("matchEdge n=%d d=%d: got %d want %d", n, d, got, want)
				}
			}
		}
	}
}

func wantChars(t *testing.T, tr *Tree, total int, per map[uint32]int) {
	t.Helper()
	if tr.Chars() != total {
		t.Fatalf("Chars = %d; want %d", tr.Chars(), total)
	}
	for w, c := range per {
		if got := tr.WorkerChars(w); got != c {
			t.Fatalf("WorkerChars(%d) = %d; want %d", w, got, c)
		}
	}
}

// checkTree verifies the structural invariants of the published tree and
// that the incremental accounting equals the sums computed by a full walk.
func checkTree(t testing.TB, tr *Tree) {
	t.Helper()
	if err := verifyTree(tr); err != nil {
		t.Fatal(err)
	}
}

func verifyTree(tr *Tree) error {
	per := map[uint32]int{}
	perB := map[uint32]int{}
	total := 0
	var walk func(n *node, depth int, parent *node) error
	walk = func(n *node, depth int, parent *node) error {
		if parent != nil {
			if len(n.label) == 0 {
				return fmt.Errorf("empty label at depth %d", depth)
			}
			if len(n.holders) == 0 {
				return fmt.Errorf("node %q at depth %d has no holder", n.label, depth)
			}
			total += len(n.label)
		}
		if len(n.keys) != len(n.children) {
			return fmt.Errorf("keys/children length mismatch at depth %d", depth)
		}
		for i := range n.holders {
			if i > 0 && n.holders[i-1].w >= n.holders[i].w {
				return fmt.Errorf("holders not ascending at depth %d", depth)
			}
			w := n.holders[i].w
			per[w] += len(n.label)
			perB[w] += len(n.label) + NodeOverhead
			if parent != nil && parent.holderIndex(w) < 0 && depth > len(n.label) {
				return fmt.Errorf("worker %d holds %q but not its parent", w, n.label)
			}
		}
		for i, c := range n.children {
			if i > 0 && n.keys[i-1] >= n.keys[i] {
				return fmt.Errorf("keys not ascending at depth %d", depth)
			}
			if len(c.label) == 0 || c.label[0] != n.keys[i] {
				return fmt.Errorf("key byte mismatch at depth %d", depth)
			}
			if err := walk(c, depth+len(c.label), n); err != nil {
				return err
			}
		}
		return nil
	}
	root := tr.root.Load()
	if len(root.label) != 0 || len(root.holders) != 0 {
		return fmt.Errorf("root has a label or holders")
	}
	if err := walk(root, 0, nil); err != nil {
		return err
	}
	if tr.Chars() != total {
		return fmt.Errorf("Chars = %d; walk says %d", tr.Chars(), total)
	}
	var ws []uint32
	for w, c := range per {
		if tr.WorkerChars(w) != c {
			return fmt.Errorf("WorkerChars(%d) = %d; walk says %d", w, tr.WorkerChars(w), c)
		}
		if tr.WorkerBytes(w) != perB[w] {
			return fmt.Errorf("WorkerBytes(%d) = %d; walk says %d", w, tr.WorkerBytes(w), perB[w])
		}
		if c > 0 {
			ws = append(ws, w)
		}
	}
	slices.Sort(ws)
	if got := tr.Workers(); !slices.Equal(got, ws) {
		return fmt.Errorf("Workers = %v; walk says %v", got, ws)
	}
	return nil
}
