package sessionshard

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/warmroute/warmroute/internal/bytesconv"
)

// DefaultTTL is the session TTL used when Config.TTL is 0.
const DefaultTTL = time.Hour

// Config configures Sessions. The zero value is usable: TTL 1h, no
// capacity limit, the wall clock.
type Config struct {
	// TTL: an entry not accessed (Get or Set) for longer than TTL is
	// reported absent by Get and dropped by Sweep. 0 (or negative) means
	// DefaultTTL.
	TTL time.Duration

	// Capacity is the maximum number of entries kept by Sweep (the
	// router's --max-sessions). 0 (or negative) means unlimited. When
	// exceeded, Sweep drops the least recently accessed entries first.
	// Between sweeps the map may hold up to Capacity+Headroom entries;
	// past that, Set starts the capacity drop itself (see Set). A flood of
	// new keys faster than the drop can go further, but never past
	// Capacity+2×Headroom: there Set does not store new keys (Refused).
	//
	// Memory: SessionBytes per entry with a 36-byte key, so the map
	// retains at most about (Capacity+2×Headroom) × SessionBytes, and
	// (Capacity+Headroom) × SessionBytes unless new keys arrive faster
	// than a drop runs (TestSessionCostCapped).
	Capacity int

	// Headroom is how far above Capacity the map may grow before Set
	// starts a capacity drop: a drop sorts every entry's access time, so
	// it runs once per Headroom new keys. 0 (or negative) means Capacity
	// (up to 2×Capacity entries between drops).
	Headroom int

	// Now returns the current time in unix nanoseconds; nil means
	// time.Now().UnixNano. Tests inject a fake clock here.
	Now func() int64
}

// dead marks an entry whose lastAccess can no longer change: it has been
// (or is being) removed from the map. Readers treat it as absent and
// writers replace it with a fresh entry.
const dead = math.MinInt64

// entry is the value of one session. It is mutated in place with atomics
// only; it is never copied.
//
// Protocol: lastAccess only grows, except for the one transition to dead,
// which is done by CompareAndSwap against a value the remover has judged
// (expired, oldest, or bound to a removed worker). Any refresh in between
// moves lastAccess forward, so the remover's CAS fails and the refreshed
// entry survives. A Set that changes the worker always moves lastAccess
// forward (by at least 1 ns), so a RemoveWorker that read the old worker
// cannot drop the rebound entry either.
type entry struct {
	lastAccess atomic.Int64 // unix ns; dead once removed
	worker     atomic.Uint32
}

// touch refreshes lastAccess to now (never backwards) and reports whether
// the entry is still live.
func (e *entry) touch(now int64) bool {
	for {
		la := e.lastAccess.Load()
		if la == dead {
			return false
		}
		if now <= la || e.lastAccess.CompareAndSwap(la, now) {
			return true
		}
	}
}

// rebind sets the worker to w and moves lastAccess strictly forward; it
// reports whether the entry is still live. When it is not, the caller must
// insert a fresh entry.
func (e *entry) rebind(w uint32, now int64) bool {
	e.worker.Store(w)
	for {
		la := e.lastAccess.Load()
		if la == dead {
			return false
		}
		n := now
		if n <= la {
			n = la + 1
		}
		if e.lastAccess.CompareAndSwap(la, n) {
			return true
		}
	}
}

// entrySize is where the key bytes start in an entry's allocation.
const entrySize = int(unsafe.Sizeof(entry{}))

// newEntry returns a live entry for (w, now) and its own copy of key,
// both in one allocation: the entry in the first entrySize bytes, the key
// bytes right after it. Get reads the key (to compare) and then the entry,
// so they share a cache line, and an insert allocates one object less.
//
// Safety: entry holds no pointers, so it may live in a pointer-free []byte
// allocation. The allocation is at least entrySize bytes, so it comes from
// a size class (a multiple of 8 bytes, never the tiny allocator) and its
// start is 8-byte aligned, as the atomics need. Both the *entry and the
// string point into the allocation and keep it alive; neither is ever
// written through except by the atomics.
func newEntry(key []byte, w uint32, now int64) (*entry, string) {
	buf := make([]byte, entrySize+len(key))
	e := (*entry)(unsafe.Pointer(unsafe.SliceData(buf)))
	e.worker.Store(w)
	e.lastAccess.Store(now)
	if len(key) == 0 {
		return e, ""
	}
	copy(buf[entrySize:], key)
	return e, unsafe.String(&buf[entrySize], len(key))
}

