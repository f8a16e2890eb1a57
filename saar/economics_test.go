package saar

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/sessionshard"
)

// qwenYAML is a fleet of two open models and a frontier reasoner, priced
// far apart: a logical model over all three, and one over the cheapest
// alone (docs/design.md §5).
const qwenYAML = `models:
  - {name: qwen3-8b, quality_score: 0.64, pricing: {prompt_per_1m: 0.05, cached_input_per_1m: 0.01, completion_per_1m: 0.10}}
  - {name: qwen3-32b, quality_score: 0.78, pricing: {prompt_per_1m: 0.30, cached_input_per_1m: 0.06, completion_per_1m: 0.60}}
  - {name: frontier-reasoner, quality_score: 0.94, pricing: {prompt_per_1m: 8.00, cached_input_per_1m: 1.20, completion_per_1m: 24.00}}
logical_models:
  - name: auto
    decisions: [{name: all, candidates: [qwen3-8b, qwen3-32b, frontier-reasoner]}]
  - name: cheap
    decisions: [{name: all, candidates: [qwen3-8b]}]
`

func qwenConfig(t testing.TB) *Config {
	t.Helper()
	cfg, err := ParseConfig([]byte(qwenYAML))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Global id indexes forget ids after their TTL (default one hour, like the
// session memory), not only past a count.
func TestIDIndexTTL(t *testing.T) {
	r, clk := newRouter(t, demoConfig(t), Options{})
	r.NoteToolCalls("sim-large", "w1", bs("call_old"))
	r.Observe(nil, "sim-large", "w1", Observed{ResponseID: []byte("resp_old")})
	if _, ok := r.ToolCallOwner([]byte("call_old")); !ok {
		t.Fatal("fresh id unknown")
	}
	clk.Add(2 * time.Hour)
	if m, ok := r.ToolCallOwner([]byte("call_old")); ok {
		t.Fatalf("tool-call id still owned by %s two hours later", m)
	}
	if _, _, ok := r.ResponseOwner([]byte("resp_old")); ok {
		t.Fatal("response id still known two hours later")
	}
}

// The id indexes are bounded in bytes, whatever the ids look like: 64k ids
// of 1 KiB each may not hold 64 MiB.
func TestIDIndexByteBoundMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("heap measurement")
	}
	r, _ := newRouter(t, demoConfig(t), Options{})
	id := []byte(strings.Repeat("x", 1024))
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	for i := 0; i < 1<<16; i++ {
		copy(id, fmt.Sprintf("%08d", i))
		r.NoteToolCalls("sim-large", "w1", [][]byte{id})
	}
	grown := int64(heap()) - int64(before)
	runtime.KeepAlive(r)
	if grown > 24<<20 {
		t.Fatalf("tool-call index holds %d MiB after 64k ids of 1 KiB", grown>>20)
	}
	t.Logf("index heap %.1f MiB", float64(grown)/(1<<20))
}

// One request carrying tool results of two models is a conflict: it is
// flagged in the reason and counted, and the session's last model (the
// author of the latest assistant message) keeps the turn.
func TestToolResultsOfTwoModelsConflict(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	r.NoteToolCalls("sim-small", "w1", bs("call_a"))
	r.NoteToolCalls("sim-large", "w2", bs("call_b"))
	s := r.Select(turn("", "hello").results("call_a", "call_b").T(), allUp)
	if s.Action != ActionHardLock || s.Reason != ReasonToolLoop+reasonConflictSuffix {
		t.Fatalf("two owners: %+v; want hard_lock %s", s, ReasonToolLoop+reasonConflictSuffix)
	}
	if v := metricValue(t, r, `vllm_router_saar_lock_conflicts_total{kind="tool_loop"}`); v != "1" {
		t.Fatalf("conflicts counted %s", v)
	}
	// With a session: its last model is one of the owners and wins.
	r.Select(turn("s", "prove it").effort("high").T(), allUp)
	r.Observe([]byte("s"), "sim-large", "w2", Observed{ToolCallIDs: bs("call_c")})
	r.NoteToolCalls("sim-medium", "w3", bs("call_d"))
	s = r.Select(turn("s", "prove it").results("call_d", "call_c").T(), allUp)
	if s.Model != "sim-large" || s.Reason != ReasonToolLoop+reasonConflictSuffix {
		t.Fatalf("session conflict: %+v", s)
	}
	// One owner: no conflict.
	s = r.Select(turn("s", "prove it").results("call_c").T(), allUp)
	expect(t, s, "sim-large", ActionHardLock, PhaseToolLoop, ReasonToolLoop)
}

