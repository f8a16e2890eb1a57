package radix

import (
	"math"
	"sync/atomic"
)

// What the cache-aware policy asks of the tree besides Match and Insert
// (docs/design.md §4, "Worker choice by estimated time to first token" and
// "Correction"): every worker's hold on one key in one walk, a worker's
// hold before it is refreshed, and dropping what a worker no longer holds.

// MatchEach calls f once for every worker that holds a non-empty prefix of
// key, with the length of the longest prefix of key it holds (a key that
// diverges inside an edge counts up to the divergence, as in Match). Order:
// workers whose hold ends nearer the root first, then by worker id. Like
// Match it is lock-free, sees one snapshot, does not allocate and does not
// retain key or f; f runs on the calling goroutine.
//
// It returns shared: the length of the longest prefix of key after which
// the tree branches at least fanout ways, holders aside, counting key itself
// as one more way where it leaves the tree (inside an edge, or at a node
// none of whose children it follows); a key that goes on past a leaf (the
// next turn of a stored conversation) adds no way. So a system prompt that
// fanout conversations or more start with is shared, a conversation's own
// history is not. fanout ≤ 1: every point of the path qualifies (shared is
// the path's length in the tree).
func (t *Tree) MatchEach(key []byte, fanout int, f func(w uint32, n int)) (shared int) {
	n := t.root.Load()
	var prev *node // the last node reached, held up to prevDepth
	prevDepth, depth := 0, 0
	for depth < len(key) {
		i := n.child(key[depth])
		ways := len(n.keys)
		if i < 0 && ways > 0 {
			ways++
		}
		if ways >= fanout {
			shared = depth
		}
		if i < 0 {
			break
		}
		c := n.children[i]
		k := matchEdge(key[depth:], c.label)
		if prev != nil {
			// The holders of prev that do not hold c hold key up to prevDepth.
			reportNotIn(prev.holders, c.holders, prevDepth, f)
		}
		depth += k
		prev, prevDepth = c, depth
		if k < len(c.label) {
			if fanout <= 2 && depth < len(key) {
				shared = depth
			}
			break
		}
		n = c
	}
	if fanout <= 1 {
		shared = depth
	}
	if prev != nil {
		reportNotIn(prev.holders, nil, prevDepth, f)
	}
	return shared
}

// reportNotIn calls f(w, depth) for every holder of hs absent from sub; both
// are ascending by worker (a child's holders are a subset of its parent's).
func reportNotIn(hs, sub []holder, depth int, f func(uint32, int)) {
	j := 0
	for i := range hs {
		w := hs[i].w
		for j < len(sub) && sub[j].w < w {
			j++
		}
		if j < len(sub) && sub[j].w == w {
			continue
		}
		f(w, depth)
	}
}

// Hold is Touch that also reports what w held before: the length of the
// longest prefix of key w holds and the access stamp of the deepest node
// of it (0 when held is 0), read before this call refreshed anything. full
// reports that w held all of key; then the stamps along the path are
// refreshed, exactly as Touch does. One walk plus, when full, the stamping
// walk; lock-free, no allocation.
func (t *Tree) Hold(key []byte, w uint32) (held int, heldAt int64, full bool) {
	return t.hold(key, w, t.now)
}

// HoldAt is Hold with the stamp now, for a caller that has read the clock
// already.
func (t *Tree) HoldAt(key []byte, w uint32, now int64) (held int, heldAt int64, full bool) {
	return t.hold(key, w, func() int64 { return now })
}

// hold is Hold, stamping with clock (read only when w holds all of key).
func (t *Tree) hold(key []byte, w uint32, clock func() int64) (held int, heldAt int64, full bool) {
	if len(key) == 0 {
		return 0, 0, true
	}
	root := t.root.Load()
	n, depth := root, 0
	for depth < len(key) {
		i := n.child(key[depth])
		if i < 0 {
			break
		}
		c := n.children[i]
		j := c.holderIndex(w)
		if j < 0 {
			break
		}
		k := matchEdge(key[depth:], c.label)
		depth += k
		held, heldAt = depth, atomic.LoadInt64(&c.holders[j].stamp)
		if k < len(c.label) {
			break
		}
		n = c
	}
	if held < len(key) {
		return held, heldAt, false
	}
	stamp := clock()
	n, depth = root, 0
	for depth < len(key) {
		c := n.children[n.child(key[depth])]
		atomic.StoreInt64(&c.holders[c.holderIndex(w)].stamp, stamp)
		depth += len(c.label)
		n = c
	}
	return held, heldAt, true
}

