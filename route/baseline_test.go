package route

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestRoundRobinSkipsUnhealthy(t *testing.T) {
	f := newFixture(t, 3, nil)
	p := &roundRobin{}
	f.reg.SetHealthy(f.ws[1], false)
	var got []int
	for i := 0; i < 4; i++ {
		c := p.Select(&Request{Workers: f.ws})
		got = append(got, f.idx(c.Worker))
	}
	if fmt.Sprint(got) != "[0 2 2 0]" {
		t.Fatalf("round robin order %v", got)
	}
}

func TestPowerOfTwoPrefersLessLoaded(t *testing.T) {
	f := newFixture(t, 2, nil)
	f.load(0, 5)
	p := &powerOfTwo{rnd: rand.New(rand.NewPCG(1, 2)).Uint64}
	loaded := 0
	for i := 0; i < 400; i++ {
		if p.Select(&Request{Workers: f.ws}).Worker == f.ws[0] {
			loaded++
		}
	}
	// The loaded worker wins only when both samples are it: about 1 in 4.
	if loaded < 40 || loaded > 160 {
		t.Fatalf("loaded worker chosen %d of 400 times, want about 100", loaded)
	}
}

func TestRandomOnlyHealthy(t *testing.T) {
	f := newFixture(t, 3, nil)
	f.reg.SetHealthy(f.ws[0], false)
	p := &random{rnd: f.ca.rnd}
	for i := 0; i < 50; i++ {
		if c := p.Select(&Request{Workers: f.ws}); c.Worker == f.ws[0] {
			t.Fatal("random chose an unhealthy worker")
		}
	}
}

func TestConsistentHashStableAndMinimalMoves(t *testing.T) {
	f := newFixture(t, 4, nil)
	p := &consistentHash{rnd: f.ca.rnd}
	owner := map[string]int{}
	for i := 0; i < 400; i++ {
		k := fmt.Sprintf("session-%d", i)
		owner[k] = f.idx(p.Select(&Request{Workers: f.ws, Session: []byte(k)}).Worker)
		if again := f.idx(p.Select(&Request{Workers: f.ws, Session: []byte(k)}).Worker); again != owner[k] {
			t.Fatalf("%s moved without a fleet change", k)
		}
	}
	per := map[int]int{}
	for _, w := range owner {
		per[w]++
	}
	for w, n := range per {
		if n < 50 {
			t.Fatalf("worker %d owns only %d of 400 sessions: %v", w, n, per)
		}
	}
	f.reg.SetHealthy(f.ws[2], false)
	for k, w := range owner {
		got := f.idx(p.Select(&Request{Workers: f.ws, Session: []byte(k)}).Worker)
		if w != 2 && got != w {
			t.Fatalf("%s moved from healthy worker %d to %d when worker 2 failed", k, w, got)
		}
		if got == 2 {
			t.Fatalf("%s still on the failed worker", k)
		}
	}
}

func TestLeastLoadedTakesTheIdlestHealthyWorker(t *testing.T) {
	f := newFixture(t, 3, nil)
	f.load(0, 2)
	p := &leastLoaded{rnd: rand.New(rand.NewPCG(1, 2)).Uint64}
	seen := map[int]int{}
	for i := 0; i < 200; i++ {
		seen[f.idx(p.Select(&Request{Workers: f.ws}).Worker)]++
	}
	if seen[0] != 0 || seen[1] < 50 || seen[2] < 50 {
		t.Fatalf("choices %v: the loaded worker taken, or ties not shared", seen)
	}
	f.reg.SetHealthy(f.ws[1], false)
	f.load(2, 3)
	if c := p.Select(&Request{Workers: f.ws}); f.idx(c.Worker) != 0 || c.Decision != LeastLoaded {
		t.Fatalf("chose %d (%s), want the healthy worker with the fewest requests", f.idx(c.Worker), c.Decision)
	}
}