// Router memory is per (session, logical model): a session that uses two
// logical models keeps two memories.
func TestMemoryPerLogicalModel(t *testing.T) {
	r, _ := newRouter(t, qwenConfig(t), Options{Policy: Policy{Version: 2}})
	s := r.Select(turn("s", "x").c(0.7).T(), allUp)
	if s.Model != "qwen3-32b" || s.Action != ActionFirst {
		t.Fatalf("auto first turn: %+v", s)
	}
	r.Observe([]byte("s"), s.Model, "w", Observed{ToolCallIDs: bs("call_1"), PromptTokens: 100})
	c := turn("s", "x").c(0.7)
	c.t.Logical = []byte("cheap")
	s = r.Select(c.T(), allUp)
	if s.Model != "qwen3-8b" || s.Action != ActionFirst {
		t.Fatalf("first turn of logical model cheap in session s: %+v (memory of auto leaked)", s)
	}
	s = r.Select(turn("s", "x").c(0.7).T(), allUp)
	if s.Model != "qwen3-32b" || s.Action != ActionStay {
		t.Fatalf("auto again: %+v", s)
	}
	// A tool result of cheap without known ids has no structural owner in
	// cheap's memory from auto's model.
	c = turn("s", "x").c(0.7)
	c.t.Logical = []byte("cheap")
	c.t.HasTools, c.t.ToolResults = true, 1
	s = r.Select(c.T(), allUp)
	if s.Model != "qwen3-8b" {
		t.Fatalf("cheap tool turn went to %s", s.Model)
	}
}

// The base selector is calibrated to demand: complexity c needs
// quality_score ≥ c, and the cheapest candidate that meets it wins.
// (Policy version 2's per-turn selector; version 3 looks ahead on a
// session's first turn.)
func TestSelectorCheapestMeetingDemand(t *testing.T) {
	cfg := qwenConfig(t)
	for i := range cfg.Logical {
		cfg.Logical[i].Session.PriceSensitivity = 0.1 // version 2's default
	}
	r, _ := newRouter(t, cfg, Options{Policy: Policy{Version: 2}})
	for _, tc := range []struct {
		c    float64
		want string
	}{{0, "qwen3-8b"}, {0.3, "qwen3-8b"}, {0.6, "qwen3-8b"}, {0.7, "qwen3-32b"}, {0.78, "qwen3-32b"}, {0.9, "frontier-reasoner"}, {1, "frontier-reasoner"}} {
		s := r.Select(turn("", "x").c(tc.c).T(), allUp)
		if s.Model != tc.want {
			t.Errorf("c=%.2f: %s, want %s", tc.c, s.Model, tc.want)
		}
	}
}

// A hard turn mid-session wins an upgrade when it is worth it: a short
// warm history moves up; the hurdle grows with the warm history.
func TestUpgradeMidSession(t *testing.T) {
	cfg := qwenConfig(t)
	decide := func(hist int, c float64) Outcome {
		in := Inputs{Logical: "auto", HistoryTokens: hist, Headers: []HeaderValue{{ComplexityHeader, fmt.Sprint(c)}}}
		mem := sessionshard.MemoryState{Model: "qwen3-32b", Decision: "all", Turns: 5, TurnsOnModel: 5,
			LastEnd: 1, PromptTokensSeen: 10000, CachedTokensSeen: 9000}
		return Decide(cfg, Policy{Version: PolicyVersion}, &in, &mem, 2)
	}
	if o := decide(2000, 0.97); o.Model != "frontier-reasoner" || o.Action != ActionSwitch {
		t.Fatalf("hard turn, 2k history: %+v", o)
	}
	if o := decide(400000, 0.97); o.Action != ActionStay {
		t.Fatalf("hard turn, 400k history: %+v", o)
	}
}

