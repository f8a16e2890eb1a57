package scale

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"testing"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/radix"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
)

var (
	sinkChoice route.Choice
	sinkMatch  radix.Match
)

// fleet returns a registry of n healthy workers serving model "m" (no
// network: the probes go to port 1, refused at once) and a cache-aware
// policy over it, warmed past its first (no_tree_random) selection.
func fleet(tb testing.TB, n int) (*loadview.Registry, *route.CacheAware) {
	tb.Helper()
	reg := loadview.NewRegistry(loadview.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for i := range n {
		ws, err := reg.Add(context.Background(), fmt.Sprintf("http://127.%d.%d.%d:1", i>>16&255, i>>8&255, i&255+1), []string{"m"})
		if err != nil {
			tb.Fatal(err)
		}
		reg.SetHealthy(ws[0], true)
	}
	seq := uint64(0)
	ca := route.NewCacheAware(reg, route.DefaultCacheAwareConfig(),
		func() uint64 { seq++; return seq * 0x9e3779b97f4a7c15 })
	ca.Select(&route.Request{Model: "m", Workers: reg.Workers()})
	return reg, ca
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// BenchmarkSessionHit: the session-hit decision (Select with a known session
// and no history: map lookup, health, load gates, refresh) as the session map
// grows. Must stay flat, 0 allocs. Also reports the heap in use per session
// and per 100k sessions (MB/100k) of the session map.
func BenchmarkSessionHit(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000, 1_000_000} {
		b.Run("sessions="+strconv.Itoa(n), func(b *testing.B) {
			keys := make([][]byte, n)
			for i := range keys {
				keys[i] = []byte("session-" + strconv.Itoa(i) + "-0123456789abcdef")
			}
			before := heapInUse()
			reg, ca := fleet(b, 8)
			ws := reg.Workers()
			for _, k := range keys {
				ca.Select(&route.Request{Model: "m", Workers: ws, Session: k})
			}
			perSession := float64(heapInUse()-before) / float64(n)
			req := &route.Request{Model: "m", Workers: ws}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				req.Session = keys[(i*7919)%n]
				sinkChoice = ca.Select(req)
			}
			b.ReportMetric(perSession, "heapB/session")
			b.ReportMetric(perSession*100_000/(1<<20), "heapMB/100k")
			runtime.KeepAlive(keys)
		})
	}
}

// BenchmarkWorkersHit: the session-hit decision as the fleet grows.
func BenchmarkWorkersHit(b *testing.B) {
	for _, n := range []int{2, 8, 32, 128, 512} {
		b.Run("workers="+strconv.Itoa(n), func(b *testing.B) {
			reg, ca := fleet(b, n)
			req := &route.Request{Model: "m", Workers: reg.Workers(), Session: []byte("session-42")}
			ca.Select(req)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				sinkChoice = ca.Select(req)
			}
		})
	}
}

// BenchmarkHistory: the per-request cost that grows with the history: the
// body scan (reqview.Parse: routing view + history key) and the radix Match
// of the history key against a tree holding the previous turn of the same
// conversation and 15 other conversations. MB/s is body bytes per second;
// docs/design.md §7 gives the routing view's targets.
func BenchmarkHistory(b *testing.B) {
	for _, size := range []int{1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20} {
		b.Run("bytes="+strconv.Itoa(size), func(b *testing.B) {
			body := reqview.SampleChatBodyOfSize(size)
			var v reqview.View
			if err := reqview.Parse(&v, body, reqview.Chat); err != nil {
				b.Fatal(err)
			}
			tr := radix.New(radix.Config{})
			hist := append([]byte(nil), v.History...)
			tr.Insert(hist[:len(hist)*15/16], 1) // the previous turn
			for c := range 15 {
				other := append(append([]byte(nil), hist[:len(hist)/4]...), "conversation "+strconv.Itoa(c)...)
				tr.Insert(other, uint32(2+c%3))
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := reqview.Parse(&v, body, reqview.Chat); err != nil {
					b.Fatal(err)
				}
				sinkMatch = tr.Match(v.History, nil)
			}
			b.ReportMetric(float64(len(v.History))/float64(len(body)), "key/body")
		})
	}
}

// BenchmarkRadixMemory: heap in use per stored character as the tree grows
// (conversations of 64 KB over a shared 8 KB prefix, grown by 2 KB turns, over
// 4 workers). docs/design.md §7: within 2×.
func BenchmarkRadixMemory(b *testing.B) {
	body := reqview.SampleChatBodyOfSize(64 << 10)
	var v reqview.View
	if err := reqview.Parse(&v, body, reqview.Chat); err != nil {
		b.Fatal(err)
	}
	hist := append([]byte(nil), v.History...)
	for _, convs := range []int{16, 64, 256} {
		b.Run("convs="+strconv.Itoa(convs), func(b *testing.B) {
			var perChar float64
			var chars int
			for b.Loop() {
				before := heapInUse()
				tr := radix.New(radix.Config{})
				key := make([]byte, 0, len(hist)+64)
				for c := range convs {
					tag := "conversation " + strconv.Itoa(c) + " "
					key = append(append(key[:0], hist[:8<<10]...), tag...)
					for off := 8 << 10; off < len(hist); off += 2 << 10 {
						key = append(key, hist[off:min(off+2<<10, len(hist))]...)
						tr.Insert(key, uint32(c%4))
					}
				}
				chars = tr.Chars()
				perChar = float64(heapInUse()-before) / float64(chars)
				runtime.KeepAlive(tr)
			}
			b.ReportMetric(perChar, "heapB/char")
			b.ReportMetric(float64(chars)/(1<<20), "Mchars")
		})
	}
}
