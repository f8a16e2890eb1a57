package saar

import (
	"math"
	"strings"

	"github.com/warmroute/warmroute/sessionshard"
)

// Mode is the model-step policy.
type Mode uint8

const (
	// ModeSAAR is the full session-aware policy (default).
	ModeSAAR Mode = iota
	// ModeSingleTurn is the base selector alone: every turn chosen on its
	// own signals, no locks, no resets, no economics.
	ModeSingleTurn
	// ModeSticky keeps the first choice of a session forever (it breaks
	// only when that model is down).
	ModeSticky
)

var modeNames = [...]string{"saar", "single_turn", "sticky"}

func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "unknown"
}

// MarshalText encodes the mode by name.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText decodes a mode name.
func (m *Mode) UnmarshalText(b []byte) error {
	for i, n := range modeNames {
		if n == string(b) {
			*m = Mode(i)
			return nil
		}
	}
	*m = ModeSAAR
	return nil
}

// PolicyVersion is the policy version a Router uses unless Options.Policy
// names another (docs/design.md §5):
//
//	1  score selector c·quality − (1−c)·normalized_price; a challenger must
//	   beat the stay score by fixed score points (stay_bias, switch_margin,
//	   handoff_penalty) plus a cache value.
//	2  demand-calibrated selector (complexity c needs quality_score ≥ c; the
//	   cheapest candidate that meets it, price_sensitivity trading quality
//	   for price) and switch economics in money (see decideV2).
//	3  (default) version 2 with this turn priced on the candidate's warm
//	   cache (utilityV3: the history the current model holds at its cached
//	   price, the rest at list price), following turns valued over the
//	   session's demand spread (followU), and a slower demand average; the
//	   re-prefill is in the turn's price, not charged again to the switch.
//
// A record replays under the version that made it; a record without a
// version was made by version 1.
const PolicyVersion = 3

// Policy is the policy version, the mode and the ablation flags of the
// policy matrix. It is recorded with every replay record, so a record
// replays under the policy that produced it.
type Policy struct {
	Version        uint8 `json:"version"` // 0 reads as 1 (records made before versions)
	Mode           Mode  `json:"mode"`
	NoToolLock     bool  `json:"no_tool_lock,omitempty"`
	NoProviderLock bool  `json:"no_provider_lock,omitempty"`
	NoDriftReset   bool  `json:"no_drift_reset,omitempty"`
	NoIdleReset    bool  `json:"no_idle_reset,omitempty"`
	NoEconomics    bool  `json:"no_economics,omitempty"` // v1: no prefix-cache value, no handoff penalty; v2: switches cost nothing
}

// V returns the effective policy version: 1 for 0 (records made before
// versions), PolicyVersion for versions this build does not know.
func (p Policy) V() int {
	switch {
	case p.Version <= 1:
		return 1
	case p.Version > PolicyVersion:
		return PolicyVersion
	}
	return int(p.Version)
}

// Phases.
const (
	PhaseUserTurn      = "user_turn"
	PhaseToolLoop      = "tool_loop"
	PhaseProviderState = "provider_state"
)

// Actions.
const (
	ActionFirst      = "first"
	ActionStay       = "stay"
	ActionSwitch     = "switch"
	ActionHardLock   = "hard_lock"
	ActionResetIdle  = "reset_idle"
	ActionResetDrift = "reset_drift"
	ActionLockBroken = "lock_broken"
)

var actions = [...]string{ActionFirst, ActionStay, ActionSwitch, ActionHardLock, ActionResetIdle, ActionResetDrift, ActionLockBroken}

// Lock kinds.
const (
	LockToolLoop      = "tool_loop"
	LockProviderState = "provider_state"
)

