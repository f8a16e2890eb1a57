// Package fastproxy is warmroute's HTTP front end. An inference request
// passes its stages in order (docs/design.md §2), each a type in a file of
// its own: the view (view.go) → admit (admit.go) → the model step
// (modelstep.go) → the worker step (workerstep.go) → forward (forward.go:
// the loop; attempt.go: one attempt; retry.go: the retry decision) → the
// relay of a stream (relay.go) → learn (package learn, fed by the attempt
// and the relay). Server (handler.go) only wires them. Beside the request
// path: the endpoint table (paths.go), the admin surfaces (admin.go,
// fleetadmin.go) and their access rules (auth.go), the operator's page
// (opsview.go) and the metrics listener (listener.go).
package fastproxy

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/admission"
	"github.com/warmroute/warmroute/kvevents"
	"github.com/warmroute/warmroute/learn"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/sharedstate"
	"github.com/warmroute/warmroute/tenantlimit"
	"github.com/warmroute/warmroute/tracing"
)

// Config configures a Server.
type Config struct {
	Registry        *loadview.Registry
	Policy          route.Policy
	Models          *saar.Router  // model step for logical models; nil: physical models only
	MaxPayloadSize  int           // --max-payload-size (bytes): larger bodies get 413
	RequestTimeout  time.Duration // --request-timeout-secs: upstream deadline; 504 when exceeded
	RetryMaxRetries int           // --retry-max-retries: attempts in all, ≥ 1
	RetryBackoff    time.Duration // first backoff; doubles per attempt, with jitter
	RetryMaxBackoff time.Duration
	APIKey          string        // --api-key: bearer token sent to workers
	ReadTimeout     time.Duration // client: time to read a request's body once its headers are in (slow clients are cut)
	IdleTimeout     time.Duration // client: keep-alive idle limit
	// ClientHeaderTimeout (--client-header-timeout-secs, default 60 s): time
	// for a request's headers to arrive, from the connection's accept for
	// its first request (a connection that sends no byte is closed after
	// it), from the first byte for later ones.
	ClientHeaderTimeout time.Duration
	Logger              *slog.Logger
	Rand                func() uint64 // jitter source; nil = math/rand/v2

	// AdminAPIKey (--admin-api-key) opens the admin surfaces on the inference
	// port to a bearer token equal to it; empty: they are not there (404).
	AdminAPIKey string
	// ClientAPIKeys (--client-api-keys): the lines of the key file; when it
	// holds keys, inference and worker endpoints need one of them as a
	// bearer token or, without one, in x-api-key (401 otherwise). A line
	// may give its tenant limits (parseClientKeys; docs/design.md §8, "Tenant limits"),
	// counted in Shared when set, else in the process.
	ClientAPIKeys []string
	// RequestIDHeaders (--request-id-headers): where a client's request id is
	// read from, first present wins; one is generated when none is. The id
	// goes upstream and back as x-request-id and is in every log line.
	RequestIDHeaders []string
	// ExtraWorkerPaths (--extra-worker-paths) extends the worker endpoints
	// that are proxied (see workerPaths); each must pass ValidWorkerPath.
	ExtraWorkerPaths []string
	// FirstByteTimeout (--first-byte-timeout-secs): the longest wait for a
	// worker's response headers, streams included; past it the attempt
	// fails over. A non-streaming response sends its headers only when
	// complete, so this also bounds its whole generation. 0: the default,
	// 300 s; < 0: off.
	FirstByteTimeout time.Duration
	// UpstreamStallTimeout (--upstream-stall-timeout-secs): a stream whose
	// worker sends no byte for this long is cut, and continued when it can
	// be (docs/design.md §8.2). 0: the default, 120 s; < 0: off.
	UpstreamStallTimeout time.Duration
	// StreamResumeAttempts (--stream-resume-attempts): the continuations a
	// cut stream may get. 0: the default, 1; < 0: none.
	StreamResumeAttempts int
	// StreamResumeMaxBytes (--stream-resume-max-bytes): the text of an
	// answer the relay keeps to continue it; past it the stream is not
	// continuable. 0: the default, 1 MiB.
	StreamResumeMaxBytes int
	// StreamStallTimeout: a streaming client that accepts no byte for this
	// long is cut and its worker slot released (default 60 s).
	StreamStallTimeout time.Duration
	// MaxConcurrentRequests (--max-concurrent-requests): requests in flight
	// past which the router answers 429 with Retry-After (default 1024; < 0 off).
	MaxConcurrentRequests int
	// The router's queue (docs/design.md §9). QueueSize (--queue-size) bounds
	// the requests waiting, all models together; 0: no queue, every request
	// goes straight to a worker up to MaxConcurrentRequests.
	QueueSize         int
	QueueTimeout      time.Duration   // --queue-timeout-secs: the longest wait (503 queue_timeout past it); counts against RequestTimeout
	QueueMaxBytes     int64           // --queue-max-bytes: bodies held while waiting (429 queue_full past it); default DefaultQueueMaxBytes
	QueueOrder        admission.Order // --queue-order
	ForwardPriority   bool            // --forward-priority: the workers get the request's priority in the body (body.go)
	TrustTenantHeader bool            // --trust-tenant-header: X-Tenant-Id names the tenant when no client key does
	// QueuePreempt (--queue-preempt): a request of priority 0 or more
	// urgent that would wait for a sequence slot on its worker takes one
	// from a background stream there, which is continued once the queue
	// releases it again (docs/design.md §9, "Preemption"). Only with a
	// queue in priority order.
	QueuePreempt bool
	// When a worker counts as full, for the queue (saturation.go):
	// SaturationWaiting (--saturation-waiting, default 0: none may wait
	// there, every request the router releases finds a free slot) requests
	// waiting in its own queue, SaturationKVUsage (--saturation-kv-usage,
	// default 0.95) of its KV cache in use, or, for a worker that reports
	// neither, SaturationQueueSecs (--saturation-queue-secs, default 2) of
	// learned queueing per request.
	SaturationWaiting   int
	SaturationKVUsage   float64
	SaturationQueueSecs float64
	// QueueHeadroom (--queue-headroom): requests per healthy worker of a
	// pool that the queue keeps for requests of priority 0 or more urgent;
	// a request of positive priority is released only past them
	// (docs/design.md §9, "Order of release"). 0: the default, 1; < 0: none.
	QueueHeadroom int
	// MaxConns bounds open client connections: past it the listener stops
	// accepting until some close (default: from the process's file limit).
	MaxConns int
	// Metrics is where the server registers its counters; nil: its own set.
	Metrics *metrics.Set
	// PD turns on disaggregated serving (docs/design.md §9, "Disaggregated
	// fleets"): a request whose worker step chooses a Prefill worker is
	// prefilled there and decoded on a Decode worker. nil: off, and every
	// worker serves whole requests whatever its role.
	PD *PDConfig
	// Reload and audit (docs/design.md §8, "Reload and audit").
	//
	// AdminAPIKeys (--admin-api-keys-file): more admin keys beside
	// AdminAPIKey, one per line as name:key (or a bare key); the name is who
	// the audit log names.
	AdminAPIKeys []string
	// Audit (--audit-log) receives one JSON line per admin call: who (the
	// admin key's name, "loopback" on a loopback metrics listener), what
	// (method, path, target) and the status. nil: no audit.
	Audit io.Writer
	// Reload re-reads the operator's files (Server.Reload: SIGHUP and POST
	// /reload); nil: POST /reload is not there (404).
	Reload func() error

	// Shared is the store router replicas share (--redis-url; docs/design.md
	// §8.3); nil: none. A response whose selection queued a binding
	// (route.Choice.Published) forwards its last byte only after the store's
	// Flush, so the next turn finds the binding on every replica.
	Shared *sharedstate.Store

	// Traces (docs/design.md §8.7). Tracer (--enable-trace) gives
	// each request not excluded a span tree, exported over OTLP, and each
	// attempt's worker a traceparent; nil: off, and the request path adds
	// nothing. The caller shuts it down after the server.
	Tracer *tracing.Tracer

	// What reaches whom (issue 33's surprises). HideWorkerHeaders
	// (--expose-worker-headers=false) leaves the worker headers
	// (x-vllm-router-worker, -base-worker, -dp-rank, -prefill-worker,
	// -decode-worker) off every answer; by default, as the vLLM router does,
	// the answers workers gave carry them. The router's own error answers
	// never do.
	HideWorkerHeaders bool
	// ModelRediscoveryInterval: a request naming a model no worker lists
	// makes the router ask every worker's /v1/models again before its 404,
	// at most one round in flight and one per this interval (rediscover.go).
	// 0: the default, DefaultModelRediscoveryInterval; < 0: off.
	ModelRediscoveryInterval time.Duration
}

