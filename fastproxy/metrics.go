package fastproxy

import (
	"strconv"
	"sync"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/route"
)

// Metric names follow the vLLM router so that dashboards carry over.
var (
	decisionCounters = func() map[string]*metrics.Counter {
		m := map[string]*metrics.Counter{}
		for _, l := range append(append([]string(nil), route.CacheAwareLabels...),
			route.PinnedWorker, route.RoundRobin, route.Random, route.PowerOfTwo, route.ConsistentHash) {
			m[l] = metrics.GetOrCreateCounter(`vllm_router_cache_aware_decisions_total{decision="` + l + `"}`)
		}
		return m
	}()
	retriesTotal     = metrics.GetOrCreateCounter(`vllm_router_retries_total`)
	retriesExhausted = metrics.GetOrCreateCounter(`vllm_router_retries_exhausted_total`)
	panicsTotal      = metrics.GetOrCreateCounter(`vllm_router_handler_panics_total`)
	modelFailovers   = metrics.GetOrCreateCounter(`vllm_router_model_failovers_total`)
	upstreamErrors   = map[string]*metrics.Counter{
		"connect": metrics.GetOrCreateCounter(`vllm_router_upstream_errors_total{kind="connect"}`),
		"timeout": metrics.GetOrCreateCounter(`vllm_router_upstream_errors_total{kind="timeout"}`),
		"status":  metrics.GetOrCreateCounter(`vllm_router_upstream_errors_total{kind="status"}`),
		"stream":  metrics.GetOrCreateCounter(`vllm_router_upstream_errors_total{kind="stream"}`),
	}
)

// countDecision increments the decision counter of label; labels are a
// closed set, so nothing else can create a series.
func countDecision(label []byte) {
	if c := decisionCounters[b2s(label)]; c != nil {
		c.Inc()
	}
}

// routeMetrics are the per-route request counters and duration histogram.
type routeMetrics struct {
	name     string
	duration latencyHistogram
	mu       sync.Mutex
	byStatus map[int]*metrics.Counter // read-mostly; a status seen once stays
	cache    [6]struct {              // lock-free fast path for the usual statuses
		status int
		c      *metrics.Counter
	}
}

func newRouteMetrics(name string) *routeMetrics {
	rm := &routeMetrics{
		name:     name,
		byStatus: map[int]*metrics.Counter{},
	}
	for i, s := range [...]int{200, 400, 404, 429, 502, 503} {
		rm.cache[i].status = s
		rm.cache[i].c = rm.counter(s)
	}
	return rm
}

func (rm *routeMetrics) counter(status int) *metrics.Counter {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	c := rm.byStatus[status]
	if c == nil {
		c = metrics.GetOrCreateCounter(`vllm_router_requests_total{route="` + rm.name + `",status="` + strconv.Itoa(status) + `"}`)
		rm.byStatus[status] = c
	}
	return c
}

func (rm *routeMetrics) count(status int) {
	for i := range rm.cache {
		if rm.cache[i].status == status {
			rm.cache[i].c.Inc()
			return
		}
	}
	rm.counter(status).Inc()
}