// Reasons (constant strings: the numbers behind them are in the record's
// scores).
const (
	ReasonBase              = "base"                            // first turn / single-turn: the base selector's choice
	ReasonNoHealthy         = "no_healthy_candidate"            // every candidate is down: the first candidate
	ReasonToolLoop          = "tool_loop"                       // tool results return to the model that issued the ids
	ReasonToolLoopConflict  = "tool_loop:conflict"              // the ids belong to two models: the session's last model if it is one of them, else the last id's
	ReasonToolLoopFallback  = "tool_loop:structural"            // ids unknown: the session's last model
	ReasonProviderState     = "provider_state"                  // previous_response_id: its model and worker
	ReasonProviderFallback  = "provider_state:structural"       // response id unknown: the session's last model and worker
	ReasonOpaqueReasoning   = "provider_state:opaque_reasoning" // encrypted/signed reasoning: the artifact's model and worker, else the session's last
	ReasonWorkerFailover    = "provider_state:worker_failover"  // pinned worker down, model kept, state lost
	ReasonToolLockBroken    = "tool_loop:lock_broken:model_down"
	ReasonStateLockBroken   = "provider_state:lock_broken:model_down"
	ReasonIdle              = "idle_timeout"
	ReasonDrift             = "decision_drift"
	ReasonEconomics         = "economics"      // challenger beat the stay score
	ReasonStayEconomics     = "stay:economics" // challenger did not beat it
	ReasonStayBest          = "stay:best"      // the current model is the best candidate
	ReasonMinTurns          = "stay:min_turns_before_switch"
	ReasonCurrentDown       = "current_model_down"
	ReasonSticky            = "sticky"
	ReasonToolLoopNoOwner   = "tool_loop:owner_unknown"
	ReasonProviderNoOwner   = "provider_state:owner_unknown"
	ReasonSingleTurn        = "single_turn"
	ReasonNoDecision        = "no_decision_matched"
	reasonConflictSuffix    = ":conflict"
	lockSourceIndex         = "index"
	lockSourceSession       = "session"
	lockSourceStructural    = "structural"
	lockSourceOpaque        = "opaque"
	economicsWarmthWeight   = 4096 // tokens of pseudo-evidence behind cache_warmth_prior
	historyTokensComplexity = 32000
)

// Reasons of a turn whose lock owner the shared store could not be asked
// for (docs/design.md §8.3): the owner may be known to another replica
// only, so the turn says so explicitly (counted in
// vllm_router_saar_lock_unreachable_total).
const (
	ReasonToolLoopFallbackDown = "tool_loop:structural:redis_down"      // ids unknown here, Redis down: the session's last model
	ReasonProviderFallbackDown = "provider_state:structural:redis_down" // response id unknown here, Redis down: last model and worker
	ReasonToolLoopNoOwnerDown  = "tool_loop:owner_unknown:redis_down"   // ids and session unknown here, Redis down: chosen freely
	ReasonProviderNoOwnerDown  = "provider_state:owner_unknown:redis_down"
	ReasonOpaqueReasoningDown  = "provider_state:opaque_reasoning:redis_down" // artifact unknown here, Redis down: last model and worker
	reasonRedisDown            = ":redis_down"
)

// Version-2 and version-3 constants of the session's demand and the
// look-ahead (docs/design.md §5).
const (
	economicsFollowTurns = 2    // turns after this one a choice is expected to serve
	demandEWMAv2         = 0.5  // v2: weight of this turn's complexity in the session's demand
	demandEWMAv3         = 0.3  // v3: the same, slower (a one-turn dip moves the demand less)
	demandPriorSD        = 0.25 // v3: the demand's spread assumed at a session's first turn and at resets
	completionEstimate   = 300  // v3: completion tokens assumed for a turn's price
)

// HeaderValue is a recorded request header.
type HeaderValue struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Inputs are everything the decision function reads besides the session
// memory, the config and the clock. Select builds them from a Turn, the
// indexes and the health callbacks; a replay record stores them.
type Inputs struct {
	Logical            string        `json:"logical"`
	Text               string        `json:"text,omitempty"` // latest user text (capped, see TextTruncated)
	TextTruncated      bool          `json:"text_truncated,omitempty"`
	HistoryChars       int           `json:"history_chars,omitempty"`
	HistoryTokens      int           `json:"history_tokens,omitempty"` // docs/design.md §5: last prompt+completion tokens + new chars/4, else chars/4
	HasTools           bool          `json:"has_tools,omitempty"`
	ToolResults        int           `json:"tool_results,omitempty"`   // number of tool results in the turn
	ToolResultID       string        `json:"tool_result_id,omitempty"` // the first one, for audit
	ToolOwner          string        `json:"tool_owner,omitempty"`     // model that issued the ids ("" unknown)
	ToolOwnerSource    string        `json:"tool_owner_source,omitempty"`
	ToolOwnerConflict  string        `json:"tool_owner_conflict,omitempty"` // another model owning some of the ids ("" none)
	PreviousResponseID string        `json:"previous_response_id,omitempty"`
	StateModel         string        `json:"state_model,omitempty"` // model and worker that created previous_response_id
	StateWorker        string        `json:"state_worker,omitempty"`
	StateSource        string        `json:"state_source,omitempty"`
	OpaqueReasoning    bool          `json:"opaque_reasoning,omitempty"`
	ReasoningID        string        `json:"reasoning_id,omitempty"`    // the last opaque artifact's id (hex)
	ReasoningModel     string        `json:"reasoning_model,omitempty"` // model and worker that produced it, when no previous_response_id owner is known
	ReasoningWorker    string        `json:"reasoning_worker,omitempty"`
	ReasoningSource    string        `json:"reasoning_source,omitempty"`
	ReasoningEffort    string        `json:"reasoning_effort,omitempty"`
	Headers            []HeaderValue `json:"headers,omitempty"`
	ModelsDown         []string      `json:"models_down,omitempty"`  // physical models with no healthy worker
	WorkersDown        []string      `json:"workers_down,omitempty"` // pinned workers found down

	// The shared store could not be asked for the owner of an id unknown
	// here (docs/design.md §8.3): the turn takes a redis_down reason.
	ToolOwnerUnreachable      bool `json:"tool_owner_unreachable,omitempty"`
	StateOwnerUnreachable     bool `json:"state_owner_unreachable,omitempty"`
	ReasoningOwnerUnreachable bool `json:"reasoning_owner_unreachable,omitempty"`
}