// PDConfig configures the disaggregated exchange (--vllm-pd-disaggregation).
type PDConfig struct {
	// DecodePolicy (--decode-policy) chooses the decode worker among the
	// model's Decode workers; Config.Policy (--prefill-policy) chooses the
	// prefill worker. It learns from the decode legs it routed. Required.
	DecodePolicy route.Policy
	// KVHold (--pd-kv-hold-secs): how long a prefill worker keeps a
	// request's KV blocks for a decode worker to pull — vLLM's
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT. A decode leg that failed before its
	// first byte is sent again with the same kv_transfer_params within it,
	// and prefilled again after it. 0: the default, 480 s.
	KVHold time.Duration
}

// DefaultKVHold is vLLM's default VLLM_NIXL_ABORT_REQUEST_TIMEOUT.
const DefaultKVHold = 480 * time.Second

// Defaults of the waits on a worker and of stream continuation (issue 31,
// docs/design.md §8.2).
const (
	DefaultFirstByteTimeout     = 300 * time.Second // a long prefill on a loaded worker stays well inside it
	DefaultUpstreamStallTimeout = 120 * time.Second // a decoding stream sends a chunk every few tens of milliseconds
	DefaultStreamResumeMaxBytes = 1 << 20
)

// orDefault is d for 0, nothing (0) for a negative duration, else d0.
func orDefault(d0, d time.Duration) time.Duration {
	switch {
	case d0 == 0:
		return d
	case d0 < 0:
		return 0
	}
	return d0
}

