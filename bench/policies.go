package bench

import (
	"strings"
	"sync"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/radix"
	"github.com/warmroute/warmroute/route"
)

// Bench-only policy names and labels.
const (
	PolicySticky = "sticky"
	PolicyPreRFC = "pre_rfc"
	PolicyOracle = "oracle"
	// PolicyCacheAwareEvents is cache_aware with the workers' KV-cache
	// events on (--kv-events): the simulated workers publish them, the
	// router follows them (docs/design.md §9, "KV events").
	PolicyCacheAwareEvents = "cache_aware_events"

	StickyHit     = "sticky_hit"      // the session's worker
	StickyMinLoad = "sticky_min_load" // a new (or moved) session, or none: least loaded

	// cache_aware variants (docs/design.md §4, placement on a session miss).
	// Plain "cache_aware" runs Options.CacheAware as given.
	PolicyCacheAware32k = "cache_aware_32k" // the fixed exchange rate: 32 KiB of prefix per extra request
	PolicyRFCRule       = "rfc_rule"        // the plain threshold rule (--affinity-chars-per-request 0)
)

// PDSeparator joins the two policies of a disaggregated fleet in one
// harness name, prefill first: "cache_aware+least_loaded" runs cache_aware
// as the prefill policy and least_loaded as the decode policy
// (docs/design.md §9, --prefill-policy and --decode-policy).
const PDSeparator = "+"

// PDPolicy is the harness name of a disaggregated fleet's policy pair.
func PDPolicy(prefill, decode string) string { return prefill + PDSeparator + decode }

// SplitPD returns the prefill and decode policies name runs in a
// disaggregated fleet. A plain name runs on both legs, as --decode-policy
// defaults to --policy; pd reports whether name was a pair.
func SplitPD(name string) (prefill, decode string, pd bool) {
	if p, d, ok := strings.Cut(name, PDSeparator); ok {
		return p, d, true
	}
	return name, name, false
}

// ControlSuffix names an A/A control: "P" + ControlSuffix runs policy P
// again under a second name, so that the spread between the two rows of one
// run measures the harness's own noise (scheduling on a shared machine),
// against which a difference between two policies can be judged. A control
// is never the cell's best policy, and the oracle has none.
const ControlSuffix = "_aa"

// controlOf returns the policy a control name runs, and whether name is a
// control.
func controlOf(name string) (string, bool) {
	base, ok := strings.CutSuffix(name, ControlSuffix)
	return base, ok && base != PolicyOracle
}

// CacheAwareVariants lists the cache_aware variants besides cache_aware itself.
var CacheAwareVariants = []string{PolicyCacheAware32k, PolicyRFCRule}

// CacheAwareVariant returns the config the cache_aware variant name runs
// with, derived from base (thresholds, gates and tree size kept), and
// whether name is a cache_aware policy at all. "cache_aware" is base itself.
func CacheAwareVariant(name string, base route.CacheAwareConfig) (route.CacheAwareConfig, bool) {
	switch name {
	case "cache_aware":
		return base, true
	case PolicyCacheAware32k:
		affinityRule(&base, 32<<10)
		return base, true
	case PolicyRFCRule:
		affinityRule(&base, 0)
		return base, true
	}
	return base, false
}

// affinityRule switches base to the fixed-exchange-rate placement of a
// session miss with chars characters per extra request (0: the RFC's plain
// threshold rule).
func affinityRule(c *route.CacheAwareConfig, chars int) {
	c.AffinityRule = true
	c.AffinityCharsPerRequest = chars
}

var (
	_ route.Policy = (*Sticky)(nil)
	_ route.Policy = (*PreRFC)(nil)
)

// Sticky routes by the session id alone: a session stays on the worker its
// first request went to (while that worker is healthy), a new session goes to
// the least-loaded healthy worker, and so does a request without a session
// id. No prefix tree, no load gates, no TTL. Safe for concurrent use.
type Sticky struct {
	rnd      func() uint64
	mu       sync.Mutex
	sessions map[string]*loadview.Worker
}

// NewSticky returns a sticky policy over reg's workers; rnd breaks min-load
// ties.
func NewSticky(reg *loadview.Registry, rnd func() uint64) *Sticky {
	p := &Sticky{rnd: rnd, sessions: map[string]*loadview.Worker{}}
	reg.OnRemove(p.Forget)
	return p
}

// Name implements route.Policy.
func (*Sticky) Name() string { return PolicySticky }

