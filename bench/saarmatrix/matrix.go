// Package saarmatrix is the SAAR policy matrix: deterministic agent
// sessions (scenarios × seeds × sessions × turns) driven through the
// shipped saar.Router (Select + Observe, injected clock) under every
// policy — single-turn, sticky, full SAAR and SAAR minus each part — with a
// simulated backend per model that synthesizes tool calls, response ids
// and usage. Every policy sees the same scripted sessions and is costed
// with the same cache model.
package saarmatrix

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/warmroute/warmroute/saar"
)

// ConfigYAML is the matrix's model configuration: the three models of
// issue 14, priced and scored as a public SAAR experiment does, two
// simulated workers each, every model a candidate of every decision (the
// decisions still separate intents, so topic drift resets). %s is the
// price_sensitivity (ConfigFor).
const ConfigYAML = `models:
  - name: qwen3-8b
    workers: ["sim://8b/0", "sim://8b/1"]
    quality_score: 0.64
    pricing: {prompt_per_1m: 0.05, cached_input_per_1m: 0.01, completion_per_1m: 0.10}
  - name: qwen3-32b
    workers: ["sim://32b/0", "sim://32b/1"]
    quality_score: 0.78
    pricing: {prompt_per_1m: 0.30, cached_input_per_1m: 0.06, completion_per_1m: 0.60}
  - name: frontier-reasoner
    workers: ["sim://frontier/0", "sim://frontier/1"]
    quality_score: 0.94
    pricing: {prompt_per_1m: 8.00, cached_input_per_1m: 1.20, completion_per_1m: 24.00}
logical_models:
  - name: auto
    decisions:
      - name: reasoning
        signals: {keywords: ["prove", "proof", "theorem", "derive", "step by step", "rigorous"]}
        candidates: [frontier-reasoner, qwen3-32b, qwen3-8b]
      - name: coding
        signals: {regex: '(?i)\b(func|def|class|stack trace|compile|refactor|debug|golang|python|rust)\b'}
        candidates: [qwen3-32b, frontier-reasoner, qwen3-8b]
      - name: tools
        signals: {has_tools: true}
        candidates: [qwen3-32b, qwen3-8b, frontier-reasoner]
      - name: default
        candidates: [qwen3-8b, qwen3-32b, frontier-reasoner]
    session: {idle_timeout_seconds: 300, min_turns_before_switch: 1, switch_margin: 0.05,
              stay_bias: 0.10, prefix_cache_weight: 0.20, handoff_penalty: 0.05, price_sensitivity: %s}
`

// ConfigFor returns the matrix configuration with price_sensitivity
// lambda (policy versions 2 and 3; version 1 ignores it).
func ConfigFor(lambda float64) *saar.Config {
	cfg, err := saar.ParseConfig([]byte(fmt.Sprintf(ConfigYAML, strconv.FormatFloat(lambda, 'g', -1, 64))))
	if err != nil {
		panic(err)
	}
	return cfg
}

// Scenario shapes the scripted sessions.
type Scenario struct {
	Name         string
	Intents      [4]float64 // weights: reasoning, coding, tools, default
	ToolsOffered float64    // probability a session is an agent that offers tools every turn
	ToolCall     float64    // probability a response issues tool calls when tools are offered
	State        float64    // probability a user turn continues with previous_response_id
	Opaque       float64    // probability a user turn carries opaque reasoning state
	Idle         float64    // probability of an idle gap (> idle timeout) before a user turn
	Drift        float64    // probability the intent changes on a user turn
	Hard         float64    // probability a user turn starts a hard phase (1–3 user turns, complexity 0.90–1.00) on the same topic
}

// Scenarios are the six scenarios of the matrix.
var Scenarios = []Scenario{
	{Name: "balanced", Intents: [4]float64{1, 1, 1, 1}, ToolsOffered: 0.5, ToolCall: 0.35, State: 0.10, Opaque: 0.03, Idle: 0.05, Drift: 0.15},
	{Name: "tool-heavy", Intents: [4]float64{1, 2, 3, 1}, ToolsOffered: 0.9, ToolCall: 0.60, State: 0.05, Opaque: 0.02, Idle: 0.03, Drift: 0.10},
	{Name: "frontier-heavy", Intents: [4]float64{4, 2, 1, 1}, ToolsOffered: 0.4, ToolCall: 0.30, State: 0.10, Opaque: 0.10, Idle: 0.05, Drift: 0.10},
	{Name: "idle-heavy", Intents: [4]float64{1, 1, 1, 2}, ToolsOffered: 0.4, ToolCall: 0.30, State: 0.05, Opaque: 0.02, Idle: 0.35, Drift: 0.10},
	{Name: "stateful-heavy", Intents: [4]float64{2, 1, 1, 1}, ToolsOffered: 0.5, ToolCall: 0.30, State: 0.40, Opaque: 0.15, Idle: 0.05, Drift: 0.10},
	{Name: "drift-heavy", Intents: [4]float64{1, 1, 1, 1}, ToolsOffered: 0.5, ToolCall: 0.30, State: 0.10, Opaque: 0.03, Idle: 0.05, Drift: 0.55},
}

