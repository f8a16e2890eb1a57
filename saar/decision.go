package saar

import "github.com/warmroute/warmroute/sessionshard"

// decision is one call of Decide in progress: what the turn is (phase,
// matched decision, complexity), the session it continues, and the outcome
// being built. A version function (decideV1, decideV2, decideV3) runs the
// steps below in the order of the package doc; each step reads the turn
// and writes d.out.
type decision struct {
	cfg *Config
	ls  *SessionSettings
	pol Policy
	in  *Inputs
	mem *sessionshard.MemoryState // nil: no memory of the session (its first turn, or no session key)
	now int64

	cand  []int   // the matched decision's candidates, indexes into cfg.Models
	c     float64 // the turn's complexity
	h     float64 // history tokens, ≥ 0
	warmH float64 // of which the session's model holds warm (0 without memory)

	best   int  // index in out.Scores of the base selector's choice
	noneUp bool // every candidate is down: best is the first (ReasonNoHealthy)

	out *Outcome // the outcome being built (Decide's)
}

// Escape analysis does not tell one field of a struct from another: a
// value read from a field of decision that reaches the outcome, or a func
// value's arguments, takes every field's pointer with it, Select's inputs
// among them, which then move to the heap. So decision holds no string
// (cur reads the memory's), out is a pointer, and the func values
// (scorer, follower) get floats and pointers into the config and the
// scores, never a field of decision itself. TestSelectAllocs fails when
// one slips.

// newDecision reads what the turn is, whatever the policy does with it:
// its phase, the decision it matches (the last one when none does) and its
// complexity.
func newDecision(cfg *Config, lg *Logical, pol Policy, in *Inputs, mem *sessionshard.MemoryState, now int64, out *Outcome) decision {
	d := decision{cfg: cfg, ls: &lg.Session, pol: pol, in: in, now: now, h: float64(max(in.HistoryTokens, 0)), out: out}
	if mem != nil && mem.Model != "" {
		d.mem = mem
		d.warmH = d.h * warmth(d.ls, mem)
	}
	d.out.Phase = phaseOf(in)
	di := matchDecision(lg, in)
	if di < 0 {
		di = len(lg.Decisions) - 1 // no decision matched: the last one, as a default
	}
	d.out.Decision, d.cand = lg.Decisions[di].Name, lg.Decisions[di].cand
	d.c, d.out.ComplexitySource = complexity(in)
	d.out.Complexity = d.c
	return d
}

// phaseOf says what the turn is: a tool loop (it carries tool results),
// provider state (previous_response_id or opaque reasoning), or a user turn.
func phaseOf(in *Inputs) string {
	switch {
	case in.ToolResults > 0:
		return PhaseToolLoop
	case in.PreviousResponseID != "" || in.OpaqueReasoning:
		return PhaseProviderState
	}
	return PhaseUserTurn
}

// trackDemand (v2, v3) moves the session's demand — the exponentially
// weighted mean and variance of its turns' complexity — by this turn,
// weighted ewma; a session without memory starts at this turn with
// variance priorVar.
func (d *decision) trackDemand(ewma, priorVar float64) {
	d.resetDemand(priorVar)
	if d.mem != nil {
		dev := d.c - d.mem.Demand
		d.out.Demand = d.mem.Demand + ewma*dev
		d.out.DemandVar = (1 - ewma) * (d.mem.DemandVar + ewma*dev*dev)
	}
}

// resetDemand (v2, v3) starts the demand afresh: this turn's complexity,
// variance priorVar.
func (d *decision) resetDemand(priorVar float64) { d.out.Demand, d.out.DemandVar = d.c, priorVar }

// cur is the session's model ("" without memory).
func (d *decision) cur() string {
	if d.mem == nil {
		return ""
	}
	return d.mem.Model
}

// A scorer is a policy version's selector: model m's line for the turn.
type scorer func(m *Model, t turnPrice) Score

// turnPrice is what a selector reads of the turn besides the model.
type turnPrice struct {
	c        float64 // complexity
	h, warmH float64 // history tokens, and of them those warm on the model
	lambda   float64 // price_sensitivity
	maxBlend float64 // the config's highest blended price
	ref      float64 // refUSD
}

// score is model m's line under the selector: the session's model prices
// its warm history as warm.
func (d *decision) score(sel scorer, m *Model) Score {
	t := turnPrice{c: d.c, h: d.h, lambda: d.ls.PriceSensitivity, maxBlend: d.cfg.maxBlend, ref: refUSD(d.cfg, d.ls)}
	if m.Name == d.cur() {
		t.warmH = d.warmH
	}
	return sel(m, t)
}