// Reads implements route.Policy: the session key.
func (*Sticky) Reads() route.Depth { return route.ReadsSession }

// Select implements route.Policy.
func (p *Sticky) Select(req *route.Request) route.Choice {
	if len(req.Session) == 0 {
		return route.Choice{Worker: route.MinLoad(req.Workers, p.rnd), Decision: StickyMinLoad}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if w := p.sessions[string(req.Session)]; w != nil && w.Healthy() && member(req.Workers, w) {
		return route.Choice{Worker: w, Decision: StickyHit}
	}
	w := route.MinLoad(req.Workers, p.rnd)
	if w != nil {
		p.sessions[string(req.Session)] = w
	}
	return route.Choice{Worker: w, Decision: StickyMinLoad}
}

// Forget drops the sessions of a removed worker.
func (p *Sticky) Forget(w *loadview.Worker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, v := range p.sessions {
		if v == w {
			delete(p.sessions, k)
		}
	}
}

// PreRFC emulates the vLLM router's cache_aware chat routing before the RFC
// of seed 000 (as the RFC describes main, after sglang's cache_aware):
//
//   - the routing text is the session id (whatever channel carried it) and
//     nothing else; without one it is empty;
//   - when the fleet is imbalanced (max load − min load > abs and max load >
//     min load × rel, over healthy workers) the least-loaded worker wins
//     (load_balance);
//   - otherwise the text is probed in a radix prefix tree: when the matched
//     fraction is strictly above the threshold the matched worker wins
//     (cache_affinity) — so session-12 matches session-1's worker (9 of 10
//     characters), the RFC's bug 1 — else the least-loaded worker
//     (low_match_min_load); an empty text always misses (bug 2);
//   - the chosen worker is taught the text.
//
// The conversation itself is never looked at (bug 3). Safe for concurrent use.
type PreRFC struct {
	threshold float64
	abs       int64
	rel       float64
	rnd       func() uint64
	tree      *radix.Tree
	reg       *loadview.Registry
}

// NewPreRFC returns the pre-RFC policy over reg's workers.
func NewPreRFC(reg *loadview.Registry, threshold float64, abs int64, rel float64, rnd func() uint64) *PreRFC {
	p := &PreRFC{threshold: threshold, abs: abs, rel: rel, rnd: rnd, reg: reg,
		tree: radix.New(radix.Config{MaxCharsPerWorker: 1 << 26})}
	reg.OnRemove(p.Forget)
	return p
}

// Name implements route.Policy.
func (*PreRFC) Name() string { return PolicyPreRFC }

// Reads implements route.Policy: it matches the session key's text.
func (*PreRFC) Reads() route.Depth { return route.ReadsSession }

// Select implements route.Policy.
func (p *PreRFC) Select(req *route.Request) route.Choice {
	text := req.Session
	if p.imbalanced(req.Workers) {
		return p.teach(text, route.MinLoad(req.Workers, p.rnd), route.LoadBalance)
	}
	if len(text) > 0 {
		m := p.tree.Match(text, func(id uint32) bool {
			w := p.reg.ByID(id)
			return w != nil && w.Healthy() && member(req.Workers, w)
		})
		if float64(m.Len) > p.threshold*float64(len(text)) {
			if w := p.reg.ByID(m.Worker); w != nil {
				return p.teach(text, w, route.CacheAffinity)
			}
		}
	}
	return p.teach(text, route.MinLoad(req.Workers, p.rnd), route.LowMatchMinLoad)
}

func (p *PreRFC) imbalanced(ws []*loadview.Worker) bool {
	lo, hi := int64(-1), int64(-1)
	for _, w := range ws {
		if !w.Healthy() {
			continue
		}
		l := w.Load()
		if lo < 0 || l < lo {
			lo = l
		}
		if l > hi {
			hi = l
		}
	}
	return lo >= 0 && hi-lo > p.abs && float64(hi) > float64(lo)*p.rel
}

func (p *PreRFC) teach(text []byte, w *loadview.Worker, label string) route.Choice {
	if w != nil && len(text) > 0 && !p.tree.Touch(text, w.ID()) {
		p.tree.Insert(text, w.ID())
	}
	return route.Choice{Worker: w, Decision: label}
}

// Forget drops a removed worker from the tree.
func (p *PreRFC) Forget(w *loadview.Worker) { p.tree.RemoveWorker(w.ID()) }

func member(ws []*loadview.Worker, w *loadview.Worker) bool {
	for _, o := range ws {
		if o == w {
			return true
		}
	}
	return false
}
