package radix

import (
	"sync/atomic"
)

// entry is one node of w's subtree during collect/evict/rebuild.
type entry struct {
	n      *node
	stamp  int64
	parent int32 // index in ents; -1 for the root
	end    int32 // one past the last preorder index of this node's subtree
	wkids  int32 // children held by w and not (yet) evicted
	cut    int32 // > 0: keep only this many bytes of the label (a leaf only w holds)
	mark   bool  // remove w from this node
	dirty  bool  // this node or a descendant is marked
}

// collect fills t.ents with w's subtree of root in preorder; ents[0] is root.
func (t *Tree) collect(root *node, w uint32) {
	t.ents = append(t.ents[:0], entry{n: root, parent: -1})
	t.collectRec(0, w)
}

func (t *Tree) collectRec(i int32, w uint32) {
	n := t.ents[i].n
	for _, c := range n.children {
		j := c.holderIndex(w)
		if j < 0 {
			continue
		}
		ci := int32(len(t.ents))
		t.ents = append(t.ents, entry{n: c, parent: i, stamp: atomic.LoadInt64(&c.holders[j].stamp)})
		t.ents[i].wkids++
		t.collectRec(ci, w)
	}
	t.ents[i].end = int32(len(t.ents))
}

// clearScratch drops node references held by the scratch slices so that
// they do not pin old snapshots, and shrinks them after a very large pass.
func (t *Tree) clearScratch() {
	clear(t.ents)
	t.ents = t.ents[:0]
	t.heap = t.heap[:0]
	if cap(t.ents) > 1<<16 {
		t.ents, t.heap = nil, nil
	}
}

// evict removes w's least-recently-accessed leaves from the unpublished tree
// root until w's chars and bytes (currently chars, bytes) are down to the
// eviction targets of the budgets that are set (Config.EvictToChars,
// Config.EvictToBytes). It returns the new root, w's chars and bytes after
// eviction, and the label bytes freed from the tree (labels of dropped
// nodes). It runs with the writer token held, on a tree
// not yet published.
//
// A worker's held nodes form a subtree hanging from the root (holders of a
// child are a subset of its parent's), so eviction and RemoveWorker both
// start with collect:
// a depth-first walk of that subtree only, never of nodes w does not hold,
// into the writer's scratch slice ents (preorder, with parent links and the
// count of w-held children).
//
// Eviction then keeps a binary min-heap of w's leaves (w-held nodes none of
// whose children w holds) keyed by (stamp, preorder index). It pops the least
// recently accessed leaf, marks w to be removed from it, and when that was the
// parent's last w-held child pushes the parent, which has just become a leaf,
// until w is down to the target. A pass costs O(h + k log h) for h nodes held
// by w and k leaves evicted; Config.EvictToChars trims below the budget so
// that the O(h) part is paid once per many inserts, not per insert.
// Stamps read during collect are a snapshot: a concurrent Touch may refresh a
// leaf after it was chosen, which at worst evicts a leaf touched during the
// pass.
//
// rebuild then applies the marks in one copy-on-write pass over the dirty
// part of the collected subtree (marked nodes and their ancestors), cloning
// each such node once, dropping nodes left with no holder.
//
// Memory: an edge split leaves both parts as views into one allocation. When
// a dropped node's label continued its parent's label in the same allocation,
// the dead bytes would stay pinned by the parent; rebuild copies the parent's
// label into an exact-size buffer instead, and so on up the chain of views
// (see follows). The bytes retained therefore stay those of live labels.
//
// cutoff extends the pass (EvictOlder): leaves stamped at or before cutoff
// go as well, whatever the budget; math.MinInt64 disables it. toChars > 0
// is w's own level (TrimWorker): leaves go until w holds at most toChars
// characters, and when nothing else asks for more, the last one is cut
// short to exactly that level, its tail dropped and its head kept, if it is
// a leaf of the tree that w alone holds (else it goes whole).
func (t *Tree) evict(root *node, w uint32, chars, bytes, cutoff, toChars int64) (*node, int64, int64, int64) {
	t.collect(root, w)
	ents := t.ents
	h := t.heap[:0]
	for i := 1; i < len(ents); i++ {
		if ents[i].wkids == 0 {
			h = append(h, int32(i))
		}
	}
	less := func(a, b int32) bool {
		ea, eb := &ents[a], &ents[b]
		return ea.stamp < eb.stamp || (ea.stamp == eb.stamp && a < b)
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		siftDown(h, i, less)
	}
	for len(h) > 0 {
		others := t.maxChars > 0 && chars > t.evictTo || t.maxBytes > 0 && bytes > t.evictToB || ents[h[0]].stamp <= cutoff
		own := toChars > 0 && chars > toChars
		if !others && !own {
			break
		}
		i := h[0]
		e := &ents[i]
		if n := e.n; !others && chars-int64(len(n.label)) < toChars && len(n.children) == 0 && len(n.holders) == 1 {
			// Cut the tail: keep the head's chars − toChars bytes fewer.
			e.cut = int32(int64(len(n.label)) - (chars - toChars))
			bytes -= chars - toChars
			chars = toChars
			for p := i; p >= 0 && !ents[p].dirty; p = ents[p].parent {
				ents[p].dirty = true
			}
			break
		}
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		siftDown(h, 0, less)

		e.mark = true
		chars -= int64(len(e.n.label))
		bytes -= int64(len(e.n.label) + NodeOverhead)
		for p := i; p >= 0 && !ents[p].dirty; p = ents[p].parent {
			ents[p].dirty = true
		}
		if p := e.parent; p > 0 {
			ents[p].wkids--
			if ents[p].wkids == 0 {
				h = append(h, p)
				siftUp(h, len(h)-1, less)
			}
		}
	}
	t.heap = h
	var freed int64
	if ents[0].dirty {
		root, _, freed = t.rebuild(0, w)
	}
	t.clearScratch()
	return root, chars, bytes, freed
}

