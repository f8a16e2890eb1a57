package radix

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// harness drives a Tree and a brute-force reference side by side.
//
// The reference is the list of (key, worker) pairs inserted and not removed;
// a query's expected Len/AnyLen is the longest common prefix with any pair
// key (of an eligible worker). With eviction the tree may hold less than the
// pairs, so the expected lengths come from a dump of the tree's (path,
// holders) instead, and the pairs bound it from above: everything the tree
// says w holds must be a prefix of a key inserted for w.
type harness struct {
	tr       *Tree
	budget   int // 0 = no eviction
	evictTo  int
	inBytes  bool // budget is MaxBytesPerWorker (else MaxCharsPerWorker)
	pairs    map[string]map[uint32]bool
	pool     [][]byte
	rng      *rand.Rand
	alphabet string
}

func newHarness(budget, evictTo int, seed uint64, alphabet string) *harness {
	return &harness{
		tr:       newTestTree(budget, evictTo),
		budget:   budget,
		evictTo:  evictTo,
		pairs:    map[string]map[uint32]bool{},
		pool:     [][]byte{nil},
		rng:      rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		alphabet: alphabet,
	}
}

// newKey derives a key from the pool: a prefix of a known key (a branch) or
// the whole key (an appended turn), plus a few random bytes.
func (h *harness) newKey(pick, cut, n int, long bool) []byte {
	base := h.pool[pick%len(h.pool)]
	c := len(base)
	if cut%3 != 0 && c > 0 { // branch: cut somewhere inside
		c = cut % (len(base) + 1)
	}
	if c > 1500 { // keep the brute force cheap
		c %= 1500
	}
	key := slices.Clone(base[:c])
	if long {
		n += 300
	}
	for i := 0; i < n; i++ {
		key = append(key, h.alphabet[h.rng.IntN(len(h.alphabet))])
	}
	if len(h.pool) < 64 {
		h.pool = append(h.pool, key)
	} else {
		h.pool[1+h.rng.IntN(63)] = key
	}
	return key
}

type dumpNode struct {
	path    string
	holders []uint32
}

func dumpTree(tr *Tree) []dumpNode {
	var out []dumpNode
	var walk func(n *node, path []byte)
	walk = func(n *node, path []byte) {
		for _, c := range n.children {
			p := append(slices.Clip(path), c.label...)
			d := dumpNode{path: string(p)}
			for i := range c.holders {
				d.holders = append(d.holders, c.holders[i].w)
			}
			out = append(out, d)
			walk(c, p)
		}
	}
	walk(tr.root.Load(), nil)
	return out
}

// nodeAt returns the node whose edge contains position l (1-based end) of q.
func nodeAt(tr *Tree, q []byte, l int) *node {
	n, depth := tr.root.Load(), 0
	for depth < l {
		c := n.children[n.child(q[depth])]
		depth += len(c.label)
		if depth >= l {
			return c
		}
		n = c
	}
	return nil
}

func lcp(a, b string) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

func (h *harness) insert(key []byte, w uint32) error {
	h.tr.Insert(key, w)
	if len(key) > 0 {
		if h.pairs[string(key)] == nil {
			h.pairs[string(key)] = map[uint32]bool{}
		}
		h.pairs[string(key)][w] = true
	}
	if err := h.check(); err != nil {
		return fmt.Errorf("after Insert(%q, %d): %w", key, w, err)
	}
	// The key just inserted has the newest stamps, so eviction takes every
	// other leaf of w first: it survives whole when it fits.
	fits := int64(len(key)) <= h.tr.evictTo
	if h.inBytes { // at most one node per byte
		fits = int64(len(key)*(1+NodeOverhead)) <= h.tr.evictToB
	}
	if h.budget == 0 || fits {
		if !h.tr.Touch(key, w) {
			return fmt.Errorf("Insert(%q, %d) then Touch = false", key, w)
		}
	}
	return nil
}

func (h *harness) touch(key []byte, w uint32) error {
	want := len(key) == 0
	if h.budget == 0 {
		for k, ws := range h.pairs {
			if ws[w] && strings.HasPrefix(k, string(key)) {
				want = true
			}
		}
	} else {
		for _, d := range dumpTree(h.tr) {
			if slices.Contains(d.holders, w) && strings.HasPrefix(d.path, string(key)) {
				want = true
			}
		}
	}
	if got := h.tr.Touch(key, w); got != want {
		return fmt.Errorf("Touch(%q, %d) = %v; want %v", key, w, got, want)
	}
	return nil
}

