// Package loadview is the worker registry: which workers exist, which models
// they serve, whether they are healthy, and how many requests each has in
// flight. Readers (every request) see an immutable snapshot published with an
// atomic pointer; writers (admin calls, health checks, discovery) are serialized
// and publish a new snapshot. Load counters are padded atomics.
//
// A worker is routable (Worker.Healthy) when its health checks pass and its
// circuit breaker, fed with request outcomes (Registry.RecordSuccess,
// RecordFailure and RecordAnswerFailure), is not Open. Unhealthy workers are
// re-probed every UnhealthyProbeInterval; Registry.ProbeSoon probes one at
// once. Registry.Admit guards the admin API with an allow-list. A worker's models (and each one's
// max_model_len) are rediscovered after every successful health check and on
// Registry.Rediscover, so LoRA adapters loaded or unloaded at run time are
// followed (models.go, docs/design.md §8.4).
//
// Several router replicas (docs/design.md §8.3): Registry.RunLoadScrapes reads
// each worker's vLLM load from /metrics, and Worker.FleetLoad blends it with
// the local in-flight count; DNSDiscovery keeps the workers in step with a
// headless service's addresses.
package loadview

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// cacheLine is the padding unit that keeps each worker's hot counter on its
// own cache line, so that requests on different workers do not false-share.
const cacheLine = 64

// loadCounters are a worker's requests in flight (the embedded counter) and,
// of them, those awaiting their first response byte, alone on their cache
// line: every request changes both.
type loadCounters struct {
	_ [cacheLine]byte
	atomic.Int64
	awaiting atomic.Int64
	_        [cacheLine - 16]byte
}

// Worker is one routable endpoint: a worker URL, or one data-parallel rank of
// it ("url@rank"). Safe for concurrent use. A *Worker stays valid after it is
// removed from the registry (requests in flight keep releasing into it), but
// it is never routed to again.
type Worker struct {
	id     uint32
	url    string // "http://h:p" or "http://h:p@rank"
	base   string // "http://h:p"
	rank   int    // data-parallel rank, -1 when not data-parallel
	rankS  string // rank as text, "" when not data-parallel
	client *fasthttp.HostClient
	up     *upstream // per base URL: client and probe-in-flight flag
	reg    *Registry // clock and breaker settings; nil only in a zero Worker
	hash   uint64    // stable hash of url, for consistent hashing
	role   Role      // fixed at Add

	inflight loadCounters

	healthy atomic.Bool              // the health checks pass (see Healthy for the whole question)
	removed atomic.Bool              // left the registry
	models  atomic.Pointer[modelSet] // nil: not discovered, serves any model (models.go)
	fixed   bool                     // models given to Add: never rediscovered
	fails   atomic.Int32             // consecutive failed health checks
	oks     atomic.Int32             // consecutive successful health checks

	// Circuit breaker (breaker.go). cbUntil is the only field the hot path
	// reads: 0 when Closed, else the unix-nano time until which the breaker
	// is Open; at or after it the breaker is HalfOpen.
	cbUntil       atomic.Int64
	errs          atomic.Int32 // consecutive failed requests while Closed
	cbOpens       atomic.Uint64
	cbOpenedAt    atomic.Int64 // unix nano of the last opening
	cbProbeFailed atomic.Bool  // a health probe started after the last opening failed
	cbMu          sync.Mutex   // serializes transitions, cbOks and cbRing
	cbOks         int          // consecutive request successes while HalfOpen
	cbRing        []int64      // times of the last CBFailureThreshold failures
	cbPos         int          // next slot of cbRing

	// Worker-reported load (scrape.go, docs/design.md §8.3).
	report        atomic.Pointer[loadReport] // nil: none yet, or the last answer was unusable
	capacity      atomic.Int64               // the most requests it was seen running while others waited; 0: not seen
	shown         atomic.Int64               // what it ran at the last report that showed requests waiting, raised by later reports that ran more with none waiting; 0: none did
	scrapeFails   atomic.Uint64
	scrapeFailing atomic.Bool   // logged as failing; cleared (and logged) on the next success
	kvCapacity    atomic.Int64  // KV capacity in tokens the engine stated at the last parsed scrape; 0: none
	kvLoadFails   atomic.Uint64 // KVLoadFailures
}

// upstream is what all ranks of one base URL share.
type upstream struct {
	client   *fasthttp.HostClient
	probing  atomic.Bool // a ProbeSoon/RunHealthChecks probe is in flight
	scraping atomic.Bool // a load scrape is in flight

	// discovering holds a token while a model discovery of the URL is in
	// flight (models.go): at most one at a time.
	discovering chan struct{}
}

// ID is the worker's registry-unique id; ids are never reused.
func (w *Worker) ID() uint32 { return w.id }

// URL is the routable name: base URL, plus "@rank" when data-parallel.
func (w *Worker) URL() string { return w.url }

// BaseURL is the URL without the data-parallel rank.
func (w *Worker) BaseURL() string { return w.base }

// Rank is the data-parallel rank, or -1.
func (w *Worker) Rank() int { return w.rank }

