package route

import (
	"io"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/puzpuzpuz/xsync/v3"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/promtext"
	"github.com/warmroute/warmroute/radix"
	"github.com/warmroute/warmroute/sessionshard"
)

// CacheAwareConfig holds the cache-aware policy's settings (router flags).
type CacheAwareConfig struct {
	Threshold  float64 // --cache-threshold: affinity when matched/key > Threshold
	BalanceAbs int64   // --balance-abs-threshold
	BalanceRel float64 // --balance-rel-threshold
	// MaxTreeSize (--max-tree-size) is each worker's budget in the history
	// tree of one model, in bytes of memory: label bytes plus
	// radix.NodeOverhead (121 B) per node held, so it bounds the heap the
	// worker's entries retain whatever the requests look like. For long
	// histories a byte is about a character (radix's BenchmarkMemoryCost
	// reports the heap bytes per stored character); a flood of 1-character
	// suffixes costs about NodeOverhead + 1 bytes each. A model's tree
	// retains at most about workers × MaxTreeSize. 0: unlimited.
	MaxTreeSize int
	// MaxSessions (--max-sessions) caps each model's session map (see
	// DefaultMaxSessions for the memory it bounds). 0 (or negative):
	// DefaultMaxSessions.
	MaxSessions int
	// AffinityRule selects the fixed exchange rate below instead of the
	// estimated time to first token (the default, docs/design.md §4).
	// cmd/warmroute sets it only when --affinity-chars-per-request is given.
	AffinityRule bool
	// AffinityCharsPerRequest (--affinity-chars-per-request), with
	// AffinityRule: on a miss, following the longest cached prefix to a
	// busier worker must save at least this many characters of prefill per
	// extra request in flight there, else the least-loaded worker serves.
	// 0: threshold affinity only (the RFC rule). Ignored without AffinityRule.
	AffinityCharsPerRequest int
	SessionTTL              time.Duration // 1 h
	Now                     func() int64  // unix ns; nil = wall clock
	// Shared, when set, is the binding store shared by router replicas
	// (docs/design.md §8.3, --redis-url): a local session miss asks it
	// before placing, a session-less request asks it for its conversation's
	// previous turn (see shared.go), and every placement is published to
	// it. nil: this replica's state only, at no cost.
	Shared SharedBindings
	// ConversationTTL bounds how long a session-less turn's binding stays
	// in the shared store (one key per turn): the next turn must come
	// within it to find its worker on another replica. Default 10 min.
	ConversationTTL time.Duration
}

// DefaultMaxSessions is the default session cap per model (and for the
// shared fallback state): 524,288 sessions. A session costs at most
// sessionshard.SessionBytes of heap with a 36-byte key, so a model's
// session map holds about 84 MB at the cap (1<<19 × 160 B). The map drops
// its oldest sessions when it reaches the cap plus its headroom (an eighth
// of the cap, see newState) and refuses new ones at the cap plus twice the
// headroom, so it never holds more than a quarter above the cap (about
// 105 MB). Sessions idle for SessionTTL go earlier.
const DefaultMaxSessions = 1 << 19

// DefaultCacheAwareConfig returns the vLLM router's defaults, with misses
// placed by estimated time to first token (AffinityRule false).
// AffinityCharsPerRequest holds the rule's rate (32 KiB of prefix, about 8k
// tokens of prefill, per extra request) for a caller that sets AffinityRule.
func DefaultCacheAwareConfig() CacheAwareConfig {
	return CacheAwareConfig{Threshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5, MaxTreeSize: 1 << 26,
		MaxSessions: DefaultMaxSessions, AffinityCharsPerRequest: 32 << 10}
}

