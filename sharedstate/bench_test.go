package sharedstate

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/redistest"
)

// BenchmarkLookupBindingCached: a binding this replica read before, served
// from the client-side cache (no round trip).
func BenchmarkLookupBindingCached(b *testing.B) {
	r := redistest.Start(b, redistest.Options{})
	s, _ := open(b, Config{URL: r.URL()})
	ctx := context.Background()
	m, sess := []byte("model"), []byte("0123456789abcdef0123456789abcdef")
	s.PublishBinding(m, sess, "http://10.0.0.1:8000", time.Hour)
	s.Flush(ctx)
	s.LookupBinding(ctx, m, sess)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, ok, err := s.LookupBinding(ctx, m, sess); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkGetLockUncached: a lock lookup that goes to Redis (loopback).
func BenchmarkGetLockUncached(b *testing.B) {
	r := redistest.Start(b, redistest.Options{})
	s, _ := open(b, Config{URL: r.URL()})
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		s.GetLock(ctx, KindToolCall, []byte("absent_"+strconv.Itoa(i)))
	}
}

// BenchmarkPutLock: one acknowledged lock write on loopback, with the AOF
// fsynced on every write (always) and once a second (everysec).
func BenchmarkPutLock(b *testing.B) {
	for _, fsync := range []string{"always", "everysec"} {
		b.Run(fsync, func(b *testing.B) {
			r := redistest.Start(b, redistest.Options{Fsync: fsync})
			s, _ := open(b, Config{URL: r.URL(), LockTimeout: time.Second})
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				if err := s.PutLock(ctx, KindToolCall, []byte("call_"+strconv.Itoa(i)), Lock{Model: "m"}, time.Hour); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPutLockParallel: concurrent lock writes with fsync always; Redis
// fsyncs once per event-loop iteration, so concurrent writes share fsyncs.
func BenchmarkPutLockParallel(b *testing.B) {
	r := redistest.Start(b, redistest.Options{Fsync: "always"})
	s, _ := open(b, Config{URL: r.URL(), LockTimeout: time.Second})
	ctx := context.Background()
	b.SetParallelism(32)
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			if err := s.PutLock(ctx, KindToolCall, []byte("call_"+strconv.Itoa(i)+"_"+strconv.FormatInt(time.Now().UnixNano(), 36)), Lock{Model: "m"}, time.Hour); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkMemoryBatch: one pipeline of 256 memory writes, per write: the
// compare-and-set script (docs/design.md §8.3) against a plain SET (what
// a release before versions sends). AOF everysec, so that Redis's work, not
// the fsync, is measured.
//
//	go test -run '^$' -bench MemoryBatch ./sharedstate
func BenchmarkMemoryBatch(b *testing.B) {
	r := redistest.Start(b, redistest.Options{Args: []string{"--appendfsync", "everysec"}})
	s, _ := open(b, Config{URL: r.URL()})
	ctx, c := context.Background(), s.cl()
	rec := MemoryRecord{Model: "sim-medium", Worker: "http://10.0.0.1:8000", Decision: "tools", Phase: "tool_loop", Turns: 12, Demand: 0.4}
	for _, bc := range []struct {
		name string
		kind Kind // KindMemory: the script; a lock kind: SET
	}{{"script", KindMemory}, {"set", KindToolCall}} {
		b.Run(bc.name, func(b *testing.B) {
			ops := make([]asyncOp, 0, 256)
			i := 0
			for b.Loop() {
				rec.LastAccess = time.Now().UnixNano()
				key := scopedKey(nil, s.ns, KindMemory, []byte("auto"), []byte("session-"+strconv.Itoa(i%1024)))
				ops = append(ops, asyncOp{key: string(key), val: string(rec.AppendEncode(nil)), ttlMs: 3600_000, kind: bc.kind})
				if i++; len(ops) == cap(ops) {
					if err := s.exec(ctx, c, ops, time.Second); err != nil {
						b.Fatal(err)
					}
					ops = ops[:0]
				}
			}
		})
	}
}