func (c *Config) setDefaults() {
	if c.MaxPayloadSize <= 0 {
		c.MaxPayloadSize = DefaultMaxPayloadSize
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 1800 * time.Second
	}
	if c.RetryMaxRetries < 1 {
		c.RetryMaxRetries = 1
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = 50 * time.Millisecond
	}
	if c.RetryMaxBackoff <= 0 {
		c.RetryMaxBackoff = 30 * time.Second
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = 60 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 120 * time.Second
	}
	if c.ClientHeaderTimeout <= 0 {
		c.ClientHeaderTimeout = 60 * time.Second
	}
	if c.StreamStallTimeout <= 0 {
		c.StreamStallTimeout = 60 * time.Second
	}
	c.FirstByteTimeout = orDefault(c.FirstByteTimeout, DefaultFirstByteTimeout)
	c.ModelRediscoveryInterval = orDefault(c.ModelRediscoveryInterval, DefaultModelRediscoveryInterval)
	c.UpstreamStallTimeout = orDefault(c.UpstreamStallTimeout, DefaultUpstreamStallTimeout)
	if c.StreamResumeAttempts == 0 {
		c.StreamResumeAttempts = 1
	}
	if c.StreamResumeMaxBytes <= 0 {
		c.StreamResumeMaxBytes = DefaultStreamResumeMaxBytes
	}
	if c.MaxConcurrentRequests == 0 {
		c.MaxConcurrentRequests = DefaultMaxConcurrentRequests
	}
	if c.QueueMaxBytes <= 0 {
		c.QueueMaxBytes = DefaultQueueMaxBytes
	}
	if c.SaturationKVUsage <= 0 {
		c.SaturationKVUsage = 0.95
	}
	if c.SaturationQueueSecs <= 0 {
		c.SaturationQueueSecs = 2
	}
	if c.QueueHeadroom == 0 {
		c.QueueHeadroom = 1
	}
	if c.PD != nil && c.PD.KVHold <= 0 {
		pd := *c.PD
		pd.KVHold = DefaultKVHold
		c.PD = &pd
	}
	if len(c.RequestIDHeaders) == 0 {
		c.RequestIDHeaders = []string{"x-request-id", "x-correlation-id", "x-trace-id", "request-id"}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Rand == nil {
		c.Rand = rand.Uint64
	}
}

// DefaultMaxPayloadSize (32 MiB) holds a 128k-token conversation with its
// tool schemas (1–2 MB of JSON) many times over, and a few base64 images;
// a request in flight costs at most about 3× its body (body, history key,
// spliced copy), so the default keeps one request under ~100 MB where the
// vLLM router's 256 MB allowed ~1 GB.
const DefaultMaxPayloadSize = 32 << 20

// DefaultQueueMaxBytes (2 GiB) bounds the bodies the queue holds: a tenth
// of a 24 GB machine, 64 requests at the largest --max-payload-size, or the
// default --queue-size of 100 of 20 MB each.
const DefaultQueueMaxBytes = 2 << 30

// DefaultMaxConcurrentRequests is four vLLM workers' worth of the engine's
// default max-num-seqs (256): beyond that a fleet queues anyway, and the
// router answers 429 with Retry-After instead of holding bodies in memory.
const DefaultMaxConcurrentRequests = 1024

// Server routes and proxies requests. Safe for concurrent use.
type Server struct {
	cfg       Config
	srv       *fasthttp.Server
	auth      atomic.Pointer[authState] // the keys that admit callers; swapped whole by SetAuth
	bearer    atomic.Pointer[string]    // "Bearer --api-key" for the workers ("" none); swapped by SetAuth
	audit     auditLog
	limits    *tenantlimit.Limiter // the tenants' limits (tenantlimits.go)
	reloadMu  sync.Mutex           // one reload at a time
	paths     map[string]endpoint
	metrics   *serverMetrics
	rm        map[string]*routeMetrics
	rmAll     *routeMetrics // worker paths and the rest
	states    sync.Pool     // *reqState
	ridPrefix [8]byte       // random per process: generated request ids do not repeat across restarts
	ridSeq    atomic.Uint64
	tracer    *tracing.Tracer // nil: tracing off

	// The stages of an inference request, in order (docs/design.md §2).
	view    viewReader
	models  modelStep
	admit   admitStage
	workers workerStep
	fwd     forwarder
	learn   *learn.Room
}

// New returns a Server; call Serve or ListenAndServe to start it.
func New(cfg Config) (*Server, error) {
	if cfg.Registry == nil || cfg.Policy == nil {
		return nil, errors.New("fastproxy: Registry and Policy are required")
	}
	if cfg.PD != nil && cfg.PD.DecodePolicy == nil {
		return nil, errors.New("fastproxy: PD needs a DecodePolicy")
	}
	cfg.setDefaults()
	for _, p := range cfg.ExtraWorkerPaths {
		if !ValidWorkerPath(p) {
			return nil, fmt.Errorf("fastproxy: extra worker path %q: want an absolute path of plain segments", p)
		}
	}
	if len(cfg.RequestIDHeaders) > maxRequestIDHeaders {
		return nil, fmt.Errorf("fastproxy: %d request-id headers: at most %d", len(cfg.RequestIDHeaders), maxRequestIDHeaders)
	}
	s := &Server{
		cfg:     cfg,
		rm:      map[string]*routeMetrics{},
		paths:   newEndpointTable(cfg.ExtraWorkerPaths),
		metrics: newServerMetrics(cfg.Metrics),
		audit:   auditLog{w: cfg.Audit},
		tracer:  cfg.Tracer,
	}
	s.limits = newTenantLimiter(cfg.Shared, s.metrics.set)
	if err := s.setAuth(Auth{ClientAPIKeys: cfg.ClientAPIKeys, AdminAPIKey: cfg.AdminAPIKey, AdminAPIKeys: cfg.AdminAPIKeys, APIKey: cfg.APIKey}); err != nil {
		return nil, fmt.Errorf("fastproxy: %w", err)
	}
	binary.LittleEndian.PutUint64(s.ridPrefix[:], rand.Uint64())
	for _, p := range []string{pathChat, pathCompletions, pathResponses, pathMessages, pathEmbeddings, pathGenerate, pathGenerateTokens} {
		s.rm[p] = newRouteMetrics(s.metrics.set, p)
	}
	s.rmAll = newRouteMetrics(s.metrics.set, "other")
	s.states.New = func() any {
		st := &reqState{srv: s}
		st.onGone = st.cancel.Cancel
		st.prepare = st.prepareTicket
		return st
	}
	s.wire()
	// fasthttp's ReadTimeout runs from a connection's accept to its first
	// request's headers, and from the first byte to the headers of later
	// ones: ClientHeaderTimeout. Once the headers are in, the body has
	// ReadTimeout of its own (HeaderReceived).
	body := fasthttp.RequestConfig{ReadTimeout: cfg.ReadTimeout}
	s.srv = &fasthttp.Server{
		Handler:               s.Handler,
		ErrorHandler:          s.errorHandler,
		Name:                  "warmroute",
		MaxRequestBodySize:    cfg.MaxPayloadSize,
		ReadTimeout:           cfg.ClientHeaderTimeout,
		HeaderReceived:        func(*fasthttp.RequestHeader) fasthttp.RequestConfig { return body },
		WriteTimeout:          cfg.RequestTimeout,
		IdleTimeout:           cfg.IdleTimeout,
		ConnState:             connState, // idle connections make room for new ones (limitListener)
		ReadBufferSize:        readBufferSize,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
		SecureErrorLogMessage: true,
		Logger:                slogPrintf{cfg.Logger},
	}
	return s, nil
}

// wire builds the stages of the request path from the config.
func (s *Server) wire() {
	cfg := &s.cfg
	s.view = viewReader{depth: cfg.Policy.Reads(), models: cfg.Models, reg: cfg.Registry}
	s.view.pool.New = func() any { return new(reqview.View) }
	s.models = newModelStep(cfg.Models, cfg.Registry, s.metrics.modelFailovers, cfg.Logger)
	s.models.forwardPriority = cfg.ForwardPriority
	sat := &saturation{reg: cfg.Registry, waiting: int64(cfg.SaturationWaiting), kv: cfg.SaturationKVUsage,
		queueSecs: cfg.SaturationQueueSecs, headroom: cfg.QueueHeadroom}
	sat.queues, _ = cfg.Policy.(route.QueueEstimator)
	s.admit = admitStage{ctl: admission.New(queueConfig(cfg, sat)), sat: sat, trustTenant: cfg.TrustTenantHeader,
		rejected: s.metrics.rejected}
	s.admit.holder, _ = cfg.Policy.(route.Holder)
	s.models.health.Pool = s.admit.pool // the model step sees the pools the queue measures (overflow)
	s.workers = workerStep{policy: cfg.Policy, reg: cfg.Registry, rediscovery: &modelRediscovery{reg: cfg.Registry,
		interval: cfg.ModelRediscoveryInterval, rounds: s.metrics.modelRediscoveries, log: cfg.Logger}}
	s.workers.rates, _ = cfg.Policy.(route.TokenRates)
	s.fwd = forwarder{
		workers: &s.workers, views: &s.view, admit: &s.admit, reg: cfg.Registry, metrics: s.metrics, log: cfg.Logger,
		attempts: cfg.RetryMaxRetries, backoff: cfg.RetryBackoff, maxBackoff: cfg.RetryMaxBackoff, rand: cfg.Rand,
		timeout: cfg.RequestTimeout, firstByte: cfg.FirstByteTimeout, stall: cfg.StreamStallTimeout,
		upstreamStall: cfg.UpstreamStallTimeout, resumeAttempts: max(cfg.StreamResumeAttempts, 0),
		resumeMaxBytes: cfg.StreamResumeMaxBytes, exposeWorkers: !cfg.HideWorkerHeaders,
	}
	s.fwd.bearer = &s.bearer
	if cfg.QueuePreempt && cfg.QueueSize > 0 && cfg.QueueOrder == admission.Fair {
		s.fwd.preempt = newPreemption()
	}
	lc := learn.Config{Policy: cfg.Policy, Models: cfg.Models, Shared: cfg.Shared, Metrics: s.metrics.set}
	if cfg.PD != nil {
		s.fwd.pd = &disagg{policy: cfg.PD.DecodePolicy, hold: cfg.PD.KVHold}
		lc.DecodePolicy = cfg.PD.DecodePolicy
	}
	s.learn = learn.New(lc)
	s.followKVEvents()
}

// followKVEvents hands each worker's KV-cache events (--kv-events,
// loadview) to the policy whose tree holds that worker: the decode
// policy's for a decode worker, the worker step's for the others
// (docs/design.md §9, "KV events").
func (s *Server) followKVEvents() {
	entry, _ := s.cfg.Policy.(route.KVFollower)
	var decode route.KVFollower
	if s.cfg.PD != nil {
		decode, _ = s.cfg.PD.DecodePolicy.(route.KVFollower)
	}
	if entry == nil && decode == nil {
		return
	}
	pick := func(w *loadview.Worker) route.KVFollower {
		if w.Role() == loadview.Decode {
			return decode
		}
		return entry
	}
	s.cfg.Registry.OnKVEvents(func(w *loadview.Worker, m kvevents.Message) {
		if f := pick(w); f != nil {
			f.KVEvents(w, &m.Batch)
		}
	})
	s.cfg.Registry.OnKVResync(func(w *loadview.Worker, r kvevents.Resync) {
		if f := pick(w); f != nil {
			f.KVResync(w, r.Reason == kvevents.ResyncRestart)
		}
	})
}

// readBufferSize is the server's read buffer per open connection. A request
// up to its size arrives in one read(2) (docs/design.md §7): tau-bench's
// agent bodies are 11 KB at the median, 21 KB at p90 and 31 KB at p99, and
// 16 KiB split a quarter of them in two. It also bounds the request headers
// (431 past it).
const readBufferSize = 32 << 10

// Serve accepts connections on ln until Shutdown. ln is wrapped so that
// running out of file descriptors slows accepting down instead of ending
// Serve, and open connections stay under Config.MaxConns.
func (s *Server) Serve(ln net.Listener) error {
	return s.srv.Serve(newLimitListener(ln, s.cfg.MaxConns, s.cfg.Logger))
}

// ServeTLS is Serve over TLS with the given certificate and key files.
func (s *Server) ServeTLS(ln net.Listener, certFile, keyFile string) error {
	return s.srv.ServeTLS(newLimitListener(ln, s.cfg.MaxConns, s.cfg.Logger), certFile, keyFile)
}

// ServeTLSConfig is Serve over TLS with cfg, whose GetCertificate may
// change the certificate of new handshakes while serving (a reload).
func (s *Server) ServeTLSConfig(ln net.Listener, cfg *tls.Config) error {
	s.srv.TLSConfig = cfg
	return s.srv.ServeTLS(newLimitListener(ln, s.cfg.MaxConns, s.cfg.Logger), "", "")
}

// Shutdown stops accepting connections and waits for in-flight requests
// (streams included) until ctx ends; queued requests keep being released
// meanwhile. Those still waiting when ctx ends get 503 with Retry-After
// (shutting_down), answered before Shutdown returns.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.ShutdownWithContext(ctx)
	s.admit.ctl.Stop()
	drain, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s.admit.ctl.Drained(drain)
	return err
}

