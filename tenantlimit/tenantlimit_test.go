package tenantlimit

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/sharedstate"
)

// minute is a time 10 s into a window.
var minute = time.Unix(1_800_000_000-1_800_000_000%60+10, 0)

// stores returns a Local store and, when redis-server is there, a Redis
// one on a fresh server.
func stores(t testing.TB) map[string]Store {
	t.Helper()
	m := map[string]Store{"local": NewLocal()}
	r := redistest.Start(t, redistest.Options{Fsync: "everysec"}) // counters need no fsync per write
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: r.URL(), Logger: quiet, ReadTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	m["redis"] = NewRedis(st)
	return m
}

// TestStoreWindow: requests are admitted up to the limit, refused past it
// without being counted, tokens refuse once they reach theirs, tenants
// count apart, and the next window starts from zero.
func TestStoreWindow(t *testing.T) {
	ctx := context.Background()
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			lim := Limits{RPM: 2, TPM: 100}
			for i := int64(1); i <= 2; i++ {
				w, ok, err := s.Admit(ctx, "a", lim, minute)
				if err != nil || !ok || w.Requests != i || w.Reset != 50*time.Second {
					t.Fatalf("request %d: %+v %v %v", i, w, ok, err)
				}
			}
			if w, ok, err := s.Admit(ctx, "a", lim, minute.Add(time.Second)); err != nil || ok || w.Requests != 2 {
				t.Fatalf("over the limit: %+v %v %v", w, ok, err)
			}
			if _, ok, _ := s.Admit(ctx, "b", lim, minute); !ok {
				t.Fatal("another tenant refused")
			}
			if w, err := s.Charge(ctx, "b", 100, minute); err != nil || w.Tokens != 100 || w.Requests != 1 {
				t.Fatalf("charge: %+v %v", w, err)
			}
			if w, ok, _ := s.Admit(ctx, "b", lim, minute); ok || w.Tokens != 100 {
				t.Fatalf("tokens at the limit admitted: %+v", w)
			}
			next := minute.Add(Period)
			if w, ok, err := s.Admit(ctx, "a", lim, next); err != nil || !ok || w.Requests != 1 || w.Tokens != 0 {
				t.Fatalf("next window: %+v %v %v", w, ok, err)
			}
		})
	}
}

// TestStoreAdmitsExactlyTheLimitConcurrently: concurrent admissions never
// admit past the limit (Redis: one atomic script each).
func TestStoreAdmitsExactlyTheLimitConcurrently(t *testing.T) {
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 20; i++ {
						if _, ok, err := s.Admit(context.Background(), "c", Limits{RPM: 50}, minute); err != nil {
							t.Error(err)
						} else if ok {
							admitted.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if n := admitted.Load(); n != 50 {
				t.Fatalf("admitted %d of 160, limit 50", n)
			}
		})
	}
}

// failing is a store that always fails.
type failing struct{}

func (failing) Admit(context.Context, string, Limits, time.Time) (Window, bool, error) {
	return Window{}, false, sharedstate.ErrDown
}
func (failing) Charge(context.Context, string, int64, time.Time) (Window, error) {
	return Window{}, sharedstate.ErrDown
}

// TestLimiterFailsOpen: a failing store admits, counted, and says the
// counts are unknown; a refusal is counted per tenant and limit.
func TestLimiterFailsOpen(t *testing.T) {
	set := metrics.NewSet()
	l := New(failing{}, set)
	if d := l.Admit(context.Background(), "a", Limits{RPM: 1}); !d.OK || d.Known {
		t.Fatalf("failing store: %+v", d)
	}
	l.Charge(context.Background(), "a", 5)
	if n := set.GetOrCreateCounter("vllm_router_tenant_limit_store_errors_total").Get(); n != 2 {
		t.Fatalf("store errors %d, want 2", n)
	}
	l = New(NewLocal(), set)
	l.now = func() time.Time { return minute }
	l.Admit(context.Background(), "a", Limits{TPM: 10})
	l.Charge(context.Background(), "a", 10)
	if d := l.Admit(context.Background(), "a", Limits{TPM: 10}); d.OK || d.Over != "tokens" || !d.Known {
		t.Fatalf("over tokens: %+v", d)
	}
	if n := set.GetOrCreateCounter(`vllm_router_tenant_limited_total{tenant="a",limit="tokens"}`).Get(); n != 1 {
		t.Fatalf("limited %d", n)
	}
}

// TestLocalBounded: the local store keeps at most maxLocal tenants of past
// windows.
func TestLocalBounded(t *testing.T) {
	s := NewLocal()
	for i := 0; i < 3*maxLocal; i++ {
		_, _, _ = s.Admit(context.Background(), itoa(int64(i)), Limits{RPM: 1}, minute.Add(time.Duration(i/maxLocal)*Period))
	}
	if n := len(s.m); n > maxLocal {
		t.Fatalf("%d entries", n)
	}
}

// BenchmarkAdmitCharge: one admission and one charge, as a limited
// tenant's request costs, per store (Redis on loopback).
func BenchmarkAdmitCharge(b *testing.B) {
	for name, s := range stores(b) {
		b.Run(name, func(b *testing.B) {
			l := New(s, metrics.NewSet())
			lim := Limits{RPM: 1 << 40, TPM: 1 << 50}
			for b.Loop() {
				l.Admit(context.Background(), "bench", lim)
				l.Charge(context.Background(), "bench", 100)
			}
		})
	}
}
