package saar

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/sessionshard"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func demoConfig(t testing.TB) *Config {
	t.Helper()
	cfg, err := LoadConfig("../examples/demo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newRouter(t testing.TB, cfg *Config, opt Options) (*Router, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	opt.Now = clk.Now
	r := NewRouter(cfg, opt)
	t.Cleanup(r.Close)
	return r, clk
}

// tb builds a Turn for logical model auto.
type tb struct{ t Turn }

func turn(session, text string) *tb {
	return &tb{Turn{Logical: []byte("auto"), Session: []byte(session), LatestUserText: []byte(text), HistoryChars: 400}}
}

func (b *tb) c(v float64) *tb {
	s := fmt.Sprint(v)
	b.t.Header = func(name string) []byte {
		if name == ComplexityHeader {
			return []byte(s)
		}
		return nil
	}
	return b
}
func (b *tb) tools() *tb { b.t.HasTools = true; return b }
func (b *tb) results(ids ...string) *tb {
	b.t.HasTools = true
	b.t.ToolResultIDs = bs(ids...)
	return b
}
func (b *tb) prev(id string) *tb  { b.t.PreviousResponseID = []byte(id); return b }
func (b *tb) opaque() *tb         { b.t.OpaqueReasoning = true; return b }
func (b *tb) effort(e string) *tb { b.t.ReasoningEffort = []byte(e); return b }
func (b *tb) chars(n int) *tb     { b.t.HistoryChars = n; return b }
func (b *tb) T() *Turn            { return &b.t }

func bs(s ...string) [][]byte {
	out := make([][]byte, len(s))
	for i := range s {
		out[i] = []byte(s[i])
	}
	return out
}

var allUp Health

func expect(t *testing.T, got Selection, model, action, phase, reason string) {
	t.Helper()
	if got.Model != model || got.Action != action || (phase != "" && got.Phase != phase) || (reason != "" && got.Reason != reason) {
		t.Fatalf("got %+v; want model=%s action=%s phase=%s reason=%s", got, model, action, phase, reason)
	}
}