// Metrics is the set holding the server's counters (tests read it).
func (s *Server) Metrics() *metrics.Set { return s.metrics.set }

const (
	pathChat        = "/v1/chat/completions"
	pathCompletions = "/v1/completions"
	pathResponses   = "/v1/responses"
	pathMessages    = "/v1/messages"
	pathEmbeddings  = "/v1/embeddings"
	pathGenerate    = "/generate"
	// pathGenerateTokens is vLLM's tokens-in, tokens-out endpoint.
	pathGenerateTokens = "/inference/v1/generate"
	hdrRequestID       = "X-Request-Id" // canonical (SetCanonical)
)

// errorHandler answers requests fasthttp could not read. Nothing of the
// request is echoed: fasthttp's own messages quote the raw header bytes,
// which may hold credentials.
func (s *Server) errorHandler(ctx *fasthttp.RequestCtx, err error) {
	ctx.SetConnectionClose()
	var rid [32]byte
	ctx.Response.Header.SetBytesV(hdrRequestID, s.newRequestID(&rid))
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "payload_too_large",
			fmt.Sprintf("request body exceeds the router's --max-payload-size of %d bytes", s.cfg.MaxPayloadSize))
	case errors.As(err, &small):
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "headers_too_large",
			"request headers are too large")
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			writeError(ctx, fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout", "timed out reading the request")
			return
		}
		badRequest(ctx, "malformed HTTP request")
	}
}

// slogPrintf adapts slog to fasthttp's Logger.
type slogPrintf struct{ l *slog.Logger }

func (p slogPrintf) Printf(format string, args ...any) { p.l.Debug(fmt.Sprintf(format, args...)) }
