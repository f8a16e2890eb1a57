package bench

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

// PolicyPrecise is the bench-only ceiling of issue 30: cache_aware's
// placement fed with each simulated worker's true KV cache instead of the
// router's prediction.
const PolicyPrecise = "precise"

// Precise's decision labels besides cache_aware's.
const (
	// PreciseUnknown: the request's prompt was not announced (see
	// Precise.announce); placed by load alone. A run shows none.
	PreciseUnknown = "precise_unknown"
)

var _ route.Policy = (*Precise)(nil)

// Precise is a measuring instrument, not a router: at decision time it
// reads, for the request's own prompt, how many leading KV blocks each
// simulated worker holds now (simworker.Worker.HeldBlocks: cached blocks,
// and the blocks of requests in flight whose prefill chunk has been
// scheduled, as KV events would have shown them), and places the request
// as cache_aware places a miss (docs/design.md §4, "Worker choice by
// estimated time to first token") with those true holds instead of the
// history tree's. It needs what no router has: the simulated workers
// themselves, and each request's prompt blocks, which the replay client
// announces before sending (announce).
//
// route offers no hook to give cache_aware's scoring another hold, so the
// scoring is re-implemented here, in its documented form:
//
//   - session affinity: a session's bound worker serves its later turns
//     unless the load gate finds it overloaded (then the least-loaded);
//   - else (a session miss, or no session id) threshold affinity: the
//     worker holding the most of the prompt, when that is more than
//     Threshold of it, is the candidate; the load gate overrides it;
//   - the cost of worker w is cache_aware's estimate,
//     Q × R × load(w) + P × uncached(w) × (1 + load(w) + pending(w)),
//     with uncached(w) the prompt's tokens beyond w's true hold; the
//     cheapest serves (ties: the longer hold, then at random); a winner
//     other than the candidate that the load gate finds overloaded yields
//     to the least-loaded worker.
//
// Q and P are what cache_aware's fit converges to on these workers: the
// engine's time per request in flight (1.5 decode steps' share) and per
// prefill token, in real seconds (× the time scale), never below
// cache_aware's floors (route.PriorQueueSeconds, route.PriorPrefillSeconds).
// R is cache_aware's turns per placement, max(route.PriorTurns, (requests +
// PriorTurns) / (placements + 1)), a placement being a session miss or,
// without ids, a request no worker holds more of than another does.
// Left out, as the truth makes them moot or they are refinements:
// cache_aware's shared-prefix rule (a prefix two workers hold counts as
// held by all: here each worker's hold is known), its expected returns of
// conversations between turns, and per-worker speeds (the fleets it runs
// on are equal). Safe for concurrent use.
type Precise struct {
	cfg route.CacheAwareConfig
	rnd func() uint64
	reg *loadview.Registry

	// Set by bind, before the first request.
	sims  map[uint32]*simworker.Worker // by registry id
	names *simworker.Worker            // names every prompt's blocks (one hash chain for the fleet)
	q, p  float64                      // seconds per request in flight, per uncached token
	bt    int                          // tokens per block

	mu       sync.Mutex
	prompts  map[string]*announced // history key → the prompt's blocks, while its request runs
	sessions map[string]uint32

	requests, placements atomic.Uint64
	unknown              atomic.Uint64 // Selects whose prompt was not announced
}

type announced struct {
	chain []uint64
	refs  int
}

// NewPrecise returns the precise policy over reg's workers; bind gives it
// the simulated workers behind them.
func NewPrecise(reg *loadview.Registry, cfg route.CacheAwareConfig, rnd func() uint64) *Precise {
	return &Precise{cfg: cfg, rnd: rnd, reg: reg, prompts: map[string]*announced{}, sessions: map[string]uint32{}}
}

// bind maps every registered worker to the simulated worker at its URL
// (sims[i] serves urls[i]) and derives the estimate's rates from the
// first one's effective config.
func (p *Precise) bind(sims []*simworker.Worker, urls []string) error {
	p.sims = map[uint32]*simworker.Worker{}
	for _, w := range p.reg.Workers() {
		for i, u := range urls {
			if u == w.URL() {
				p.sims[w.ID()] = sims[i]
			}
		}
		if p.sims[w.ID()] == nil {
			return fmt.Errorf("precise: no simulated worker at %s", w.URL())
		}
	}
	if len(sims) == 0 {
		return fmt.Errorf("precise: no workers")
	}
	p.names = sims[0]
	c := p.names.Config()
	scale := c.TimeScale
	if scale <= 0 {
		scale = 1
	}
	p.q = max(route.PriorQueueSeconds, 1.5*c.DecodePerSeq.Seconds()*scale)
	p.p = max(route.PriorPrefillSeconds, c.PerToken.Seconds()*scale)
	p.bt = c.BlockTokens
	return nil
}