// CacheAware routes a session to the worker whose KV prefix cache holds it:
// exact session-id affinity first, then the longest cached prefix of the
// serialized history, then the least-loaded worker; the load gates override
// any affinity when the chosen worker is overloaded. Every selection teaches
// the session map and the history tree before the request is proxied, so the
// session's next request finds it even while this one runs.
//
// Memory: per-model state (a session map and a history tree) exists only
// for the models the registry serves explicitly (loadview.Registry.Serves),
// decided before any state is created, and Sweep drops the states of models
// no longer served. Every other model name a client sends (one routed to
// wildcard workers whose models are unknown, or a pass-through) shares ONE
// fallback state. So the states, and the metric series of WriteMetrics,
// number at most served models + 1, whatever names clients send. Each state
// keeps at most about MaxSessions × sessionshard.SessionBytes of sessions
// and workers × MaxTreeSize bytes of tree.
//
// Why a shared fallback rather than stateless min-load routing: a fleet
// whose workers' models are unknown (discovery failed or not offered)
// routes everything through it, and there it still gives session
// stickiness and prefix affinity; since a wildcard worker in practice
// serves one model, the fallback is then effectively that model's state.
// Names that no worker serves can only churn the fallback's own bounded
// maps, never the served models' states. In the fallback, affinity counts
// only for workers among the request's Workers.
type CacheAware struct {
	cfg      CacheAwareConfig
	reg      *loadview.Registry
	rnd      func() uint64
	models   *xsync.MapOf[string, *modelState] // served models only
	fallback atomic.Pointer[modelState]        // every other model name; created on first use
	eligible func(uint32) bool                 // healthy and registered; built once so Match does not allocate

	shared      SharedBindings // cfg.Shared
	sharedStats sharedCounters
	refreshedAt atomic.Int64 // unix ns of the last refresh (shared.go)

	// KV events (kvfollow.go): each worker's stream, and what it did.
	follow                            *xsync.MapOf[uint32, *kvFollow]
	kvApplied, kvCleared, kvEvictions atomic.Uint64
}

// FallbackModel is the model label of the shared fallback state in
// Summaries and WriteMetrics (the state of every model name the fleet does
// not serve explicitly).
const FallbackModel = "(unserved)"

var (
	_ Policy         = (*CacheAware)(nil)
	_ Learner        = (*CacheAware)(nil)
	_ TokenRates     = (*CacheAware)(nil)
	_ CacheForgetter = (*CacheAware)(nil)
	_ MetricsWriter  = (*CacheAware)(nil)
	_ Summarizer     = (*CacheAware)(nil)
	_ Sweeper        = (*CacheAware)(nil)
	_ QueueEstimator = (*CacheAware)(nil)
	_ Holder         = (*CacheAware)(nil)
)

// modelState is the routing memory of one model (or of the fallback).
type modelState struct {
	name     []byte // the model, or FallbackModel: its bindings' model in the shared store
	sessions *sessionshard.Sessions
	tree     *radix.Tree
	rates    *xsync.MapOf[uint32, *rates] // learned per worker (estimate.go)
	// requests and placements count Selects with a key and the placements
	// among them (estimate.go, turnsPerPlacement).
	requests, placements atomic.Uint64
	pool                 *rates        // learned from every worker's answers (estimate.go)
	ref                  *reference    // what speeds are measured against (reference.go)
	elapsed              requestTime   // mean request duration: returns' time constant (returns.go)
	lastAnswer           atomic.Uint64 // worker id << 32 | float32 odds of the latest answer (returns.go)
	fallback             bool          // shared by unserved model names: affinity only within req.Workers
}

// NewCacheAware returns the cache-aware policy over reg's workers.
func NewCacheAware(reg *loadview.Registry, cfg CacheAwareConfig, rnd func() uint64) *CacheAware {
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = time.Hour
	}
	if cfg.ConversationTTL <= 0 {
		cfg.ConversationTTL = DefaultConversationTTL
	}
	if cfg.BalanceRel <= 0 {
		cfg.BalanceRel = 1.5
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	c := &CacheAware{cfg: cfg, reg: reg, rnd: rnd, models: xsync.NewMapOf[string, *modelState](), shared: cfg.Shared,
		follow: xsync.NewMapOf[uint32, *kvFollow]()}
	c.eligible = func(id uint32) bool {
		w := reg.ByID(id)
		return w != nil && w.Healthy()
	}
	reg.OnRemove(c.Forget)
	reg.OnModelsChange(c.modelsChanged)
	if c.shared != nil {
		c.shared.OnInvalidate(c.invalidated)
		c.shared.OnReconnect(c.untrack)
	}
	return c
}