// No fixed constant makes a class of switch impossible (policy version 2):
// for every ordered pair of models there is a turn — a complexity, a short
// warm history — on which a session moves from one to the other, even with
// the economics keys far above their defaults.
func TestNoSwitchClassImpossible(t *testing.T) {
	cfg, err := ParseConfig([]byte(strings.Replace(qwenYAML, "decisions: [{name: all, candidates: [qwen3-8b, qwen3-32b, frontier-reasoner]}]",
		"decisions: [{name: all, candidates: [qwen3-8b, qwen3-32b, frontier-reasoner]}]\n    session: {switch_margin: 2, stay_bias: 2, handoff_penalty: 2, prefix_cache_weight: 2}", 1)))
	if err != nil {
		t.Fatal(err)
	}
	models := []string{"qwen3-8b", "qwen3-32b", "frontier-reasoner"}
	for _, from := range models {
		for _, to := range models {
			if from == to {
				continue
			}
			found := false
			for c := 0.0; c <= 1.0001 && !found; c += 0.05 {
				for _, d := range []float64{0, 0.5, 1} {
					in := Inputs{Logical: "auto", HistoryTokens: 10, Headers: []HeaderValue{{ComplexityHeader, fmt.Sprint(c)}}}
					mem := sessionshard.MemoryState{Model: from, Decision: "all", Turns: 3, TurnsOnModel: 3, LastEnd: 1, Demand: d}
					if o := Decide(cfg, Policy{Version: PolicyVersion}, &in, &mem, 2); o.Model == to && o.Action == ActionSwitch {
						found = true
						break
					}
				}
			}
			if !found {
				t.Errorf("no turn moves a session from %s to %s", from, to)
			}
		}
	}
}

// The hurdle of an upgrade grows with the warm history: the least
// complexity that moves a qwen3-32b session to frontier-reasoner rises with
// the history, and a long enough history keeps even a c=1 turn.
func TestUpgradeHurdleGrowsWithHistory(t *testing.T) {
	cfg := qwenConfig(t)
	minC := func(hist int) float64 {
		for c := 0.80; c <= 1.0001; c += 0.005 {
			in := Inputs{Logical: "auto", HistoryTokens: hist, Headers: []HeaderValue{{ComplexityHeader, fmt.Sprint(c)}}}
			mem := sessionshard.MemoryState{Model: "qwen3-32b", Decision: "all", Turns: 5, TurnsOnModel: 5, LastEnd: 1, Demand: 0.7}
			if o := Decide(cfg, Policy{Version: PolicyVersion}, &in, &mem, 2); o.Action == ActionSwitch {
				return c
			}
		}
		return 2
	}
	prev := 0.0
	for _, h := range []int{0, 2000, 5000, 8000, 12000, 50000} {
		c := minC(h)
		t.Logf("history %6d: least complexity to upgrade %.3f", h, c)
		if c < prev {
			t.Fatalf("history %d: %.3f < %.3f of a shorter history", h, c, prev)
		}
		prev = c
	}
	if minC(0) > 1 || minC(50000) <= 1 {
		t.Fatalf("short history must upgrade, 50k must not: %.3f %.3f", minC(0), minC(50000))
	}
}

// A record replays under the policy version that made it: records of a
// router of each version replay without a diff, and a record without a
// version (written before versions) reads as 1.
func TestReplayUnderRecordedVersion(t *testing.T) {
	cfg := qwenConfig(t)
	for _, v := range []uint8{1, 2, 3} {
		r, _ := newRouter(t, cfg, Options{Policy: Policy{Version: v}})
		for i, c := range []float64{0.7, 0.97, 0.97, 0.3, 0.97} {
			r.Select(turn("s", "x").c(c).chars(4000*(i+1)).T(), allUp)
			r.Observe([]byte("s"), r.Records("s", 1)[0].Outcome.Model, "w", Observed{PromptTokens: 1000 * (i + 1), CachedTokens: 900 * i})
		}
		recs := r.Records("", 0)
		if recs[0].Policy.Version != v {
			t.Fatalf("record version %d, want %d", recs[0].Policy.Version, v)
		}
		if d := Replay(cfg, recs); len(d) != 0 {
			t.Fatalf("v%d replay diffs: %v", v, d)
		}
	}
	var p Policy
	if err := json.Unmarshal([]byte(`{"mode":"saar"}`), &p); err != nil || p.V() != 1 {
		t.Fatalf("record without version: %+v %v", p, err)
	}
	if (Policy{}).V() != 1 || (Policy{Version: 9}).V() != PolicyVersion {
		t.Fatal("V")
	}
}