// EvictOlder drops from w's part of the tree every node w last accessed at
// or before cutoff (a Config.Now stamp), leaves first, as budget eviction
// does (see evict). The policy calls it when w's own answer shows that its
// KV cache evicted a prefix last used at cutoff: an LRU cache has then
// evicted everything older as well. It never blocks: like Insert it applies
// the write or hands it over to the write in progress. Costs O(nodes w
// holds) when applied; not meant for every request.
func (t *Tree) EvictOlder(w uint32, cutoff int64) {
	if t.tryAcquire() {
		t.evictOlderHeld(w, cutoff)
		t.resume(combineLimit)
		return
	}
	o := opPool.Get().(*op)
	o.key = o.key[:0]
	o.w, o.stamp, o.older = w, cutoff, true
	t.handOver(o)
}

// SetWorkerBudget sets w's own budget in characters of the tree (label
// bytes, as WorkerChars counts them) for TrimWorker: the part of its
// worker's KV cache this tree may claim (docs/design.md §4, "The tree's
// budget"). 0 (or negative) clears it. Insert never applies it, so the
// write on the request path costs what it did; TrimWorker does, off that
// path. It sets nothing for a worker that holds nothing yet (there is
// nothing to trim; set it again once it holds something). Lock-free, O(1).
func (t *Tree) SetWorkerBudget(w uint32, chars int) {
	if st, ok := t.stats.Load(w); ok {
		st.budget.Store(int64(max(chars, 0)))
	}
}

// WorkerBudget returns w's budget as SetWorkerBudget set it; 0: none.
func (t *Tree) WorkerBudget(w uint32) int {
	if st, ok := t.stats.Load(w); ok {
		return int(st.budget.Load())
	}
	return 0
}

// TrimWorker evicts w's least-recently-accessed parts until w holds no
// more than its own budget less a 64th, when it holds more than the budget
// (SetWorkerBudget); it reports whether w was over and a trim was applied
// or handed over. The order is an LRU cache's (vLLM frees the blocks of
// finished requests least recently used first, a sequence's tail before its
// head): w's least recently accessed leaf goes first, a parent once its
// last child went, and the last leaf to go is cut short, keeping its head,
// when it alone holds the leaf and cutting reaches the level. Never blocks
// (handed over like EvictOlder); O(nodes w holds) when applied, so a caller
// checks WorkerChars against the budget first, as TrimWorker does itself.
func (t *Tree) TrimWorker(w uint32) bool {
	st, ok := t.stats.Load(w)
	if !ok || st.target(st.chars.Load()) == 0 {
		return false
	}
	t.EvictOlder(w, math.MinInt64)
	return true
}

// evictOlderHeld is insertHeld for EvictOlder.
func (t *Tree) evictOlderHeld(w uint32, cutoff int64) {
	ok := false
	defer t.release(&ok)
	t.drainPending()
	t.evictOlder(w, cutoff)
	ok = true
}

// evictOlder applies EvictOlder(w, cutoff). Called with the writer token held.
func (t *Tree) evictOlder(w uint32, cutoff int64) {
	st, ok := t.stats.Load(w)
	if !ok {
		return
	}
	old := t.root.Load()
	chars := st.chars.Load()
	root, chars, bytes, freed := t.evict(old, w, chars, st.bytes.Load(), cutoff, st.target(chars))
	if root == old {
		return
	}
	st.chars.Store(chars)
	st.bytes.Store(bytes)
	t.chars.Add(-freed)
	t.root.Store(root)
}
