//go:build !race

package sessionshard

import (
	"testing"
	"time"
)

func TestAllocationSessions(t *testing.T) {
	s := NewSessions(Config{}) // wall clock, as in production
	hit := []byte("0b6f0c2e-3a41-4c5e-9d2a-7f1e8b9c0d11")
	miss := []byte("0b6f0c2e-3a41-4c5e-9d2a-7f1e8b9c0d12")
	s.Set(hit, 1)

	f := func(name string, fn func()) {
		t.Helper()
		if n := testing.AllocsPerRun(1000, fn); n != 0 {
			t.Fatalf("%s: %v allocations per call, want 0", name, n)
		}
	}
	f("Get hit", func() {
		if _, ok := s.Get(hit); !ok {
			t.Fatal("miss")
		}
	})
	f("Get miss", func() {
		if _, ok := s.Get(miss); ok {
			t.Fatal("hit")
		}
	})
	f("Set existing, same worker", func() { s.Set(hit, 1) })
	w := uint32(1)
	f("Set existing, other worker", func() { w++; s.Set(hit, w) })
}

func TestAllocationSessionsFakeClock(t *testing.T) {
	c := &fakeClock{}
	s := NewSessions(Config{TTL: time.Hour, Now: c.Now})
	key := []byte("session-1")
	s.Set(key, 1)
	if n := testing.AllocsPerRun(1000, func() { c.Advance(1); s.Get(key); s.Set(key, 1) }); n != 0 {
		t.Fatalf("%v allocations per Get+Set with a moving clock, want 0", n)
	}
}