func (in *Inputs) header(name string) string {
	for i := range in.Headers {
		if strings.EqualFold(in.Headers[i].Name, name) {
			return in.Headers[i].Value
		}
	}
	return ""
}

func (in *Inputs) modelDown(m string) bool {
	for _, d := range in.ModelsDown {
		if d == m {
			return true
		}
	}
	return false
}

func (in *Inputs) workerDown(w string) bool {
	for _, d := range in.WorkersDown {
		if d == w {
			return true
		}
	}
	return false
}

// Score is one model's line in a decision: the base score and every bonus
// or penalty. Policy version 1: Final = Base + StayBias + CacheValue for
// the current model, Base − Margin − Handoff for a challenger. Version 2:
// Base is the selector utility min(quality, demand) − price_sensitivity ·
// NormPrice; a challenger's Final = Gain − Hurdle (quality points; the
// money behind the hurdle in the *USD fields), the current model's 0.
type Score struct {
	Model      string  `json:"model"`
	Candidate  bool    `json:"candidate"` // among the matched decision's candidates
	Current    bool    `json:"current,omitempty"`
	Down       bool    `json:"down,omitempty"`
	Quality    float64 `json:"quality"`
	NormPrice  float64 `json:"norm_price"`
	Base       float64 `json:"base"`
	StayBias   float64 `json:"stay_bias,omitempty"`
	CacheValue float64 `json:"cache_value,omitempty"`
	Margin     float64 `json:"margin,omitempty"`
	Handoff    float64 `json:"handoff,omitempty"`

	// Version 2 (challengers only).
	Gain         float64 `json:"gain,omitempty"`          // quality points: this turn + following turns
	ReprefillUSD float64 `json:"reprefill_usd,omitempty"` // warm history prefilled again on this model
	LostCacheUSD float64 `json:"lost_cache_usd,omitempty"`
	HandoffUSD   float64 `json:"handoff_usd,omitempty"`
	StayUSD      float64 `json:"stay_usd,omitempty"`
	Hurdle       float64 `json:"hurdle,omitempty"` // (1+switch_margin)·κ·Σ USD, quality points

	Final float64 `json:"final"`
}

// Outcome is the result of the decision function.
type Outcome struct {
	Model            string  `json:"model"`
	Decision         string  `json:"decision"`
	Phase            string  `json:"phase"`
	Action           string  `json:"action"`
	Reason           string  `json:"reason"`
	PinnedWorker     string  `json:"pinned_worker,omitempty"`
	LockKind         string  `json:"lock_kind,omitempty"`  // kind of the hard lock (or of the broken lock)
	LockModel        string  `json:"lock_model,omitempty"` // model of the hard lock ("" none)
	Failover         bool    `json:"failover,omitempty"`   // pinned worker released (provider state lost)
	Conflict         bool    `json:"conflict,omitempty"`   // tool results of two models (ReasonToolLoopConflict)
	Complexity       float64 `json:"complexity"`
	ComplexitySource string  `json:"complexity_source"`
	Demand           float64 `json:"demand,omitempty"`     // v2: the session's demand after this turn (EWMA of complexity)
	DemandVar        float64 `json:"demand_var,omitempty"` // v2: its exponentially weighted variance
	Scores           []Score `json:"scores,omitempty"`
}