// CacheAwareName is the cache-aware policy's name (--policy).
const CacheAwareName = "cache_aware"

// Name implements Policy.
func (c *CacheAware) Name() string { return CacheAwareName }

// Reads implements Policy: the whole routing view, the prefix key included.
func (c *CacheAware) Reads() Depth { return ReadsHistory }

// state returns the model's state and whether it existed before this call:
// the model's own when the fleet serves it, else the shared fallback. No
// state is created for a model name the registry does not serve.
func (c *CacheAware) state(model string) (*modelState, bool) {
	if st, ok := c.models.Load(model); ok {
		return st, true
	}
	if !c.reg.Serves(model) {
		if st := c.fallback.Load(); st != nil {
			return st, true
		}
		st := c.newState(FallbackModel, true)
		if c.fallback.CompareAndSwap(nil, st) {
			return st, false
		}
		return c.fallback.Load(), true
	}
	// model may alias a request buffer: store a copy.
	name := strings.Clone(model)
	return c.models.LoadOrCompute(name, func() *modelState { return c.newState(name, false) })
}

func (c *CacheAware) newState(name string, fallback bool) *modelState {
	return &modelState{
		name: []byte(name),
		sessions: sessionshard.NewSessions(sessionshard.Config{TTL: c.cfg.SessionTTL,
			Capacity: c.cfg.MaxSessions, Headroom: max(c.cfg.MaxSessions/8, 64), Now: c.cfg.Now}),
		tree:     radix.New(radix.Config{MaxBytesPerWorker: c.cfg.MaxTreeSize, Now: c.cfg.Now}),
		rates:    xsync.NewMapOf[uint32, *rates](),
		pool:     newRates(),
		ref:      newReference(),
		fallback: fallback,
	}
}

// Select implements Policy. See docs/design.md §4 for the decision table.
func (c *CacheAware) Select(req *Request) Choice {
	req.now = c.now() // one clock read for the session map, the tree stamps and the estimate
	st, known := c.state(req.Model)
	if !known {
		if w, label := c.sharedFirst(st, req); w != nil {
			return c.teach(st, req, w, label) // a replica that just started joins the others
		}
		return c.teach(st, req, RandomHealthy(req.Workers, c.rnd), NoTreeRandom)
	}
	var cand *loadview.Worker
	var label string
	matched := 0 // prefix characters cand holds, for a miss
	if len(req.Prefix) > 0 {
		st.requests.Add(1)
	}
	if len(req.Session) > 0 {
		if id, ok := st.sessions.GetAt(req.Session, req.now); ok {
			if w := c.reg.ByID(id); w != nil && w.Healthy() && (!(req.Subset || st.fallback) || contains(req.Workers, w)) {
				cand, label = w, SessionIDMatch
			} else {
				st.sessions.Delete(req.Session) // lazy drop: worker gone or unhealthy
			}
		}
		if cand == nil && c.shared != nil {
			if cand = c.sharedSession(st, req); cand != nil {
				label = SessionIDMatch // bound on another replica (§8.3)
			}
		}
		if cand == nil {
			if len(req.Prefix) == 0 {
				return c.teach(st, req, MinLoad(req.Workers, c.rnd), EmptyHistoryMinLoad)
			}
			cand, label, matched = c.matchPrefix(st, req, FullHistoryMatch, StaleTenantFallback, FullHistoryLowMatch)
		}
	} else {
		cand, label, matched = c.matchPrefix(st, req, CacheAffinity, FirstHealthyFallback, LowMatchMinLoad)
		if c.shared != nil {
			if w := c.sharedConversation(st, req, matched); w != nil {
				cand, label = w, ConversationMatch // its previous turn ran there (§8.3)
			}
		}
	}
	if !c.cfg.AffinityRule {
		if label != SessionIDMatch && label != ConversationMatch {
			return c.placeByTTFT(st, req, cand, label)
		}
		st.returned(cand.ID(), req.now) // the session is back from between turns (returns.go)
	}
	if cand == nil { // a min-load label: no affinity to balance against
		return c.teach(st, req, MinLoad(req.Workers, c.rnd), label)
	}
	if loadview.Imbalanced(req.Workers, cand, c.cfg.BalanceAbs, c.cfg.BalanceRel) {
		return c.teach(st, req, MinLoad(req.Workers, c.rnd), LoadBalance)
	}
	if label != SessionIDMatch && label != ConversationMatch {
		cand, label = c.placeMiss(st, req, cand, label, matched)
	}
	return c.teach(st, req, cand, label)
}

