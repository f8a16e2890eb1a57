// Package radix implements a copy-on-write radix tree over bytes that records
// which workers hold which prefixes of long keys (serialized chat histories).
//
// Readers (Match, Touch, WorkerChars, Chars, Workers) never lock and never
// block on writers: they load the published root once and walk immutable
// nodes. Writes (Insert, RemoveWorker) run one at a time, but no caller
// waits for another: a caller that finds a write running hands its own over
// to the goroutine running it and returns (flat combining over a lock-free
// stack; see combine.go). Each write clones every node on the paths it
// changes once, then publishes the new root with one atomic store. The only
// memory a published node ever sees written is its per-worker last-access
// stamps (atomic stores).
//
// Layout: a node has an immutable edge label, its children as a small slice
// sorted by first byte (with the first bytes in a parallel []byte searched by
// bytes.IndexByte; at most 256 entries), and its holders as a small slice of
// {worker, atomic stamp} sorted by worker. Labels are copied once, when an
// Insert stores a new suffix; clones and edge splits share them.
//
// Memory bound: each worker is charged, for every node it holds, the label
// bytes plus NodeOverhead (121 bytes on 64-bit: the node and its share of
// its parent's slices), and kept within Config.MaxBytesPerWorker.
//
// Eviction: each Insert that takes a worker over its budget collects that
// worker's held subtree once (never nodes it does not hold), pops its
// least-recently-accessed leaves from a min-heap, pushing a parent as soon as
// it becomes a leaf, and applies the removals in one copy-on-write pass. See
// Tree.evict and Config.EvictToBytes for the costs.
package radix

import (
	"math"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/puzpuzpuz/xsync/v3"
)

// Config configures a Tree.
type Config struct {
	// MaxBytesPerWorker is the per-worker memory budget in bytes, as
	// --max-tree-size: every node a worker holds costs it len(label) +
	// NodeOverhead bytes (see NodeOverhead), so the budget bounds the
	// heap the worker's entries retain, whatever the shape of the keys.
	// For long histories (labels of kilobytes) a byte is about a
	// character; for a flood of 1-character leaves it is about
	// NodeOverhead+1 bytes per leaf. 0 means unlimited.
	//
	// Bound: the tree's nodes, labels, holder slices and child slices
	// retain at most the sum over workers of MaxBytesPerWorker (a node
	// held by k workers is charged to each of them), plus the size-class
	// rounding of the allocator (see TestTreeHeapWithinBudget), the
	// writer's scratch slices (about 44 bytes per node of the largest
	// worker's subtree) and the handed-over writes (maxPendingBytes).
	MaxBytesPerWorker int

	// EvictToBytes is the level, in bytes, that a worker that went over
	// MaxBytesPerWorker is trimmed down to; the same as EvictToChars for
	// MaxCharsPerWorker. 0 means MaxBytesPerWorker - MaxBytesPerWorker/64.
	EvictToBytes int

	// MaxCharsPerWorker is a per-worker budget in characters (bytes of
	// edge labels only, no node overhead). It does not bound memory: a
	// flood of 1-character leaves costs NodeOverhead+1 bytes each. Kept
	// for callers that budget characters; use MaxBytesPerWorker to bound
	// memory. 0 means unlimited. When both are set, a worker is trimmed
	// when it exceeds either.
	MaxCharsPerWorker int

	// EvictToChars is the level a worker that went over MaxCharsPerWorker is
	// trimmed down to. An eviction pass costs O(nodes the worker holds) to
	// collect its leaves (see evict.go); trimming a little below the budget
	// makes that pass rare instead of one per Insert at steady state.
	// 0 (or negative) means MaxCharsPerWorker - MaxCharsPerWorker/64; larger
	// than MaxCharsPerWorker means MaxCharsPerWorker. Set it to
	// MaxCharsPerWorker for exact "evict until within budget".
	EvictToChars int

	// Now is the clock in nanoseconds used for access stamps (injectable for
	// tests). nil means time.Now().UnixNano. It is called by Insert and by
	// Touch, concurrently, so it must be safe for concurrent use.
	Now func() int64
}