// Decide is the pure decision function of the model step: the same config,
// policy, inputs, memory snapshot (nil: no memory) and time (unix ns)
// always give the same outcome. Select and Replay both call it.
func Decide(cfg *Config, pol Policy, in *Inputs, mem *sessionshard.MemoryState, now int64) Outcome {
	var out Outcome
	lg := cfg.logicalByName(in.Logical)
	if lg == nil {
		out.Action, out.Reason = ActionFirst, ReasonNoDecision
		return out
	}
	ls := &lg.Session
	v2 := pol.V() >= 2
	v3 := pol.V() >= 3
	ewma, priorVar := demandEWMAv2, 0.0
	if v3 {
		ewma, priorVar = demandEWMAv3, demandPriorSD*demandPriorSD
	}
	hasMem := mem != nil && mem.Model != ""

	// Phase: what the turn is, whatever the policy does with it.
	switch {
	case in.ToolResults > 0:
		out.Phase = PhaseToolLoop
	case in.PreviousResponseID != "" || in.OpaqueReasoning:
		out.Phase = PhaseProviderState
	default:
		out.Phase = PhaseUserTurn
	}

	// Base selector: intent, complexity, candidate scores.
	di := matchDecision(lg, in)
	if di < 0 {
		di = len(lg.Decisions) - 1 // no decision matched: the last one, as a default
	}
	d := &lg.Decisions[di]
	out.Decision = d.Name
	c, src := complexity(in)
	out.Complexity, out.ComplexitySource = c, src
	if v2 {
		out.Demand, out.DemandVar = c, priorVar
		if hasMem {
			dev := c - mem.Demand
			out.Demand = mem.Demand + ewma*dev
			out.DemandVar = (1 - ewma) * (mem.DemandVar + ewma*dev*dev)
		}
	}
	cur := ""
	if hasMem {
		cur = mem.Model
	}
	out.Scores = make([]Score, 0, len(d.cand)+1)
	best := -1
	h, warmH := float64(max(in.HistoryTokens, 0)), 0.0
	if hasMem {
		warmH = h * warmth(ls, mem)
	}
	score := func(m *Model) Score {
		switch {
		case v3 && m.Name == cur:
			return utilityV3(cfg, ls, m, c, h, warmH)
		case v3:
			return utilityV3(cfg, ls, m, c, h, 0)
		case v2:
			return utility(cfg, ls, m, c)
		}
		return baseScore(cfg, m, c)
	}
	for _, mi := range d.cand {
		m := &cfg.Models[mi]
		s := score(m)
		s.Candidate = true
		s.Down = in.modelDown(m.Name)
		s.Current = m.Name == cur
		out.Scores = append(out.Scores, s)
		if !s.Down && (best < 0 || better(&s, &out.Scores[best], v2)) {
			best = len(out.Scores) - 1
		}
	}
	bestReason := ReasonBase
	if best < 0 {
		best, bestReason = 0, ReasonNoHealthy
	}
	bestModel := out.Scores[best].Model

	// ahead (v3) is the choice where the session is free to choose (first
	// turn, resets): the candidate of the highest U(this turn) +
	// F · Ū(following turns), the following turns at the session's demand
	// and warm on the chosen model (followU); earlier versions take the
	// base selector's best.
	ahead := func() string {
		if !v3 {
			return bestModel
		}
		sd := math.Sqrt(max(out.DemandVar, 0))
		bi, bv := -1, 0.0
		for i := range out.Scores {
			s := &out.Scores[i]
			if s.Down || !s.Candidate {
				continue
			}
			v := s.Base + economicsFollowTurns*followU(out.Scores, s, out.Demand, sd, ls.PriceSensitivity, warmNormPrice(cfg, ls, cfg.Model(s.Model), h))
			if bi < 0 || v > bv+1e-12 || (v >= bv-1e-12 && s.NormPrice < out.Scores[bi].NormPrice) {
				bi, bv = i, v
			}
		}
		if bi < 0 {
			return bestModel
		}
		return out.Scores[bi].Model
	}
	choose := func(model, action, reason string) Outcome {
		out.Model, out.Action, out.Reason = model, action, reason
		return out
	}

	if pol.Mode == ModeSingleTurn {
		switch {
		case !hasMem:
			return choose(bestModel, ActionFirst, bestReason)
		case bestModel == cur:
			return choose(bestModel, ActionStay, ReasonSingleTurn)
		default:
			return choose(bestModel, ActionSwitch, ReasonSingleTurn)
		}
	}

	// 1. Hard locks, before everything else, whether or not the locked
	// model is among the decision's candidates.
	lockModel, lockKind, lockReason, pinned := "", "", "", ""
	if in.ToolResults > 0 && !pol.NoToolLock {
		switch {
		case in.ToolOwner != "" && in.ToolOwnerConflict != "":
			// Tool results of two models: the author of the latest assistant
			// message (the session's last model) when it is one of them.
			lockModel, lockReason, out.Conflict = in.ToolOwner, ReasonToolLoopConflict, true
			if hasMem && mem.Model == in.ToolOwnerConflict {
				lockModel = mem.Model
			}
		case in.ToolOwner != "":
			lockModel, lockReason = in.ToolOwner, ReasonToolLoop
		case hasMem:
			lockModel, lockReason = mem.Model, ReasonToolLoopFallback
			if in.ToolOwnerUnreachable {
				lockReason = ReasonToolLoopFallbackDown
			}
		}
		if lockModel != "" {
			lockKind = LockToolLoop
		}
	}
	if (in.PreviousResponseID != "" || in.OpaqueReasoning) && !pol.NoProviderLock {
		m, w, r := "", "", ""
		switch {
		case in.PreviousResponseID != "" && in.StateModel != "":
			m, w, r = in.StateModel, in.StateWorker, ReasonProviderState
		case in.ReasoningModel != "":
			m, w, r = in.ReasoningModel, in.ReasoningWorker, ReasonOpaqueReasoning
		case hasMem && in.PreviousResponseID != "":
			m, w, r = mem.Model, mem.Worker, ReasonProviderFallback
			if in.StateOwnerUnreachable || in.ReasoningOwnerUnreachable {
				r = ReasonProviderFallbackDown
			}
		case hasMem:
			m, w, r = mem.Model, mem.Worker, ReasonOpaqueReasoning
			if in.ReasoningOwnerUnreachable {
				r = ReasonOpaqueReasoningDown
			}
		}
		if m != "" {
			if lockModel != "" && lockModel != m {
				r += reasonConflictSuffix // provider state wins: the backend holds the state
			}
			lockModel, lockKind, lockReason, pinned = m, LockProviderState, r, w
		}
	}
	if lockModel != "" {
		out.LockKind = lockKind
		if in.modelDown(lockModel) || cfg.Model(lockModel) == nil {
			r := ReasonToolLockBroken
			if lockKind == LockProviderState {
				r = ReasonStateLockBroken
			}
			return choose(bestModel, ActionLockBroken, r)
		}
		out.LockModel = lockModel
		if pinned != "" && in.workerDown(pinned) {
			pinned, lockReason, out.Failover = "", ReasonWorkerFailover, true
		}
		out.PinnedWorker = pinned
		return choose(lockModel, ActionHardLock, lockReason)
	}

	if !hasMem {
		switch out.Phase {
		case PhaseToolLoop:
			if !pol.NoToolLock {
				bestReason = ReasonToolLoopNoOwner
				if in.ToolOwnerUnreachable {
					bestReason = ReasonToolLoopNoOwnerDown
				}
			}
		case PhaseProviderState:
			if !pol.NoProviderLock {
				bestReason = ReasonProviderNoOwner
				if in.StateOwnerUnreachable || in.ReasoningOwnerUnreachable {
					bestReason = ReasonProviderNoOwnerDown
				}
			}
		}
		return choose(ahead(), ActionFirst, bestReason)
	}
	if in.modelDown(cur) {
		return choose(bestModel, ActionSwitch, ReasonCurrentDown)
	}
	if pol.Mode == ModeSticky {
		return choose(cur, ActionStay, ReasonSticky)
	}

	// 2. Reset boundaries: reselect freely.
	if !pol.NoIdleReset {
		// Idle since the session's last activity: the end of its previous
		// response, or a later turn still in flight (or failed).
		end := max(mem.LastEnd, mem.LastAccess)
		if float64(now-end) > ls.IdleTimeoutSeconds*1e9 {
			if v2 {
				out.Demand, out.DemandVar = c, priorVar
			}
			return choose(ahead(), ActionResetIdle, ReasonIdle)
		}
	}
	if !pol.NoDriftReset && mem.Decision != "" && mem.Decision != d.Name {
		if v2 {
			out.Demand, out.DemandVar = c, priorVar
		}
		return choose(ahead(), ActionResetDrift, ReasonDrift)
	}

	// 3. Switch economics.
	ci := -1
	for i := range out.Scores {
		if out.Scores[i].Current {
			ci = i
		}
	}
	if ci < 0 { // the current model is not a candidate (a lock took it there): it may stay all the same
		m := cfg.Model(cur)
		if m == nil {
			return choose(bestModel, ActionSwitch, ReasonCurrentDown)
		}
		s := score(m)
		s.Current = true
		out.Scores = append(out.Scores, s)
		ci = len(out.Scores) - 1
	}
	if v2 {
		to := decideV2(cfg, ls, pol, in, mem, &out, ci)
		switch {
		case to < 0 && bestModel == cur:
			return choose(cur, ActionStay, ReasonStayBest)
		case to < 0:
			return choose(cur, ActionStay, ReasonStayEconomics)
		case mem.TurnsOnModel < ls.MinTurnsBeforeSwitch:
			return choose(cur, ActionStay, ReasonMinTurns)
		}
		return choose(out.Scores[to].Model, ActionSwitch, ReasonEconomics)
	}

	// Version 1: the current model earns stay_bias and the prefix-cache
	// value; a challenger pays switch_margin and the handoff penalty.
	cs := &out.Scores[ci]
	cs.StayBias = ls.StayBias
	if !pol.NoEconomics {
		cs.CacheValue = cacheValue(cfg, ls, cfg.Model(cur), in.HistoryTokens, mem)
	}
	cs.Final = cs.Base + cs.StayBias + cs.CacheValue
	for i := range out.Scores {
		if i == ci {
			continue
		}
		s := &out.Scores[i]
		s.Margin = ls.SwitchMargin
		if !pol.NoEconomics {
			s.Handoff = ls.HandoffPenalty
		}
		s.Final = s.Base - s.Margin - s.Handoff
	}
	if bestModel == cur {
		return choose(cur, ActionStay, ReasonStayBest)
	}
	if out.Scores[best].Down || out.Scores[best].Final <= cs.Final {
		return choose(cur, ActionStay, ReasonStayEconomics)
	}
	if mem.TurnsOnModel < ls.MinTurnsBeforeSwitch {
		return choose(cur, ActionStay, ReasonMinTurns)
	}
	return choose(bestModel, ActionSwitch, ReasonEconomics)
}

