package saar

import (
	"io"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
	"github.com/puzpuzpuz/xsync/v3"

	"github.com/warmroute/warmroute/promtext"
)

// Metrics, in the Router's own *metrics.Set (Options.Metrics; written by
// Router.WriteMetrics):
//
//	vllm_router_saar_selections_total{model,action}
//	vllm_router_saar_switches_total{from,to,reason}
//	vllm_router_saar_hard_locks_total{kind}              kind: tool_loop | provider_state
//	vllm_router_saar_lock_breaks_total{kind}
//	vllm_router_saar_lock_conflicts_total{kind}          tool results of two models in one request
//	vllm_router_saar_index_ids{index}                    index: tool_call | response | reasoning
//	vllm_router_saar_index_bytes{index}                  estimated bytes (bounded by Options.IndexBytes)
//	vllm_router_saar_index_evicted_total{index}          ids dropped by a bound before their TTL
//	vllm_router_saar_worker_failovers_total              provider state lost (pinned worker down)
//	vllm_router_saar_continuity_violations_total         must stay 0
//	vllm_router_saar_replay_dropped_total                replay log records dropped (queue full, or after Close)
//	vllm_router_saar_replay_write_errors_total           replay log records not written (encode or write error)
//
// With a shared store (Options.Shared, docs/design.md §8.3):
//
//	vllm_router_saar_shared_locks_found_total{index}     locks found in Redis after a local miss
//	vllm_router_saar_lock_unreachable_total{kind}        turns decided with a redis_down reason
//	vllm_router_saar_shared_lock_write_failures_total    lock writes not acknowledged (kept for replay)
//	vllm_router_saar_shared_memory_loads_total           session memory records adopted from Redis
//
// Label values come only from the config (model names) and from constants
// (actions, reasons, lock kinds), escaped with promtext; a name that is not
// in the config never creates a series. Every counter a selection touches
// is created up front or cached, so the hot path does not format names.
type routerMetrics struct {
	set        *metrics.Set
	models     atomic.Pointer[modelCounters] // the config's models (SetConfig swaps them)
	hard       map[string]*metrics.Counter
	broken     map[string]*metrics.Counter
	conflicts  map[string]*metrics.Counter
	switches   *xsync.MapOf[switchKey, *metrics.Counter]
	failovers  *metrics.Counter
	violations *metrics.Counter
	dropped    *metrics.Counter
	writeErrs  *metrics.Counter
}

// modelCounters are the selection counters of one config's models.
type modelCounters struct {
	sel [][]*metrics.Counter // [model][action]
	idx map[string]int
}

// setModels creates (or finds, for a name an earlier config had) the
// selection counters of cfg's models.
func (m *routerMetrics) setModels(cfg *Config) {
	mc := &modelCounters{idx: map[string]int{}}
	for i := range cfg.Models {
		name := cfg.Models[i].Name
		mc.idx[name] = i
		row := make([]*metrics.Counter, len(actions))
		for j, a := range actions {
			row[j] = m.set.GetOrCreateCounter(`vllm_router_saar_selections_total{` +
				promtext.Label("model", name) + `,` + promtext.Label("action", a) + `}`)
		}
		mc.sel = append(mc.sel, row)
	}
	m.models.Store(mc)
}

type switchKey struct{ from, to, reason string }

// reasons are the Reason* values Decide can return: the only values of the
// reason label.
var reasons = func() map[string]bool {
	m := map[string]bool{}
	for _, r := range []string{ReasonBase, ReasonNoHealthy, ReasonToolLoop, ReasonToolLoopFallback, ReasonProviderState,
		ReasonProviderFallback, ReasonOpaqueReasoning, ReasonWorkerFailover, ReasonToolLockBroken, ReasonStateLockBroken,
		ReasonIdle, ReasonDrift, ReasonEconomics, ReasonStayEconomics, ReasonStayBest, ReasonMinTurns, ReasonCurrentDown,
		ReasonSticky, ReasonToolLoopNoOwner, ReasonProviderNoOwner, ReasonSingleTurn, ReasonNoDecision, ReasonToolLoopConflict,
		ReasonToolLoopFallbackDown, ReasonProviderFallbackDown, ReasonToolLoopNoOwnerDown, ReasonProviderNoOwnerDown, ReasonOpaqueReasoningDown, ReasonQueueOverflow} {
		m[r], m[r+reasonConflictSuffix] = true, true
	}
	return m
}()

