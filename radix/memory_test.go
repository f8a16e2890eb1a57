//go:build !race

package radix

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"testing"
	"unsafe"
)

// Heap measurements: the race detector's shadow memory and allocation
// changes would distort them, hence !race.

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
	return float64(after-before) / float64(nodes), nodes
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

// TestMemoryCost reports what the tree retains: heap bytes per stored
// character of long chat histories (8–64 KB over a shared 4 KB system
// prompt) and per 1-character leaf. It is a measurement, not a check; run it
// with
//
//	WARMROUTE_MEMCOST=1 go test -run TestMemoryCost -v ./radix/
func TestMemoryCost(t *testing.T) {
	if os.Getenv("WARMROUTE_MEMCOST") == "" || testing.Short() {
		t.Skip("set WARMROUTE_MEMCOST=1 to measure")
	}
	for _, size := range []int{8 << 10, 16 << 10, 64 << 10} {
		perChar, chars := memPerHistory(256, size)
		t.Logf("histories of %2d KB (4 KB shared prompt, 2 KB turns): %.3f heap bytes per stored char over %d chars",
			size>>10, perChar, chars)
	}
	perNode, nodes := perLeaf(100_000)
	t.Logf("1-char leaves: %.1f heap bytes per node over %d nodes (charged NodeOverhead+1 = %d)", perNode, nodes, NodeOverhead+1)
}

// memPerHistory inserts convs histories of size bytes (a shared 4 KB
// prompt, then 2 KB turns, each turn an Insert as the router does) over 4
// workers and returns the live heap per stored character.
func memPerHistory(convs, size int) (float64, int) {
	before := heapAlloc()
	tr := New(Config{})
	rng := rand.New(rand.NewPCG(9, 9))
	sys := jsonish(rng, make([]byte, 4096))
	turn := make([]byte, 2048)
	key := make([]byte, 0, size+len(turn)+16)
	for c := 0; c < convs; c++ {
		key = append(append(key[:0], sys...), `{"conv":`+strconv.Itoa(c)+`}`...)
		for len(key) < size {
			key = append(key, jsonish(rng, turn)...)
			tr.Insert(key, uint32(c%4))
		}
	}
	after := heapAlloc()
	chars := tr.Chars()
	runtime.KeepAlive(tr)
	return float64(after-before) / float64(chars), chars
}