func TestExamplesParse(t *testing.T) {
	for _, p := range []string{"../examples/demo.yaml", "../examples/fleet.yaml"} {
		cfg, err := LoadConfig(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if !cfg.IsLogical("auto") || cfg.IsLogical(cfg.Models[0].Name) {
			t.Fatalf("%s: logical lookup wrong", p)
		}
	}
	cfg := demoConfig(t)
	for _, m := range cfg.Models {
		if len(m.Workers) != 0 {
			t.Fatalf("demo.yaml must not name workers: %v", m.Workers)
		}
	}
	ls := cfg.Logical[0].Session
	if ls != DefaultSessionSettings() {
		t.Fatalf("demo session settings %+v differ from defaults", ls)
	}
}

const okModels = `models:
  - name: a
    quality_score: 0.5
    pricing: {prompt_per_1m: 1, cached_input_per_1m: 0.1, completion_per_1m: 2}
  - name: b
    quality_score: 0.9
    pricing: {prompt_per_1m: 4, cached_input_per_1m: 0.4, completion_per_1m: 8}
`

func TestConfigErrors(t *testing.T) {
	f := func(name, yml string, line int, contains string) {
		t.Helper()
		_, err := ParseConfig([]byte(yml))
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("%s: want ConfigError, got %v", name, err)
		}
		if ce.Line != line || !strings.Contains(ce.Error(), contains) {
			t.Fatalf("%s: got %q (line %d); want line %d containing %q", name, ce.Error(), ce.Line, line, contains)
		}
		if line > 0 && !strings.Contains(ce.Error(), fmt.Sprintf("line %d", line)) {
			t.Fatalf("%s: message %q does not name the line", name, ce.Error())
		}
	}
	f("unknown candidate", okModels+`logical_models:
  - name: auto
    decisions:
      - name: d
        candidates: [a, nope]
`, 12, `unknown candidate model "nope"`)
	f("duplicate model", okModels+`  - name: a
    quality_score: 0.1
`, 8, `duplicate model name "a"`)
	f("duplicate logical", okModels+`logical_models:
  - name: auto
    decisions: [{name: d, candidates: [a]}]
  - name: auto
    decisions: [{name: d, candidates: [a]}]
`, 11, `duplicate logical model name "auto"`)
	f("duplicate decision", okModels+`logical_models:
  - name: auto
    decisions:
      - {name: d, candidates: [a]}
      - {name: d, candidates: [b]}
`, 12, `duplicate decision name`)
	f("logical equals physical", okModels+`logical_models:
  - name: b
    decisions: [{name: d, candidates: [a]}]
`, 9, `name of a physical model`)
	f("bad regex", okModels+`logical_models:
  - name: auto
    decisions:
      - name: d
        signals:
          regex: ['ok', '(unclosed']
        candidates: [a]
`, 13, "bad regex")
	f("negative price", `models:
  - name: a
    quality_score: 0.5
    pricing:
      prompt_per_1m: 1
      completion_per_1m: -2
`, 6, "completion_per_1m is negative")
	f("unknown top key", okModels+`logical_model: []
`, 8, `unknown key "logical_model"`)
	f("unknown model key", `models:
  - name: a
    quality: 0.5
`, 3, `unknown key "quality"`)
	f("unknown session key", okModels+`logical_models:
  - name: auto
    decisions: [{name: d, candidates: [a]}]
    session:
      idle_timeout: 5
`, 12, `unknown key "idle_timeout"`)
	f("unknown signal key", okModels+`logical_models:
  - name: auto
    decisions:
      - name: d
        signals: {keyword: [x]}
        candidates: [a]
`, 12, `unknown key "keyword"`)
	f("no decisions key", okModels+`logical_models:
  - name: auto
`, 9, "has no decisions")
	f("empty decisions", okModels+`logical_models:
  - name: auto
    decisions: []
`, 10, "has no decisions")
	f("no candidates", okModels+`logical_models:
  - name: auto
    decisions:
      - name: d
`, 11, `decision "d" has no candidates`)
	f("quality range", `models:
  - name: a
    quality_score: 1.5
`, 3, "outside [0, 1]")
	f("string for number", `models:
  - name: a
    quality_score: high
`, 3, "expected a number")
	f("negative margin", okModels+`logical_models:
  - name: auto
    decisions: [{name: d, candidates: [a]}]
    session: {switch_margin: -1}
`, 11, "switch_margin is negative")
	f("overflowing penalty", okModels+`logical_models:
  - name: auto
    decisions: [{name: d, candidates: [a]}]
    session: {handoff_penalty: 1e308}
`, 11, "handoff_penalty is out of range")
	f("zero idle timeout", okModels+`logical_models:
  - name: auto
    decisions: [{name: d, candidates: [a]}]
    session: {idle_timeout_seconds: 0}
`, 11, "idle_timeout_seconds must be positive")
	f("no models", "logical_models: []\n", 1, "no models")
}

func TestBaseSelector(t *testing.T) {
	cfg := demoConfig(t)
	for i := range cfg.Logical {
		cfg.Logical[i].Session.PriceSensitivity = 0.1 // version 2's default
	}
	r, _ := newRouter(t, cfg, Options{Policy: Policy{Version: 2}}) // the per-turn selector (v3 looks ahead on first turns)
	f := func(b *tb, model, decision string) {
		t.Helper()
		s := r.Select(b.T(), allUp)
		if s.Model != model || s.Decision != decision || s.Action != ActionFirst {
			t.Fatalf("got %+v; want %s / %s / first", s, model, decision)
		}
	}
	f(turn("", "hello there"), "sim-small", "default")
	f(turn("", "please prove this theorem").effort("high"), "sim-large", "reasoning")
	f(turn("", "please prove this theorem").effort("low"), "sim-medium", "reasoning")
	f(turn("", "please prove this theorem").effort("high").c(0.1), "sim-medium", "reasoning") // header wins
	f(turn("", "why does my func not compile"), "sim-medium", "coding")
	f(turn("", "hello").tools(), "sim-small", "tools")
	f(turn("", "what is the weather").tools().c(1), "sim-medium", "tools")

	// complexity estimates
	cf := func(in Inputs, want float64, src string) {
		t.Helper()
		c, s := complexity(&in)
		if s != src || c < want-1e-9 || c > want+1e-9 {
			t.Fatalf("complexity(%+v) = %v %s; want %v %s", in, c, s, want, src)
		}
	}
	cf(Inputs{Headers: []HeaderValue{{ComplexityHeader, "0.42"}}, ReasoningEffort: "high"}, 0.42, SourceHeader)
	cf(Inputs{Headers: []HeaderValue{{ComplexityHeader, "7"}}}, 1, SourceHeader)
	cf(Inputs{Headers: []HeaderValue{{ComplexityHeader, "x"}}, ReasoningEffort: "medium"}, 0.5, SourceReasoningEffort)
	cf(Inputs{Text: "Prove it"}, 0.70, SourceHeuristic)
	cf(Inputs{Text: "please refactor"}, 0.50, SourceHeuristic)
	cf(Inputs{Text: "hi!"}, 0.15, SourceHeuristic)
	cf(Inputs{Text: "this"}, 0.35, SourceHeuristic) // "hi" only on word boundaries
	cf(Inputs{Text: "ok", HistoryTokens: 64000, HasTools: true}, 0.55, SourceHeuristic)
}

