package route

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Benchmarks of the worker step alone (body scan excluded). Compare runs with
//
//	go test -run '^$' -bench . -benchmem -count 6 ./route | tee new.txt; benchstat old.txt new.txt

var sinkChoice Choice

// BenchmarkSelectSessionHit: a session hit on a 64 KB history, with the
// fixture's clock and with the wall clock (what the router runs with: each
// reading costs about 25 ns per vDSO call on a paravirtualised guest).
func BenchmarkSelectSessionHit(b *testing.B) {
	b.Run("fake-clock", func(b *testing.B) { benchSessionHit(b, nil) })
	b.Run("wall-clock", func(b *testing.B) { benchSessionHit(b, func(c *CacheAwareConfig) { c.Now = nil }) })
}

// benchSessionHit times a session hit on a 64 KB history with the fixture
// configured by mod.
func benchSessionHit(b *testing.B, mod func(*CacheAwareConfig)) {
	f := newFixture(&testing.T{}, 8, mod)
	hist := []byte(strings.Repeat("history ", 8<<10)) // 64 KB
	req := &Request{Model: "m", Workers: f.reg.Workers(), Session: []byte("session-42"), Prefix: hist}
	f.ca.Select(req)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sinkChoice = f.ca.Select(req)
	}
}

// BenchmarkObserve: what the proxy's report of one answer costs (a
// non-streamed answer with usage and cached_tokens, 3 requests in flight
// when it was sent): the returns, characters per token, predicted vs
// served counters and the three fits (reference, worker, pool).
func BenchmarkObserve(b *testing.B) {
	f := newFixture(&testing.T{}, 8, nil)
	hist := []byte(strings.Repeat("history ", 128)) // 1 KB
	ch := f.ca.Select(&Request{Model: "m", Workers: f.reg.Workers(), Session: []byte("session-42"), Prefix: hist})
	s := &Served{TTFB: 3 * time.Millisecond, Elapsed: 3 * time.Millisecond, Load: 3,
		PromptTokens: 260, CachedTokens: 240, CompletionTokens: 16}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.TTFB = time.Duration(2+i%3) * time.Millisecond
		f.ca.Observe(ch, s)
	}
}

// BenchmarkSelectSessionHitShared: the same decision with a shared store
// configured (several replicas): a local binding never asks the store.
func BenchmarkSelectSessionHitShared(b *testing.B) {
	fake := newFakeRedis().client()
	benchSessionHit(b, func(c *CacheAwareConfig) { c.Shared = fake })
}

// BenchmarkSelectHistoryMiss64KB: a new 64 KB history whose first 63 KB are
// cached (a shared system prompt): tree match, min-load, and the insert of
// the new suffix.
func BenchmarkSelectHistoryMiss64KB(b *testing.B) {
	f := newFixture(&testing.T{}, 8, nil)
	base := strings.Repeat("shared system prompt ", 3000) // 63 KB shared by every session
	f.ca.Select(&Request{Model: "m", Workers: f.reg.Workers(), Prefix: []byte(base)})
	key := []byte(base)
	req := &Request{Model: "m", Workers: f.reg.Workers()}
	b.SetBytes(int64(len(base) + 1024))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key = append(key[:len(base)], "user "...)
		for len(key) < len(base)+1024 {
			key = strconv.AppendInt(key, int64(i), 36)
		}
		req.Prefix = key
		sinkChoice = f.ca.Select(req)
	}
}

// BenchmarkSelectSessionsScale: session-hit decision time as the session map
// grows; it must stay flat.
func BenchmarkSelectSessionsScale(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			f := newFixture(&testing.T{}, 8, nil)
			keys := make([][]byte, n)
			for i := range keys {
				keys[i] = []byte("session-" + strconv.Itoa(i))
				f.ca.Select(&Request{Model: "m", Workers: f.reg.Workers(), Session: keys[i]})
			}
			req := &Request{Model: "m", Workers: f.reg.Workers()}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req.Session = keys[(i*7919)%n]
				sinkChoice = f.ca.Select(req)
			}
		})
	}
}

// BenchmarkSelectWorkersScale: session-hit decision time as the fleet grows;
// flat because the load gates scan the fleet only past the absolute gate.
func BenchmarkSelectWorkersScale(b *testing.B) {
	for _, n := range []int{2, 8, 64, 512} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			f := newFixture(&testing.T{}, n, nil)
			req := &Request{Model: "m", Workers: f.reg.Workers(), Session: []byte("s"), Prefix: []byte(sys + "user: hi")}
			f.ca.Select(req)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				sinkChoice = f.ca.Select(req)
			}
		})
	}
}

func BenchmarkBaselines(b *testing.B) {
	f := newFixture(&testing.T{}, 8, nil)
	req := &Request{Model: "m", Workers: f.reg.Workers(), Session: []byte("session-42")}
	for _, name := range []string{RoundRobin, Random, PowerOfTwo, ConsistentHash} {
		p, _ := New(name, f.reg, Options{})
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				sinkChoice = p.Select(req)
			}
		})
	}
}
