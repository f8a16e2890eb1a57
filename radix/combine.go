package radix

import (
	"sync"
)

// Writers never wait for each other: flat combining.
//
// The tree has one writer token (Tree.writing, an atomic bool) and one
// lock-free stack of handed-over writes (Tree.pending, a Treiber stack of
// *op). A writer first tries to take the token with one CompareAndSwap. If
// it wins, it applies whatever was handed over, then its own write, then
// releases the token (see combine). If it loses, it copies its key into a
// pooled buffer (the caller's key may alias a request buffer and must never
// be stored), pushes (key, worker, stamp) onto the stack and tries the token
// once more; if that fails too it returns: the current holder applies the
// write for it. Nobody ever blocks: a failed CompareAndSwap is followed by a
// return, never by a wait. RemoveWorker, which must not return before it is
// applied, waits on its own channel, never on the token.
//
// Why not sync.Mutex.TryLock: its failure does not mean "held by a goroutine
// that will look at the stack after releasing it". It also fails on an
// unlocked mutex in starvation mode (ownership in flight to a woken waiter)
// and when the CompareAndSwap loses to waiter bookkeeping of an Unlock in
// progress. The argument below needs a failed acquire to have observed the
// token held, which a CompareAndSwap(false, true) on a bool that only
// holders set back to false gives exactly.
//
// Ordering argument. Every operation on writing and pending is a sync/atomic
// operation, and those are sequentially consistent in Go: they happen in one
// total order that every goroutine agrees on. Let a writer P push op o.
//
//  1. Any goroutine that takes the token after o's push applies o before it
//     releases the token: the first thing a holder does is pending.Swap(nil),
//     which comes after the push in the total order, so it returns a list
//     that contains o, unless an earlier Swap already took o; only token
//     holders Swap, and a holder applies everything it took before it
//     releases.
//  2. If P's second CompareAndSwap fails, it read writing == true: some H
//     held the token at that point, after the push. H's release
//     (writing.Store(false)) is later still, and after it H loads pending
//     (combine). That load comes after the push, so it sees o (or o already
//     taken by a Swap, hence applied by 1). H then tries the token: if it
//     wins, it applies o; if it loses, a holder H2 took the token after H's
//     release, so after the push, and 1 applies to H2. If H has combined
//     its share (combineLimit) it starts a goroutine that does the same
//     acquire attempt in its place.
//
// So no write is ever dropped, and a handed-over write is published at the
// latest when the holder at the time of the hand-over finishes the round in
// progress plus one more round (microseconds per write; see Insert for
// costs). Nothing is bounded silently:
//
//   - a request that wins the token applies, round after round, the writes
//     handed over while it held it, but after combineLimit of other callers'
//     writes it releases the token and, if more are pending, leaves them to
//     a short-lived goroutine (combineDetached) that drains until the stack
//     is empty. One round takes the whole stack, which holds at most
//     maxPending inserts plus one write per waiting caller (below), so a
//     request's Insert applies at most its own write, combineLimit others
//     and one more round.
//   - at most maxPending handed-over Inserts, holding at most
//     maxPendingBytes of key copies, wait on the stack (npending).
//     Past that an Insert still hands its write over, but then waits on a
//     channel until it is applied, as RemoveWorker does: that is overload
//     (writes requested faster than one core applies them; see
//     BenchmarkTeachContended/saturated), and backpressure on the callers
//     is the only alternative to unbounded memory (one key copy per queued
//     write) and to dropping writes. A waiting caller waits for one round
//     of the holder, never for a lock queue. Pending entries, and their key
//     copies, are therefore bounded by maxPending (maxPendingBytes) plus one
//     per waiting caller.
//
// A handed-over write carries the stamp of its call, not of its
// application: the request arrived then. Writers store a holder's stamp only
// if it is newer than the one present, so an old handed-over stamp never
// moves back a Touch that happened in between.

// combineLimit is how many writes handed over by others one caller applies
// before it leaves the rest to a background goroutine.
const combineLimit = 32

// maxPending and maxPendingBytes bound the handed-over Inserts waiting on
// the stack, in writes and in bytes of key copies: an Insert that would go
// past either still hands its write over but waits until it is applied
// (backpressure). They are far above what the router queues while a writer
// is merely descheduled (64 sessions of 64 KB: 4 MiB), so they only bite
// under overload.
const (
	maxPending      = 256
	maxPendingBytes = 16 << 20
)

// maxPooledKey is the largest key buffer kept in opPool.
const maxPooledKey = 4 << 20

// op is one handed-over write: an insert of key for w stamped stamp, or
// RemoveWorker(w). done, when non-nil, is closed once the write is applied
// (RemoveWorker, and an Insert past maxPending); such an op is not pooled.
type op struct {
	next   *op
	key    []byte // a private copy (pooled), never the caller's buffer
	w      uint32
	stamp  int64 // the insert's stamp; EvictOlder's cutoff
	remove bool
	older  bool // EvictOlder(w, stamp); key is empty
	done   chan struct{}
}

var opPool = sync.Pool{New: func() any { return new(op) }}