func TestToolLockByIDAcrossDecisions(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	s := r.Select(turn("s1", "prove the theorem").effort("high").tools().T(), allUp)
	expect(t, s, "sim-large", ActionFirst, PhaseUserTurn, "")
	r.Observe([]byte("s1"), "sim-large", "w-large-1", Observed{ToolCallIDs: bs("call_1", "call_2"), PromptTokens: 100})
	// The tool result's text matches the default decision ([sim-small, sim-medium]):
	// the lock still returns it to sim-large.
	s = r.Select(turn("s1", "hello").results("call_2").T(), allUp)
	expect(t, s, "sim-large", ActionHardLock, PhaseToolLoop, ReasonToolLoop)
	if s.Decision != "tools" || s.LockKind != LockToolLoop {
		t.Fatalf("decision/lock: %+v", s)
	}
	// Without a session id: the global id index.
	s = r.Select(turn("", "hello").results("call_1").T(), allUp)
	expect(t, s, "sim-large", ActionHardLock, PhaseToolLoop, ReasonToolLoop)
	if r.Stats().HardLocks != 2 {
		t.Fatalf("hard locks %d", r.Stats().HardLocks)
	}
	// Ablation: with NoToolLock the base selector decides.
	ra, _ := newRouter(t, demoConfig(t), Options{Policy: Policy{NoToolLock: true}})
	ra.Select(turn("s1", "prove the theorem").effort("high").tools().T(), allUp)
	ra.Observe([]byte("s1"), "sim-large", "w", Observed{ToolCallIDs: bs("call_1")})
	s = ra.Select(turn("s1", "hello").results("call_1").T(), allUp)
	if s.Action == ActionHardLock {
		t.Fatalf("NoToolLock still locked: %+v", s)
	}
}

func TestToolLockSessionIDsAndStructuralFallback(t *testing.T) {
	// Tiny global index: the ids fall out of it, the session's per-model ids remain.
	r, _ := newRouter(t, demoConfig(t), Options{IndexCapacity: 16})
	r.Select(turn("s1", "hello").c(1).tools().T(), allUp) // tools decision, c=1 → sim-medium
	r.Observe([]byte("s1"), "sim-medium", "w1", Observed{ToolCallIDs: bs("call_x")})
	for i := 0; i < 200; i++ {
		r.Observe(nil, "sim-small", "w9", Observed{ToolCallIDs: bs(fmt.Sprintf("other_%d", i))})
	}
	if _, ok := r.ToolCallOwner([]byte("call_x")); ok {
		t.Fatal("expected call_x evicted from the global index")
	}
	s := r.Select(turn("s1", "hello").c(0).results("call_x").T(), allUp)
	expect(t, s, "sim-medium", ActionHardLock, PhaseToolLoop, ReasonToolLoop)
	if rec, _ := r.Record(s.ReplayID); rec.Inputs.ToolOwnerSource != lockSourceSession {
		t.Fatalf("owner source %q", rec.Inputs.ToolOwnerSource)
	}

	// Structural fallback: the ids were never observed; the session's last model.
	r2, _ := newRouter(t, demoConfig(t), Options{})
	s = r2.Select(turn("s2", "hello").T(), allUp)
	expect(t, s, "sim-small", ActionFirst, PhaseUserTurn, "")
	s = r2.Select(turn("s2", "prove it").effort("high").results("call_unknown").T(), allUp)
	expect(t, s, "sim-small", ActionHardLock, PhaseToolLoop, ReasonToolLoopFallback)

	// No memory at all: no lock possible, phase still tool_loop.
	s = r2.Select(turn("", "hello").results("nobody").T(), allUp)
	expect(t, s, "sim-small", ActionFirst, PhaseToolLoop, ReasonToolLoopNoOwner)
}

