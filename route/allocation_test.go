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