// HardMidSession is the scenario of hard turns mid-session without topic
// drift: sessions on one everyday topic (coding, tools, chat) in which a
// hard phase of 1–3 user turns (complexity 0.90–1.00) starts with
// probability 0.15 on each user turn.
var HardMidSession = Scenario{Name: "hard-midsession", Intents: [4]float64{0, 2, 1, 1}, ToolsOffered: 0.5, ToolCall: 0.30,
	State: 0.05, Opaque: 0.02, Idle: 0.02, Drift: 0, Hard: 0.15}

// PolicySpec names a policy of the matrix.
type PolicySpec struct {
	Name   string
	Policy saar.Policy
}

// Policies are the policies of the matrix, baseline first: the version-1
// policies (version 1's selector and fixed margins, the reference), then the
// version-3 policies (demand-calibrated selector priced per turn, look-ahead at the session's demand, switches priced in money).
var Policies = []PolicySpec{
	{"single-turn-v1", saar.Policy{Version: 1, Mode: saar.ModeSingleTurn}},
	{"saar-v1", saar.Policy{Version: 1}},
	{"single-turn", saar.Policy{Version: 3, Mode: saar.ModeSingleTurn}},
	{"sticky", saar.Policy{Version: 3, Mode: saar.ModeSticky}},
	{"saar", saar.Policy{Version: 3}},
	{"saar-no-tool-lock", saar.Policy{Version: 3, NoToolLock: true}},
	{"saar-no-provider-lock", saar.Policy{Version: 3, NoProviderLock: true}},
	{"saar-no-drift-reset", saar.Policy{Version: 3, NoDriftReset: true}},
	{"saar-no-idle-reset", saar.Policy{Version: 3, NoIdleReset: true}},
	{"saar-no-economics", saar.Policy{Version: 3, NoEconomics: true}},
}

// Params size the matrix.
type Params struct {
	Lambda    float64 // price_sensitivity of the config (saar.DefaultPriceSensitivity)
	Scenarios []Scenario
	Seeds     int
	Sessions  int
	Turns     int
	Policies  []PolicySpec
}

// DefaultParams: (6 + hard-midsession) scenarios × 5 seeds × 40 sessions
// × 18 turns = 25,200 turns per policy (21,600 over the six scenarios of
// issue 14).
func DefaultParams() Params {
	return Params{Lambda: saar.DefaultPriceSensitivity, Scenarios: append(append([]Scenario(nil), Scenarios...), HardMidSession),
		Seeds: 5, Sessions: 40, Turns: 18, Policies: Policies}
}

// Stats are one policy's totals (over all scenarios, or one).
type Stats struct {
	Policy          string
	Scenario        string // "" for the total
	Turns           int
	Switches        int
	UnsafeTool      int // switches on tool-loop turns
	UnsafeState     int // switches on provider-state turns
	Cost            float64
	QualitySum      float64
	Shortfall       float64 // Σ max(0, quality the turn needs − quality served)
	Upgrades        int     // mid-session switches to a higher quality_score
	Downgrades      int     // mid-session switches to a lower quality_score
	LockBreaks      uint64
	Violations      uint64
	HardLocks       uint64
	CachedTokens    int64
	PromptTokens    int64
	ResetsIdle      int
	ResetsDrift     int
	EconomicSwitch  int
	FirstSelections int
}

// Unsafe is the number of switches on tool-loop or provider-state turns.
func (s *Stats) Unsafe() int { return s.UnsafeTool + s.UnsafeState }

// MeanQuality is the mean quality score of the served models.
func (s *Stats) MeanQuality() float64 {
	if s.Turns == 0 {
		return 0
	}
	return s.QualitySum / float64(s.Turns)
}