// NodeOverhead is what one node costs a worker that holds it, besides its
// label bytes: the node struct (four slice headers), the worker's holder
// entry in the node's holders slice, the node's pointer in its parent's
// children slice and its first byte in the parent's keys. 121 bytes on
// 64-bit platforms; TestNodeOverhead checks it against the measured heap
// per 1-character leaf, so a change to node's layout cannot make the
// budget drift silently.
const NodeOverhead = int(unsafe.Sizeof(node{})) + // label, keys, children, holders headers
	int(unsafe.Sizeof(holder{})) + // this worker's entry in holders
	int(unsafe.Sizeof((*node)(nil))) + // the parent's children entry
	1 // the parent's keys entry

// Match is the result of Tree.Match.
type Match struct {
	// Len is the length of the longest prefix of the key held by an eligible
	// worker, Worker the most recently accessed eligible holder of the deepest
	// node reached by that prefix (ties: lower id). Worker is 0 when Len is 0.
	Len    int
	Worker uint32
	// AnyLen and AnyWorker are the same regardless of eligibility.
	AnyLen    int
	AnyWorker uint32
}

// wstat is the per-worker accounting: characters (label bytes) and bytes
// (label bytes plus NodeOverhead per node held). It is written only by the
// writer (with the writer token held) and read atomically by anyone.
type wstat struct {
	chars  atomic.Int64
	bytes  atomic.Int64
	budget atomic.Int64 // SetWorkerBudget's characters; 0: none
}

// target is the level, in characters, that TrimWorker evicts w down to
// when it holds chars: 0 (nothing to trim) unless chars is over w's own
// budget, else the budget less a 64th (so that the next pass is many
// inserts away, as with EvictToChars).
func (st *wstat) target(chars int64) int64 {
	b := st.budget.Load()
	if b <= 0 || chars <= b {
		return 0
	}
	return max(b-b/64, 1)
}

// Tree is a copy-on-write radix tree over bytes with per-worker membership.
//
// All methods are safe for concurrent use and none waits on a lock: readers
// walk a published snapshot, Insert applies its write or hands it over to
// the write in progress (published microseconds later, never dropped), and
// RemoveWorker waits only for its own removal to be applied. A Tree must not
// be copied after first use.
type Tree struct {
	root  atomic.Pointer[node]
	chars atomic.Int64
	stats *xsync.MapOf[uint32, *wstat]

	now      func() int64
	maxChars int64 // 0: no character budget
	evictTo  int64
	maxBytes int64 // 0: no byte budget
	evictToB int64

	// hook, when set (tests only), is called by every applied insert
	// before it changes anything: a test makes a write panic with it.
	hook func(key []byte)

	// writing is the writer token and pending the writes handed over to
	// its holder (see combine.go); the fields below belong to the holder.
	writing       atomic.Bool
	pending       atomic.Pointer[op]
	npending      atomic.Int64 // handed-over Inserts not yet applied
	npendingBytes atomic.Int64 // and the bytes of their key copies
	ents          []entry
	heap          []int32
	path          []step
}

// New returns an empty tree.
func New(cfg Config) *Tree {
	t := &Tree{
		stats: xsync.NewMapOf[uint32, *wstat](),
		now:   cfg.Now,
	}
	if t.now == nil {
		t.now = func() int64 { return time.Now().UnixNano() }
	}
	t.maxChars, t.evictTo = budget(cfg.MaxCharsPerWorker, cfg.EvictToChars)
	t.maxBytes, t.evictToB = budget(cfg.MaxBytesPerWorker, cfg.EvictToBytes)
	t.root.Store(&node{})
	return t
}

// budget returns a budget and its eviction target (see Config).
func budget(limit, to int) (int64, int64) {
	if limit <= 0 {
		return 0, 0
	}
	if to <= 0 {
		to = limit - limit/64
	}
	return int64(limit), int64(min(to, limit))
}

// over reports whether a worker holding chars characters and bytes bytes is
// over one of the budgets.
func (t *Tree) over(chars, bytes int64) bool {
	return (t.maxChars > 0 && chars > t.maxChars) || (t.maxBytes > 0 && bytes > t.maxBytes)
}

