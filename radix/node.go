package radix

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"sync/atomic"
)

// holder records that a worker holds a node, with the node's last-access
// stamp for that worker.
//
// stamp is the only field of a published tree that is ever written: with
// atomic stores, by Touch and by the writer. A holders slice whose membership
// does not change is shared between a node and its clones, so a stamp refresh
// is seen by every snapshot that contains the node.
type holder struct {
	stamp int64 // nanoseconds, accessed atomically; first field for 64-bit alignment
	w     uint32
	_     uint32 // keeps the element size 16 so stamp stays 8-aligned on 32-bit platforms
}

// node is an immutable tree node once published (except holder stamps).
//
// Invariants (checked by the tests):
//   - label is non-empty for every node but the root;
//   - keys[i] == children[i].label[0], keys ascending, no duplicates;
//   - holders is non-empty for every node but the root, ascending by w;
//   - the holders of a child are a subset of the holders of its parent
//     (holding a key means holding every prefix of it), so a worker's held
//     nodes form a subtree that hangs from the root.
//
// label is shared, never copied, by clones and by edge splits: the parts of a
// split stay views into one allocation. See compaction in evict.go for how
// dead parts of such an allocation are released.
type node struct {
	label    []byte
	keys     []byte
	children []*node
	holders  []holder
}

// clone returns a shallow copy sharing label, keys, children and holders.
// The caller must replace (not modify) any shared slice it changes.
func (n *node) clone() *node {
	c := *n
	return &c
}

// child returns the index of the child whose label starts with b, or -1.
func (n *node) child(b byte) int {
	return bytes.IndexByte(n.keys, b)
}

// holderIndex returns the index of w in n.holders, or -1.
func (n *node) holderIndex(w uint32) int {
	for i := range n.holders {
		if n.holders[i].w == w {
			return i
		}
	}
	return -1
}

// withHolder returns a new holders slice: hs plus w stamped now, ascending by w.
func withHolder(hs []holder, w uint32, now int64) []holder {
	out := make([]holder, 0, len(hs)+1)
	added := false
	for i := range hs {
		if !added && hs[i].w > w {
			out = append(out, holder{stamp: now, w: w})
			added = true
		}
		out = append(out, holder{stamp: atomic.LoadInt64(&hs[i].stamp), w: hs[i].w})
	}
	if !added {
		out = append(out, holder{stamp: now, w: w})
	}
	return out
}

// withoutHolder returns a new holders slice: hs minus w (nil when empty).
func withoutHolder(hs []holder, w uint32) []holder {
	if len(hs) <= 1 {
		return nil
	}
	out := make([]holder, 0, len(hs)-1)
	for i := range hs {
		if hs[i].w != w {
			out = append(out, holder{stamp: atomic.LoadInt64(&hs[i].stamp), w: hs[i].w})
		}
	}
	return out
}

// copyHolders returns a fresh copy of hs (stamps loaded atomically), for a
// new node that must not share stamps with the node it was split from.
func copyHolders(hs []holder) []holder {
	out := make([]holder, len(hs))
	for i := range hs {
		out[i] = holder{stamp: atomic.LoadInt64(&hs[i].stamp), w: hs[i].w}
	}
	return out
}

// mostRecent returns the holder of n with the latest stamp among those for
// which eligible is true (nil = all); ties go to the lower worker id.
// ok is false when no holder is eligible.
func (n *node) mostRecent(eligible func(uint32) bool) (w uint32, ok bool) {
	var best int64
	for i := range n.holders {
		h := &n.holders[i]
		if eligible != nil && !eligible(h.w) {
			continue
		}
		s := atomic.LoadInt64(&h.stamp)
		if !ok || s > best {
			w, best, ok = h.w, s, true
		}
	}
	return w, ok
}

// anyEligible reports whether some holder of n satisfies eligible.
func (n *node) anyEligible(eligible func(uint32) bool) bool {
	for i := range n.holders {
		if eligible(n.holders[i].w) {
			return true
		}
	}
	return false
}

// matchEdge returns how many leading bytes of label are a prefix of rest.
// The common case, a label fully contained in the key, is one vectorized
// memequal; only a divergent edge pays for locating the first difference.
func matchEdge(rest, label []byte) int {
	if bytes.HasPrefix(rest, label) {
		return len(label)
	}
	return commonPrefix(rest, label)
}

// commonPrefix returns the length of the longest common prefix of a and b.
// It skips equal 256-byte blocks with the runtime's vectorized memequal, then
// locates the first difference 8 bytes at a time.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	a, b = a[:n], b[:n]
	i := 0
	for ; i+256 <= n; i += 256 {
		if string(a[i:i+256]) != string(b[i:i+256]) {
			break
		}
	}
	for ; i+8 <= n; i += 8 {
		if x := binary.LittleEndian.Uint64(a[i:]) ^ binary.LittleEndian.Uint64(b[i:]); x != 0 {
			return i + bits.TrailingZeros64(x)>>3
		}
	}
	for ; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// follows reports whether b starts exactly where a ends, inside a's
// allocation: b is the next piece of an edge label that was split from the
// same buffer as a. Only spare capacity of a's own allocation can hold b[0],
// so a true result is never a coincidence of adjacent allocations.
func follows(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 || cap(a) == len(a) {
		return false
	}
	return &a[:len(a)+1][len(a)] == &b[0]
}