// rebuild returns the replacement of ents[i].n with the marks of its subtree
// applied: the node itself when clean, nil when it is left with no holder.
// relabeled reports that its label now lives in a new allocation; freed is
// the label bytes of the dropped nodes of the subtree.
func (t *Tree) rebuild(i int32, w uint32) (nn *node, relabeled bool, freed int64) {
	e := t.ents[i]
	old := e.n
	if !e.dirty {
		return old, false, 0
	}
	nn = old.clone()
	if e.mark {
		nn.holders = withoutHolder(old.holders, w)
	}
	if e.cut > 0 {
		// A leaf w alone holds, cut short: its head in an exact-size copy.
		nn.label = cloneBytes(old.label[:e.cut])
		nn.holders = copyHolders(old.holders)
		return nn, true, int64(len(old.label)) - int64(e.cut)
	}
	var children []*node
	dropped, compact := 0, false
	k := 0 // cursor in old.children
	for j := i + 1; j < e.end; j = t.ents[j].end {
		ce := &t.ents[j]
		if !ce.dirty {
			continue
		}
		nc, rel, f := t.rebuild(j, w)
		freed += f
		if nc == ce.n {
			continue
		}
		if children == nil {
			children = append([]*node(nil), old.children...)
		}
		for children[k] != ce.n {
			k++
		}
		children[k] = nc
		if nc == nil {
			dropped++
		}
		if follows(old.label, ce.n.label) && (nc == nil || rel) {
			compact = true
		}
	}
	if children != nil {
		if dropped > 0 {
			keys := make([]byte, 0, len(children)-dropped)
			kept := make([]*node, 0, len(children)-dropped)
			for _, c := range children {
				if c != nil {
					keys = append(keys, c.label[0])
					kept = append(kept, c)
				}
			}
			nn.keys, children = keys, kept
		}
		nn.children = children
	}
	if i > 0 && len(nn.holders) == 0 {
		// Holders of children are a subset of ours: none remain.
		return nil, false, freed + int64(len(old.label))
	}
	if compact {
		nn.label = cloneBytes(old.label)
		relabeled = true
	}
	return nn, relabeled, freed
}

func siftDown(h []int32, i int, less func(a, b int32) bool) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && less(h[r], h[l]) {
			m = r
		}
		if !less(h[m], h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func siftUp(h []int32, i int, less func(a, b int32) bool) {
	for i > 0 {
		p := (i - 1) / 2
		if !less(h[i], h[p]) {
			return
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}
