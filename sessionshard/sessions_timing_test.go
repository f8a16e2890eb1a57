package sessionshard

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/internal/bytesconv"
)

// Benchmarks. Run them with
//
//	go test -run='^$' -bench=. -benchmem -benchtime=100ms ./sessionshard
//
// Compare runs with benchstat over -count=5 or more.

// keyLen is the length of the UUID-shaped session keys used below.
const keyLen = 36

// keyArena returns n distinct UUID-shaped keys, packed in one buffer so a
// million of them do not cost a million slice headers.
func keyArena(n int) []byte {
	buf := make([]byte, 0, n*keyLen)
	for i := range n {
		h := uint64(i)*0x9e3779b97f4a7c15 + 0x2545f4914f6cdd1d
		buf = fmt.Appendf(buf, "%08x-%04x-4%03x-8%03x-%012x",
			uint32(h>>32), uint16(h>>16), uint16(h)&0xfff, i&0xfff, uint64(i)&0xffffffffffff)
	}
	return buf
}

func arenaKey(arena []byte, i int) []byte {
	return arena[i*keyLen : (i+1)*keyLen : (i+1)*keyLen]
}

// syncMapSessions is the baseline: the same entries and the same Get logic
// (clock, TTL check, CAS refresh) on a sync.Map instead of xsync.MapOf.
type syncMapSessions struct {
	m   sync.Map // string -> *entry
	ttl int64
}

func (s *syncMapSessions) Set(key []byte, w uint32) {
	e := &entry{}
	e.worker.Store(w)
	e.lastAccess.Store(wallClock())
	s.m.Store(string(key), e)
}

func (s *syncMapSessions) Get(key []byte) (uint32, bool) {
	v, ok := s.m.Load(bytesconv.B2S(key))
	if !ok {
		return 0, false
	}
	e := v.(*entry)
	now := wallClock()
	la := e.lastAccess.Load()
	if la == dead || now-la > s.ttl {
		return 0, false
	}
	if now > la {
		e.lastAccess.CompareAndSwap(la, now)
	}
	return e.worker.Load(), true
}

var sink atomic.Uint32

// BenchmarkGetHit: parallel Get hits over 1024 hot keys, Sessions against
// the sync.Map baseline doing the same work; then the bare lookups.
func BenchmarkGetHit(b *testing.B) {
	const n = 1024
	arena := keyArena(n)
	s := NewSessions(Config{})
	base := &syncMapSessions{ttl: int64(DefaultTTL)}
	for i := range n {
		s.Set(arenaKey(arena, i), uint32(i))
		base.Set(arenaKey(arena, i), uint32(i))
	}
	var seed atomic.Uint64
	run := func(b *testing.B, get func([]byte) (uint32, bool)) {
		b.ReportAllocs()
		b.SetBytes(keyLen)
		b.RunParallel(func(pb *testing.PB) {
			i := int(seed.Add(1) * 7919)
			var acc uint32
			for pb.Next() {
				i = (i + 1) & (n - 1)
				w, ok := get(arenaKey(arena, i))
				if !ok {
					panic("miss")
				}
				acc += w
			}
			sink.Add(acc)
		})
	}
	b.Run("sessions", func(b *testing.B) { run(b, s.Get) })
	b.Run("syncmap", func(b *testing.B) { run(b, base.Get) })
	// The lookups alone, without the clock and the refresh.
	b.Run("lookup/mapof", func(b *testing.B) {
		run(b, func(key []byte) (uint32, bool) {
			e, ok := s.m.Load(bytesconv.B2S(key))
			if !ok {
				return 0, false
			}
			return e.worker.Load(), true
		})
	})
	b.Run("lookup/syncmap", func(b *testing.B) {
		run(b, func(key []byte) (uint32, bool) {
			v, ok := base.m.Load(bytesconv.B2S(key))
			if !ok {
				return 0, false
			}
			return v.(*entry).worker.Load(), true
		})
	})
}

// BenchmarkGetMiss: parallel Get misses (keys never set).
func BenchmarkGetMiss(b *testing.B) {
	const n = 1024
	arena := keyArena(2 * n)
	s := NewSessions(Config{})
	for i := range n {
		s.Set(arenaKey(arena, i), uint32(i))
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i = (i + 1) & (n - 1)
			if _, ok := s.Get(arenaKey(arena, n+i)); ok {
				panic("hit")
			}
		}
	})
}

// BenchmarkSetExisting: Set on keys already present (same worker, and a
// rebind to another worker).
func BenchmarkSetExisting(b *testing.B) {
	const n = 1024
	arena := keyArena(n)
	s := NewSessions(Config{})
	for i := range n {
		s.Set(arenaKey(arena, i), 1)
	}
	b.Run("same-worker", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s.Set(arenaKey(arena, i&(n-1)), 1)
		}
	})
	b.Run("rebind", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s.Set(arenaKey(arena, i&(n-1)), uint32(i))
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		var seed atomic.Uint64
		b.RunParallel(func(pb *testing.PB) {
			i := int(seed.Add(1) * 7919)
			for pb.Next() {
				i++
				s.Set(arenaKey(arena, i&(n-1)), 1)
			}
		})
	})
}

// BenchmarkSetNew: Set of a key never seen (copy, entry, map insert,
// growth included).
func BenchmarkSetNew(b *testing.B) {
	s := NewSessions(Config{})
	key := make([]byte, 0, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		key = strconv.AppendInt(append(key[:0], "sess-2f1e8b9c-0d11-4c5e-"...), int64(i), 10)
		s.Set(key, 1)
	}
}

// BenchmarkGetGrowth: Get hit cost as the map grows. "hot=64" and
// "hot=1024" read that many keys spread evenly over the map (the working
// set of active sessions), "uniform" reads keys uniformly at random over
// all of them. The lookup is O(1); what grows with the map is cache and
// TLB misses: 1024 hot keys spread over a 1M-entry map touch ~3000 pages.
func BenchmarkGetGrowth(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			arena := keyArena(n)
			s := NewSessions(Config{})
			for i := range n {
				s.Set(arenaKey(arena, i), uint32(i))
			}
			run := func(b *testing.B, idx []int) {
				b.ReportAllocs()
				var acc uint32
				for i := 0; b.Loop(); i++ {
					w, ok := s.Get(arenaKey(arena, idx[i&(len(idx)-1)]))
					if !ok {
						panic("miss")
					}
					acc += w
				}
				sink.Add(acc)
			}
			for _, h := range []int{64, 1024} {
				idx := make([]int, h)
				for j := range idx {
					idx[j] = j * n / h
				}
				b.Run(fmt.Sprintf("hot=%d", h), func(b *testing.B) { run(b, idx) })
			}
			r := rand.New(rand.NewPCG(1, 2))
			idx := make([]int, 1<<16)
			for j := range idx {
				idx[j] = r.IntN(n)
			}
			b.Run("uniform", func(b *testing.B) { run(b, idx) })
		})
	}
}

// BenchmarkClock is the cost of the default clock (time.Now().UnixNano),
// which Get and Set call once each.
func BenchmarkClock(b *testing.B) {
	var acc int64
	for b.Loop() {
		acc += wallClock()
	}
	sink.Add(uint32(acc))
}
