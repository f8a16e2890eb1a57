package radix

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkTeachContended is the router's teach step under agent load: 32
// sessions per P (64 on 2 cores) whose histories start at 64 KB (a shared
// 16 KB system prompt + tools, then 48 KB of their own) and grow by one
// 1 KB turn per op: Touch, then Insert on a miss, as route.CacheAware.teach
// does. After 64 turns a session starts over from its 64 KB base (a new
// branch). Four workers, a 4 MB budget each, so eviction runs too.
//
//   - saturated: each op is only the teach step. The one writer is then the
//     bottleneck whatever the protocol (inserts are requested faster than
//     one core applies them), so this measures throughput and overload.
//   - request: each op is a request: Select's Match over the key, a stand-in
//     for the rest of the request's CPU work (hashing the body once,
//     ~memory speed, like scanning it), teach, then a 2 ms wait for the
//     upstream (sleep). The cores and the writer are then busy a fraction
//     of the time, the regime of the router's mutex profile; ns/op is
//     mostly the sleep divided by the sessions, and the numbers to read are
//     the teach latencies and the blocked time.
//
// Besides ns/op (wall time per op over all goroutines) it reports the
// median and p99 latency of one teach call (with 64 goroutines on 2 cores
// the saturated p99 is mostly time slicing). Run it with -mutexprofile and
// -blockprofile to see the time spent blocked on the tree.
func BenchmarkTeachContended(b *testing.B) {
	b.Run("saturated", func(b *testing.B) { benchTeachContended(b, false) })
	b.Run("request", func(b *testing.B) { benchTeachContended(b, true) })
}

func benchTeachContended(b *testing.B, request bool) {
	const (
		sysSize  = 16 << 10
		baseSize = 64 << 10
		turnSize = 1 << 10
		maxTurns = 64
		perP     = 32
	)
	sessions := perP * runtime.GOMAXPROCS(0)
	rng := rand.New(rand.NewPCG(4, 4))
	sys := jsonish(rng, make([]byte, sysSize))
	turns := make([][]byte, 256)
	for i := range turns {
		turns[i] = jsonish(rng, make([]byte, turnSize))
	}
	tr := New(Config{MaxCharsPerWorker: 4 << 20})
	bases := make([][]byte, sessions)
	for s := range bases {
		base := append(slices.Clip(sys), fmt.Sprintf(`{"session":%d}`, s)...)
		for len(base) < baseSize {
			base = append(base, turns[rng.IntN(len(turns))]...)
		}
		bases[s] = base
		tr.Insert(base, uint32(s%4))
	}

	seed := maphash.MakeSeed()
	var sink atomic.Uint64
	var next atomic.Int64
	var mu sync.Mutex
	var lat []int64
	b.SetParallelism(perP)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		s := int(next.Add(1)-1) % sessions
		base, w := bases[s], uint32(s%4)
		key := make([]byte, 0, baseSize+(maxTurns+1)*turnSize)
		key = append(key, base...)
		samples := make([]int64, 0, 1<<14)
		var n, branch uint64
		for pb.Next() {
			if len(key) >= len(base)+maxTurns*turnSize {
				branch++
				key = binary.LittleEndian.AppendUint64(key[:len(base)], branch)
			}
			n++
			key = append(key, turns[n%uint64(len(turns))]...)
			binary.LittleEndian.PutUint64(key[len(key)-turnSize:], n) // unique turn
			if request {
				_ = tr.Match(key, nil)
				sink.Add(maphash.Bytes(seed, key))
			}
			t0 := time.Now()
			if !tr.Touch(key, w) {
				tr.Insert(key, w)
			}
			samples = append(samples, int64(time.Since(t0)))
			if request {
				time.Sleep(2 * time.Millisecond)
			}
		}
		mu.Lock()
		lat = append(lat, samples...)
		mu.Unlock()
	})
	b.StopTimer()
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2])/1e3, "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100])/1e3, "p99-µs")
	}
}