// placeByTTFT decides a miss with a key (docs/design.md §4, "Worker choice
// by estimated time to first token"): the worker with the lowest estimated
// time to first token serves. A session placed here serves its later turns
// warm wherever it goes, so moving it costs one re-prefill: this turn's,
// which the estimate counts. Labels stay those of the decision table: the
// hit label when the chosen worker holds more than the threshold of the
// key, load_balance when an affinity worker existed but another one was
// faster, the stale/low label otherwise. The load gate still overrides an
// affinity choice (then min-load serves, as load_balance).
func (c *CacheAware) placeByTTFT(st *modelState, req *Request, cand *loadview.Worker, label string) Choice {
	hit := cand != nil
	if hit && loadview.Imbalanced(req.Workers, cand, c.cfg.BalanceAbs, c.cfg.BalanceRel) {
		return c.teach(st, req, MinLoad(req.Workers, c.rnd), LoadBalance)
	}
	w, held := c.fastest(st, req)
	if w == nil {
		return c.teach(st, req, nil, label)
	}
	if !hit {
		return c.teach(st, req, w, label)
	}
	if float64(held) <= c.cfg.Threshold*float64(len(req.Prefix)) {
		return c.teach(st, req, w, LoadBalance)
	}
	if w != cand && loadview.Imbalanced(req.Workers, w, c.cfg.BalanceAbs, c.cfg.BalanceRel) {
		return c.teach(st, req, MinLoad(req.Workers, c.rnd), LoadBalance)
	}
	return c.teach(st, req, w, label)
}

// placeMiss decides a session miss that has prefix affinity to cand. A
// miss places a session for all its later turns, and the prefix a new
// session matches is mostly what many sessions share (system prompt, tool
// schemas): following it would pile every new session onto whichever worker
// served that prefix last, long before the load gates fire. So affinity to
// a worker busier than the least-loaded one must pay for itself: the
// characters it saves over the least-loaded worker's own match must reach
// AffinityCharsPerRequest per extra request in flight. Else the
// least-loaded worker serves: with the hit label when it holds enough of
// the prefix itself, as load_balance otherwise. A conversation forked under
// a new session id (a long session-specific match) still follows its cache.
func (c *CacheAware) placeMiss(st *modelState, req *Request, cand *loadview.Worker, label string, matched int) (*loadview.Worker, string) {
	per := int64(c.cfg.AffinityCharsPerRequest)
	least := MinLoad(req.Workers, c.rnd)
	if per <= 0 || least == nil || least == cand {
		return cand, label
	}
	extra := cand.FleetLoad() - least.FleetLoad()
	if extra <= 0 {
		return cand, label
	}
	id := least.ID()
	mine := st.tree.Match(req.Prefix, func(w uint32) bool { return w == id }).Len
	if int64(matched-mine) >= extra*per {
		return cand, label
	}
	if float64(mine) > c.cfg.Threshold*float64(len(req.Prefix)) {
		return least, label
	}
	return least, LoadBalance
}

// matchPrefix probes the tree with req.Prefix. It returns the affinity worker,
// hit and the characters it holds, or nil and stale (the best holder is gone
// or unhealthy) or low.
func (c *CacheAware) matchPrefix(st *modelState, req *Request, hit, stale, low string) (*loadview.Worker, string, int) {
	n := len(req.Prefix)
	if n == 0 {
		return nil, low, 0
	}
	eligible := c.eligible
	if req.Subset || st.fallback {
		eligible = func(id uint32) bool {
			w := c.reg.ByID(id)
			return w != nil && w.Healthy() && contains(req.Workers, w)
		}
	}
	m := st.tree.Match(req.Prefix, eligible)
	thr := c.cfg.Threshold * float64(n)
	if float64(m.Len) > thr {
		if w := c.reg.ByID(m.Worker); w != nil {
			return w, hit, m.Len
		}
	}
	if float64(m.AnyLen) > thr {
		return nil, stale, 0
	}
	return nil, low, 0
}