func (h *harness) remove(w uint32) error {
	h.tr.RemoveWorker(w)
	for k, ws := range h.pairs {
		delete(ws, w)
		if len(ws) == 0 {
			delete(h.pairs, k)
		}
	}
	if h.tr.WorkerChars(w) != 0 {
		return fmt.Errorf("RemoveWorker(%d): WorkerChars = %d", w, h.tr.WorkerChars(w))
	}
	if err := h.check(); err != nil {
		return fmt.Errorf("after RemoveWorker(%d): %w", w, err)
	}
	return nil
}

func (h *harness) match(q []byte, elig []uint32) error {
	var eligible func(uint32) bool
	isElig := func(uint32) bool { return true }
	if elig != nil {
		eligible = only(elig...)
		isElig = eligible
	}
	got := h.tr.Match(q, eligible)
	dump := dumpTree(h.tr)

	var wantLen, wantAny int
	if h.budget == 0 {
		for k, ws := range h.pairs {
			l := lcp(k, string(q))
			wantAny = max(wantAny, l)
			for w := range ws {
				if isElig(w) {
					wantLen = max(wantLen, l)
				}
			}
		}
	}
	var dumpLen, dumpAny int
	for _, d := range dump {
		l := lcp(d.path, string(q))
		dumpAny = max(dumpAny, l)
		if slices.ContainsFunc(d.holders, isElig) {
			dumpLen = max(dumpLen, l)
		}
	}
	if h.budget != 0 {
		wantLen, wantAny = dumpLen, dumpAny
	} else if dumpLen != wantLen || dumpAny != wantAny {
		return fmt.Errorf("tree content differs from the pairs for %q: dump %d/%d pairs %d/%d", q, dumpLen, dumpAny, wantLen, wantAny)
	}
	if got.Len != wantLen || got.AnyLen != wantAny {
		return fmt.Errorf("Match(%q, %v) = %+v; want Len %d AnyLen %d", q, elig, got, wantLen, wantAny)
	}
	// The worker: the most recent eligible holder of the node reached.
	f := func(l int, w uint32, eligible func(uint32) bool, isElig func(uint32) bool) error {
		if l == 0 {
			if w != 0 {
				return fmt.Errorf("Match(%q) = %+v: worker without a match", q, got)
			}
			return nil
		}
		n := nodeAt(h.tr, q, l)
		want, _ := n.mostRecent(eligible)
		if w != want {
			return fmt.Errorf("Match(%q, %v) = %+v: worker %d, want %d", q, elig, got, w, want)
		}
		if h.budget == 0 { // the holders of that node are exactly the pairs reaching l
			var hs, ws []uint32
			for i := range n.holders {
				hs = append(hs, n.holders[i].w)
			}
			for k, kws := range h.pairs {
				if lcp(k, string(q)) >= l {
					for w := range kws {
						if !slices.Contains(ws, w) {
							ws = append(ws, w)
						}
					}
				}
			}
			slices.Sort(ws)
			if !slices.Equal(hs, ws) {
				return fmt.Errorf("holders of %q[:%d] = %v; pairs say %v", q, l, hs, ws)
			}
		}
		return nil
	}
	if err := f(got.Len, got.Worker, eligible, isElig); err != nil {
		return err
	}
	return f(got.AnyLen, got.AnyWorker, nil, func(uint32) bool { return true })
}

// check verifies invariants and accounting, the budget, and that the tree
// holds nothing the pairs do not.
func (h *harness) check() error {
	if err := verifyTree(h.tr); err != nil {
		return err
	}
	for _, d := range dumpTree(h.tr) {
		for _, w := range d.holders {
			ok := false
			for k, ws := range h.pairs {
				if ws[w] && strings.HasPrefix(k, d.path) {
					ok = true
					break
				}
			}
			if !ok {
				return fmt.Errorf("worker %d holds %q, never inserted", w, d.path)
			}
		}
	}
	if h.budget > 0 {
		for _, w := range h.tr.Workers() {
			if c := h.tr.WorkerChars(w); c > h.budget {
				return fmt.Errorf("WorkerChars(%d) = %d > budget %d", w, c, h.budget)
			}
			if b := h.tr.WorkerBytes(w); h.inBytes && b > h.budget {
				return fmt.Errorf("WorkerBytes(%d) = %d > budget %d", w, b, h.budget)
			}
		}
	}
	return nil
}

