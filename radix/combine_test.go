package radix

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
)

// waitIdle waits until no write is pending or running. When every Insert
// caller has returned, the only writer that may still be running is the
// background goroutine a caller leaves its excess to (combineLimit).
// pending is loaded before writing: a write taken off the stack is applied
// before the token is released, so pending == nil followed by a free token
// means everything handed over before the first load is published.
func waitIdle(t testing.TB, tr *Tree) {
	t.Helper()
	testwait.Until(t, "no write to be pending or running", func() bool {
		return tr.pending.Load() == nil && !tr.writing.Load()
	})
}

// pendingLen counts the writes handed over and not yet taken by a holder.
func pendingLen(tr *Tree) int {
	n := 0
	for o := tr.pending.Load(); o != nil; o = o.next {
		n++
	}
	return n
}

// TestConcurrentInsertsNothingLost has many goroutines grow their own keys
// (a shared prefix plus a private history, one turn per Insert, Touch first
// like the router) into one tree at once, each reusing and then scribbling
// over its request buffer. Every write must land: afterwards each final key
// matches in full for its worker, and the tree's accounting is exact.
func TestConcurrentInsertsNothingLost(t *testing.T) {
	const goroutines = 32
	turns := 60
	if testing.Short() {
		turns = 15
	}
	tr := New(Config{})
	rng := rand.New(rand.NewPCG(5, 5))
	sys := jsonish(rng, make([]byte, 2048))
	finals := make([][]byte, goroutines)
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 9))
			w := uint32(g % 5)
			key := append(bytes.Clone(sys), fmt.Sprintf(`{"conv":%d}`, g)...)
			req := make([]byte, 0, 64<<10) // the request buffer Insert must not keep
			for i := 0; i < turns; i++ {
				key = append(key, jsonish(r, make([]byte, 32+r.IntN(200)))...)
				req = append(req[:0], key...)
				if !tr.Touch(req, w) {
					tr.Insert(req, w)
				}
				for j := range req {
					req[j] = 'X'
				}
				if i%7 == 0 {
					runtime.Gosched()
				}
			}
			finals[g] = key
		})
	}
	wg.Wait()
	waitIdle(t, tr)
	for g, key := range finals {
		w := uint32(g % 5)
		if m := tr.Match(key, only(w)); m.Len != len(key) || m.Worker != w {
			t.Fatalf("goroutine %d: Match = %+v; want len %d worker %d", g, m, len(key), w)
		}
		if !tr.Touch(key, w) {
			t.Fatalf("goroutine %d: Touch = false", g)
		}
	}
	if m := tr.Match(bytes.Repeat([]byte("X"), 64), nil); m.AnyLen != 0 {
		t.Fatalf("the tree holds a scribbled request buffer: %+v", m)
	}
	checkTree(t, tr)
}

// TestConcurrentInsertsWithEviction is the same race with a budget, so
// writes applied by a combiner also evict, and with RemoveWorker calls
// handed over among them.
func TestConcurrentInsertsWithEviction(t *testing.T) {
	const goroutines = 16
	const budget = 8 << 10
	tr := New(Config{MaxCharsPerWorker: budget})
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 11))
			key := []byte(fmt.Sprintf("conv%d|", g))
			for i := 0; i < 80; i++ {
				key = append(key, jsonish(r, make([]byte, 20+r.IntN(100)))...)
				if len(key) > 4<<10 {
					key = key[:8]
				}
				if g == 0 && i%20 == 19 {
					tr.RemoveWorker(uint32(r.IntN(4)))
					continue
				}
				if w := uint32(g % 4); !tr.Touch(key, w) {
					tr.Insert(key, w)
				}
			}
		})
	}
	wg.Wait()
	waitIdle(t, tr)
	checkTree(t, tr)
	for w := uint32(0); w < 4; w++ {
		if c := tr.WorkerChars(w); c > budget {
			t.Fatalf("worker %d over budget: %d", w, c)
		}
	}
}