// teach records the selection: the session now lives on w and w's KV cache
// will hold the history. A nil w (no healthy worker) teaches nothing. The
// Choice carries what w held of the key before, for Observe.
func (c *CacheAware) teach(st *modelState, req *Request, w *loadview.Worker, label string) Choice {
	if w == nil {
		return Choice{Decision: label}
	}
	id := w.ID()
	pub := false
	if len(req.Session) > 0 && label != SessionIDMatch {
		st.sessions.SetAt(req.Session, id, req.now)
		if c.shared != nil {
			pub = c.publish(st, req.Session, w, req.now, c.cfg.SessionTTL)
		}
	} else if c.shared != nil && len(req.Session) == 0 {
		pub = c.publishConversation(st, req, w)
	}
	ch := Choice{Worker: w, Decision: label, st: st, keyLen: len(req.Prefix), pub: pub}
	if len(req.Prefix) > 0 {
		var full bool
		if ch.held, ch.heldAt, full = st.tree.HoldAt(req.Prefix, id, req.now); !full {
			st.tree.InsertAt(req.Prefix, id, req.now)
		}
	}
	// A worker removed while this selection ran was forgotten before it was
	// taught here: forget it again, or its tree entries would stay for good.
	if !w.Healthy() && c.reg.ByID(id) == nil {
		st.sessions.RemoveWorker(id)
		st.tree.RemoveWorker(id)
		st.rates.Delete(id)
	}
	return ch
}

// Forget drops a removed worker's sessions and tree entries in every model;
// NewCacheAware subscribes it to the registry's removals.
func (c *CacheAware) Forget(w *loadview.Worker) {
	c.follow.Delete(w.ID())
	c.each(func(_ string, st *modelState) {
		st.sessions.RemoveWorker(w.ID())
		st.tree.RemoveWorker(w.ID())
		st.rates.Delete(w.ID())
	})
}

// ForgetCache drops w's history-tree entries in every model, for when its
// engine's prefix cache was emptied (a fleet-wide /reset_prefix_cache or
// /sleep, docs/design.md §8.4). Sessions and learned rates stay: the
// binding is still right, the next turn re-prefills where it is.
func (c *CacheAware) ForgetCache(w *loadview.Worker) {
	c.each(func(_ string, st *modelState) { st.tree.RemoveWorker(w.ID()) })
}

// modelsChanged drops what a worker holds in the models it no longer
// serves (a LoRA adapter unloaded at run time, docs/design.md §8.4): its
// sessions there go to placement again, its tree entries and rates go.
// Other models' state is untouched.
func (c *CacheAware) modelsChanged(ch loadview.ModelChange) {
	id := ch.Worker.ID()
	for _, m := range ch.Removed {
		if st, ok := c.models.Load(m); ok {
			st.sessions.RemoveWorker(id)
			st.tree.RemoveWorker(id)
			st.rates.Delete(id)
		}
	}
}

// each calls f for every state: the served models', then the fallback
// (named FallbackModel) if it exists.
func (c *CacheAware) each(f func(model string, st *modelState)) {
	c.models.Range(func(model string, st *modelState) bool {
		f(model, st)
		return true
	})
	if st := c.fallback.Load(); st != nil {
		f(FallbackModel, st)
	}
}