// update maps e to w and refreshes it; it reports whether e is still live.
func (e *entry) update(w uint32, now int64) bool {
	if e.worker.Load() == w {
		return e.touch(now)
	}
	return e.rebind(w, now)
}

// Sessions is the exact-match session → worker map of one model (sticky
// routing). A key maps to the worker (a caller-assigned uint32 id, never
// reused) that served the session, and to the time of its last access.
//
// Design: an xsync.MapOf from the key (a private copy, allocated together
// with its entry) to a *entry holding the worker and the last access as
// atomics. Get is a MapOf.Load (no writes to the map, no locks) plus one
// CAS on the entry; Set on an existing key updates the entry in place with
// atomics. Only inserting a new key allocates (the key copy with its
// entry, the map's node) and locks one map bucket. Removal (RemoveWorker,
// Sweep) first marks the entry dead with a CAS, so it never drops an
// entry that a concurrent Get/Set has just refreshed or rebound (see
// entry), and then removes it from the map.
//
// Key lifetime: the key []byte passed to any method is read only during the
// call and never retained; it may alias a request buffer. Set copies the
// key when it inserts a new entry.
//
// All methods are safe for concurrent use. A Sessions must not be copied
// after first use.
type Sessions struct {
	m        *xsync.MapOf[string, *entry]
	ttl      int64
	capacity int
	headroom int
	now      func() int64

	// n counts the entries in m, dead ones not yet removed included.
	n atomic.Int64
	// refused counts the new keys Set did not store (hard limit).
	refused atomic.Uint64

	// sweepMu serializes sweeps (Sweep and the capacity drop started by
	// Set); Get and Set never take it.
	sweepMu sync.Mutex
	// bgSweep is set while a capacity drop started by Set is running.
	bgSweep atomic.Bool
	bg      sync.WaitGroup
}

// NewSessions returns an empty Sessions configured by cfg.
func NewSessions(cfg Config) *Sessions {
	s := &Sessions{
		m:        xsync.NewMapOf[string, *entry](),
		ttl:      int64(cfg.TTL),
		capacity: cfg.Capacity,
		now:      cfg.Now,
	}
	if s.ttl <= 0 {
		s.ttl = int64(DefaultTTL)
	}
	if s.capacity < 0 {
		s.capacity = 0
	}
	s.headroom = cfg.Headroom
	if s.headroom <= 0 {
		s.headroom = s.capacity
	}
	if s.now == nil {
		s.now = wallClock
	}
	return s
}

func wallClock() int64 { return time.Now().UnixNano() }

// expired reports whether an entry last accessed at la is expired at now.
func (s *Sessions) expired(la, now int64) bool {
	return now-la > s.ttl
}

// Get returns the worker of key and refreshes its last access.
//
// It allocates nothing and takes no locks: one MapOf.Load and at most one
// CAS on the entry. key is used only for the lookup and is not retained.
// An entry last accessed longer than TTL ago is reported absent (and not
// refreshed); Sweep will drop it.
func (s *Sessions) Get(key []byte) (worker uint32, ok bool) {
	return s.GetAt(key, s.now())
}

// GetAt is Get at now (unix ns), for a caller that has read the clock
// already.
func (s *Sessions) GetAt(key []byte, now int64) (worker uint32, ok bool) {
	e, ok := s.m.Load(bytesconv.B2S(key))
	if !ok {
		return 0, false
	}
	la := e.lastAccess.Load()
	if la == dead || s.expired(la, now) {
		return 0, false
	}
	if now > la && !e.lastAccess.CompareAndSwap(la, now) {
		// Someone else refreshed it (lastAccess only grows: fine) or
		// removed it.
		if e.lastAccess.Load() == dead {
			return 0, false
		}
	}
	return e.worker.Load(), true
}

