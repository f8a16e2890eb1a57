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
	r.RecordFailure(w)
	r.probes.Wait()
	check("open")
	clk.Advance(time.Second)
	check("half-open")
}