// TestHandOver makes the hand-over path deterministic: the test holds the
// writer token, as a goroutine in the middle of a write would. Inserts then
// return at once without publishing, keep no reference to the caller's
// buffer, and become visible, in call order, when the holder finishes
// (combine, what every holder runs before returning). A RemoveWorker handed
// over returns only once applied.
func TestHandOver(t *testing.T) {
	tr := newTestTree(0, 0)
	tr.Insert([]byte("system|"), 3)
	if !tr.tryAcquire() {
		t.Fatal("token taken on an idle tree")
	}

	buf := []byte("system|hello world")
	tr.Insert(buf, 1) // handed over
	copy(buf, "XXXXXXXXXXXXXXXXXX")
	buf = append(buf[:0], "system|hello there"...)
	tr.Insert(buf, 2) // handed over
	copy(buf, "YYYYYYYYYYYYYYYYYY")
	tr.Insert([]byte("system|hello world"), 2) // handed over: now held by 1 and 2

	if tr.pending.Load() == nil {
		t.Fatal("nothing handed over")
	}
	if m := tr.Match([]byte("system|hello world"), nil); m.AnyLen != 7 {
		t.Fatalf("handed-over insert visible while the holder runs: %+v", m)
	}

	removed := make(chan struct{})
	go func() {
		tr.RemoveWorker(3) // handed over too: must wait for the holder
		close(removed)
	}()
	testwait.Until(t, "RemoveWorker to hand over", func() bool { return pendingLen(tr) == 4 })
	select {
	case <-removed:
		t.Fatal("RemoveWorker returned before the holder applied it")
	case <-time.After(20 * time.Millisecond):
	}

	tr.combine(combineLimit) // the holder finishes: drains and releases
	<-removed
	if tr.writing.Load() || tr.pending.Load() != nil {
		t.Fatal("holder returned with the token held or writes pending")
	}
	if m := tr.Match([]byte("system|hello world"), only(1)); m.Len != 18 || m.Worker != 1 {
		t.Fatalf("handed-over insert of worker 1: %+v", m)
	}
	// Applied in call order: worker 2's later insert of the same key has the
	// newer stamp.
	if m := tr.Match([]byte("system|hello world"), nil); m.Len != 18 || m.Worker != 2 {
		t.Fatalf("handed-over inserts out of order: %+v", m)
	}
	if m := tr.Match([]byte("system|hello there"), only(2)); m.Len != 18 {
		t.Fatalf("handed-over insert of worker 2: %+v", m)
	}
	for _, junk := range []string{"XXXX", "YYYY"} {
		if m := tr.Match([]byte(junk), nil); m.AnyLen != 0 {
			t.Fatalf("tree kept the caller's buffer: %q matches %+v", junk, m)
		}
	}
	if tr.WorkerChars(3) != 0 {
		t.Fatalf("RemoveWorker(3) not applied: %d chars", tr.WorkerChars(3))
	}
	checkTree(t, tr)

	// With the token free again, Insert publishes before it returns.
	tr.Insert([]byte("system|direct"), 4)
	if m := tr.Match([]byte("system|direct"), only(4)); m.Len != 13 {
		t.Fatalf("direct insert not published on return: %+v", m)
	}
}

// TestHandOverOlderStampKeepsTouch: a handed-over write carries the stamp
// of its call; a Touch that came after it must not be moved back.
func TestHandOverOlderStampKeepsTouch(t *testing.T) {
	tr := newTestTree(0, 0)
	tr.Insert([]byte("abc"), 1)
	tr.Insert([]byte("abc"), 2)
	if !tr.tryAcquire() {
		t.Fatal("token taken")
	}
	tr.Insert([]byte("abcdef"), 1) // stamped now, applied later
	tr.Touch([]byte("abc"), 2)     // newer
	tr.combine(combineLimit)
	if m := tr.Match([]byte("abc"), nil); m.Worker != 2 {
		t.Fatalf("older handed-over stamp overwrote a newer Touch: %+v", m)
	}
	if m := tr.Match([]byte("abcdef"), nil); m.Len != 6 || m.Worker != 1 {
		t.Fatalf("handed-over insert: %+v", m)
	}
}