// Set maps key to worker w and refreshes its last access.
//
// An existing entry (expired but not yet swept included) is updated in
// place with atomics: no allocation, no lock. A new key is copied, so the
// caller may reuse key's buffer as soon as Set returns.
//
// Memory bound: when an insert leaves more than Capacity+Headroom entries
// in the map, Set starts the capacity drop of Sweep (expired entries, then the
// least recently accessed down to Capacity) in a background goroutine,
// at most one at a time, so the calling request does not pay for it. If
// new keys arrive faster than that drop removes them and the map reaches
// Capacity+2×Headroom entries, Set does not store new keys until the drop
// has made room (counted by Refused): such a session is simply not sticky
// for a while, which is what a full map means anyway.
func (s *Sessions) Set(key []byte, w uint32) {
	s.SetAt(key, w, s.now())
}

// SetAt is Set at now (unix ns), for a caller that has read the clock
// already.
func (s *Sessions) SetAt(key []byte, w uint32, now int64) {
	if e, ok := s.m.Load(bytesconv.B2S(key)); ok && e.update(w, now) {
		return
	}
	if s.capacity > 0 && s.n.Load() >= int64(s.capacity+2*s.headroom) {
		s.refused.Add(1)
		s.startCapacityDrop()
		return
	}
	s.insert(key, w, now)
}

// Refused returns how many new keys Set has not stored because the map was
// at its hard limit, Capacity+2×Headroom (see Set).
func (s *Sessions) Refused() uint64 { return s.refused.Load() }

// insert stores a fresh entry for key (copied), or updates the live entry
// that a concurrent Set has inserted meanwhile.
func (s *Sessions) insert(key []byte, w uint32, now int64) {
	fresh, k := newEntry(key, w, now)
	inserted := false
	s.m.Compute(k, func(cur *entry, loaded bool) (*entry, bool) {
		if loaded && cur.update(w, now) {
			return cur, false
		}
		// Absent, or dead and waiting for its remover: replace it. The
		// remover deletes only if the map still holds the dead entry.
		inserted = !loaded
		return fresh, false
	})
	if !inserted {
		return
	}
	if n := s.n.Add(1); s.capacity > 0 && n > int64(s.capacity+s.headroom) {
		s.startCapacityDrop()
	}
}

func (s *Sessions) startCapacityDrop() {
	if !s.bgSweep.CompareAndSwap(false, true) {
		return
	}
	s.bg.Go(func() {
		defer s.bgSweep.Store(false)
		s.Sweep(nil)
	})
}

// Delete removes key. key is not retained.
func (s *Sessions) Delete(key []byte) {
	// LoadAndDelete only deletes, so the aliasing key is never stored.
	if e, ok := s.m.LoadAndDelete(bytesconv.B2S(key)); ok {
		e.lastAccess.Store(dead)
		s.n.Add(-1)
	}
}

// kill marks e dead if its lastAccess is still la and then removes it from
// the map under key k. It reports whether e was dropped by this call.
func (s *Sessions) kill(k string, e *entry, la int64) bool {
	if !e.lastAccess.CompareAndSwap(la, dead) {
		return false
	}
	// If a concurrent Set has already replaced the dead entry, remove
	// finds nothing to delete, but e is gone from the map all the same and
	// the drop counts.
	s.remove(k, e)
	return true
}

// remove deletes key k from the map if it still maps to the dead entry e
// (a concurrent Set may have replaced it with a fresh one: that one stays).
func (s *Sessions) remove(k string, e *entry) {
	removed := false
	s.m.Compute(k, func(cur *entry, loaded bool) (*entry, bool) {
		if !loaded {
			return nil, true // nothing to delete
		}
		if cur != e {
			return cur, false // replaced by a concurrent Set: keep
		}
		removed = true
		return nil, true
	})
	if removed {
		s.n.Add(-1)
	}
}

// killWorker removes e if it is still live and bound to w.
func (s *Sessions) killWorker(k string, e *entry, w uint32) bool {
	for {
		// Load lastAccess before the worker: a rebind stores the worker
		// before moving lastAccess forward, so if we see the old worker
		// the CAS below fails.
		la := e.lastAccess.Load()
		if la == dead || e.worker.Load() != w {
			return false
		}
		if s.kill(k, e, la) {
			return true
		}
	}
}