// better orders candidates for the base selector: v1 the higher base score;
// v2 the higher utility, then the lower price (the cheapest candidate that
// meets the demand), then the first listed.
func better(s, b *Score, v2 bool) bool {
	if !v2 {
		return s.Base > b.Base
	}
	const eps = 1e-12
	return s.Base > b.Base+eps || (s.Base >= b.Base-eps && s.NormPrice < b.NormPrice)
}

// baseScore (v1): score = c·quality − (1−c)·normalized_price, where
// normalized_price = blended price / the highest blended price of the
// config's physical models (blended = (3·prompt + completion)/4 per 1M).
func baseScore(cfg *Config, m *Model, c float64) Score {
	np := normPrice(cfg, m)
	b := c*m.Quality - (1-c)*np
	return Score{Model: m.Name, Quality: m.Quality, NormPrice: np, Base: b, Final: b}
}

func normPrice(cfg *Config, m *Model) float64 {
	if cfg.maxBlend > 0 {
		return m.Pricing.Blended() / cfg.maxBlend
	}
	return 0
}

// utility (v2) is the demand-calibrated selector: a turn of complexity c
// needs quality_score ≥ c (its demand), quality beyond the demand is worth
// nothing, and price costs price_sensitivity per unit of normalized
// blended price:
//
//	U(m, c) = min(quality_m, c) − price_sensitivity · normalized_price_m
//
// The best candidate maximizes U, ties going to the cheaper: with
// price_sensitivity → 0 that is the cheapest candidate meeting the demand
// (the best one when none does); a larger price_sensitivity accepts a
// shortfall of up to price_sensitivity · Δnormalized_price to pay less.
func utility(cfg *Config, ls *SessionSettings, m *Model, c float64) Score {
	np := normPrice(cfg, m)
	u := min(m.Quality, c) - ls.PriceSensitivity*np
	return Score{Model: m.Name, Quality: m.Quality, NormPrice: np, Base: u, Final: u}
}