func TestProviderStateLock(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	s := r.Select(turn("s1", "prove it").effort("high").T(), allUp)
	expect(t, s, "sim-large", ActionFirst, "", "")
	r.Observe([]byte("s1"), "sim-large", "w-large-2", Observed{ResponseID: []byte("resp_1")})
	if m, w, ok := r.ResponseOwner([]byte("resp_1")); !ok || m != "sim-large" || w != "w-large-2" {
		t.Fatalf("ResponseOwner = %s %s %v", m, w, ok)
	}
	// Another session (or none): previous_response_id pins model and worker.
	for _, sess := range []string{"s1", "other", ""} {
		s = r.Select(turn(sess, "hello").prev("resp_1").T(), allUp)
		expect(t, s, "sim-large", ActionHardLock, PhaseProviderState, ReasonProviderState)
		if s.PinnedWorker != "w-large-2" || s.LockKind != LockProviderState {
			t.Fatalf("pinned %+v", s)
		}
	}
	r.ForgetResponse([]byte("resp_1"))
	if _, _, ok := r.ResponseOwner([]byte("resp_1")); ok {
		t.Fatal("ForgetResponse")
	}

	// Opaque reasoning: the session's last model and worker.
	r2, _ := newRouter(t, demoConfig(t), Options{})
	r2.Select(turn("s", "hello").c(1).T(), allUp) // default, c=1 → sim-medium
	r2.Observe([]byte("s"), "sim-medium", "w-med-1", Observed{})
	s = r2.Select(turn("s", "prove it").effort("high").opaque().T(), allUp)
	expect(t, s, "sim-medium", ActionHardLock, PhaseProviderState, ReasonOpaqueReasoning)
	if s.PinnedWorker != "w-med-1" {
		t.Fatalf("pinned %q", s.PinnedWorker)
	}
}

func TestLockBrokenAndWorkerFailover(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	r.Select(turn("s", "prove it").effort("high").tools().T(), allUp)
	r.Observe([]byte("s"), "sim-large", "wl1", Observed{ToolCallIDs: bs("c1"), ResponseID: []byte("r1")})
	largeDown := Health{ModelUp: func(m string) bool { return m != "sim-large" }}
	s := r.Select(turn("s", "prove it").effort("high").results("c1").T(), largeDown)
	if s.Action != ActionLockBroken || s.Model == "sim-large" || s.Reason != ReasonToolLockBroken || s.LockKind != LockToolLoop {
		t.Fatalf("want lock_broken: %+v", s)
	}
	if st := r.Stats(); st.LockBreaks != 1 || st.Switches != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The served model differs from the old lock but the lock was broken: no violation.
	r.Observe([]byte("s"), s.Model, "wm1", Observed{Lock: s.LockModel})
	if r.Stats().ContinuityViolations != 0 {
		t.Fatal("violation counted for an explicit break")
	}

	// Provider state: pinned worker down, model up → failover, lock holds.
	r2, _ := newRouter(t, demoConfig(t), Options{})
	r2.Select(turn("s", "prove it").effort("high").T(), allUp)
	r2.Observe([]byte("s"), "sim-large", "wl1", Observed{ResponseID: []byte("r1")})
	w1Down := Health{WorkerUp: func(w string) bool { return w != "wl1" }}
	s = r2.Select(turn("s", "x").prev("r1").T(), w1Down)
	expect(t, s, "sim-large", ActionHardLock, PhaseProviderState, ReasonWorkerFailover)
	if s.PinnedWorker != "" || r2.Stats().WorkerFailovers != 1 {
		t.Fatalf("failover: %+v %+v", s, r2.Stats())
	}
	// Provider state with the whole model down: broken.
	s = r2.Select(turn("s", "x").prev("r1").T(), largeDown)
	if s.Action != ActionLockBroken || s.Reason != ReasonStateLockBroken {
		t.Fatalf("want provider lock broken: %+v", s)
	}
}

