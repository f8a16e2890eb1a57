package saar

import (
	"strings"
	"testing"
)

// prefill is the pools' prefill time per token in these tests (route's prior).
const prefill = 25e-6

// saturated is a Health whose pools of the models in wait are saturated,
// with that expected wait in seconds; the other pools have room.
func saturated(wait map[string]float64) Health {
	return Health{Pool: func(m string) PoolState {
		if w, ok := wait[m]; ok {
			return PoolState{Saturated: true, WaitSeconds: w, PrefillSeconds: prefill}
		}
		return PoolState{PrefillSeconds: prefill}
	}}
}

// replays checks that every record of r replays to its outcome.
func replays(t *testing.T, r *Router) {
	t.Helper()
	if d := r.Replay(r.Records("", 0)); len(d) != 0 {
		t.Fatalf("records do not replay: %v", d)
	}
}

// An unlocked turn whose model's pool is saturated goes to another
// candidate with room, recorded and counted; the session stays on its
// model (a detour), and a pool with room moves nothing.
func TestOverflowMovesAnUnlockedTurn(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	s := r.Select(turn("s1", "hello").T(), saturated(map[string]float64{"sim-small": 0.5}))
	expect(t, s, "sim-medium", ActionOverflow, PhaseUserTurn, ReasonQueueOverflow)
	if s.OverflowFrom != "sim-small" {
		t.Fatalf("OverflowFrom = %q", s.OverflowFrom)
	}
	rec, _ := r.Record(s.ReplayID)
	if o := rec.Outcome.Overflow; o == nil || o.From != "sim-small" || o.Action != ActionFirst || o.WaitSeconds != 0.5 || o.CostSeconds != 0 {
		t.Fatalf("overflow record %+v", o)
	}
	if len(rec.Inputs.Pools) != 3 {
		t.Fatalf("pools %+v", rec.Inputs.Pools)
	}
	r.Observe([]byte("s1"), "sim-medium", "w2", Observed{PromptTokens: 100, Logical: []byte("auto")})

	// The pool has room again: the session's model is still sim-small.
	s = r.Select(turn("s1", "and then").chars(500).T(), saturated(nil))
	expect(t, s, "sim-small", ActionStay, PhaseUserTurn, "")
	if rec, _ := r.Record(s.ReplayID); rec.Inputs.Pools != nil {
		t.Fatalf("pools recorded while none is saturated: %+v", rec.Inputs.Pools)
	}
	replays(t, r)

	if st := r.Stats(); st.Overflows != 1 || st.Switches != 0 {
		t.Fatalf("stats %+v", st)
	}
	var b strings.Builder
	r.WriteMetrics(&b)
	for _, want := range []string{
		`vllm_router_saar_switches_total{from="sim-small",to="sim-medium",reason="queue_overflow"} 1`,
		`vllm_router_saar_selections_total{model="sim-medium",action="overflow"} 1`,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// A hard-locked turn waits for its model, however long.
func TestOverflowNeverMovesALockedTurn(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	expect(t, r.Select(turn("s1", "hello").T(), allUp), "sim-small", ActionFirst, "", "")
	s := r.Select(turn("s1", "hello").results("call_unknown").T(), saturated(map[string]float64{"sim-small": 1e6}))
	expect(t, s, "sim-small", ActionHardLock, PhaseToolLoop, ReasonToolLoopFallback)
	replays(t, r)
}

// A long warm history stays for a wait shorter than its re-prefill
// elsewhere, and moves for a longer one.
func TestOverflowWeighsTheWarmHistory(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	expect(t, r.Select(turn("s1", "hello").T(), allUp), "sim-small", ActionFirst, "", "")
	r.Observe([]byte("s1"), "sim-small", "w1", Observed{PromptTokens: 100_000, CachedTokens: 100_000, Logical: []byte("auto")})
	// About 98k tokens warm: 2.4 s of prefill on sim-medium.
	s := r.Select(turn("s1", "and then").chars(800).T(), saturated(map[string]float64{"sim-small": 0.5}))
	expect(t, s, "sim-small", ActionStay, PhaseUserTurn, "")
	s = r.Select(turn("s1", "and then").chars(1200).T(), saturated(map[string]float64{"sim-small": 10}))
	expect(t, s, "sim-medium", ActionOverflow, PhaseUserTurn, ReasonQueueOverflow)
	rec, _ := r.Record(s.ReplayID)
	if o := rec.Outcome.Overflow; o == nil || o.CostSeconds < 2 || o.CostSeconds > 3 || o.Action != ActionStay {
		t.Fatalf("overflow record %+v", o)
	}
	replays(t, r)
}

// No target: one that serves the turn's demand worse, one outside the
// matched decision's candidates, one saturated too, one down.
func TestOverflowOnlyToAnAllowedModelWithRoom(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	// reasoning decision [sim-large, sim-medium], complexity 1: sim-medium falls short.
	s := r.Select(turn("a", "prove the theorem").c(1).T(), saturated(map[string]float64{"sim-large": 10}))
	expect(t, s, "sim-large", ActionFirst, "", "")
	// default decision [sim-small, sim-medium]: sim-large is not a candidate.
	s = r.Select(turn("b", "hello").T(), saturated(map[string]float64{"sim-small": 10, "sim-medium": 10}))
	expect(t, s, "sim-small", ActionFirst, "", "")
	h := saturated(map[string]float64{"sim-small": 10})
	h.ModelUp = func(m string) bool { return m != "sim-medium" }
	s = r.Select(turn("c", "hello").T(), h)
	expect(t, s, "sim-small", ActionFirst, "", "")
	replays(t, r)
}