// MeanShortfall is how far, on average per turn, the served model fell
// short of the quality the turn needed: the quality_score of the cheapest
// model whose quality_score is at least the turn's complexity (the best
// model when none is), the same demand for every policy. Serving a better
// model than needed costs money, not quality, so it counts 0.
func (s *Stats) MeanShortfall() float64 {
	if s.Turns == 0 {
		return 0
	}
	return s.Shortfall / float64(s.Turns)
}

func (s *Stats) add(o *Stats) {
	s.Turns += o.Turns
	s.Switches += o.Switches
	s.UnsafeTool += o.UnsafeTool
	s.UnsafeState += o.UnsafeState
	s.Cost += o.Cost
	s.QualitySum += o.QualitySum
	s.Shortfall += o.Shortfall
	s.Upgrades += o.Upgrades
	s.Downgrades += o.Downgrades
	s.LockBreaks += o.LockBreaks
	s.Violations += o.Violations
	s.HardLocks += o.HardLocks
	s.CachedTokens += o.CachedTokens
	s.PromptTokens += o.PromptTokens
	s.ResetsIdle += o.ResetsIdle
	s.ResetsDrift += o.ResetsDrift
	s.EconomicSwitch += o.EconomicSwitch
	s.FirstSelections += o.FirstSelections
}

// Result is the matrix: per policy the total and per scenario.
type Result struct {
	Params     Params
	Totals     []Stats            // in Params.Policies order
	ByScenario map[string][]Stats // policy → per scenario, in Params.Scenarios order
	Frontier   []Point            // price_sensitivity frontier over the six scenarios (set by the caller, optional)
}

// turnSpec is one scripted turn, independent of the policy.
type turnSpec struct {
	text       string
	effort     string
	complexity string // x-warmroute-complexity header ("" none)
	hasTools   bool
	toolResult bool // carries the results of the previous response's tool calls
	state      bool // previous_response_id = previous response
	opaque     bool
	issueTools int // tool calls the response issues
	gap        time.Duration
	duration   time.Duration
	newTokens  int // user text or tool results added before this turn
	completion int
}

var texts = [4][]string{
	{"prove that this scheduler never starves a job", "derive the bound step by step", "give a rigorous proof of the lemma", "prove the invariant holds"},
	{"why does this func not compile", "refactor the python class", "debug the stack trace below", "port this golang handler to rust"},
	{"check the deployment status", "look up the open tickets", "fetch the latest metrics", "run the search"},
	{"thanks, summarize the notes", "hello, what's new", "translate this paragraph", "list the next steps"},
}

// bands are the complexity ranges of the intents (reasoning, coding,
// tools, default): each turn's x-warmroute-complexity is drawn from its
// intent's band, on a 0.01 grid.
var bands = [4][2]float64{{0.60, 1.00}, {0.40, 0.85}, {0.20, 0.70}, {0.00, 0.50}}

func script(sc Scenario, seed, sess, turns int) []turnSpec {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/%d", sc.Name, seed, sess)
	rng := rand.New(rand.NewPCG(h.Sum64(), uint64(seed)))
	pick := func() int {
		total := sc.Intents[0] + sc.Intents[1] + sc.Intents[2] + sc.Intents[3]
		x := rng.Float64() * total
		for i, w := range sc.Intents {
			if x < w {
				return i
			}
			x -= w
		}
		return 3
	}
	draw := func(lo, hi float64) string {
		n := int((hi-lo)*100 + 0.5)
		return strconv.FormatFloat(lo+float64(rng.IntN(n+1))/100, 'f', 2, 64)
	}
	agent := rng.Float64() < sc.ToolsOffered
	intent := pick()
	out := make([]turnSpec, turns)
	pendingTools, hard := 0, 0
	for t := range out {
		ts := &out[t]
		ts.duration = time.Duration(2+rng.IntN(20)) * time.Second
		ts.completion = 80 + rng.IntN(500)
		if pendingTools > 0 {
			ts.toolResult = true
			ts.hasTools = true
			ts.text = out[t-1].text
			// A per-request classifier's complexity moves with the tool
			// output, within the topic's band (or the hard phase's).
			ts.complexity = draw(bands[intent][0], bands[intent][1])
			if hard > 0 {
				ts.complexity = draw(0.90, 1.00)
			}
			ts.gap = time.Duration(1+rng.IntN(5)) * time.Second
			ts.newTokens = pendingTools * (150 + rng.IntN(1500))
			if rng.Float64() < sc.ToolCall*0.6 {
				ts.issueTools = 1 + rng.IntN(2)
			}
			pendingTools = ts.issueTools
			continue
		}
		if t > 0 && rng.Float64() < sc.Drift {
			intent = pick()
		}
		if hard > 0 {
			hard--
		}
		if t > 0 && hard == 0 && rng.Float64() < sc.Hard {
			hard = 1 + rng.IntN(3)
		}
		ts.text = texts[intent][rng.IntN(4)]
		ts.hasTools = agent || intent == 2
		ts.complexity = draw(bands[intent][0], bands[intent][1])
		if hard > 0 {
			ts.complexity = draw(0.90, 1.00)
		}
		if t > 0 {
			ts.state = rng.Float64() < sc.State
			ts.opaque = !ts.state && rng.Float64() < sc.Opaque
			if rng.Float64() < sc.Idle {
				ts.gap = time.Duration(320+rng.IntN(1500)) * time.Second
			} else {
				ts.gap = time.Duration(5+rng.IntN(90)) * time.Second
			}
		}
		ts.newTokens = 30 + rng.IntN(400)
		if ts.hasTools && rng.Float64() < sc.ToolCall {
			ts.issueTools = 1 + rng.IntN(3)
		}
		pendingTools = ts.issueTools
	}
	return out
}

