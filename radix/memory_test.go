//go:build !race

package radix

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
	"unsafe"
)

// Heap measurements: the race detector's shadow memory and allocation
// changes would distort them, hence !race.

// heapAlloc is the live heap after two collections (the second frees
// what the first's finalizers released).
func heapAlloc() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// history is a shape of chat histories for memPerChar: convs
// conversations over a shared 4 KB system prompt, each grown turn by turn
// (turn bytes per Insert, as the router inserts a request's key) to size
// bytes.
type history struct{ convs, size, turn int }

func (h history) String() string {
	return fmt.Sprintf("history=%s/turn=%s", sizeName(h.size), sizeName(h.turn))
}

// histories are the shapes measured: short and long turns, histories
// from 8 KB to 64 KB.
var histories = []history{
	{convs: 64, size: 8 << 10, turn: 256},
	{convs: 256, size: 8 << 10, turn: 2 << 10},
	{convs: 64, size: 36 << 10, turn: 2 << 10},
	{convs: 256, size: 64 << 10, turn: 2 << 10},
}

// memPerChar builds the tree of h's histories over 4 workers and returns
// the live heap it retains per stored character, and that count.
func memPerChar(h history) (float64, int) {
	before := heapAlloc()
	tr := New(Config{})
	rng := rand.New(rand.NewPCG(3, 3))
	sys := jsonish(rng, make([]byte, 4096))
	turn := make([]byte, h.turn)
	key := make([]byte, 0, h.size+h.turn+16)
	for c := 0; c < h.convs; c++ {
		key = append(append(key[:0], sys...), `{"conv":`+strconv.Itoa(c)+`}`...)
		for len(key) < h.size {
			key = append(key, jsonish(rng, turn)...)
			tr.Insert(key, uint32(c%4))
		}
	}
	after := heapAlloc()
	chars := tr.Chars()
	runtime.KeepAlive(tr)
	return float64(int64(after)-int64(before)) / float64(chars), chars
}

// TestMemoryPerChar holds the tree to docs/design.md §7's bound: at most 2
// bytes of live heap per stored character of chat histories. The bound is
// the design's, not a measurement's: BenchmarkMemoryPerChar reports the
// cost.
func TestMemoryPerChar(t *testing.T) {
	for _, h := range histories {
		if perChar, chars := memPerChar(h); perChar > 2 {
			t.Errorf("%v: %.3f heap bytes per stored character over %d characters; want <= 2", h, perChar, chars)
		}
	}
}

// BenchmarkMemoryPerChar reports the live heap per stored character
// (B/char) of each shape of histories.
func BenchmarkMemoryPerChar(b *testing.B) {
	for _, h := range histories {
		b.Run(h.String(), func(b *testing.B) {
			var perChar float64
			for b.Loop() {
				perChar, _ = memPerChar(h)
			}
			b.ReportMetric(perChar, "B/char")
		})
	}
}

// leafKeys returns n distinct keys that differ only in their last
// characters: a shared 32-byte prefix plus i in six decimal digits, so the
// tree is a 10-ary trie under the prefix whose leaves hold 1 character.
func leafKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%-32s%06d", "system prompt shared by all keys", i)
	}
	return keys
}

func countNodes(n *node) int {
	c := 0
	for _, ch := range n.children {
		c += 1 + countNodes(ch)
	}
	return c
}

// perLeaf measures the live heap retained per node of a tree of n 1-char
// leaf keys held by one worker, without a budget.
func perLeaf(n int) (perNode float64, nodes int) {
	keys := leafKeys(n)
	before := heapAlloc()
	tr := New(Config{})
	for _, k := range keys {
		tr.Insert(k, 1)
	}
	after := heapAlloc()
	nodes = countNodes(tr.root.Load())
	runtime.KeepAlive(tr)
	runtime.KeepAlive(keys) // live in both measurements
	return float64(int64(after)-int64(before)) / float64(nodes), nodes
}

// TestNodeOverhead pins NodeOverhead to the node's layout and checks it
// against the heap a 1-character leaf really retains: if node gains a field
// or a per-node allocation, one of the two checks fails and the budget's
// per-node charge must be revisited.
func TestNodeOverhead(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 {
		// 4 slice headers + one holder + a child pointer + a key byte.
		if NodeOverhead != 4*24+16+8+1 {
			t.Fatalf("NodeOverhead = %d; node layout changed: update the breakdown and this test", NodeOverhead)
		}
	}
	perNode, nodes := perLeaf(100_000)
	t.Logf("%.1f heap bytes per 1-char node over %d nodes; charged %d", perNode, nodes, NodeOverhead+1)
	// The charge must cover the real cost up to allocator rounding and
	// the root's large children slices.
	if perNode > 1.25*float64(NodeOverhead+1) || perNode < 0.75*float64(NodeOverhead+1) {
		t.Fatalf("a 1-char leaf retains %.1f bytes, charged %d: NodeOverhead drifted", perNode, NodeOverhead+1)
	}
}

// TestTreeHeapWithinBudget inserts 100k distinct keys that each add a
// 1-character leaf under a small byte budget: the accounted bytes stay
// within the budget and the live heap within 2× of it.
func TestTreeHeapWithinBudget(t *testing.T) {
	const budget = 1 << 20
	keys := leafKeys(100_000)
	before := heapAlloc()
	tr := New(Config{MaxBytesPerWorker: budget})
	for i, k := range keys {
		tr.Insert(k, 1)
		if b := tr.WorkerBytes(1); b > budget {
			t.Fatalf("after %d inserts: %d bytes accounted > budget %d", i+1, b, budget)
		}
	}
	after := heapAlloc()
	runtime.KeepAlive(keys) // live in both measurements
	checkTree(t, tr)
	heap := int64(after) - int64(before)
	t.Logf("budget %d: accounted %d bytes (%d chars) in %d nodes, live heap %d (%.2f× budget)",
		budget, tr.WorkerBytes(1), tr.WorkerChars(1), countNodes(tr.root.Load()), heap, float64(heap)/budget)
	runtime.KeepAlive(tr)
	if heap > 2*budget {
		t.Fatalf("live heap %d > 2× budget %d", heap, budget)
	}
}

// BenchmarkMemoryPerLeaf reports the live heap a 1-character leaf retains
// (B/node), the worst case per stored character, which the byte budget
// charges as NodeOverhead+1 (charged-B/node).
func BenchmarkMemoryPerLeaf(b *testing.B) {
	var perNode float64
	for b.Loop() {
		perNode, _ = perLeaf(100_000)
	}
	b.ReportMetric(perNode, "B/node")
	b.ReportMetric(float64(NodeOverhead+1), "charged-B/node")
}
