package fastproxy

import (
	"strconv"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/promtext"
	"github.com/warmroute/warmroute/route"
)

// serverMetrics are one Server's counters, in its own metrics.Set (no
// globals: two servers in one process count apart). Names follow the vLLM
// router so that dashboards carry over. Every label value is from a closed
// set, so no client can create a series.
type serverMetrics struct {
	set              *metrics.Set
	decisions        map[string]*metrics.Counter
	retries          *metrics.Counter
	retriesExhausted *metrics.Counter
	panics           *metrics.Counter
	modelFailovers   *metrics.Counter
	upstreamErrors   map[string]*metrics.Counter // by failure kind
	authFailures     *metrics.Counter
	rejected         *metrics.Counter // over --max-concurrent-requests
	streamsCut       *metrics.Counter
	resumes          map[string]*metrics.Counter // stream continuations by outcome (resume.go)
	resumePrompt     *metrics.Counter            // the continuations' prompt tokens: the router's cost of them
	preempts         map[string]*metrics.Counter // preempted streams by outcome (preempt.go)
	// Disaggregated fleets (pd.go): requests a prefill worker was chosen
	// for, by outcome; decode legs sent again with the same
	// kv_transfer_params; the decode policy's decisions.
	pd              map[string]*metrics.Counter
	pdDecodeRetries *metrics.Counter
	decodeDecisions map[string]*metrics.Counter
	// Reloads (reload.go): by result, and when the last one succeeded.
	reloadOK, reloadErrors *metrics.Counter
	reloadLast             *metrics.Gauge

	// Rounds of /v1/models that requests for a model no worker lists
	// started (rediscover.go).
	modelRediscoveries *metrics.Counter
}

// Failure kinds of an upstream attempt (label kind of vllm_router_upstream_errors_total).
const (
	kindConnect      = "connect"            // dial refused or timed out: failed over
	kindPool         = "pool"               // the router's own connection pool to the worker was full
	kindFirstByte    = "first_byte_timeout" // no response headers within --first-byte-timeout-secs
	kindTimeout      = "timeout"            // --request-timeout-secs passed
	kindStatus       = "status"             // 408, 500, 502, 504 from the worker
	kindBackpressure = "backpressure"       // 429 or 503 from the worker
	kindInvalid      = "invalid_response"   // not a parseable HTTP response
	kindReset        = "reset"              // connection closed before the response
	kindStream       = "stream"             // a stream cut mid-way
	kindStall        = "stall"              // no stream byte within --upstream-stall-timeout-secs
	kindCanceled     = "client_gone"        // the client left before the response
)

var failureKinds = [...]string{kindConnect, kindPool, kindFirstByte, kindTimeout, kindStatus, kindBackpressure, kindInvalid, kindReset, kindStream, kindStall, kindCanceled}

func newServerMetrics(set *metrics.Set) *serverMetrics {
	if set == nil {
		set = metrics.NewSet()
	}
	m := &serverMetrics{
		set:              set,
		decisions:        map[string]*metrics.Counter{},
		retries:          set.NewCounter(`vllm_router_retries_total`),
		retriesExhausted: set.NewCounter(`vllm_router_retries_exhausted_total`),
		panics:           set.NewCounter(`vllm_router_handler_panics_total`),
		modelFailovers:   set.NewCounter(`vllm_router_model_failovers_total`),
		upstreamErrors:   map[string]*metrics.Counter{},
		authFailures:     set.NewCounter(`vllm_router_auth_failures_total`),
		rejected:         set.NewCounter(`vllm_router_rejected_requests_total`),
		streamsCut:       set.NewCounter(`vllm_router_streams_cut_total`),
		resumes:          map[string]*metrics.Counter{},
		resumePrompt:     set.NewCounter(`vllm_router_stream_resume_prompt_tokens_total`),
		pd:               map[string]*metrics.Counter{},
		pdDecodeRetries:  set.NewCounter(`vllm_router_pd_decode_retries_total`),
		decodeDecisions:  map[string]*metrics.Counter{},
		reloadOK:         set.NewCounter(`vllm_router_config_reloads_total{result="ok"}`),
		reloadErrors:     set.NewCounter(`vllm_router_config_reloads_total{result="error"}`),
		reloadLast:       set.NewGauge(`vllm_router_config_last_reload_success_timestamp_seconds`, nil),
	}
	m.reloadLast.Set(float64(time.Now().UnixNano()) / 1e9) // the start is the first load
	m.modelRediscoveries = set.NewCounter(`vllm_router_model_rediscoveries_total`)
	for _, o := range pdOutcomes {
		m.pd[o] = set.NewCounter(`vllm_router_pd_requests_total{` + promtext.Label("outcome", o) + `}`)
	}
	for _, o := range resumeOutcomes {
		m.resumes[o] = set.NewCounter(`vllm_router_stream_resumes_total{` + promtext.Label("outcome", o) + `}`)
	}
	m.preempts = map[string]*metrics.Counter{}
	for _, o := range preemptOutcomes {
		m.preempts[o] = set.NewCounter(`vllm_router_stream_preemptions_total{` + promtext.Label("outcome", o) + `}`)
	}
	for _, l := range route.Labels() {
		m.decisions[l] = set.NewCounter(`vllm_router_cache_aware_decisions_total{` + promtext.Label("decision", l) + `}`)
		m.decodeDecisions[l] = set.NewCounter(`vllm_router_pd_decode_decisions_total{` + promtext.Label("decision", l) + `}`)
	}
	for _, k := range failureKinds {
		m.upstreamErrors[k] = set.NewCounter(`vllm_router_upstream_errors_total{` + promtext.Label("kind", k) + `}`)
	}
	return m
}

// countDecision increments the decision counter of label; labels are a
// closed set, so nothing else can create a series.
func (m *serverMetrics) countDecision(label []byte) {
	if c := m.decisions[bytesconv.B2S(label)]; c != nil {
		c.Inc()
	}
}

// countDecodeDecision counts the decode policy's decision label.
func (m *serverMetrics) countDecodeDecision(label string) {
	if c := m.decodeDecisions[label]; c != nil {
		c.Inc()
	}
}

// routeMetrics are the per-route request counters and duration histogram.
type routeMetrics struct {
	name     string
	set      *metrics.Set
	duration latencyHistogram
	mu       sync.Mutex
	byStatus map[string]*metrics.Counter // read-mostly; a status seen once stays (at most ~900 values)
	cache    [6]struct {                 // lock-free fast path for the usual statuses
		status int
		c      *metrics.Counter
	}
}

func newRouteMetrics(set *metrics.Set, name string) *routeMetrics {
	rm := &routeMetrics{name: name, set: set, byStatus: map[string]*metrics.Counter{}}
	for i, s := range [...]int{200, 400, 404, 429, 502, 503} {
		rm.cache[i].status = s
		rm.cache[i].c = rm.counter(strconv.Itoa(s))
	}
	return rm
}

// counter returns the counter of status, a 3-digit code or a word such as
// "stream_cut" (a stream that began with 200 and did not end well).
func (rm *routeMetrics) counter(status string) *metrics.Counter {
	rm.mu.Lock()
	defer rm.mu.Unlock()
	c := rm.byStatus[status]
	if c == nil {
		c = rm.set.GetOrCreateCounter(`vllm_router_requests_total{` + promtext.Label("route", rm.name) + `,` + promtext.Label("status", status) + `}`)
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
	if status < 100 || status > 999 {
		status = 0
	}
	rm.counter(strconv.Itoa(status)).Inc()
}
