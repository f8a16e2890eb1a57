package saar

import (
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

// Policy is the mode plus the ablation flags of the policy matrix. It is
// recorded with every replay record, so a record replays under the policy
// that produced it.
type Policy struct {
	Mode           Mode `json:"mode"`
	NoToolLock     bool `json:"no_tool_lock,omitempty"`
	NoProviderLock bool `json:"no_provider_lock,omitempty"`
	NoDriftReset   bool `json:"no_drift_reset,omitempty"`
	NoIdleReset    bool `json:"no_idle_reset,omitempty"`
	NoEconomics    bool `json:"no_economics,omitempty"` // no prefix-cache value, no handoff penalty
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
	ReasonToolLoopFallback  = "tool_loop:structural"            // ids unknown: the session's last model
	ReasonProviderState     = "provider_state"                  // previous_response_id: its model and worker
	ReasonProviderFallback  = "provider_state:structural"       // response id unknown: the session's last model and worker
	ReasonOpaqueReasoning   = "provider_state:opaque_reasoning" // encrypted/signed reasoning: last model and worker
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
	PreviousResponseID string        `json:"previous_response_id,omitempty"`
	StateModel         string        `json:"state_model,omitempty"` // model and worker that created previous_response_id
	StateWorker        string        `json:"state_worker,omitempty"`
	StateSource        string        `json:"state_source,omitempty"`
	OpaqueReasoning    bool          `json:"opaque_reasoning,omitempty"`
	ReasoningEffort    string        `json:"reasoning_effort,omitempty"`
	Headers            []HeaderValue `json:"headers,omitempty"`
	ModelsDown         []string      `json:"models_down,omitempty"`  // physical models with no healthy worker
	WorkersDown        []string      `json:"workers_down,omitempty"` // pinned workers found down
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
// or penalty. Final is what is compared: the current model earns StayBias
// and CacheValue; a challenger pays Margin and Handoff.
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
	Final      float64 `json:"final"`
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
	Complexity       float64 `json:"complexity"`
	ComplexitySource string  `json:"complexity_source"`
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
	cur := ""
	if hasMem {
		cur = mem.Model
	}
	out.Scores = make([]Score, 0, len(d.cand)+1)
	best := -1
	for _, mi := range d.cand {
		m := &cfg.Models[mi]
		s := baseScore(cfg, m, c)
		s.Candidate = true
		s.Down = in.modelDown(m.Name)
		s.Current = m.Name == cur
		out.Scores = append(out.Scores, s)
		if !s.Down && (best < 0 || s.Base > out.Scores[best].Base) {
			best = len(out.Scores) - 1
		}
	}
	bestReason := ReasonBase
	if best < 0 {
		best, bestReason = 0, ReasonNoHealthy
	}
	bestModel := out.Scores[best].Model

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
		case in.ToolOwner != "":
			lockModel, lockReason = in.ToolOwner, ReasonToolLoop
		case hasMem:
			lockModel, lockReason = mem.Model, ReasonToolLoopFallback
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
		case hasMem && in.PreviousResponseID != "":
			m, w, r = mem.Model, mem.Worker, ReasonProviderFallback
		case hasMem:
			m, w, r = mem.Model, mem.Worker, ReasonOpaqueReasoning
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
			}
		case PhaseProviderState:
			if !pol.NoProviderLock {
				bestReason = ReasonProviderNoOwner
			}
		}
		return choose(bestModel, ActionFirst, bestReason)
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
			return choose(bestModel, ActionResetIdle, ReasonIdle)
		}
	}
	if !pol.NoDriftReset && mem.Decision != "" && mem.Decision != d.Name {
		return choose(bestModel, ActionResetDrift, ReasonDrift)
	}

	// 3. Switch economics: the current model earns stay_bias and the
	// prefix-cache value; a challenger pays switch_margin and the handoff
	// penalty.
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
		s := baseScore(cfg, m, c)
		s.Current = true
		out.Scores = append(out.Scores, s)
		ci = len(out.Scores) - 1
	}
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

// baseScore: score = c·quality − (1−c)·normalized_price, where
// normalized_price = blended price / the highest blended price of the
// config's physical models (blended = (3·prompt + completion)/4 per 1M).
func baseScore(cfg *Config, m *Model, c float64) Score {
	np := 0.0
	if cfg.maxBlend > 0 {
		np = m.Pricing.Blended() / cfg.maxBlend
	}
	b := c*m.Quality - (1-c)*np
	return Score{Model: m.Name, Quality: m.Quality, NormPrice: np, Base: b, Final: b}
}

// cacheValue is the prefix-cache value of staying on model m, in score
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
	warmth := (float64(mem.CachedTokensSeen) + ls.CacheWarmthPrior*economicsWarmthWeight) /
		(float64(mem.PromptTokensSeen) + economicsWarmthWeight)
	warmth = clamp01(warmth)
	return ls.PrefixCacheWeight * float64(historyTokens) * delta * warmth / (ls.EconomicsRefTokens * cfg.maxPrompt)
}