// utilityV3 is the v3 selector: the utility of v2 with the price of this
// very turn instead of the list blended price — the history the candidate
// holds warm (warmH tokens, the current model only) at its cached price, the
// rest of the history h at its prompt price, completionEstimate tokens at
// its completion price — normalized so that a reference turn
// (economics_ref_tokens at the highest blended price) costs 1:
//
//	U(m, c) = min(quality_m, c) − price_sensitivity · turn_usd_m / ref_usd
//
// Staying warm is cheaper by the re-prefill a switch pays, so v3's
// switch hurdle no longer counts it; a long history makes a dear model
// dearer, so the expensive model goes where it costs least per turn.
func utilityV3(cfg *Config, ls *SessionSettings, m *Model, c, h, warmH float64) Score {
	usd := (warmH*m.Pricing.CachedInputPer1M + (h-warmH)*m.Pricing.PromptPer1M + completionEstimate*m.Pricing.CompletionPer1M) / 1e6
	np := usd / refUSD(cfg, ls)
	u := min(m.Quality, c) - ls.PriceSensitivity*np
	return Score{Model: m.Name, Quality: m.Quality, NormPrice: np, Base: u, Final: u}
}

// warmNormPrice (v3) is the normalized price of a following turn on m, the
// history h warm: h at the cached price, completionEstimate at the
// completion price.
func warmNormPrice(cfg *Config, ls *SessionSettings, m *Model, h float64) float64 {
	if m == nil {
		return 0
	}
	return (h*m.Pricing.CachedInputPer1M + completionEstimate*m.Pricing.CompletionPer1M) / 1e6 / refUSD(cfg, ls)
}

