package route

import (
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/kvevents"
)

// A worker's KV events keep its part of the tree true: when the engine
// removes blocks, every history the worker last used no later than the
// one that stored them leaves the tree, newer ones stay, other workers are
// untouched; removals of blocks never seen, or of other tiers, change
// nothing; AllBlocksCleared empties the worker's part; a resync forgets
// the map, so a removal after it changes nothing.
func TestKVEventsFollowTheEngine(t *testing.T) {
	f := newFixture(t, 2, nil)
	st, _ := f.ca.state("m")
	w0, w1 := f.ws[0], f.ws[1]
	conv := func(name string) []byte { return []byte(name + strings.Repeat(" turn", 400)) }
	insert := func(name string, w uint32) { st.tree.InsertAt(conv(name), w, f.now.Load()) }
	stored := func(hs ...kvevents.BlockHash) *kvevents.Batch {
		return &kvevents.Batch{Events: []kvevents.Event{kvevents.BlockStored{BlockHashes: hs, BlockSize: 16, Medium: "GPU"}}}
	}
	removed := func(medium string, hs ...kvevents.BlockHash) *kvevents.Batch {
		return &kvevents.Batch{Events: []kvevents.Event{kvevents.BlockRemoved{BlockHashes: hs, Medium: medium}}}
	}
	holds := func(name string, w uint32) bool { // read-only: Hold would refresh the stamps
		held := false
		st.tree.MatchEach(conv(name), 0, func(h uint32, n int) { held = held || h == w && n > 0 })
		return held
	}

	f.ca.follower(w0).noteAnswer(100*time.Millisecond, 200*time.Millisecond)
	insert("old", w0.ID())
	insert("old", w1.ID())
	f.now.Add(int64(100 * time.Millisecond)) // the prefill ends, the store arrives
	f.ca.KVEvents(w0, stored(1, 2, 3))
	f.now.Add(int64(time.Minute))
	insert("new", w0.ID())
	f.now.Add(int64(100 * time.Millisecond))
	f.ca.KVEvents(w0, stored(4, 5))

	f.ca.KVEvents(w0, removed("CPU", 3))  // another tier
	f.ca.KVEvents(w0, removed("GPU", 99)) // never stored
	if !holds("old", w0.ID()) || !holds("new", w0.ID()) {
		t.Fatal("a removal that names no followed GPU block changed the tree")
	}
	f.ca.KVEvents(w0, removed("GPU", 3, 2))
	if holds("old", w0.ID()) || !holds("new", w0.ID()) || !holds("old", w1.ID()) {
		t.Fatalf("after the old history's blocks left: old on w0 %v (want gone), new on w0 %v, old on w1 %v",
			holds("old", w0.ID()), holds("new", w0.ID()), holds("old", w1.ID()))
	}
	if f.ca.kvEvictions.Load() != 1 {
		t.Fatalf("evictions %d", f.ca.kvEvictions.Load())
	}

	f.ca.KVResync(w0, false)
	f.ca.KVEvents(w0, removed("GPU", 4, 5))
	if !holds("new", w0.ID()) {
		t.Fatal("a removal of blocks stored before a resync evicted")
	}
	insert("other", w1.ID())
	f.ca.KVResync(w1, true) // w1's engine restarted: its cache is empty
	if st.tree.WorkerChars(w1.ID()) != 0 || !holds("new", w0.ID()) {
		t.Fatal("a restarted publisher did not empty its worker's part alone")
	}
	insert("old", w1.ID())
	f.ca.KVEvents(w0, &kvevents.Batch{Events: []kvevents.Event{kvevents.AllBlocksCleared{}}})
	if st.tree.WorkerChars(w0.ID()) != 0 || !holds("old", w1.ID()) {
		t.Fatal("AllBlocksCleared did not empty the worker's part alone")
	}

	// A history selected within the worker's answer time may still be
	// running, its blocks held: a removal right after its store spares it.
	insert("running", w0.ID())
	f.now.Add(int64(100 * time.Millisecond))
	f.ca.KVEvents(w0, stored(6))
	f.ca.KVEvents(w0, removed("GPU", 6))
	if !holds("running", w0.ID()) {
		t.Fatal("a history that may still be running was evicted")
	}
}

// The map of one worker's blocks is bounded by its engine's capacity, and
// by kvMapMax when it states none, whatever the events say.
func TestKVFollowIsBounded(t *testing.T) {
	f := newFixture(t, 1, nil)
	w := f.ws[0]
	hs := make([]kvevents.BlockHash, 3*kvMapMin)
	for i := range hs {
		hs[i] = kvevents.BlockHash(i)
	}
	fl := f.ca.follower(w)
	fl.mu.Lock()
	for _, h := range hs {
		fl.put(h, 1, kvMapMin)
	}
	n := len(fl.stamps)
	fl.mu.Unlock()
	if n != kvMapMin {
		t.Fatalf("%d blocks followed, bound %d", n, kvMapMin)
	}
	if got := mapLimit(w, 16); got != kvMapMax {
		t.Fatalf("limit without a stated capacity %d", got)
	}
}