// RankString is the rank as decimal text, "" when not data-parallel.
func (w *Worker) RankString() string { return w.rankS }

// Hash is a stable 64-bit hash of URL(): equal on every router replica.
func (w *Worker) Hash() uint64 { return w.hash }

// Client is the upstream client shared by all ranks of one base URL.
func (w *Worker) Client() *fasthttp.HostClient { return w.client }

// Load is the number of requests in flight on this worker.
func (w *Worker) Load() int64 { return w.inflight.Load() }

// Awaiting is the number of requests in flight that have had no response
// byte yet: queued or prefilling on the worker, or, when not streamed,
// running to their end (docs/design.md §4 (6)). Other replicas' requests
// are not counted.
func (w *Worker) Awaiting() int64 { return w.inflight.awaiting.Load() }

// Acquire counts one request in flight, awaiting its first byte. Pair every
// Acquire with exactly one FirstByte and then exactly one Release; the
// counters are never reset while requests are running.
func (w *Worker) Acquire() {
	w.inflight.Add(1)
	w.inflight.awaiting.Add(1)
}

// FirstByte ends the wait of one request started with Acquire: at its first
// response byte or, when none came, at its end, before Release.
func (w *Worker) FirstByte() { w.inflight.awaiting.Add(-1) }

// Release ends one request started with Acquire.
func (w *Worker) Release() { w.inflight.Add(-1) }

// Healthy reports whether the worker may be routed to: its health checks
// pass, its circuit breaker is not Open (Closed or HalfOpen) and it has not
// been removed. Lock-free and allocation-free; it reads the clock only while
// the breaker is not Closed (to see Open turn HalfOpen lazily).
func (w *Worker) Healthy() bool {
	if !w.healthy.Load() || w.removed.Load() {
		return false
	}
	u := w.cbUntil.Load()
	return u == 0 || w.nowNano() >= u
}

// HealthCheckOK reports the health-check state alone (no breaker, no
// removal): whether the last probes passed the thresholds.
func (w *Worker) HealthCheckOK() bool { return w.healthy.Load() }

func (w *Worker) nowNano() int64 {
	if w.reg != nil {
		return w.reg.nowNano()
	}
	return time.Now().UnixNano()
}

// Models returns the models the worker serves; nil means unknown (any model).
func (w *Worker) Models() []string {
	if s := w.models.Load(); s != nil {
		return s.names
	}
	return nil
}

// ParseWorkerURL splits "http://h:p@rank" into its base URL and rank (-1 when
// absent) and checks that the URL is absolute http(s) with a host.
func ParseWorkerURL(raw string) (base string, rank int, err error) {
	raw = strings.TrimSpace(raw)
	rank = -1
	if i := strings.LastIndexByte(raw, '@'); i > strings.Index(raw, "://")+2 && i >= 0 {
		r, perr := strconv.Atoi(raw[i+1:])
		if perr == nil {
			if r < 0 {
				return "", 0, errorf("worker url %q: negative data-parallel rank", raw)
			}
			rank, raw = r, raw[:i]
		}
	}
	raw = strings.TrimRight(raw, "/")
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok || (scheme != "http" && scheme != "https") || rest == "" || strings.ContainsAny(rest, "/?#@ ") {
		return "", 0, errorf("worker url %q: want http(s)://host:port[@rank]", raw)
	}
	return raw, rank, nil
}

// newHostClient returns the upstream client of one base URL: dials bounded
// by connect (see dialer), reads and writes by timeout (the request timeout).
func newHostClient(base string, timeout, connect time.Duration, dial fasthttp.DialFunc) *fasthttp.HostClient {
	scheme, host, _ := strings.Cut(base, "://")
	return &fasthttp.HostClient{
		Addr:        addrWithPort(scheme, host),
		IsTLS:       scheme == "https",
		Name:        "warmroute",
		MaxConns:    4096,
		DialTimeout: dialer(dial, connect),
		// Below uvicorn's 5 s keep-alive (vLLM's server): a pooled connection
		// the worker already closed would otherwise fail a request.
		MaxIdleConnDuration: 4 * time.Second,
		// A request that failed on a reused connection which the worker had
		// closed is sent once more on a fresh connection to the same worker.
		RetryIfErr: func(_ *fasthttp.Request, attempts int, err error) (bool, bool) {
			return false, attempts < 2 && (errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF))
		},
		ReadTimeout:              timeout,
		WriteTimeout:             timeout,
		NoDefaultUserAgentHeader: true,
		DisablePathNormalizing:   true,
		MaxResponseBodySize:      0,
		ReadBufferSize:           16 << 10,
		WriteBufferSize:          16 << 10,
	}
}

func addrWithPort(scheme, host string) string {
	if strings.LastIndexByte(host, ':') > strings.LastIndexByte(host, ']') {
		return host
	}
	if scheme == "https" {
		return host + ":443"
	}
	return host + ":80"
}

// Hash64 is FNV-1a over b followed by a final avalanche mix: stable across
// processes and releases (consistent hashing must agree between replicas).
func Hash64(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return Mix64(h)
}

// Mix64 is the splitmix64 finalizer.
func Mix64(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}