// Run runs the matrix. Policies run concurrently (each on its own Router);
// the result is deterministic.
func Run(p Params) *Result {
	cfg := ConfigFor(p.Lambda)
	res := &Result{Params: p, Totals: make([]Stats, len(p.Policies)), ByScenario: map[string][]Stats{}}
	per := make([][]Stats, len(p.Policies))
	var wg sync.WaitGroup
	for pi := range p.Policies {
		wg.Add(1)
		go func(pi int) {
			defer wg.Done()
			per[pi] = runPolicy(cfg, p, p.Policies[pi])
		}(pi)
	}
	wg.Wait()
	for pi, ps := range p.Policies {
		res.Totals[pi].Policy = ps.Name
		for si := range per[pi] {
			res.Totals[pi].add(&per[pi][si])
		}
		res.ByScenario[ps.Name] = per[pi]
	}
	return res
}

// demand is the quality a turn of complexity c needs: the quality_score of
// the cheapest model whose quality_score is at least c, or the best model's
// when none is. It is the same for every policy and every price
// sensitivity.
func demand(cfg *saar.Config, c float64) float64 {
	q, price, best := -1.0, 0.0, 0.0
	for i := range cfg.Models {
		m := &cfg.Models[i]
		best = max(best, m.Quality)
		if m.Quality >= c && (q < 0 || m.Pricing.Blended() < price) {
			q, price = m.Quality, m.Pricing.Blended()
		}
	}
	if q < 0 {
		return best
	}
	return q
}

func workerOf(cfg *saar.Config, model, session string) string {
	m := cfg.Model(model)
	h := fnv.New32a()
	h.Write([]byte(session))
	return m.Workers[int(h.Sum32())%len(m.Workers)]
}

func runPolicy(cfg *saar.Config, p Params, ps PolicySpec) []Stats {
	out := make([]Stats, len(p.Scenarios))
	for si, sc := range p.Scenarios {
		st := &out[si]
		st.Policy, st.Scenario = ps.Name, sc.Name
		for seed := 1; seed <= p.Seeds; seed++ {
			clock := time.Unix(1_700_000_000, 0)
			r := saar.NewRouter(cfg, saar.Options{Now: func() time.Time { return clock }, Policy: ps.Policy, RingSize: -1})
			for sess := 0; sess < p.Sessions; sess++ {
				key := fmt.Sprintf("%s-%d-%d", sc.Name, seed, sess)
				runSession(cfg, r, &clock, key, script(sc, seed, sess, p.Turns), st)
			}
			rs := r.Stats()
			st.LockBreaks += rs.LockBreaks
			st.Violations += rs.ContinuityViolations
			st.HardLocks += rs.HardLocks
		}
	}
	return out
}