// Sweep drops the states of models the registry no longer serves, then
// expired sessions, sessions of unregistered workers, and the oldest
// sessions past capacity, in every remaining state. Returns how many
// sessions went (those of dropped states included).
func (c *CacheAware) Sweep() int {
	if c.shared != nil {
		c.refresh()
	}
	valid := func(id uint32) bool { return c.reg.ByID(id) != nil }
	n := 0
	workers := c.reg.Workers()
	c.models.Range(func(model string, st *modelState) bool {
		if !c.reg.Serves(model) {
			c.models.Delete(model)
			n += st.sessions.Len()
			return true
		}
		n += st.sessions.Sweep(valid)
		c.applyCapacities(st, workers)
		return true
	})
	if st := c.fallback.Load(); st != nil {
		n += st.sessions.Sweep(valid)
		c.applyCapacities(st, workers)
	}
	return n
}

// applyCapacities applies every worker's stated capacity to st's tree
// (applyCapacity): a capacity the scrape learned, or a trim that a
// worker's answers have not triggered yet, takes effect by the next sweep.
func (c *CacheAware) applyCapacities(st *modelState, ws []*loadview.Worker) {
	for _, w := range ws {
		r, _ := st.rates.Load(w.ID())
		c.applyCapacity(st, w, r)
	}
}

// States returns how many routing states exist: served models with state,
// plus one for the fallback once used. At most len(reg.Models()) + 1 after
// a Sweep.
func (c *CacheAware) States() int {
	n := c.models.Size()
	if c.fallback.Load() != nil {
		n++
	}
	return n
}

// writeSharedMetrics writes the worker step's use of the shared store
// (§8.3): lookups of local misses by result (hit: the binding's worker
// serves; miss: none; stale: its worker is unknown here, unhealthy or
// excluded; down: Redis unavailable, routed on local state), publishes
// (queued or dropped), invalidations applied and local sessions dropped on
// reconnect.
func (c *CacheAware) writeSharedMetrics(w io.Writer) {
	s := &c.sharedStats
	for _, r := range []struct {
		name string
		v    *atomic.Uint64
	}{
		{`vllm_router_shared_lookups_total{result="hit"}`, &s.hit},
		{`vllm_router_shared_lookups_total{result="miss"}`, &s.miss},
		{`vllm_router_shared_lookups_total{result="stale"}`, &s.stale},
		{`vllm_router_shared_lookups_total{result="down"}`, &s.down},
		{`vllm_router_shared_publishes_total{result="queued"}`, &s.published},
		{`vllm_router_shared_publishes_total{result="dropped"}`, &s.dropped},
		{`vllm_router_shared_invalidations_total`, &s.invalidated},
		{`vllm_router_shared_resync_dropped_sessions_total`, &s.cleared},
	} {
		metrics.WriteCounterUint64(w, r.name, r.v.Load())
	}
}

