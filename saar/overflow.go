package saar

// Overflow to another model when the chosen model's pool is saturated
// (docs/design.md §9, "Overflow to another model"). The router's admit
// stage measures the pools (Health.Pool); the rule that moves a turn is
// here, with the economics, and is recorded, so a record replays it.

// PoolState is one physical model's pool as the router's queue sees it
// when a turn is decided.
type PoolState struct {
	Model string `json:"model"`
	// Saturated: a request sent to the pool now would wait in the router's
	// queue (its room, in requests, is no more than what the queue holds
	// for it).
	Saturated bool `json:"saturated,omitempty"`
	// WaitSeconds is the expected wait of such a request (saturated only).
	WaitSeconds float64 `json:"wait_seconds,omitempty"`
	// PrefillSeconds is the pool's learned time to prefill one uncached
	// prompt token.
	PrefillSeconds float64 `json:"prefill_seconds_per_token,omitempty"`
}

// Overflow is how a turn left its chosen model's saturated pool: the model
// the session rules and the economics chose, with their action and reason,
// the expected wait there, and the cost of the move in seconds.
type Overflow struct {
	From        string  `json:"from"`
	Action      string  `json:"action"`
	Reason      string  `json:"reason"`
	WaitSeconds float64 `json:"wait_seconds"`
	CostSeconds float64 `json:"cost_seconds"`
}

// pool returns model's recorded pool, nil when none is recorded.
func (in *Inputs) pool(model string) *PoolState {
	for i := range in.Pools {
		if in.Pools[i].Model == model {
			return &in.Pools[i]
		}
	}
	return nil
}

// overflow applies the overflow rule to the completed outcome, in every
// policy version and mode. The turn's chosen model M is left for another
// model m only when all of these hold:
//
//   - the turn is not locked: no hard lock, no broken lock, no pinned
//     worker (a locked turn never moves; it waits for its model);
//   - M's pool is saturated, with expected wait W > 0 (PoolState);
//   - m is a candidate of the turn's matched decision (the logical
//     model's allowed set), up, and its pool is recorded and not saturated;
//   - m serves this turn's demand c as well as M: min(quality_m, c) ≥
//     min(quality_M, c). The wait buys latency, never quality; the price
//     of one turn elsewhere is not weighed against the wait;
//   - the move costs less time than the wait: W > cost(m).
//
// The cost is the prefill the move adds, in seconds:
//
//	cost(m) = max(0, warm_M − warm_m) · prefill_m
//
// warm_X is the history the session's model holds warm (the tokens the
// economics price as warm, h · warmth) when X is the session's model, else
// 0, and prefill_m the seconds m's pool takes to prefill a token (learned).
// So a first turn, or one whose model is not warm, moves for any wait; a
// long warm history stays for a short one.
//
// Among such m the lowest cost wins, then the better selector score (the
// cheaper at equal utility), then the first listed. The outcome then goes
// to m with ActionOverflow and ReasonQueueOverflow, and Overflow records
// the choice it replaces. It is a detour of this turn only: the session's
// memory keeps M (remember), so the next turn is decided as if this one
// had stayed, and never overflows back because of this one. A turn is
// decided once before it waits: the router does not overflow a turn again
// (nor on failover).
func (d *decision) overflow() {
	in, out := d.in, d.out
	if len(in.Pools) == 0 || out.Action == ActionHardLock || out.Action == ActionLockBroken ||
		out.LockModel != "" || out.PinnedWorker != "" {
		return
	}
	from := in.pool(out.Model)
	if from == nil || !from.Saturated || from.WaitSeconds <= 0 {
		return
	}
	cur := d.cur()
	warmFrom, need := 0.0, 0.0
	if out.Model == cur {
		warmFrom = d.warmH
	}
	if m := d.cfg.Model(out.Model); m != nil {
		need = min(m.Quality, d.c)
	}
	best, bestCost := -1, 0.0
	for i := range out.Scores {
		s := &out.Scores[i]
		if !s.Candidate || s.Down || s.Model == out.Model || min(s.Quality, d.c) < need-1e-12 {
			continue
		}
		p := in.pool(s.Model)
		if p == nil || p.Saturated {
			continue
		}
		warm := 0.0
		if s.Model == cur {
			warm = d.warmH
		}
		cost := max(warmFrom-warm, 0) * max(p.PrefillSeconds, 0)
		if best < 0 || cost < bestCost || cost == bestCost && betterUtility(s, &out.Scores[best]) {
			best, bestCost = i, cost
		}
	}
	if best < 0 || from.WaitSeconds <= bestCost {
		return
	}
	out.Overflow = &Overflow{From: out.Model, Action: out.Action, Reason: out.Reason,
		WaitSeconds: from.WaitSeconds, CostSeconds: bestCost}
	out.Model, out.Action, out.Reason = out.Scores[best].Model, ActionOverflow, ReasonQueueOverflow
}