// Match walks key and reports the longest prefix held by an eligible worker
// and by any worker (see Match). A key that diverges in the middle of an edge
// matches up to the divergence point. eligible may be nil (all workers) and
// is called only from the calling goroutine, before Match returns.
//
// Match is lock-free, never blocks on writers and does not allocate. It sees
// one consistent snapshot: the tree as published by some writer between the
// call and its return. key is not retained.
func (t *Tree) Match(key []byte, eligible func(uint32) bool) Match {
	var m Match
	n := t.root.Load()
	var best, last *node // deepest eligible node; deepest node
	checking := true
	depth := 0
	for depth < len(key) {
		i := n.child(key[depth])
		if i < 0 {
			break
		}
		c := n.children[i]
		k := matchEdge(key[depth:], c.label)
		depth += k
		last, m.AnyLen = c, depth
		// Holders of a child are a subset of its parent's, so once a node
		// has no eligible holder no deeper node has one either.
		if checking {
			if eligible == nil || c.anyEligible(eligible) {
				best, m.Len = c, depth
			} else {
				checking = false
			}
		}
		if k < len(c.label) {
			break
		}
		n = c
	}
	if last != nil {
		m.AnyWorker, _ = last.mostRecent(nil)
	}
	if best != nil {
		m.Worker, _ = best.mostRecent(eligible)
	}
	return m
}

// Touch refreshes w's access stamps along key's path if w already holds the
// whole key, and reports whether it did. It is lock-free and does not
// allocate: stamps are atomic stores into the published nodes, no clone.
// An empty key is held by everyone: Touch returns true and stores nothing.
// key is not retained.
//
// A Touch racing with a writer that changes the membership of a node on the
// same path may have its refresh of that node lost (the writer copies the
// stamps it saw); stamps are advisory LRU hints, so this is harmless.
func (t *Tree) Touch(key []byte, w uint32) bool {
	return touch(t.root.Load(), key, w, t.now)
}

// touch verifies that w holds all of key in the snapshot root and if so
// stamps w's holders along the path with now(). Holding the deepest node
// implies holding every ancestor, so only that node's membership is checked;
// the second walk compares no bytes, it only re-descends by first byte.
func touch(root *node, key []byte, w uint32, now func() int64) bool {
	if len(key) == 0 {
		return true
	}
	n, depth := root, 0
	for {
		i := n.child(key[depth])
		if i < 0 {
			return false
		}
		c := n.children[i]
		k := matchEdge(key[depth:], c.label)
		depth += k
		if depth == len(key) {
			if c.holderIndex(w) < 0 {
				return false
			}
			break
		}
		if k < len(c.label) {
			return false
		}
		n = c
	}
	stamp := now()
	n, depth = root, 0
	for depth < len(key) {
		c := n.children[n.child(key[depth])]
		atomic.StoreInt64(&c.holders[c.holderIndex(w)].stamp, stamp)
		depth += len(c.label)
		n = c
	}
	return true
}

// Insert records that worker w holds key, and thus every prefix of it, and
// refreshes w's access stamps along the path. When w then holds more than
// its budget (Config.MaxBytesPerWorker, Config.MaxCharsPerWorker), w's
// least-recently-accessed leaves are evicted in the same write, and so are
// those of any other holder of an edge this insert split, if the split's
// extra node took that holder over its budget. The change is
// published atomically: readers see the tree either before or after the
// whole write, eviction included. If w already holds the whole key the write
// only refreshes stamps, as Touch does, and publishes nothing.
//
// Insert never blocks. If no other write is running it applies the write
// itself, with one walk of key (byte comparisons and path recording at
// once; the copy-on-write pass follows the recorded path), and returns with
// it published. Otherwise it hands the write over to the goroutine running
// the writes, which publishes it after the write in progress, typically
// microseconds later; until then Match and Touch may not see it. See
// combine.go for the protocol, the ordering argument and the bounds. The
// stamp is taken when Insert is called in both cases.
//
// key is not retained and may be reused by the caller as soon as Insert
// returns: a handed-over write carries a private copy.
func (t *Tree) Insert(key []byte, w uint32) {
	if len(key) > 0 {
		t.InsertAt(key, w, t.now())
	}
}

// InsertAt is Insert with the stamp now (unix ns), for a caller that has
// read the clock already.
func (t *Tree) InsertAt(key []byte, w uint32, stamp int64) {
	if len(key) == 0 {
		return
	}
	if t.tryAcquire() {
		t.insertHeld(key, w, stamp)
		t.resume(combineLimit)
		return
	}
	t.handOverInsert(key, w, stamp)
}