// refUSD is the price of a reference turn: economics_ref_tokens at the
// config's highest blended price (1 when undefined).
func refUSD(cfg *Config, ls *SessionSettings) float64 {
	if r := cfg.maxBlend * ls.EconomicsRefTokens / 1e6; r > 0 {
		return r
	}
	return 1
}

// kappa is the exchange rate of version 2, quality points per dollar:
// the selector charges price_sensitivity points for one reference turn
// (economics_ref_tokens tokens) at the config's highest blended price, so
//
//	κ = price_sensitivity · 1e6 / (max_blended_per_1m · economics_ref_tokens)
func kappa(cfg *Config, ls *SessionSettings) float64 {
	if cfg.maxBlend <= 0 || ls.EconomicsRefTokens <= 0 {
		return 0
	}
	return ls.PriceSensitivity * 1e6 / (cfg.maxBlend * ls.EconomicsRefTokens)
}

// decideV2 prices every switch away from the current model (index ci of
// out.Scores) in money and weighs it against the quality it buys; it
// returns the index of the challenger to switch to, or -1 to stay. With H
// the warm history in tokens, w the observed cache warmth of the current
// model, R = economics_ref_tokens, prices per token:
//
//	cost_usd(m) = H·(prompt_m − cached_m)                        re-prefill of the warm history on m
//	            + prefix_cache_weight · w · H·(prompt_cur − cached_cur)   warm cache lost on cur
//	            + handoff_penalty · H · prompt_m                  handoff overhead (schemas, template) as a share of the history
//	            + stay_bias · H · blended_cur                     continuity of staying, a share of the session's investment
//	gain(m)     = ΔU(c) + max(F·(ΔU(d−σ) + ΔU(d+σ))/2, −κ·back_usd)
//	ΔU(x)       = U(m, x) − U(cur, x);  F = 2 following turns
//	d, σ²       = the session's demand: exponentially weighted mean and variance of c (weight ½ on this turn)
//	back_usd    = H·(prompt_cur − cached_cur) + handoff_penalty · H · prompt_cur   (returning if they do not need m)
//	switch to the m with the largest gain(m) − (1+switch_margin)·κ·cost_usd(m) > 0
//
// Every cost term is proportional to H, so the hurdle grows linearly with
// the warm history and vanishes with it: whatever the keys' values, no class
// of switch is impossible — any quality gain (or price saving) moves a
// short enough session. Policy.NoEconomics sets
// cost_usd and back_usd to 0.
func decideV2(cfg *Config, ls *SessionSettings, pol Policy, in *Inputs, mem *sessionshard.MemoryState, out *Outcome, ci int) int {
	cs := &out.Scores[ci]
	cs.Final = 0
	curM := cfg.Model(cs.Model)
	k := kappa(cfg, ls)
	h := float64(max(in.HistoryTokens, 0))
	// The following turns' demand, as two points d ± σ: U is concave in
	// the demand, so its mean alone would overvalue a cheaper model.
	sd := math.Sqrt(max(out.DemandVar, 0))
	dLo, dHi := clamp01(out.Demand-sd), clamp01(out.Demand+sd)
	v3 := pol.V() >= 3
	follow := func(s *Score) float64 {
		if v3 {
			return followU(out.Scores, s, out.Demand, sd, ls.PriceSensitivity, warmNormPrice(cfg, ls, cfg.Model(s.Model), h))
		}
		return (min(s.Quality, dLo)+min(s.Quality, dHi))/2 - ls.PriceSensitivity*s.NormPrice
	}
	ucurD := follow(cs)
	var lost, stay, back float64
	if !pol.NoEconomics && curM != nil {
		cp := curM.Pricing
		lost = ls.PrefixCacheWeight * warmth(ls, mem) * h * (cp.PromptPer1M - cp.CachedInputPer1M) / 1e6
		stay = ls.StayBias * h * cp.Blended() / 1e6
		back = h * (cp.PromptPer1M - cp.CachedInputPer1M + ls.HandoffPenalty*cp.PromptPer1M) / 1e6
	}
	to := -1
	for i := range out.Scores {
		if i == ci {
			continue
		}
		s := &out.Scores[i]
		m := cfg.Model(s.Model)
		if !pol.NoEconomics && m != nil {
			if !v3 { // v3: the re-prefill is in this turn's price (utilityV3)
				s.ReprefillUSD = h * (m.Pricing.PromptPer1M - m.Pricing.CachedInputPer1M) / 1e6
			}
			s.HandoffUSD = ls.HandoffPenalty * h * m.Pricing.PromptPer1M / 1e6
			s.LostCacheUSD, s.StayUSD = lost, stay
		}
		cost := s.ReprefillUSD + s.LostCacheUSD + s.HandoffUSD + s.StayUSD
		ud := follow(s)
		s.Gain = (s.Base - cs.Base) + max(economicsFollowTurns*(ud-ucurD), -k*back)
		s.Hurdle = (1 + ls.SwitchMargin) * k * cost
		s.Final = s.Gain - s.Hurdle
		if !s.Down && s.Candidate && s.Final > 0 && (to < 0 || s.Final > out.Scores[to].Final) {
			to = i
		}
	}
	return to
}

