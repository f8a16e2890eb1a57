//go:build !race

package route

import (
	"strings"
	"testing"
)

func TestSessionHitDecisionAllocatesNothing(t *testing.T) {
	f := newFixture(t, 4, nil)
	hist := []byte(strings.Repeat("history ", 8<<10))
	req := &Request{Model: "m", Workers: f.reg.Workers(), Session: []byte("session-42"), Prefix: hist}
	f.ca.Select(req)
	if c := f.ca.Select(req); c.Decision != SessionIDMatch {
		t.Fatalf("warm-up: %s", c.Decision)
	}
	if n := testing.AllocsPerRun(200, func() { f.ca.Select(req) }); n != 0 {
		t.Fatalf("session hit allocates %.1f times per decision", n)
	}
}

func TestBaselinesAllocateNothing(t *testing.T) {
	f := newFixture(t, 4, nil)
	req := &Request{Model: "m", Workers: f.reg.Workers(), Session: []byte("session-42")}
	for _, name := range []string{RoundRobin, Random, PowerOfTwo, ConsistentHash} {
		p, _ := New(name, f.reg, Options{Rand: f.ca.rnd})
		if n := testing.AllocsPerRun(200, func() { p.Select(req) }); n != 0 {
			t.Errorf("%s allocates %.1f times per decision", name, n)
		}
	}
}

// With a shared store (several replicas, docs/design.md §8.3) a session
// bound locally is decided as without one: no store call, no allocation.
func TestSharedSessionHitAllocatesNothing(t *testing.T) {
	fake := newFakeRedis().client()
	f := newFixture(t, 4, func(c *CacheAwareConfig) { c.Shared = fake })
	hist := []byte(strings.Repeat("history ", 8<<10))
	req := &Request{Model: "m", Workers: f.reg.Workers(), Session: []byte("session-42"), Prefix: hist}
	f.ca.Select(req)
	if c := f.ca.Select(req); c.Decision != SessionIDMatch {
		t.Fatalf("warm-up: %s", c.Decision)
	}
	n := fake.lookups
	if a := testing.AllocsPerRun(200, func() { f.ca.Select(req) }); a != 0 {
		t.Fatalf("session hit with a shared store allocates %.1f times per decision", a)
	}
	if fake.lookups != n {
		t.Fatal("a local session hit asked the shared store")
	}
}