// insertHeld applies the writes handed over so far and then Insert(key, w)
// stamped stamp, and releases the token. Called with the token held; the
// release is deferred, so an insert that panics cannot keep every later
// write waiting for a token nobody holds (see release).
func (t *Tree) insertHeld(key []byte, w uint32, stamp int64) {
	ok := false
	defer t.release(&ok)
	t.drainPending() // writes handed over before ours go first
	t.insert(key, w, stamp)
	ok = true
}

// step is one edge of the path recorded by insert's walk: the index of the
// child taken and how many bytes of its label the key matched.
type step struct {
	i, k int32
}

// insert applies Insert(key, w) stamped stamp. Called with the writer token
// held; key is only read, never stored.
//
// It walks key once, comparing bytes and recording the path. If w holds the
// node where the key ends it only refreshes stamps along the recorded path.
// Otherwise it clones the recorded path (splitting the last edge if the key
// ends or diverges inside it), adds w along it and the new suffix as a leaf,
// evicts if w went over budget, and publishes the new root.
func (t *Tree) insert(key []byte, w uint32, stamp int64) {
	if t.hook != nil {
		t.hook(key)
	}
	old := t.root.Load()
	path := t.path[:0]
	n, depth := old, 0
	for depth < len(key) {
		i := n.child(key[depth])
		if i < 0 {
			break
		}
		c := n.children[i]
		k := matchEdge(key[depth:], c.label)
		path = append(path, step{int32(i), int32(k)})
		depth += k
		n = c
		if k < len(c.label) {
			break
		}
	}
	t.path = path
	if depth == len(key) {
		if j := n.holderIndex(w); j >= 0 {
			// w holds the deepest node, hence every ancestor.
			n = old
			for _, s := range path {
				c := n.children[s.i]
				stampNewer(&c.holders[c.holderIndex(w)].stamp, stamp)
				n = c
			}
			return
		}
	}
	st, _ := t.stats.LoadOrCompute(w, func() *wstat { return &wstat{} })

	// Chars and bytes (NodeOverhead per node) added for w; chars added to
	// the tree; the holders of the edge split by this insert, if any.
	var added, addedB, total int64
	var split []holder
	root := old.clone()
	cur := root
	depth = 0
	for _, s := range path {
		c := cur.children[s.i] // cur is a clone: its children are still the originals
		var nc *node
		if k := int(s.k); k < len(c.label) {
			// Split c at k: the upper part takes a fresh copy of the
			// holders (its stamps must evolve separately), the lower part
			// keeps c's children and shares c's holders. Both parts are
			// views into c's label allocation; nothing is copied.
			tail := c.clone()
			tail.label = c.label[k:]
			nc = &node{
				label:    c.label[:k],
				keys:     []byte{tail.label[0]},
				children: []*node{tail},
				holders:  copyHolders(c.holders),
			}
			// Every holder of c now holds one more node.
			split = c.holders
			for i := range split {
				if hs, ok := t.stats.Load(split[i].w); ok {
					hs.bytes.Add(int64(NodeOverhead))
				}
			}
		} else {
			nc = c.clone()
		}
		children := slices.Clone(cur.children)
		children[s.i] = nc
		cur.children = children // keys unchanged: nc.label[0] == c.label[0]
		if j := nc.holderIndex(w); j >= 0 {
			stampNewer(&nc.holders[j].stamp, stamp)
		} else {
			nc.holders = withHolder(nc.holders, w, stamp)
			added += int64(len(nc.label))
			addedB += int64(len(nc.label) + NodeOverhead)
		}
		depth += len(nc.label)
		cur = nc
	}
	if depth < len(key) {
		leaf := &node{
			label:   cloneBytes(key[depth:]),
			holders: []holder{{stamp: stamp, w: w}},
		}
		cur.keys, cur.children = insertChild(cur.keys, cur.children, leaf)
		added += int64(len(leaf.label))
		addedB += int64(len(leaf.label) + NodeOverhead)
		total += int64(len(leaf.label))
	}

	total -= t.trim(&root, w, st, added, addedB)
	// The split charged the other holders of the split edge one node
	// each: trim any it took over budget too. At most one edge splits per
	// insert, and a holder is trimmed below its budget (EvictToBytes), so
	// this is as rare as the inserter's own eviction.
	for i := range split {
		if v := split[i].w; v != w {
			if vs, ok := t.stats.Load(v); ok {
				total -= t.trim(&root, v, vs, 0, 0)
			}
		}
	}
	t.chars.Add(total)
	t.root.Store(root)
}