func runSession(cfg *saar.Config, r *saar.Router, clock *time.Time, key string, turns []turnSpec, st *Stats) {
	var (
		prevModel, prevResp string
		prevIDs             [][]byte
		history, prefix     int // tokens
		chars               int
	)
	up := saar.Health{}
	for t := range turns {
		ts := &turns[t]
		*clock = clock.Add(ts.gap)
		history += ts.newTokens
		chars = history * 4
		turn := saar.Turn{
			Logical:        []byte("auto"),
			Session:        []byte(key),
			LatestUserText: []byte(ts.text),
			HistoryChars:   chars,
			HasTools:       ts.hasTools,
		}
		if ts.effort != "" {
			turn.ReasoningEffort = []byte(ts.effort)
		}
		needQ := -1.0
		if ts.complexity != "" {
			v := []byte(ts.complexity)
			turn.Header = func(name string) []byte {
				if name == saar.ComplexityHeader {
					return v
				}
				return nil
			}
			c, _ := strconv.ParseFloat(ts.complexity, 64)
			needQ = demand(cfg, c)
		}
		if ts.toolResult {
			turn.ToolResultIDs = prevIDs
		}
		if ts.state && prevResp != "" {
			turn.PreviousResponseID = []byte(prevResp)
		}
		turn.OpaqueReasoning = ts.opaque
		sel := r.Select(&turn, up)
		model := sel.Model
		worker := sel.PinnedWorker
		if worker == "" {
			worker = workerOf(cfg, model, key)
		}

		// Accounting, the same cache model for every policy: the prefix
		// carried from the previous turn is billed at the cached input
		// price when the same model serves this turn, full price otherwise.
		m := cfg.Model(model)
		cached := 0
		if model == prevModel {
			cached = prefix
		}
		st.Turns++
		st.QualitySum += m.Quality
		if needQ >= 0 {
			st.Shortfall += max(0, needQ-m.Quality)
		}
		st.Cost += (float64(cached)*m.Pricing.CachedInputPer1M + float64(history-cached)*m.Pricing.PromptPer1M +
			float64(ts.completion)*m.Pricing.CompletionPer1M) / 1e6
		st.CachedTokens += int64(cached)
		st.PromptTokens += int64(history)
		switch sel.Action {
		case saar.ActionResetIdle:
			st.ResetsIdle++
		case saar.ActionResetDrift:
			st.ResetsDrift++
		case saar.ActionFirst:
			st.FirstSelections++
		}
		if prevModel != "" && model != prevModel {
			st.Switches++
			if sel.Action == saar.ActionSwitch {
				st.EconomicSwitch++
			}
			switch pq := cfg.Model(prevModel).Quality; {
			case m.Quality > pq:
				st.Upgrades++
			case m.Quality < pq:
				st.Downgrades++
			}
			switch {
			case ts.toolResult:
				st.UnsafeTool++
			case ts.state || ts.opaque:
				st.UnsafeState++
			}
		}

		// The simulated backend of the serving model: usage, tool calls,
		// a response id.
		*clock = clock.Add(ts.duration)
		prevIDs = prevIDs[:0:0]
		for k := 0; k < ts.issueTools; k++ {
			prevIDs = append(prevIDs, []byte(fmt.Sprintf("call_%s_%s_%d_%d", model, key, t, k)))
		}
		prevResp = fmt.Sprintf("resp_%s_%s_%d", model, key, t)
		r.Observe([]byte(key), model, worker, saar.Observed{
			ResponseID:       []byte(prevResp),
			ToolCallIDs:      prevIDs,
			PromptTokens:     history,
			CachedTokens:     cached,
			CompletionTokens: ts.completion,
			Lock:             sel.LockModel,
			Logical:          turn.Logical,
		})
		history += ts.completion
		prefix = history
		prevModel = model
	}
	*clock = clock.Add(time.Second)
}

// Baseline returns the reference total: single-turn-v1 (version 1's
// selector per turn, without memory), else the first policy.
func (r *Result) Baseline() *Stats {
	for i := range r.Totals {
		if r.Totals[i].Policy == "single-turn-v1" {
			return &r.Totals[i]
		}
	}
	return &r.Totals[0]
}

// Total returns a policy's total, or nil.
func (r *Result) Total(policy string) *Stats {
	for i := range r.Totals {
		if r.Totals[i].Policy == policy {
			return &r.Totals[i]
		}
	}
	return nil
}

// scenarioNames returns the scenario names in order.
func (r *Result) scenarioNames() []string {
	out := make([]string, len(r.Params.Scenarios))
	for i, s := range r.Params.Scenarios {
		out[i] = s.Name
	}
	return out
}