// scoreCandidates scores the matched decision's candidates and picks the
// base selector's choice: the best candidate whose model is up (better
// orders two), or the first candidate (ReasonNoHealthy) when all are down.
// Room is left for the current model's line (currentScore).
func (d *decision) scoreCandidates(sel scorer, better func(s, b *Score) bool) {
	d.out.Scores = make([]Score, 0, len(d.cand)+1)
	d.best = -1
	for _, mi := range d.cand {
		m := &d.cfg.Models[mi]
		s := d.score(sel, m)
		s.Candidate = true
		s.Down = d.in.modelDown(m.Name)
		s.Current = m.Name == d.cur()
		d.out.Scores = append(d.out.Scores, s)
		i := len(d.out.Scores) - 1
		if !s.Down && (d.best < 0 || better(&d.out.Scores[i], &d.out.Scores[d.best])) {
			d.best = i
		}
	}
	if d.best < 0 {
		d.best, d.noneUp = 0, true
	}
}

func (d *decision) bestModel() string { return d.out.Scores[d.best].Model }

// bestReason is the reason of the base selector's choice.
func (d *decision) bestReason() string {
	if d.noneUp {
		return ReasonNoHealthy
	}
	return ReasonBase
}

// choose completes the outcome.
func (d *decision) choose(model, action, reason string) Outcome {
	d.out.Model, d.out.Action, d.out.Reason = model, action, reason
	return *d.out
}

// chooseFreely completes a free choice (first turn, reset) whose action and
// reason the session rules set.
func (d *decision) chooseFreely(model string) Outcome {
	d.out.Model = model
	return *d.out
}

// next is what the session rules leave to the policy version.
type next uint8

const (
	ruled      next = iota // the outcome is complete
	freeChoice             // choose freely (first turn, reset); d.out has the action and reason
	economics              // weigh staying on the current model against switching
)

// sessionRules applies what every version applies before its economics,
// in order: the mode, the hard locks, a turn without memory, the current
// model down, sticky, the idle and the drift resets, and a current model
// the config does not know.
func (d *decision) sessionRules() next {
	switch {
	case d.pol.Mode == ModeSingleTurn:
		d.singleTurn()
	case d.hardLock():
	case d.mem == nil:
		d.out.Action, d.out.Reason = ActionFirst, d.firstReason()
		return freeChoice
	case d.in.modelDown(d.cur()):
		d.choose(d.bestModel(), ActionSwitch, ReasonCurrentDown)
	case d.pol.Mode == ModeSticky:
		d.choose(d.cur(), ActionStay, ReasonSticky)
	case d.idle():
		d.out.Action, d.out.Reason = ActionResetIdle, ReasonIdle
		return freeChoice
	case d.drifted():
		d.out.Action, d.out.Reason = ActionResetDrift, ReasonDrift
		return freeChoice
	case d.cfg.Model(d.cur()) == nil: // a model the config does not know cannot stay
		d.choose(d.bestModel(), ActionSwitch, ReasonCurrentDown)
	default:
		return economics
	}
	return ruled
}

// singleTurn (ModeSingleTurn) takes the base selector's choice: no locks,
// no resets, no economics.
func (d *decision) singleTurn() {
	switch {
	case d.mem == nil:
		d.choose(d.bestModel(), ActionFirst, d.bestReason())
	case d.bestModel() == d.cur():
		d.choose(d.bestModel(), ActionStay, ReasonSingleTurn)
	default:
		d.choose(d.bestModel(), ActionSwitch, ReasonSingleTurn)
	}
}

// lock is a hard lock's evidence: the model (and for provider state the
// worker) the turn must go to.
type lock struct{ kind, model, worker, reason string }

// hardLock applies the hard locks, before everything else and whether or
// not the locked model is among the decision's candidates: provider state
// wins over a tool loop (the backend holds the state). A locked model
// down, or unknown to the config, breaks the lock openly; a pinned worker
// down while its model is up fails over (state lost). It reports whether a
// lock decided the turn.
func (d *decision) hardLock() bool {
	l := d.toolLock()
	if p := d.providerLock(); p.model != "" {
		if l.model != "" && l.model != p.model {
			p.reason += reasonConflictSuffix
		}
		l = p
	}
	if l.model == "" {
		return false
	}
	d.out.LockKind = l.kind
	if d.in.modelDown(l.model) || d.cfg.Model(l.model) == nil {
		broken := ReasonToolLockBroken
		if l.kind == LockProviderState {
			broken = ReasonStateLockBroken
		}
		d.choose(d.bestModel(), ActionLockBroken, broken)
		return true
	}
	d.out.LockModel = l.model
	if l.worker != "" && d.in.workerDown(l.worker) {
		l.worker, l.reason, d.out.Failover = "", ReasonWorkerFailover, true
	}
	d.out.PinnedWorker = l.worker
	d.choose(l.model, ActionHardLock, l.reason)
	return true
}