// trim adds chars and bytes to v's accounting and, when that takes v over
// a budget, evicts v's least-recently-accessed leaves from the unpublished
// tree *root. It returns the label bytes freed from the tree.
func (t *Tree) trim(root **node, v uint32, st *wstat, chars, bytes int64) (freed int64) {
	chars += st.chars.Load()
	bytes += st.bytes.Load()
	if t.over(chars, bytes) {
		*root, chars, bytes, freed = t.evict(*root, v, chars, bytes, math.MinInt64, 0)
	}
	st.chars.Store(chars)
	st.bytes.Store(bytes)
	return freed
}

// stampNewer stores stamp at p unless p already holds a newer one (a Touch
// that happened after the call of a handed-over write). A Touch racing with
// the load may still be overwritten; stamps are advisory (see Touch).
func stampNewer(p *int64, stamp int64) {
	if atomic.LoadInt64(p) < stamp {
		atomic.StoreInt64(p, stamp)
	}
}

// RemoveWorker drops w from every node and prunes the nodes left with no
// holder, at O(nodes held by w). When it returns, the removal is published.
// It never waits on a lock: if another write is running it hands the
// removal over (see combine.go) and waits until the goroutine running the
// writes has applied it. Meant for worker removal, not the request path.
func (t *Tree) RemoveWorker(w uint32) {
	if t.tryAcquire() {
		t.removeHeld(w)
		t.resume(combineLimit)
		return
	}
	done := make(chan struct{})
	t.handOver(&op{w: w, remove: true, done: done})
	<-done
}

// removeHeld is insertHeld for RemoveWorker(w).
func (t *Tree) removeHeld(w uint32) {
	ok := false
	defer t.release(&ok)
	t.drainPending()
	t.removeWorker(w)
	ok = true
}

// removeWorker applies RemoveWorker(w). Called with the writer token held.
func (t *Tree) removeWorker(w uint32) {
	st, ok := t.stats.Load(w)
	if !ok {
		return
	}
	root := t.root.Load()
	t.collect(root, w)
	for i := 1; i < len(t.ents); i++ {
		t.ents[i].mark = true
		t.ents[i].dirty = true
	}
	var freed int64
	if len(t.ents) > 1 {
		t.ents[0].dirty = true
		root, _, freed = t.rebuild(0, w)
	}
	t.clearScratch()
	t.chars.Add(-freed)
	st.chars.Store(0)
	st.bytes.Store(0)
	t.stats.Delete(w)
	t.root.Store(root)
}

// WorkerChars returns the characters (bytes of edge labels) w holds. It is
// O(1) and lock-free; while a writer is running it may reflect the write in
// progress.
func (t *Tree) WorkerChars(w uint32) int {
	if st, ok := t.stats.Load(w); ok {
		return int(st.chars.Load())
	}
	return 0
}

// WorkerBytes returns the bytes charged to w against MaxBytesPerWorker:
// for each node w holds, its label bytes plus NodeOverhead. O(1) and
// lock-free, like WorkerChars.
func (t *Tree) WorkerBytes(w uint32) int {
	if st, ok := t.stats.Load(w); ok {
		return int(st.bytes.Load())
	}
	return 0
}

// Chars returns the total bytes of edge labels in the tree. Lock-free.
func (t *Tree) Chars() int {
	return int(t.chars.Load())
}

// Workers returns the workers that hold anything, ascending. It allocates;
// meant for gauges.
func (t *Tree) Workers() []uint32 {
	var ws []uint32
	t.stats.Range(func(w uint32, st *wstat) bool {
		if st.chars.Load() > 0 {
			ws = append(ws, w)
		}
		return true
	})
	slices.Sort(ws)
	return ws
}

// insertChild returns new keys/children slices with c added in first-byte order.
func insertChild(keys []byte, children []*node, c *node) ([]byte, []*node) {
	i, _ := slices.BinarySearch(keys, c.label[0])
	nk := make([]byte, len(keys)+1)
	copy(nk, keys[:i])
	nk[i] = c.label[0]
	copy(nk[i+1:], keys[i:])
	nc := make([]*node, len(children)+1)
	copy(nc, children[:i])
	nc[i] = c
	copy(nc[i+1:], children[i:])
	return nk, nc
}

// cloneBytes returns an exact-size copy of b.
func cloneBytes(b []byte) []byte {
	c := make([]byte, len(b))
	copy(c, b)
	return c
}