// WriteMetrics writes the state gauges in Prometheus text format:
// vllm_router_sessions{model}, vllm_router_sessions_refused_total{model}
// (new sessions not stored at the session map's hard limit),
// vllm_router_tree_chars{model,worker} and vllm_router_tree_bytes{model,worker}
// (what MaxTreeSize bounds), vllm_router_tree_budget_chars{model,worker}
// (the worker's budget from its stated KV capacity, when it states one),
// the learned rates of the estimate
// (vllm_router_ttft_queue_seconds{model,worker},
// vllm_router_ttft_prefill_seconds_per_token{model,worker},
// vllm_router_chars_per_token{model,worker}, and the measured speed that
// speeds.go reads relative to the fleet, vllm_router_ttft_speed{model,worker}),
// and per worker, summed over
// models, the prefix tokens the tree predicted cached and the cached_tokens
// the worker reported (vllm_router_prefix_tokens_predicted_total{worker},
// vllm_router_prefix_tokens_served_total{worker}; both counted only for
// answers that reported cached_tokens) and the tree corrections
// (vllm_router_tree_corrections_total{worker}, those KV events made
// included); once KV events arrive (kvfollow.go), the evictions they made
// (vllm_router_tree_kv_evictions_total) and the caches they cleared
// (vllm_router_tree_kv_clears_total). Label values are escaped by
// promtext. The series number at most (served models + 1) × (2 + 7 ×
// workers) + 3 × workers: model names clients send cannot add any (see
// CacheAware).
func (c *CacheAware) WriteMetrics(w io.Writer) {
	type counts struct{ predicted, served, corrections uint64 }
	perWorker := map[string]*counts{}
	for _, s := range c.Summaries(0) {
		model := promtext.Label("model", s.Model)
		metrics.WriteGaugeUint64(w, `vllm_router_sessions{`+model+`}`, uint64(s.Sessions))
		metrics.WriteCounterUint64(w, `vllm_router_sessions_refused_total{`+model+`}`, s.SessionsRefused)
		for _, ws := range s.Workers {
			labels := model + `,` + promtext.Label("worker", ws.Worker)
			metrics.WriteGaugeUint64(w, `vllm_router_tree_chars{`+labels+`}`, uint64(ws.TreeChars))
			metrics.WriteGaugeUint64(w, `vllm_router_tree_bytes{`+labels+`}`, uint64(ws.TreeBytes))
			if ws.TreeBudgetChars > 0 {
				metrics.WriteGaugeUint64(w, `vllm_router_tree_budget_chars{`+labels+`}`, uint64(ws.TreeBudgetChars))
			}
			if ws.Rates == nil {
				continue
			}
			metrics.WriteGaugeFloat64(w, `vllm_router_ttft_queue_seconds{`+labels+`}`, ws.Rates.QueueSeconds)
			metrics.WriteGaugeFloat64(w, `vllm_router_ttft_prefill_seconds_per_token{`+labels+`}`, ws.Rates.PrefillSeconds)
			metrics.WriteGaugeFloat64(w, `vllm_router_chars_per_token{`+labels+`}`, ws.Rates.CharsPerToken)
			metrics.WriteGaugeFloat64(w, `vllm_router_ttft_speed{`+labels+`}`, ws.Rates.Speed)
			n := perWorker[ws.Worker]
			if n == nil {
				n = &counts{}
				perWorker[ws.Worker] = n
			}
			n.predicted += ws.PredictedTokens
			n.served += ws.ServedTokens
			n.corrections += ws.Corrections
		}
	}
	names := make([]string, 0, len(perWorker))
	for name := range perWorker {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		n, l := perWorker[name], promtext.Label("worker", name)
		metrics.WriteCounterUint64(w, `vllm_router_prefix_tokens_predicted_total{`+l+`}`, n.predicted)
		metrics.WriteCounterUint64(w, `vllm_router_prefix_tokens_served_total{`+l+`}`, n.served)
		metrics.WriteCounterUint64(w, `vllm_router_tree_corrections_total{`+l+`}`, n.corrections)
	}
	if c.kvApplied.Load() > 0 {
		metrics.WriteCounterUint64(w, `vllm_router_tree_kv_evictions_total`, c.kvEvictions.Load())
		metrics.WriteCounterUint64(w, `vllm_router_tree_kv_clears_total`, c.kvCleared.Load())
	}
	if c.shared != nil {
		c.writeSharedMetrics(w)
	}
}

// Summary describes one model's routing memory (GET /debug/sessions).
// The fallback state (see CacheAware) has Model FallbackModel and
// Fallback true.
type Summary struct {
	Model           string          `json:"model"`
	Fallback        bool            `json:"fallback,omitempty"`
	Sessions        int             `json:"sessions"`
	SessionsRefused uint64          `json:"sessions_refused,omitempty"`
	TreeChars       int             `json:"tree_chars"`
	Workers         []WorkerSummary `json:"workers"`
	Recent          []SessionEntry  `json:"recent,omitempty"`
}

// WorkerSummary is one worker's share of a model's memory.
type WorkerSummary struct {
	Worker    string `json:"worker"`
	Sessions  int    `json:"sessions"`
	TreeChars int    `json:"tree_chars"`
	TreeBytes int    `json:"tree_bytes"` // charged against MaxTreeSize
	// TreeBudgetChars is the worker's own budget in the tree, from the KV
	// capacity its engine states (docs/design.md §4, "The tree's
	// budget"); 0 when it states none.
	TreeBudgetChars int `json:"tree_budget_chars,omitempty"`
	// Rates is the learned estimate (nil until the worker served this model
	// through Observe); the counters are Observe's (see WriteMetrics).
	Rates           *Rates `json:"rates,omitempty"`
	PredictedTokens uint64 `json:"prefix_tokens_predicted,omitempty"`
	ServedTokens    uint64 `json:"prefix_tokens_served,omitempty"`
	Corrections     uint64 `json:"tree_corrections,omitempty"`
}