// toolLock is the lock of tool results: the model that issued their ids;
// ids of two models are a conflict (counted), which the author of the
// latest assistant message (the session's model) wins when it is one of
// them; ids unknown: structurally, the session's model.
func (d *decision) toolLock() lock {
	in := d.in
	if in.ToolResults == 0 || d.pol.NoToolLock {
		return lock{}
	}
	l := lock{kind: LockToolLoop}
	switch {
	case in.ToolOwner != "" && in.ToolOwnerConflict != "":
		l.model, l.reason, d.out.Conflict = in.ToolOwner, ReasonToolLoopConflict, true
		if d.mem != nil && d.mem.Model == in.ToolOwnerConflict {
			l.model = d.mem.Model
		}
	case in.ToolOwner != "":
		l.model, l.reason = in.ToolOwner, ReasonToolLoop
	case d.mem != nil:
		l.model, l.reason = d.mem.Model, ReasonToolLoopFallback
		if in.ToolOwnerUnreachable {
			l.reason = ReasonToolLoopFallbackDown
		}
	default:
		return lock{}
	}
	return l
}

// providerLock is the lock of provider state: the model and worker that
// created previous_response_id, else those that produced the opaque
// reasoning artifact, else the session's model and worker.
func (d *decision) providerLock() lock {
	in := d.in
	if (in.PreviousResponseID == "" && !in.OpaqueReasoning) || d.pol.NoProviderLock {
		return lock{}
	}
	l := lock{kind: LockProviderState}
	switch {
	case in.PreviousResponseID != "" && in.StateModel != "":
		l.model, l.worker, l.reason = in.StateModel, in.StateWorker, ReasonProviderState
	case in.ReasoningModel != "":
		l.model, l.worker, l.reason = in.ReasoningModel, in.ReasoningWorker, ReasonOpaqueReasoning
	case d.mem != nil && in.PreviousResponseID != "":
		l.model, l.worker, l.reason = d.mem.Model, d.mem.Worker, ReasonProviderFallback
		if in.StateOwnerUnreachable || in.ReasoningOwnerUnreachable {
			l.reason = ReasonProviderFallbackDown
		}
	case d.mem != nil:
		l.model, l.worker, l.reason = d.mem.Model, d.mem.Worker, ReasonOpaqueReasoning
		if in.ReasoningOwnerUnreachable {
			l.reason = ReasonOpaqueReasoningDown
		}
	default:
		return lock{}
	}
	return l
}

// firstReason is the reason of a turn without memory: a tool result or
// provider state whose owner is unknown says so (and that the shared store
// could not be asked, when so); other turns carry the base selector's.
func (d *decision) firstReason() string {
	in := d.in
	switch {
	case d.out.Phase == PhaseToolLoop && !d.pol.NoToolLock:
		if in.ToolOwnerUnreachable {
			return ReasonToolLoopNoOwnerDown
		}
		return ReasonToolLoopNoOwner
	case d.out.Phase == PhaseProviderState && !d.pol.NoProviderLock:
		if in.StateOwnerUnreachable || in.ReasoningOwnerUnreachable {
			return ReasonProviderNoOwnerDown
		}
		return ReasonProviderNoOwner
	}
	return d.bestReason()
}

// idle reports an idle reset: the session's last activity — the end of its
// previous response, or a later turn still in flight (or failed) — is
// longer ago than idle_timeout_seconds.
func (d *decision) idle() bool {
	if d.pol.NoIdleReset {
		return false
	}
	end := max(d.mem.LastEnd, d.mem.LastAccess)
	return float64(d.now-end) > d.ls.IdleTimeoutSeconds*1e9
}

// drifted reports a drift reset: the turn matches another decision than
// the session's last turn.
func (d *decision) drifted() bool {
	return !d.pol.NoDriftReset && d.mem.Decision != "" && d.mem.Decision != d.out.Decision
}

// currentScore returns the index of the current model's line in
// out.Scores, adding it when the current model is not a candidate (a lock
// took the session there: it may stay all the same).
func (d *decision) currentScore(sel scorer) int {
	ci := -1
	for i := range d.out.Scores {
		if d.out.Scores[i].Current {
			ci = i
		}
	}
	if ci >= 0 {
		return ci
	}
	s := d.score(sel, d.cfg.Model(d.cur()))
	s.Current = true
	d.out.Scores = append(d.out.Scores, s)
	return len(d.out.Scores) - 1
}

// stayOrSwitch completes the economics: switch to out.Scores[to] once the
// session has spent min_turns_before_switch turns on its model; to < 0
// stays (the current model is the best candidate, or no challenger beat
// it).
func (d *decision) stayOrSwitch(to int) Outcome {
	switch {
	case to < 0 && d.bestModel() == d.cur():
		return d.choose(d.cur(), ActionStay, ReasonStayBest)
	case to < 0:
		return d.choose(d.cur(), ActionStay, ReasonStayEconomics)
	case d.mem.TurnsOnModel < d.ls.MinTurnsBeforeSwitch:
		return d.choose(d.cur(), ActionStay, ReasonMinTurns)
	}
	return d.choose(d.out.Scores[to].Model, ActionSwitch, ReasonEconomics)
}