// announce records the prompt blocks of a chat completions body about to
// be sent, under the history key the router will derive from it; done
// forgets them once the request ended. The client calls it before its
// clock starts, so the cost of naming blocks is no part of a TTFT.
func (p *Precise) announce(body []byte) (done func()) {
	var v reqview.View
	v.Reset()
	if reqview.Parse(&v, body, reqview.Chat) != nil {
		return func() {}
	}
	chain, err := p.names.PromptBlocks(body)
	if err != nil {
		return func() {}
	}
	key := string(v.History)
	p.mu.Lock()
	a := p.prompts[key]
	if a == nil {
		a = &announced{chain: chain}
		p.prompts[key] = a
	}
	a.refs++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		if a.refs--; a.refs == 0 {
			delete(p.prompts, key)
		}
		p.mu.Unlock()
	}
}

// Unknown is how many selections found no announced prompt.
func (p *Precise) Unknown() uint64 { return p.unknown.Load() }

// Name implements route.Policy.
func (*Precise) Name() string { return PolicyPrecise }

// Reads implements route.Policy: the history key, to find the prompt.
func (*Precise) Reads() route.Depth { return route.ReadsHistory }

// Select implements route.Policy.
func (p *Precise) Select(req *route.Request) route.Choice {
	p.mu.Lock()
	a := p.prompts[string(req.Prefix)]
	var bound uint32
	boundOK := false
	if len(req.Session) > 0 {
		bound, boundOK = p.sessions[string(req.Session)]
	}
	p.mu.Unlock()
	if a == nil {
		p.unknown.Add(1)
		return p.bindSession(req, route.MinLoad(req.Workers, p.rnd), PreciseUnknown)
	}
	p.requests.Add(1)
	if boundOK {
		if w := p.reg.ByID(bound); w != nil && w.Healthy() && member(req.Workers, w) {
			if loadview.Imbalanced(req.Workers, w, p.cfg.BalanceAbs, p.cfg.BalanceRel) {
				return p.bindSession(req, route.MinLoad(req.Workers, p.rnd), route.LoadBalance)
			}
			return route.Choice{Worker: w, Decision: route.SessionIDMatch}
		}
	}
	w, label := p.place(req, a.chain)
	return p.bindSession(req, w, label)
}

// place decides a placement by the estimate over the true holds.
func (p *Precise) place(req *route.Request, chain []uint64) (*loadview.Worker, string) {
	n := len(chain)
	holds := make([]int, len(req.Workers))
	h1, h2 := 0, 0
	var cand *loadview.Worker // the longest holder
	for i, w := range req.Workers {
		sim := p.sims[w.ID()]
		if sim == nil || !w.Healthy() {
			continue
		}
		h := sim.HeldBlocks(chain)
		holds[i] = h
		switch {
		case h > h1:
			h1, h2, cand = h, h1, w
		case h > h2:
			h2 = h
		}
	}
	if len(req.Session) > 0 || h1 <= h2 {
		p.placements.Add(1) // a new conversation: no hold of its own anywhere
	}
	hit, low := route.CacheAffinity, route.LowMatchMinLoad
	if len(req.Session) > 0 {
		hit, low = route.FullHistoryMatch, route.FullHistoryLowMatch
	}
	thr := p.cfg.Threshold * float64(n)
	if float64(h1) <= thr || cand == nil {
		cand = nil
	} else if loadview.Imbalanced(req.Workers, cand, p.cfg.BalanceAbs, p.cfg.BalanceRel) {
		return route.MinLoad(req.Workers, p.rnd), route.LoadBalance
	}
	turns := max(route.PriorTurns, (float64(p.requests.Load())+route.PriorTurns)/(float64(p.placements.Load())+1))
	var best *loadview.Worker
	bestT, bestHeld, ties := 0.0, 0, uint64(0)
	for i, w := range req.Workers {
		if !w.Healthy() {
			continue
		}
		load, pending := float64(w.FleetLoad()), float64(w.Awaiting())
		t := p.q*turns*load + p.p*float64((n-holds[i])*p.bt)*(1+load+pending)
		switch {
		case best == nil || t < bestT || (t == bestT && holds[i] > bestHeld):
			best, bestT, bestHeld, ties = w, t, holds[i], 1
		case t == bestT && holds[i] == bestHeld:
			ties++
			if p.rnd()%ties == 0 {
				best = w
			}
		}
	}
	switch {
	case best == nil:
		return nil, low
	case cand == nil:
		return best, low
	case float64(bestHeld) <= thr:
		return best, route.LoadBalance
	case best != cand && loadview.Imbalanced(req.Workers, best, p.cfg.BalanceAbs, p.cfg.BalanceRel):
		return route.MinLoad(req.Workers, p.rnd), route.LoadBalance
	}
	return best, hit
}

// bindSession binds req's session (if any) to w and returns the choice.
func (p *Precise) bindSession(req *route.Request, w *loadview.Worker, label string) route.Choice {
	if w != nil && len(req.Session) > 0 {
		p.mu.Lock()
		p.sessions[string(req.Session)] = w.ID()
		p.mu.Unlock()
	}
	return route.Choice{Worker: w, Decision: label}
}