// step performs one op decoded from the next bytes of next().
func (h *harness) step(next func() int) error {
	w := uint32(next() % 5)
	switch op := next() % 20; {
	case op < 9:
		return h.insert(h.newKey(next(), next(), 1+next()%12, next()%16 == 0), w)
	case op < 12:
		key := h.pool[next()%len(h.pool)]
		if cut := next(); cut%2 == 0 && len(key) > 0 {
			key = key[:cut%len(key)]
		}
		return h.touch(key, w)
	case op < 13:
		return h.remove(w)
	default:
		q := h.pool[next()%len(h.pool)]
		if m := next(); m%3 == 0 && len(q) > 0 { // diverge somewhere
			q = slices.Clone(q)
			q[m%len(q)] ^= 1
		} else if m%3 == 1 {
			q = append(slices.Clone(q), 'z')
		}
		var elig []uint32
		if e := next(); e%2 == 0 {
			for i := uint32(0); i < 5; i++ {
				if e>>(i+1)&1 == 1 {
					elig = append(elig, i)
				}
			}
		}
		return h.match(q, elig)
	}
}

func runReference(t *testing.T, budget, evictTo int, alphabet string, seed uint64, ops int) {
	h := newHarness(budget, evictTo, seed, alphabet)
	rng := rand.New(rand.NewPCG(seed, 1))
	next := func() int { return rng.IntN(1 << 16) }
	for i := 0; i < ops; i++ {
		if err := h.step(next); err != nil {
			t.Fatalf("seed %d op %d: %v", seed, i, err)
		}
	}
}

func TestReferenceModel(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		runReference(t, 0, 0, "ab", seed, 400)
		runReference(t, 0, 0, "abcdefgh", seed, 400)
	}
}

// runReferenceBytes is runReference with a byte budget (MaxBytesPerWorker).
func runReferenceBytes(t *testing.T, budget, evictTo int, alphabet string, seed uint64, ops int) {
	h := newHarness(budget, evictTo, seed, alphabet)
	now, _ := counterClock()
	h.tr = New(Config{MaxBytesPerWorker: budget, EvictToBytes: evictTo, Now: now})
	h.inBytes = true
	rng := rand.New(rand.NewPCG(seed, 1))
	next := func() int { return rng.IntN(1 << 16) }
	for i := 0; i < ops; i++ {
		if err := h.step(next); err != nil {
			t.Fatalf("seed %d op %d: %v", seed, i, err)
		}
	}
}

// TestReferenceModelEvictionBytes: byte budgets, where splits charge every
// holder of the split edge a node (and may take them over budget).
func TestReferenceModelEvictionBytes(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		runReferenceBytes(t, 1000, 1000, "abc", seed, 400) // exact
		runReferenceBytes(t, 3000, 0, "ab", seed, 400)     // default low water
		runReferenceBytes(t, 8000, 5000, "abcd", seed, 300)
	}
}

func TestReferenceModelEviction(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		runReference(t, 60, 60, "abc", seed, 400)     // exact
		runReference(t, 400, 0, "ab", seed, 400)      // default low water
		runReference(t, 1000, 700, "abcd", seed, 300) // long keys too
	}
}

// FuzzTree decodes the input into a sequence of ops (see harness.step) and
// checks each against the reference. The first byte picks the budget.
func FuzzTree(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte{1, 0, 0, 5, 3, 1, 0, 0, 7, 9, 2, 1, 15, 0, 0, 1, 1, 1, 12, 0, 2, 0, 0})
	f.Add(bytes.Repeat([]byte{3, 0, 4, 2, 5, 13, 1, 19, 2}, 20))
	f.Add(bytes.Repeat([]byte{2, 7, 1, 0, 9, 11, 4, 0, 3, 1, 12, 2}, 30))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 1024 {
			return
		}
		budgets := []int{0, 16, 40, 100}
		budget := budgets[int(data[0])%len(budgets)]
		h := newHarness(budget, budget, uint64(data[0]), "abc")
		pos := 1
		next := func() int {
			if pos >= len(data) {
				return 0
			}
			pos++
			return int(data[pos-1])
		}
		for pos < len(data) {
			if err := h.step(next); err != nil {
				t.Fatal(err)
			}
		}
	})
}