// SessionEntry is one session-map entry.
type SessionEntry struct {
	Session    string  `json:"session"`
	Worker     string  `json:"worker"`
	IdleSecond float64 `json:"idle_seconds"`
}

// Summaries returns every model's summary (sorted by model, the fallback
// last), each with up to recent most recently used sessions.
func (c *CacheAware) Summaries(recent int) []Summary {
	var out []Summary
	c.each(func(model string, st *modelState) {
		out = append(out, c.summarize(model, st, recent))
	})
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Fallback != out[j].Fallback {
			return out[j].Fallback
		}
		return out[i].Model < out[j].Model
	})
	return out
}

func (c *CacheAware) summarize(model string, st *modelState, recent int) Summary {
	s := Summary{Model: model, Fallback: st.fallback, Sessions: st.sessions.Len(),
		SessionsRefused: st.sessions.Refused(), TreeChars: st.tree.Chars()}
	per := st.sessions.PerWorker()
	ids := map[uint32]bool{}
	for id := range per {
		ids[id] = true
	}
	for _, id := range st.tree.Workers() {
		ids[id] = true
	}
	st.rates.Range(func(id uint32, _ *rates) bool {
		ids[id] = true
		return true
	})
	for id := range ids {
		ws := WorkerSummary{Worker: c.workerName(id), Sessions: per[id],
			TreeChars: st.tree.WorkerChars(id), TreeBytes: st.tree.WorkerBytes(id), TreeBudgetChars: st.tree.WorkerBudget(id)}
		if r, ok := st.rates.Load(id); ok {
			rs := r.get()
			ws.Rates = &rs
			ws.PredictedTokens, ws.ServedTokens, ws.Corrections = r.predicted.Load(), r.served.Load(), r.corrections.Load()
		}
		s.Workers = append(s.Workers, ws)
	}
	sort.Slice(s.Workers, func(i, j int) bool { return s.Workers[i].Worker < s.Workers[j].Worker })
	if recent > 0 {
		now := c.now()
		st.sessions.Range(func(key string, w uint32, last int64) bool {
			s.Recent = append(s.Recent, SessionEntry{Session: key, Worker: c.workerName(w), IdleSecond: float64(now-last) / 1e9})
			return true
		})
		sort.Slice(s.Recent, func(i, j int) bool { return s.Recent[i].IdleSecond < s.Recent[j].IdleSecond })
		if len(s.Recent) > recent {
			s.Recent = s.Recent[:recent]
		}
	}
	return s
}

func (c *CacheAware) workerName(id uint32) string {
	if w := c.reg.ByID(id); w != nil {
		return w.URL()
	}
	return "gone#" + strconv.FormatUint(uint64(id), 10)
}

func (c *CacheAware) now() int64 {
	if c.cfg.Now != nil {
		return c.cfg.Now()
	}
	return time.Now().UnixNano()
}

func contains(ws []*loadview.Worker, w *loadview.Worker) bool {
	for _, o := range ws {
		if o == w {
			return true
		}
	}
	return false
}

// HolderOf returns the healthy worker holding req's history now, or nil:
// the one its session is bound to or, without a session key, the one
// holding the longest eligible match of its prefix key when that is at
// least half of it. It teaches nothing.
func (c *CacheAware) HolderOf(req *Request) *loadview.Worker {
	st, ok := c.models.Load(req.Model)
	if !ok {
		return nil
	}
	if len(req.Session) > 0 {
		id, ok := st.sessions.GetAt(req.Session, c.now())
		if w := c.reg.ByID(id); ok && w != nil && w.Healthy() {
			return w
		}
		return nil
	}
	if len(req.Prefix) == 0 {
		return nil
	}
	if m := st.tree.Match(req.Prefix, c.eligible); 2*m.Len >= len(req.Prefix) {
		return c.reg.ByID(m.Worker)
	}
	return nil
}
