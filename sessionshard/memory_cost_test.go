//go:build !race

package sessionshard

import (
	"os"
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

// sessionCost inserts n sessions with keys of keyLen bytes (from keyOf)
// into a Sessions with capacity (0: none) and headroom and returns the live heap it
// retains per session present afterwards, and that count.
func sessionCost(n, capacity, headroom int, keyOf func(i int) []byte) (float64, int) {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = keyOf(i)
	}
	before := liveHeap()
	s := NewSessions(Config{Capacity: capacity, Headroom: headroom})
	for i, k := range keys {
		s.Set(k, uint32(i%8))
	}
	s.bg.Wait()
	after := liveHeap()
	runtime.KeepAlive(keys)
	held := s.Len()
	runtime.KeepAlive(s)
	return float64(int64(after)-int64(before)) / float64(held), held
}

// TestSessionCost checks the documented per-session cost (SessionBytes):
// 100k sessions with UUID-shaped 36-byte keys retain at most SessionBytes
// each.
func TestSessionCost(t *testing.T) {
	arena := keyArena(100_000)
	per, n := sessionCost(100_000, 0, 0, func(i int) []byte { return arenaKey(arena, i) })
	t.Logf("%.1f heap bytes per session over %d sessions (36-byte keys); documented %d", per, n, SessionBytes)
	if per > float64(SessionBytes) {
		t.Fatalf("%.1f bytes per session > SessionBytes %d: update the constant and the defaults built on it", per, SessionBytes)
	}
}

// TestMemoryCost reports the live heap per session: UUID-shaped 36-byte
// keys at several sizes, 256-byte keys (the longest the front end keeps as
// sent), and a capped map after a flood of 4× its capacity. It is a
// measurement; run it with
//
//	WARMROUTE_MEMCOST=1 go test -run TestMemoryCost -v ./sessionshard/
func TestMemoryCost(t *testing.T) {
	if os.Getenv("WARMROUTE_MEMCOST") == "" || testing.Short() {
		t.Skip("set WARMROUTE_MEMCOST=1 to measure")
	}
	for _, n := range []int{1 << 16, 1 << 18, 1 << 20} {
		arena := keyArena(n)
		per, held := sessionCost(n, 0, 0, func(i int) []byte { return arenaKey(arena, i) })
		t.Logf("%7d sessions, 36-byte keys:  %6.1f heap bytes/session, %6.1f MB", held, per, per*float64(held)/1e6)
	}
	long := func(i int) []byte {
		k := make([]byte, 256)
		copy(k, keyArena(1)) // fixed prefix
		for j := 0; j < 8; j++ {
			k[255-j] = byte(i >> (8 * j))
		}
		return k
	}
	per, held := sessionCost(1<<18, 0, 0, long)
	t.Logf("%7d sessions, 256-byte keys: %6.1f heap bytes/session, %6.1f MB", held, per, per*float64(held)/1e6)

	const capacity = 1 << 18
	arena := keyArena(4 * capacity)
	for _, headroom := range []int{0, capacity / 4} {
		per, held = sessionCost(4*capacity, capacity, headroom, func(i int) []byte { return arenaKey(arena, i) })
		t.Logf("capacity %d, headroom %d, %d inserted: %d held, %.1f heap bytes/held session, %.1f MB",
			capacity, headroom, 4*capacity, held, per, per*float64(held)/1e6)
	}
}
