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
