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

// PolicyVersion is the policy version a Router uses unless Options.Policy
// names another (docs/design.md §5):
//
//	1  score selector c·quality − (1−c)·normalized_price; a challenger must
//	   beat the stay score by fixed score points (stay_bias, switch_margin,
//	   handoff_penalty) plus a cache value.
//	2  demand-calibrated selector (complexity c needs quality_score ≥ c; the
//	   cheapest candidate that meets it, price_sensitivity trading quality
//	   for price) and switch economics in money (see priceSwitches).
//	3  (default) version 2 with this turn priced on the candidate's warm
//	   cache (scoreV3: the history the current model holds at its cached
//	   price, the rest at list price), following turns valued over the
//	   session's demand spread (followV3), and a slower demand average; the
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
	ActionOverflow   = "overflow" // the chosen model's pool was saturated: the turn goes to another candidate this once (overflow.go)
)

var actions = [...]string{ActionFirst, ActionStay, ActionSwitch, ActionHardLock, ActionResetIdle, ActionResetDrift, ActionLockBroken, ActionOverflow}

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
	ReasonQueueOverflow     = "queue_overflow" // the chosen model's pool was saturated and its wait cost more than the move (overflow.go)
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
	// Pools are the config's models' pools as the router's queue saw them,
	// recorded only when one of them was saturated (Health.Pool): what the
	// overflow rule reads (overflow.go).
	Pools []PoolState `json:"pools,omitempty"`

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

// Outcome is the result of the decision function: the verdict (what replay
// compares) and how it was reached.
type Outcome struct {
	Verdict
	LockKind         string  `json:"lock_kind,omitempty"`  // kind of the hard lock (or of the broken lock)
	LockModel        string  `json:"lock_model,omitempty"` // model of the hard lock ("" none)
	Failover         bool    `json:"failover,omitempty"`   // pinned worker released (provider state lost)
	Conflict         bool    `json:"conflict,omitempty"`   // tool results of two models (ReasonToolLoopConflict)
	Complexity       float64 `json:"complexity"`
	ComplexitySource string  `json:"complexity_source"`
	Demand           float64 `json:"demand,omitempty"`     // v2: the session's demand after this turn (EWMA of complexity)
	DemandVar        float64 `json:"demand_var,omitempty"` // v2: its exponentially weighted variance
	Scores           []Score `json:"scores,omitempty"`
	// Overflow is set when the turn left its chosen model's saturated pool
	// (ActionOverflow): that choice, and what the move was weighed on.
	Overflow *Overflow `json:"overflow,omitempty"`
}

// Decide is the pure decision function of the model step: the same config,
// policy, inputs, memory snapshot (nil: no memory) and time (unix ns)
// always give the same outcome. Select and Replay both call it. Each
// policy version is one function (decideV1, decideV2, decideV3) built from
// the steps every version shares (decision.go) and its own selector and
// economics (economics.go); then, whatever the version, the overflow rule
// (overflow.go), which moves nothing unless the inputs record a saturated
// pool.
func Decide(cfg *Config, pol Policy, in *Inputs, mem *sessionshard.MemoryState, now int64) Outcome {
	lg := cfg.logicalByName(in.Logical)
	if lg == nil {
		return Outcome{Verdict: Verdict{Action: ActionFirst, Reason: ReasonNoDecision}}
	}
	var out Outcome
	d := newDecision(cfg, lg, pol, in, mem, now, &out)
	switch pol.V() { // each version completes out (d.out)
	case 1:
		decideV1(&d)
	case 2:
		decideV2(&d)
	default:
		decideV3(&d)
	}
	d.overflow()
	return out
}

// decideV1 is policy version 1: the score selector c·quality −
// (1−c)·normalized_price, and a challenger that must beat the current
// model's stay score by fixed score points (switchTargetV1).
func decideV1(d *decision) Outcome {
	d.scoreCandidates(scoreV1, betterV1)
	switch d.sessionRules() {
	case ruled:
		return *d.out
	case freeChoice:
		return d.chooseFreely(d.bestModel())
	}
	return d.stayOrSwitch(switchTargetV1(d, d.currentScore(scoreV1)))
}

// decideV2 is policy version 2: the demand-calibrated selector (scoreV2)
// and a switch priced in money, the re-prefill of the warm history
// included (priceSwitches).
func decideV2(d *decision) Outcome {
	d.trackDemand(demandEWMAv2, 0)
	d.scoreCandidates(scoreV2, betterUtility)
	switch d.sessionRules() {
	case ruled:
		return *d.out
	case freeChoice:
		d.resetDemand(0)
		return d.chooseFreely(d.bestModel())
	}
	ci := d.currentScore(scoreV2)
	chargeReprefill(d, ci)
	return d.stayOrSwitch(priceSwitches(d, ci, followV2))
}

// decideV3 is policy version 3 (the default): version 2 with this turn
// priced on each candidate's warm cache (scoreV3, so the re-prefill is in
// the price and not charged again to the switch), following turns valued
// over the session's demand spread (followV3), a slower demand average,
// and free choices that look ahead (aheadModel).
func decideV3(d *decision) Outcome {
	d.trackDemand(demandEWMAv3, demandPriorSD*demandPriorSD)
	d.scoreCandidates(scoreV3, betterUtility)
	switch d.sessionRules() {
	case ruled:
		return *d.out
	case freeChoice:
		d.resetDemand(demandPriorSD * demandPriorSD)
		return d.chooseFreely(aheadModel(d))
	}
	return d.stayOrSwitch(priceSwitches(d, d.currentScore(scoreV3), followV3))
}
