//go:build !race

package sessionshard

import (
	"fmt"
	"runtime"
	"testing"
)

// Heap measurements (hence !race: the race detector changes allocation).

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// load is a shape of sessions to measure: n keys of keyLen bytes set into
// a Sessions with capacity (0: none) and headroom (0: Capacity).
type load struct {
	n, keyLen, capacity, headroom int
}

func (l load) String() string {
	s := fmt.Sprintf("keys=%dB/sessions=%d", l.keyLen, l.n)
	if l.capacity > 0 {
		s += fmt.Sprintf("/capacity=%d/headroom=%d", l.capacity, l.headroom)
	}
	return s
}

// keys returns l's n distinct keys: UUID-shaped for 36 bytes, else a fixed
// prefix ending in the key's index.
func (l load) keys() [][]byte {
	keys := make([][]byte, l.n)
	if l.keyLen == keyLen {
		arena := keyArena(l.n)
		for i := range keys {
			keys[i] = arenaKey(arena, i)
		}
		return keys
	}
	prefix := keyArena(1)
	for i := range keys {
		k := make([]byte, l.keyLen)
		copy(k, prefix)
		for j := 0; j < 8; j++ {
			k[l.keyLen-1-j] = byte(i >> (8 * j))
		}
		keys[i] = k
	}
	return keys
}

// cost sets l's keys (the drops Set starts finished) and returns the live
// heap the Sessions retains in all and the sessions it holds.
func (l load) cost() (heap int64, held int) {
	keys := l.keys()
	before := liveHeap()
	s := NewSessions(Config{Capacity: l.capacity, Headroom: l.headroom})
	for i, k := range keys {
		s.Set(k, uint32(i%8))
	}
	s.bg.Wait()
	after := liveHeap()
	runtime.KeepAlive(keys)
	held = s.Len()
	runtime.KeepAlive(s)
	return int64(after) - int64(before), held
}

// TestSessionCost holds a session to the documented SessionBytes with a
// UUID-shaped 36-byte key, and a longer key to SessionBytes plus what its
// length adds (the longest the front end keeps as sent: 256 bytes). 2^16
// sessions is the worst count: the map's table has just doubled, so each
// session's share of it is the largest.
func TestSessionCost(t *testing.T) {
	for _, l := range []load{{n: 1 << 16, keyLen: keyLen}, {n: 1 << 16, keyLen: 256}} {
		heap, held := l.cost()
		per, limit := float64(heap)/float64(held), SessionBytes+l.keyLen-keyLen
		if per > float64(limit) {
			t.Errorf("%v: %.1f heap bytes per session > %d: update SessionBytes and the defaults built on it", l, per, limit)
		}
	}
}

// TestSessionCostCapped: a flood of new keys, 4× Capacity, leaves a capped
// map within the documented bound (Capacity+2×Headroom) × SessionBytes,
// with the default headroom and a smaller one.
func TestSessionCostCapped(t *testing.T) {
	const capacity = 1 << 16
	for _, headroom := range []int{0, capacity / 4} {
		l := load{n: 4 * capacity, keyLen: keyLen, capacity: capacity, headroom: headroom}
		heap, held := l.cost()
		if headroom == 0 {
			headroom = capacity // Config's default
		}
		if limit := int64(capacity+2*headroom) * SessionBytes; heap > limit {
			t.Errorf("%v: %d heap bytes for %d sessions held > (Capacity+2×Headroom) × SessionBytes = %d", l, heap, held, limit)
		}
	}
}

// BenchmarkMemoryPerSession reports the live heap per session held
// (heapB/session), in all (heapMB) and the sessions held: 36-byte keys at
// several counts, 256-byte keys, and a capped map after a flood of 4× its
// capacity.
func BenchmarkMemoryPerSession(b *testing.B) {
	const capacity = 1 << 18
	for _, l := range []load{
		{n: 1 << 16, keyLen: keyLen},
		{n: 100_000, keyLen: keyLen},
		{n: 1 << 18, keyLen: keyLen},
		{n: 1 << 20, keyLen: keyLen},
		{n: 1 << 18, keyLen: 256},
		{n: 4 * capacity, keyLen: keyLen, capacity: capacity},
		{n: 4 * capacity, keyLen: keyLen, capacity: capacity, headroom: capacity / 4},
	} {
		b.Run(l.String(), func(b *testing.B) {
			var heap int64
			var held int
			for b.Loop() {
				heap, held = l.cost()
			}
			b.ReportMetric(float64(heap)/float64(held), "heapB/session")
			b.ReportMetric(float64(heap)/1e6, "heapMB")
			b.ReportMetric(float64(held), "sessions")
		})
	}
}