func newRouterMetrics(cfg *Config, set *metrics.Set) *routerMetrics {
	m := &routerMetrics{
		set:        set,
		hard:       map[string]*metrics.Counter{},
		broken:     map[string]*metrics.Counter{},
		conflicts:  map[string]*metrics.Counter{},
		switches:   xsync.NewMapOf[switchKey, *metrics.Counter](),
		failovers:  set.GetOrCreateCounter(`vllm_router_saar_worker_failovers_total`),
		violations: set.GetOrCreateCounter(`vllm_router_saar_continuity_violations_total`),
		dropped:    set.GetOrCreateCounter(`vllm_router_saar_replay_dropped_total`),
		writeErrs:  set.GetOrCreateCounter(`vllm_router_saar_replay_write_errors_total`),
	}
	m.setModels(cfg)
	for _, k := range []string{LockToolLoop, LockProviderState} {
		m.hard[k] = set.GetOrCreateCounter(`vllm_router_saar_hard_locks_total{` + promtext.Label("kind", k) + `}`)
		m.broken[k] = set.GetOrCreateCounter(`vllm_router_saar_lock_breaks_total{` + promtext.Label("kind", k) + `}`)
		m.conflicts[k] = set.GetOrCreateCounter(`vllm_router_saar_lock_conflicts_total{` + promtext.Label("kind", k) + `}`)
	}
	return m
}

func (m *routerMetrics) selection(model, action string) {
	mc := m.models.Load()
	i, ok := mc.idx[model]
	if !ok {
		return
	}
	for j, a := range actions {
		if a == action {
			mc.sel[i][j].Inc()
			return
		}
	}
}

func (m *routerMetrics) hardLock(kind string) {
	if c := m.hard[kind]; c != nil {
		c.Inc()
	}
}

func (m *routerMetrics) conflict(kind string) {
	if c := m.conflicts[kind]; c != nil {
		c.Inc()
	}
}

// indexGauges exports the size of the global id indexes, read at scrape.
func (m *routerMetrics) indexGauges(tools, resps, reas *idIndex) {
	for _, x := range []struct {
		name string
		idx  *idIndex
	}{{"tool_call", tools}, {"response", resps}, {"reasoning", reas}} {
		idx, l := x.idx, promtext.Label("index", x.name)
		m.set.NewGauge(`vllm_router_saar_index_ids{`+l+`}`, func() float64 { n, _, _ := idx.stats(); return float64(n) })
		m.set.NewGauge(`vllm_router_saar_index_bytes{`+l+`}`, func() float64 { _, b, _ := idx.stats(); return float64(b) })
		m.set.NewGauge(`vllm_router_saar_index_evicted_total{`+l+`}`, func() float64 { _, _, e := idx.stats(); return float64(e) })
	}
}

func (m *routerMetrics) lockBreak(kind string) {
	if c := m.broken[kind]; c != nil {
		c.Inc()
	}
}

// switched counts a model change; models outside the config and unknown
// reasons are not counted (they would be unbounded label values).
func (m *routerMetrics) switched(from, to, reason string) {
	k := switchKey{from, to, reason}
	c, ok := m.switches.Load(k)
	if !ok {
		mc := m.models.Load()
		if _, ok := mc.idx[from]; !ok {
			return
		}
		if _, ok := mc.idx[to]; !ok || !reasons[reason] {
			return
		}
		c, _ = m.switches.LoadOrCompute(k, func() *metrics.Counter {
			return m.set.GetOrCreateCounter(`vllm_router_saar_switches_total{` + promtext.Label("from", from) + `,` +
				promtext.Label("to", to) + `,` + promtext.Label("reason", reason) + `}`)
		})
	}
	c.Inc()
}

// Metrics returns the router's metric set (Options.Metrics, or the set
// NewRouter created).
func (r *Router) Metrics() *metrics.Set { return r.met.set }

// WriteMetrics writes the router's metrics in Prometheus text format (for
// /metrics). Do not also register the set with metrics.RegisterSet, or the
// series are written twice.
func (r *Router) WriteMetrics(w io.Writer) { r.met.set.WritePrometheus(w) }