// TestHandOverBackpressure: past maxPending handed-over inserts, Insert
// still hands its write over but waits until it is applied, so the stack
// and its key copies stay bounded; nothing is dropped.
func TestHandOverBackpressure(t *testing.T) {
	tr := newTestTree(0, 0)
	if !tr.tryAcquire() {
		t.Fatal("token taken")
	}
	for i := 0; i < maxPending; i++ {
		tr.Insert(fmt.Appendf(nil, "key-%03d", i), 1) // returns at once
	}
	returned := make(chan struct{})
	go func() {
		tr.Insert([]byte("key-last"), 2)
		close(returned)
	}()
	testwait.Until(t, "the extra Insert to hand over", func() bool { return tr.npending.Load() > maxPending })
	select {
	case <-returned:
		t.Fatal("Insert past maxPending returned before it was applied")
	case <-time.After(20 * time.Millisecond):
	}
	tr.combine(combineLimit)
	<-returned
	if n := tr.npending.Load(); n != 0 {
		t.Fatalf("npending = %d after the drain", n)
	}
	for i := 0; i < maxPending; i++ {
		if m := tr.Match(fmt.Appendf(nil, "key-%03d", i), only(1)); m.Len != 7 {
			t.Fatalf("key-%03d lost: %+v", i, m)
		}
	}
	if m := tr.Match([]byte("key-last"), only(2)); m.Len != 8 {
		t.Fatalf("key-last lost: %+v", m)
	}
	checkTree(t, tr)
}

// panicOn makes every applied insert of key panic (test hook).
func panicOn(tr *Tree, key string) {
	tr.hook = func(k []byte) {
		if string(k) == key {
			panic("insert hook: " + key)
		}
	}
}

// insertRecovering calls Insert and reports whether it panicked.
func insertRecovering(tr *Tree, key string, w uint32) (panicked bool) {
	defer func() { panicked = recover() != nil }()
	tr.Insert([]byte(key), w)
	return false
}

// TestInsertPanicReleasesToken: an insert that panics while its caller
// holds the writer token must not keep the token: the next Insert takes
// it, applies its write and publishes it before returning.
func TestInsertPanicReleasesToken(t *testing.T) {
	tr := newTestTree(0, 0)
	panicOn(tr, "boom")
	if !insertRecovering(tr, "boom", 1) {
		t.Fatal("the hook did not panic")
	}
	if tr.writing.Load() {
		t.Fatal("the writer token is still held after a panicking insert")
	}
	done := make(chan struct{})
	go func() {
		tr.Insert([]byte("after"), 2)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the insert after a panicking one did not complete")
	}
	if m := tr.Match([]byte("after"), only(2)); m.Len != 5 {
		t.Fatalf("the insert after the panic is not published: %+v", m)
	}
	checkTree(t, tr)
}

// TestHandedOverPanicKeepsOthers: a handed-over insert that panics while
// a holder drains the stack is dropped, but the writes handed over after
// it are still applied, a RemoveWorker waiting behind it returns, and the
// token is free again.
func TestHandedOverPanicKeepsOthers(t *testing.T) {
	tr := newTestTree(0, 0)
	tr.Insert([]byte("gone"), 3)
	panicOn(tr, "boom")
	if !tr.tryAcquire() {
		t.Fatal("token taken on an idle tree")
	}
	tr.Insert([]byte("before"), 1) // handed over
	tr.Insert([]byte("boom"), 1)   // handed over; panics when applied
	tr.Insert([]byte("after"), 2)  // handed over
	removed := make(chan struct{})
	go func() {
		tr.RemoveWorker(3) // handed over; waits until applied
		close(removed)
	}()
	testwait.Until(t, "RemoveWorker to hand over", func() bool { return pendingLen(tr) == 4 })
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handed-over insert did not panic")
			}
		}()
		tr.combine(combineLimit) // the holder finishes and meets the panic
	}()
	select {
	case <-removed:
	case <-time.After(10 * time.Second):
		t.Fatal("RemoveWorker behind a panicking write never returned")
	}
	waitIdle(t, tr)
	for _, c := range []struct {
		key string
		w   uint32
	}{{"before", 1}, {"after", 2}} {
		if m := tr.Match([]byte(c.key), only(c.w)); m.Len != len(c.key) {
			t.Fatalf("%q of worker %d lost: %+v", c.key, c.w, m)
		}
	}
	if m := tr.Match([]byte("boom"), nil); m.AnyLen > 1 { // "b" is before's
		t.Fatalf("the panicking insert was applied: %+v", m)
	}
	if tr.WorkerChars(3) != 0 {
		t.Fatal("RemoveWorker(3) not applied")
	}
	if n := tr.npending.Load(); n != 0 {
		t.Fatalf("npending = %d", n)
	}
	checkTree(t, tr)
	tr.Insert([]byte("later"), 4)
	if m := tr.Match([]byte("later"), only(4)); m.Len != 5 {
		t.Fatalf("insert after recovery not published: %+v", m)
	}
}
