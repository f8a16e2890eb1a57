//go:build !race

package loadview

import (
	"testing"
	"time"
)

// The per-request questions allocate nothing, in every breaker state.
func TestHotPathAllocations(t *testing.T) {
	clk := newFakeClock()
	r, ws := fleet(t, 1, Config{CBFailureThreshold: 1, CBTimeoutDuration: time.Second, FailureThreshold: 1 << 20, Now: clk.Now})
	w := ws[0]
	check := func(state string) {
		t.Helper()
		if n := testing.AllocsPerRun(1000, func() { _ = w.Healthy() }); n != 0 {
			t.Errorf("Healthy (%s): %v allocs", state, n)
		}
		if n := testing.AllocsPerRun(1000, func() { _ = w.BreakerState() }); n != 0 {
			t.Errorf("BreakerState (%s): %v allocs", state, n)
		}
	}
	check("closed")
	if n := testing.AllocsPerRun(1000, func() { r.RecordSuccess(w) }); n != 0 {
		t.Errorf("RecordSuccess (closed): %v allocs", n)
	}
	if n := testing.AllocsPerRun(1000, func() { r.RecordAnswerFailure(w) }); n != 0 { // the last healthy worker: not counted
		t.Errorf("RecordAnswerFailure (last healthy): %v allocs", n)
	}
	r.RecordFailure(w)
	r.probes.Wait()
	check("open")
	clk.Advance(time.Second)
	check("half-open")
}

// FleetLoad (every routing decision) and the /metrics parser allocate
// nothing (docs/design.md §8.3).
func TestLoadScrapeAllocations(t *testing.T) {
	clk := newFakeClock()
	_, ws := fleet(t, 1, Config{LoadScrapeInterval: time.Second, Now: clk.Now})
	w := ws[0]
	if n := testing.AllocsPerRun(1000, func() { _ = w.FleetLoad() }); n != 0 {
		t.Errorf("FleetLoad (no report): %v allocs", n)
	}
	w.report.Store(&loadReport{running: 5, others: 3, at: clk.Now().UnixNano()})
	if w.FleetLoad() != 3 {
		t.Fatalf("fleet load %d", w.FleetLoad())
	}
	if n := testing.AllocsPerRun(1000, func() { _ = w.FleetLoad() }); n != 0 {
		t.Errorf("FleetLoad (fresh report): %v allocs", n)
	}
	body := []byte(vllmExposition + `vllm:num_requests_running{engine="1",model_name="x"} 2` + "\n")
	ld := vllmLoad{byEngine: make([]engineLoad, 2)}
	if n := testing.AllocsPerRun(1000, func() {
		if err := parseVLLMLoad(body, &ld); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("parseVLLMLoad: %v allocs", n)
	}
}