// handOverInsert hands Insert(key, w) stamped stamp over to the holder of
// the token. It returns at once unless the stack is full (maxPending,
// maxPendingBytes); then it waits until its own write is applied.
func (t *Tree) handOverInsert(key []byte, w uint32, stamp int64) {
	o := opPool.Get().(*op)
	o.key = append(o.key[:0], key...)
	o.w, o.stamp = w, stamp
	n, nb := t.npending.Add(1), t.npendingBytes.Add(int64(len(key)))
	if n <= maxPending && nb <= maxPendingBytes {
		t.handOver(o)
		return
	}
	done := make(chan struct{})
	o.done = done
	t.handOver(o)
	<-done
}

// tryAcquire takes the writer token without waiting.
func (t *Tree) tryAcquire() bool {
	return t.writing.CompareAndSwap(false, true)
}

// release gives the writer token back. Every section that holds the token
// releases it with a deferred call to release, so a write that panics (a
// bug: the tree's writes do not panic on any input) still frees the token
// and later writes are not blocked behind it. *ok is false when the
// section did not finish, that is while panicking: the section will not
// look at the stack again, so whatever was handed over meanwhile (and the
// writes drainPending put back, see there) is left to a fresh goroutine,
// as combine does past its limit.
func (t *Tree) release(ok *bool) {
	t.writing.Store(false)
	if !*ok && t.pending.Load() != nil {
		go t.combineDetached()
	}
}

// handOver pushes o onto the pending stack (Treiber push; pops only ever
// take the whole stack, so there is no ABA) and then tries once more to take
// the token, combining if it wins. See the ordering argument above.
func (t *Tree) handOver(o *op) {
	t.push(o)
	if t.tryAcquire() {
		t.combine(combineLimit)
	}
}

func (t *Tree) push(o *op) {
	for {
		head := t.pending.Load()
		o.next = head
		if t.pending.CompareAndSwap(head, o) {
			return
		}
	}
}

// drainPending applies every write on the pending stack, oldest first, and
// returns how many. Called with the token held.
//
// If a write panics, the deferred settle drops that one write (its waiter,
// if any, is released; the counters are corrected) and pushes the writes
// not yet applied back onto the stack, so the next holder applies them:
// none is lost and no waiter hangs.
func (t *Tree) drainPending() int {
	list := t.pending.Swap(nil)
	if list == nil {
		return 0
	}
	// Reverse the LIFO stack: writes of one goroutine apply in call order.
	var fifo *op
	for list != nil {
		next := list.next
		list.next = fifo
		fifo, list = list, next
	}
	n := 0
	var cur, rest *op // the write being applied, and those after it
	defer func() {
		if cur != nil {
			t.settle(cur, rest)
		}
	}()
	for o := fifo; o != nil; o = rest {
		cur, rest = o, o.next
		o.next = nil
		switch {
		case o.remove:
			t.removeWorker(o.w)
		case o.older:
			t.evictOlder(o.w, o.stamp)
		default:
			t.insert(o.key, o.w, o.stamp)
		}
		t.done(o)
		n++
	}
	cur = nil
	return n
}

// done retires the applied write o: counters, waiter, pool.
func (t *Tree) done(o *op) {
	if !o.remove && !o.older {
		t.npending.Add(-1)
		t.npendingBytes.Add(-int64(len(o.key)))
	}
	if o.done != nil {
		close(o.done)
	} else if cap(o.key) <= maxPooledKey {
		o.key, o.older = o.key[:0], false
		opPool.Put(o)
	}
}

// settle runs when the write failed panicked in drainPending: it retires
// failed as if applied (it is dropped; insert never retains its key, so
// the op may still be pooled) and pushes rest, the writes after it, back
// onto the stack in their order.
func (t *Tree) settle(failed, rest *op) {
	t.done(failed)
	for o := rest; o != nil; {
		next := o.next
		t.push(o)
		o = next
	}
}

// combine is called with the token held. It drains the pending stack,
// releases the token, and if more was handed over meanwhile takes the token
// back (without waiting) and drains again, until the stack is empty, the
// token is taken by someone else (who will drain), or limit writes were
// applied (then a background goroutine continues).
func (t *Tree) combine(limit int) {
	applied := 0
	for {
		applied += t.drainHeld()
		if t.pending.Load() == nil {
			return
		}
		if applied >= limit {
			go t.combineDetached()
			return
		}
		if !t.tryAcquire() {
			return
		}
	}
}

// drainHeld applies the handed-over writes and releases the token (deferred:
// see release).
func (t *Tree) drainHeld() int {
	ok := false
	defer t.release(&ok)
	n := t.drainPending()
	ok = true
	return n
}

// resume is called by a writer right after it released the token: if
// writes were handed over meanwhile, it takes the token back (without
// waiting) and combines them. Argument 2 above: after its release, a holder
// loads pending.
func (t *Tree) resume(limit int) {
	if t.pending.Load() != nil && t.tryAcquire() {
		t.combine(limit)
	}
}

// combineDetached drains on behalf of a caller that combined its share. It
// is a plain acquire attempt, so argument 2 applies when it fails.
func (t *Tree) combineDetached() {
	if t.tryAcquire() {
		t.combine(int(^uint(0) >> 1))
	}
}