func TestContinuityViolationCounted(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	r.Select(turn("s", "prove it").effort("high").tools().T(), allUp)
	r.Observe([]byte("s"), "sim-large", "w", Observed{ToolCallIDs: bs("c1")})
	s := r.Select(turn("s", "x").results("c1").T(), allUp)
	if s.LockModel != "sim-large" {
		t.Fatalf("%+v", s)
	}
	r.Observe([]byte("s"), "sim-large", "w", Observed{Lock: s.LockModel})
	r.Observe([]byte("s"), "sim-small", "w", Observed{Lock: s.LockModel}) // a buggy caller served another model
	if r.Stats().ContinuityViolations != 1 {
		t.Fatalf("violations %d", r.Stats().ContinuityViolations)
	}
}

func TestIdleResetFromEndOfResponse(t *testing.T) {
	r, clk := newRouter(t, demoConfig(t), Options{})
	r.Select(turn("s", "hello").T(), allUp)
	clk.Add(200 * time.Second) // a long response
	r.Observe([]byte("s"), "sim-small", "w", Observed{PromptTokens: 100})
	clk.Add(250 * time.Second) // 450 s after the selection, 250 s after the end
	s := r.Select(turn("s", "hello").T(), allUp)
	expect(t, s, "sim-small", ActionStay, "", "")
	r.Observe([]byte("s"), "sim-small", "w", Observed{PromptTokens: 100})
	clk.Add(301 * time.Second)
	s = r.Select(turn("s", "hello").c(1).T(), allUp)
	expect(t, s, "sim-medium", ActionResetIdle, PhaseUserTurn, ReasonIdle)
	// Ablation: no idle reset, economics decides (and keeps it).
	ra, clk2 := newRouter(t, demoConfig(t), Options{Policy: Policy{NoIdleReset: true}})
	ra.Select(turn("s", "hello").T(), allUp)
	clk2.Add(time.Hour)
	s = ra.Select(turn("s", "hello").T(), allUp)
	expect(t, s, "sim-small", ActionStay, "", "")
}

func TestDriftReset(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	r.Select(turn("s", "hello").T(), allUp)
	s := r.Select(turn("s", "prove the theorem").effort("high").T(), allUp)
	expect(t, s, "sim-large", ActionResetDrift, PhaseUserTurn, ReasonDrift)
	// A drift that lands on the same model is still a reset, not a switch.
	s = r.Select(turn("s", "hello").c(0.2).T(), allUp)
	if s.Action != ActionResetDrift || r.Stats().Switches != 2 {
		t.Fatalf("%+v %+v", s, r.Stats())
	}
	// Within one decision a big complexity change is an economic question.
	s = r.Select(turn("s", "hello").c(1).T(), allUp)
	if s.Action != ActionSwitch && s.Action != ActionStay {
		t.Fatalf("%+v", s)
	}
}