// warmth is the observed share of the current model's prompt tokens that
// were cached, with cache_warmth_prior as 4096 tokens of pseudo-evidence.
func warmth(ls *SessionSettings, mem *sessionshard.MemoryState) float64 {
	return clamp01((float64(mem.CachedTokensSeen) + ls.CacheWarmthPrior*economicsWarmthWeight) /
		(float64(mem.PromptTokensSeen) + economicsWarmthWeight))
}

// cacheValue (v1) is the prefix-cache value of staying on model m, in score
// units:
//
//	value_usd = history_tokens · (prompt_per_1m − cached_input_per_1m) / 1e6 · warmth
//	warmth    = (cached_seen + prior·4096) / (prompt_seen + 4096)   (observed, with a prior)
//	value     = prefix_cache_weight · value_usd / ref_usd
//	ref_usd   = economics_ref_tokens · max prompt_per_1m of the config / 1e6
//
// i.e. the dollars a cache checkout would throw away, measured in "one
// reference prompt at the fleet's highest input price". It is linear in
// history tokens, so a longer session is never easier to move.
func cacheValue(cfg *Config, ls *SessionSettings, m *Model, historyTokens int, mem *sessionshard.MemoryState) float64 {
	if m == nil || cfg.maxPrompt <= 0 || ls.EconomicsRefTokens <= 0 || historyTokens <= 0 {
		return 0
	}
	delta := m.Pricing.PromptPer1M - m.Pricing.CachedInputPer1M
	if delta <= 0 {
		return 0
	}
	return ls.PrefixCacheWeight * float64(historyTokens) * delta * warmth(ls, mem) / (ls.EconomicsRefTokens * cfg.maxPrompt)
}

// followZ are the standard normal quantiles at (k+½)/8, k = 0..7: eight
// equally likely following turns.
var followZ = [8]float64{-1.5341, -0.8871, -0.4888, -0.1573, 0.1573, 0.4888, 0.8871, 1.5341}

// needQ is the quality_score of the cheapest candidate whose quality is at
// least x (the best candidate's when none is).
func needQ(sc []Score, x float64) float64 {
	q, np, best := -1.0, 0.0, 0.0
	for i := range sc {
		s := &sc[i]
		if !s.Candidate {
			continue
		}
		best = max(best, s.Quality)
		if s.Quality >= x && (q < 0 || s.NormPrice < np) {
			q, np = s.Quality, s.NormPrice
		}
	}
	if q < 0 {
		return best
	}
	return q
}

// followU (v3) is the expected utility of model s on a following turn
// whose complexity x is distributed Normal(d, sd²) (clamped to [0, 1]), a
// following turn needing the quality of the cheapest candidate that meets
// x (needQ: a tool loop that follows cannot move to a better model, so
// falling short of the tier costs the whole tier), priced at np:
//
//	Ū(m) = E[min(quality_m, need(x))] − price_sensitivity · np
func followU(sc []Score, s *Score, d, sd, lambda, np float64) float64 {
	var sum float64
	for _, z := range followZ {
		x := clamp01(d + z*sd)
		sum += min(s.Quality, needQ(sc, x))
	}
	return sum/float64(len(followZ)) - lambda*np
}