// RemoveWorker eagerly drops every entry of worker w and returns how many
// it dropped. It walks the whole map; Get and Set are not blocked (each
// map bucket is locked only while its pointers are copied). An entry
// rebound to another worker by a concurrent Set is kept.
func (s *Sessions) RemoveWorker(w uint32) int {
	dropped := 0
	s.m.Range(func(k string, e *entry) bool {
		if e.worker.Load() == w && s.killWorker(k, e, w) {
			dropped++
		}
		return true
	})
	return dropped
}

// Sweep drops, in one pass, the expired entries and the entries whose
// worker fails valid (nil means every worker is valid); then, if more than
// Capacity entries remain, the least recently accessed ones down to
// Capacity. It returns how many entries it dropped.
//
// Cost: two passes over the map and a sort of the live entries' access
// times (O(n log n), 8 bytes per entry, only when over capacity). Sweeps
// are serialized with each other but never block Get or Set: the map is
// walked bucket by bucket, and each drop is a CAS on the entry plus a
// one-bucket delete. An entry accessed while the sweep runs is kept, so
// the map may stay slightly above Capacity until the next sweep.
//
// valid is called without any lock held.
func (s *Sessions) Sweep(valid func(uint32) bool) int {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()

	now := s.now()
	dropped := 0
	var las []int64
	collect := false
	if n := s.n.Load(); s.capacity > 0 && n > int64(s.capacity) {
		collect = true
		las = make([]int64, 0, n+n/8)
	}
	s.m.Range(func(k string, e *entry) bool {
		for {
			la := e.lastAccess.Load()
			if la == dead {
				return true
			}
			if s.expired(la, now) || (valid != nil && !valid(e.worker.Load())) {
				if s.kill(k, e, la) {
					dropped++
					return true
				}
				continue // refreshed or rebound meanwhile: judge again
			}
			if collect {
				las = append(las, la)
			}
			return true
		}
	})
	if !collect || len(las) <= s.capacity {
		return dropped
	}

	// Drop the excess oldest: every entry accessed before the cutoff, and
	// as many accessed exactly at the cutoff as needed.
	excess := len(las) - s.capacity
	slices.Sort(las)
	cutoff := las[excess-1]
	atCutoff := excess - countBelow(las[:excess], cutoff)
	s.m.Range(func(k string, e *entry) bool {
		la := e.lastAccess.Load()
		switch {
		case la == dead || la > cutoff:
		case la < cutoff:
			if s.kill(k, e, la) {
				dropped++
			}
		case atCutoff > 0:
			if s.kill(k, e, la) {
				dropped++
				atCutoff--
			}
		}
		return true
	})
	return dropped
}

// countBelow returns how many values of the sorted slice a are below v.
func countBelow(a []int64, v int64) int {
	i, _ := slices.BinarySearch(a, v)
	return i
}

// Len returns the number of entries held, including expired entries that
// no sweep has dropped yet.
func (s *Sessions) Len() int {
	return int(s.n.Load())
}

// Range calls f for each entry held (expired entries not yet swept
// included) with its key, worker and last access (unix ns), until f
// returns false. It is meant for debug summaries. key is the map's own
// copy and may be retained. f is called without any lock held and may call
// other methods of s; entries changed concurrently may or may not be seen.
func (s *Sessions) Range(f func(key string, w uint32, lastAccess int64) bool) {
	s.m.Range(func(k string, e *entry) bool {
		la := e.lastAccess.Load()
		if la == dead {
			return true
		}
		return f(k, e.worker.Load(), la)
	})
}

// PerWorker returns the number of live (not expired) entries per worker,
// for gauges. It walks the map and allocates the result.
func (s *Sessions) PerWorker() map[uint32]int {
	now := s.now()
	per := make(map[uint32]int)
	s.m.Range(func(_ string, e *entry) bool {
		la := e.lastAccess.Load()
		if la != dead && !s.expired(la, now) {
			per[e.worker.Load()]++
		}
		return true
	})
	return per
}

// SessionBytes is the most live heap one session of a Sessions retains
// with a UUID-shaped (36-byte) key on 64-bit platforms: the key copy with
// its entry (one allocation, a 64-byte size class) and its share of the
// map's table, with headroom for the allocator. A longer key adds its
// length beyond 36 bytes, rounded with the entry to the allocator's size
// class. TestSessionCost holds the map to both; BenchmarkMemoryPerSession
// reports the cost.
const SessionBytes = 160