func TestMinTurnsBeforeSwitch(t *testing.T) {
	cfg, err := ParseConfig([]byte(`models:
  - {name: small, quality_score: 0.6, pricing: {prompt_per_1m: 0.1, cached_input_per_1m: 0.02, completion_per_1m: 0.4}}
  - {name: large, quality_score: 0.95, pricing: {prompt_per_1m: 8, cached_input_per_1m: 1.2, completion_per_1m: 24}}
logical_models:
  - name: auto
    decisions: [{name: all, candidates: [small, large]}]
    session: {min_turns_before_switch: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := newRouter(t, cfg, Options{})
	s := r.Select(turn("s", "x").c(0.1).T(), allUp)
	expect(t, s, "small", ActionFirst, "", "")
	s = r.Select(turn("s", "x").c(1).T(), allUp)
	expect(t, s, "small", ActionStay, "", ReasonMinTurns)
	s = r.Select(turn("s", "x").c(1).T(), allUp)
	expect(t, s, "small", ActionStay, "", ReasonMinTurns)
	s = r.Select(turn("s", "x").c(1).T(), allUp)
	expect(t, s, "large", ActionSwitch, "", ReasonEconomics)
	s = r.Select(turn("s", "x").c(0.1).T(), allUp) // one turn on large: held again
	expect(t, s, "large", ActionStay, "", ReasonMinTurns)
}

// A longer session needs a bigger quality gain to switch: the minimal
// gain (found by bisection, complexity 1 so the base score is the quality)
// grows with the history, and a fixed gain switches short sessions only.
func TestEconomicsMonotone(t *testing.T) {
	build := func(gain float64) *Config {
		cfg, err := ParseConfig([]byte(fmt.Sprintf(`models:
  - {name: cur, quality_score: 0.5, pricing: {prompt_per_1m: 8, cached_input_per_1m: 0.8, completion_per_1m: 24}}
  - {name: alt, quality_score: %v, pricing: {prompt_per_1m: 8, cached_input_per_1m: 0.8, completion_per_1m: 24}}
logical_models:
  - name: auto
    decisions: [{name: all, candidates: [cur, alt]}]
`, 0.5+gain)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	decide := func(cfg *Config, hist int) Outcome {
		in := Inputs{Logical: "auto", HistoryTokens: hist, Headers: []HeaderValue{{ComplexityHeader, "1"}}}
		mem := sessionshard.MemoryState{Model: "cur", Decision: "all", Turns: 5, TurnsOnModel: 5,
			LastEnd: 1, PromptTokensSeen: 10000, CachedTokensSeen: 9000}
		return Decide(cfg, Policy{}, &in, &mem, 2)
	}
	minGain := func(hist int) float64 {
		lo, hi := 0.0, 0.5
		for i := 0; i < 30; i++ {
			mid := (lo + hi) / 2
			if decide(build(mid), hist).Action == ActionSwitch {
				hi = mid
			} else {
				lo = mid
			}
		}
		return hi
	}
	prev := 0.0
	for _, h := range []int{0, 500, 2000, 8000, 20000, 40000} {
		g := minGain(h)
		if g < prev {
			t.Fatalf("history %d: min gain %.4f < %.4f of a shorter session", h, g, prev)
		}
		t.Logf("history %6d tokens: min quality gain to switch %.4f", h, g)
		prev = g
	}
	if base := minGain(0); base < 0.2-1e-6 || base > 0.2+1e-3 {
		t.Fatalf("gain at empty history = %.4f; want stay_bias+margin+handoff = 0.20", base)
	}
	// table: a fixed gain of 0.3 moves a short session, not a long one
	f := func(hist int, action string) {
		t.Helper()
		if got := decide(build(0.3), hist); got.Action != action {
			t.Fatalf("history %d: %s (%s); want %s", hist, got.Action, got.Reason, action)
		}
	}
	f(0, ActionSwitch)
	f(2000, ActionSwitch)
	f(20000, ActionStay)
	f(100000, ActionStay)
	// NoEconomics: the long session moves too.
	in := Inputs{Logical: "auto", HistoryTokens: 100000, Headers: []HeaderValue{{ComplexityHeader, "1"}}}
	mem := sessionshard.MemoryState{Model: "cur", Decision: "all", TurnsOnModel: 5, LastEnd: 1}
	if o := Decide(build(0.3), Policy{NoEconomics: true}, &in, &mem, 2); o.Action != ActionSwitch {
		t.Fatalf("NoEconomics: %+v", o)
	}
}

func TestStickyAndSingleTurnModes(t *testing.T) {
	st, _ := newRouter(t, demoConfig(t), Options{Policy: Policy{Mode: ModeSticky}})
	st.Select(turn("s", "hello").T(), allUp)
	s := st.Select(turn("s", "prove it").effort("high").T(), allUp)
	expect(t, s, "sim-small", ActionStay, "", ReasonSticky)
	one, _ := newRouter(t, demoConfig(t), Options{Policy: Policy{Mode: ModeSingleTurn}})
	one.Select(turn("s", "prove it").effort("high").tools().T(), allUp)
	one.Observe([]byte("s"), "sim-large", "w", Observed{ToolCallIDs: bs("c")})
	s = one.Select(turn("s", "hello").results("c").T(), allUp)
	if s.Action != ActionSwitch || s.Model == "sim-large" {
		t.Fatalf("single-turn ignores locks: %+v", s)
	}
}

func runScript(t *testing.T, r *Router, clk *fakeClock, sessions, turns int) {
	for i := 0; i < turns; i++ {
		for j := 0; j < sessions; j++ {
			sess := fmt.Sprintf("s%d", j)
			b := turn(sess, []string{"hello", "prove the theorem", "fix my func", "thanks"}[(i+j)%4]).chars(400 * (i + 1))
			switch (i * (j + 1)) % 5 {
			case 1:
				b.results(fmt.Sprintf("call_%d_%d", j, i-1))
			case 2:
				b.prev(fmt.Sprintf("resp_%d_%d", j, i-1))
			case 3:
				b.c(float64(j%10) / 10)
			case 4:
				b.effort("medium").opaque()
			}
			s := r.Select(b.T(), allUp)
			clk.Add(time.Duration(1+(i*j)%400) * time.Second)
			r.Observe([]byte(sess), s.Model, s.Model+"-w1", Observed{
				ToolCallIDs: bs(fmt.Sprintf("call_%d_%d", j, i)), ResponseID: []byte(fmt.Sprintf("resp_%d_%d", j, i)),
				PromptTokens: 100 * (i + 1), CachedTokens: 50 * i, CompletionTokens: 20,
			})
		}
	}
}

func TestReplayDeterminism(t *testing.T) {
	var jsonl bytes.Buffer
	cfg := demoConfig(t)
	r, clk := newRouter(t, cfg, Options{Replay: &jsonl})
	runScript(t, r, clk, 6, 10)
	r.Close() // the replay log is written by its own goroutine
	recs := r.Records("", 0)
	if len(recs) != 60 {
		t.Fatalf("records %d", len(recs))
	}
	if d := r.Replay(recs); len(d) != 0 {
		t.Fatalf("replay diffs: %v", d)
	}
	actions := map[string]int{}
	for _, rec := range recs {
		actions[rec.Outcome.Action]++
	}
	t.Logf("actions %v", actions)
	if len(actions) < 4 {
		t.Fatalf("script exercises too few actions: %v", actions)
	}
	fromFile, err := ReadRecords(bytes.NewReader(jsonl.Bytes()))
	if err != nil || len(fromFile) != 60 {
		t.Fatalf("ReadRecords: %d %v", len(fromFile), err)
	}
	if d := Replay(cfg, fromFile); len(d) != 0 {
		t.Fatalf("JSONL replay diffs: %v", d)
	}
	path := filepath.Join(t.TempDir(), "replay.jsonl")
	if err := os.WriteFile(path, jsonl.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := ReplayFile(path, cfg)
	if err != nil || rep.Records != 60 || len(rep.Diffs) != 0 {
		t.Fatalf("ReplayFile: %+v %v", rep, err)
	}
	// A tampered record is found: TestReplayFindsTamperedRecords.
	// Per-session records.
	if got := r.Records("s1", 3); len(got) != 3 || got[2].Session != "s1" || got[0].Seq > got[2].Seq {
		t.Fatalf("Records(s1,3): %d", len(got))
	}
}

func TestConcurrentSelectObserve(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{RingSize: 256, Replay: &bytes.Buffer{} /* guarded by the router */})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				sess := fmt.Sprintf("s%d", (g*7+i)%50)
				b := turn(sess, []string{"hello", "prove it", "debug this func"}[i%3]).chars(100 * i)
				if i%4 == 1 {
					b.results(fmt.Sprintf("c%d_%d", g, i-1))
				}
				if i%6 == 2 {
					b.prev(fmt.Sprintf("r%d_%d", g, i-1))
				}
				s := r.Select(b.T(), allUp)
				r.Observe([]byte(sess), s.Model, "w", Observed{ToolCallIDs: bs(fmt.Sprintf("c%d_%d", g, i)),
					ResponseID: []byte(fmt.Sprintf("r%d_%d", g, i)), PromptTokens: i, CachedTokens: i / 2, Lock: s.LockModel})
				if i%50 == 0 {
					r.Records(sess, 5)
					r.Sweep()
				}
			}
		}(g)
	}
	wg.Wait()
	st := r.Stats()
	if st.Selections != 2400 || st.ContinuityViolations != 0 {
		t.Fatalf("stats %+v", st)
	}
	if d := r.Replay(r.Records("", 0)); len(d) != 0 {
		t.Fatalf("concurrent replay diffs: %v", d[0])
	}
}

func TestNotLogical(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	if s := r.Select(&Turn{Logical: []byte("sim-small")}, allUp); s != (Selection{}) {
		t.Fatalf("physical model selected: %+v", s)
	}
	if !r.IsLogicalBytes([]byte("auto")) || r.IsLogical("sim-large") {
		t.Fatal("IsLogical")
	}
	if got := r.LogicalModels(); len(got) != 1 || got[0] != "auto" {
		t.Fatalf("LogicalModels %v", got)
	}
}

// Signals read the text the user wrote, not its JSON escapes: a word after
// an escaped newline is a word.
func TestSignalsReadUnescapedText(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	s := r.Select(turn("esc", `Hi.\nProve that it holds`).T(), allUp)
	if s.Decision != "reasoning" {
		t.Fatalf("escaped newline before a keyword: decision %q", s.Decision)
	}
}

// Tool-call ids are reused across backends (call_0): a session's own
// memory of an id wins over the global index, which the last issuer
// taught.
func TestSessionToolIDsWinOverGlobalIndex(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	r.Select(turn("a", "hello").c(0).tools().T(), allUp)
	r.Observe([]byte("a"), "sim-small", "w1", Observed{ToolCallIDs: bs("call_0")})
	r.Select(turn("b", "prove it").effort("high").T(), allUp)
	r.Observe([]byte("b"), "sim-large", "w2", Observed{ToolCallIDs: bs("call_0")})
	s := r.Select(turn("a", "hello").results("call_0").T(), allUp)
	expect(t, s, "sim-small", ActionHardLock, PhaseToolLoop, ReasonToolLoop)
}

// A tool result without an id is still a tool-loop turn: it stays with the
// session's model, whatever the text asks for.
func TestToolResultWithoutIDIsToolLoop(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	r.Select(turn("a", "hello").c(0).tools().T(), allUp)
	r.Observe([]byte("a"), "sim-small", "w1", Observed{ToolCallIDs: bs("call_0")})
	tr := turn("a", "prove it rigorously").effort("high")
	tr.t.HasTools, tr.t.ToolResults = true, 1
	s := r.Select(tr.T(), allUp)
	expect(t, s, "sim-small", ActionHardLock, PhaseToolLoop, ReasonToolLoopFallback)
}

// Idle is measured from the session's last activity: a turn in flight
// (never observed) keeps the session warm.
func TestTurnInFlightKeepsSessionWarm(t *testing.T) {
	r, clk := newRouter(t, demoConfig(t), Options{})
	r.Select(turn("busy", "hello").T(), allUp)
	clk.Add(10 * time.Second)
	r.Observe([]byte("busy"), "sim-small", "w", Observed{PromptTokens: 100})
	clk.Add(190 * time.Second)
	r.Select(turn("busy", "hello").T(), allUp) // still running
	clk.Add(120 * time.Second)
	s := r.Select(turn("busy", "hello").c(1).T(), allUp)
	if s.Action == ActionResetIdle {
		t.Fatalf("reset_idle 120 s after a turn began: %+v", s)
	}
}

// A model name outside the config (a client's name for a physical model)
// teaches the id indexes only: it does not become the session's memory.
func TestUnknownModelTeachesIndexesOnly(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	r.Observe([]byte("fresh"), "client-chosen", "w9", Observed{ResponseID: []byte("resp_x")})
	if _, w, ok := r.ResponseOwner([]byte("resp_x")); !ok || w != "w9" {
		t.Fatalf("index not taught: %q %v", w, ok)
	}
	s := r.Select(turn("fresh", "hello").T(), allUp)
	expect(t, s, "sim-small", ActionFirst, PhaseUserTurn, ReasonBase)
}

func TestToolCallsNotedMidStream(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	r.NoteToolCalls("sim-large", "w1", bs("call_early"))
	s := r.Select(turn("", "hello").results("call_early").T(), allUp)
	expect(t, s, "sim-large", ActionHardLock, PhaseToolLoop, ReasonToolLoop)
}
