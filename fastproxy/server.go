// Package fastproxy is warmroute's HTTP front end: the endpoint table, the
// routing view of each request body, upstream proxying with retries and
// streaming, the router's response headers, OpenAI-style errors, the admin
// surfaces and their access rules, and the metrics/admin listener.
package fastproxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/connwatch"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/sharedstate"
	"github.com/warmroute/warmroute/upstream"
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
	ReadTimeout     time.Duration // client: time to read a request (slow clients are cut)
	IdleTimeout     time.Duration // client: keep-alive idle limit
	Logger          *slog.Logger
	Rand            func() uint64 // jitter source; nil = math/rand/v2

	// AdminAPIKey (--admin-api-key) opens the admin surfaces on the inference
	// port to a bearer token equal to it; empty: they are not there (404).
	AdminAPIKey string
	// ClientAPIKeys (--client-api-keys): when set, inference and worker
	// endpoints need one of them as a bearer token (401 otherwise).
	ClientAPIKeys []string
	// RequestIDHeaders (--request-id-headers): where a client's request id is
	// read from, first present wins; one is generated when none is. The id
	// goes upstream and back as x-request-id and is in every log line.
	RequestIDHeaders []string
	// ExtraWorkerPaths (--extra-worker-paths) extends the worker endpoints
	// that are proxied (see workerPaths); each must pass ValidWorkerPath.
	ExtraWorkerPaths []string
	// FirstByteTimeout (--first-byte-timeout-secs; 0 = off): the longest
	// wait for a worker's response headers; past it the attempt fails over.
	// A non-streaming response sends its headers only when complete, so
	// this also bounds its whole generation.
	FirstByteTimeout time.Duration
	// StreamStallTimeout: a streaming client that accepts no byte for this
	// long is cut and its worker slot released (default 60 s).
	StreamStallTimeout time.Duration
	// MaxConcurrentRequests (--max-concurrent-requests): requests in flight
	// past which the router answers 429 with Retry-After (default 1024; < 0 off).
	MaxConcurrentRequests int
	// MaxConns bounds open client connections: past it the listener stops
	// accepting until some close (default: from the process's file limit).
	MaxConns int
	// Metrics is where the server registers its counters; nil: its own set.
	Metrics *metrics.Set
	// Shared is the store router replicas share (--redis-url; docs/design.md
	// §8.3); nil: none. A response whose selection queued a binding
	// (route.Choice.Published) forwards its last byte only after the store's
	// Flush, so the next turn finds the binding on every replica.
	Shared *sharedstate.Store
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
	if c.StreamStallTimeout <= 0 {
		c.StreamStallTimeout = 60 * time.Second
	}
	if c.MaxConcurrentRequests == 0 {
		c.MaxConcurrentRequests = DefaultMaxConcurrentRequests
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

// DefaultMaxConcurrentRequests is four vLLM workers' worth of the engine's
// default max-num-seqs (256): beyond that a fleet queues anyway, and the
// router answers 429 with Retry-After instead of holding bodies in memory.
const DefaultMaxConcurrentRequests = 1024

// Server routes and proxies requests. Safe for concurrent use.
type Server struct {
	cfg        Config
	srv        *fasthttp.Server
	bearer     string
	adminKey   []byte
	clientKeys clientKeys
	paths      map[string]endpoint
	metrics    *serverMetrics
	rm         map[string]*routeMetrics
	rmAll      *routeMetrics     // worker paths and the rest
	states     sync.Pool         // *reqState
	views      sync.Pool         // *reqview.View, apart from the states: see dropView
	observers  sync.Pool         // *observer
	ca         *route.CacheAware // the policy, when it is cache-aware: it learns from every answer
	reads      viewDepth         // how much of a body the policy needs (readView)
	health     saar.Health       // the model step's view of the fleet
	inflight   atomic.Int64      // requests counted against MaxConcurrentRequests
	ridPrefix  [8]byte           // random per process: generated request ids do not repeat across restarts
	ridSeq     atomic.Uint64
	lockWait   *metrics.Histogram // time responses waited for their shared lock writes; nil: locks are local (no shared store)
}

// reqState is the pooled per-request scratch: the routing view and buffers.
type reqState struct {
	view    *reqview.View // nil once dropped (dropView)
	early   bool          // forward may drop the view once the first choice is made
	req     route.Request
	scratch []byte
	tried   [8]*loadview.Worker // backing array of the workers tried; a longer list spills to the heap
	fit     []*loadview.Worker  // the candidates whose context fits (contextfit.go); keeps its capacity
	fitBuf  [8]*loadview.Worker // fit's first backing array
	sel     saar.Selection      // the model step's choice (logical models)
	kind    reqview.Kind        // endpoint family of an inference request
	body    []byte              // the original body after a model splice; reused as the next splice buffer
	pin     *loadview.Worker    // a worker the request must go to first (provider state)
	noRetry bool                // only the pinned worker may serve
	obs     *observer           // learns from the response (model step, cache-aware policy); nil when nobody does
	spliced bool                // body holds a spliced model name; the original is in body
	model   []byte              // the JSON-unescaped model name, when it had escapes
	cancel  upstream.Canceler   // cancels a buffered upstream exchange when the client leaves
	onGone  func()              // cancel.Cancel, bound once per pooled state
	watch   connwatch.Conn      // the client's registration when its connection keeps none (see do)
	ranked  bool                // an attempt set the data-parallel rank header on the request
}

// modelName is the request's model name, JSON-unescaped (clients that escape
// "/" send "org\/name"); it aliases the body or st.model.
func (st *reqState) modelName() string {
	m := st.view.Model
	if bytes.IndexByte(m, '\\') >= 0 {
		m = bodyKey(m, &st.model)
	}
	return b2s(m)
}

// New returns a Server; call Serve or ListenAndServe to start it.
func New(cfg Config) (*Server, error) {
	if cfg.Registry == nil || cfg.Policy == nil {
		return nil, errors.New("fastproxy: Registry and Policy are required")
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
		cfg:        cfg,
		rm:         map[string]*routeMetrics{},
		paths:      newEndpointTable(cfg.ExtraWorkerPaths),
		clientKeys: newClientKeys(cfg.ClientAPIKeys),
		metrics:    newServerMetrics(cfg.Metrics),
	}
	if cfg.APIKey != "" {
		s.bearer = "Bearer " + cfg.APIKey
	}
	if cfg.AdminAPIKey != "" {
		s.adminKey = []byte(cfg.AdminAPIKey)
	}
	binary.LittleEndian.PutUint64(s.ridPrefix[:], rand.Uint64())
	for _, p := range []string{pathChat, pathCompletions, pathResponses, pathMessages, pathEmbeddings, pathGenerate, pathGenerateTokens} {
		s.rm[p] = newRouteMetrics(s.metrics.set, p)
	}
	s.rmAll = newRouteMetrics(s.metrics.set, "other")
	s.ca, _ = cfg.Policy.(*route.CacheAware)
	switch {
	case s.ca != nil:
		s.reads = readAll
	case cfg.Policy.Name() == route.ConsistentHash:
		s.reads = readSession
	default:
		s.reads = readModel
	}
	s.observers.New = func() any { return new(observer) }
	s.views.New = func() any { return new(reqview.View) }
	s.states.New = func() any {
		st := new(reqState)
		st.onGone = st.cancel.Cancel
		return st
	}
	s.health = s.newHealth()
	if cfg.Models != nil && cfg.Models.SharesLocks() {
		s.lockWait = s.metrics.set.GetOrCreateHistogram("vllm_router_lock_write_wait_seconds")
	}
	s.srv = &fasthttp.Server{
		Handler:               s.Handler,
		ErrorHandler:          s.errorHandler,
		Name:                  "warmroute",
		MaxRequestBodySize:    cfg.MaxPayloadSize,
		ReadTimeout:           cfg.ReadTimeout,
		WriteTimeout:          cfg.RequestTimeout,
		IdleTimeout:           cfg.IdleTimeout,
		ReadBufferSize:        readBufferSize,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
		SecureErrorLogMessage: true,
		Logger:                slogPrintf{cfg.Logger},
	}
	return s, nil
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

// Shutdown stops accepting connections and waits for in-flight requests
// (streams included) until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.ShutdownWithContext(ctx) }

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

// Handler is the fasthttp handler for the router's inference listener.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	path, ep, ok := s.endpointOf(ctx)
	rm := s.rm[path]
	if rm == nil {
		rm = s.rmAll
	}
	var ridBuf [128]byte
	rid := s.requestID(ctx, &ridBuf)
	clientClose := ctx.Request.Header.ConnectionClose() // forward drops the client's Connection header
	defer func() {
		if clientClose {
			ctx.SetConnectionClose()
		}
		if p := recover(); p != nil {
			s.metrics.panics.Inc()
			s.cfg.Logger.Error("handler panic", "request_id", string(rid), "path", path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			ctx.Response.Reset()
			writeError(ctx, fasthttp.StatusInternalServerError, "internal_error", "internal_error", "internal router error")
		}
		ctx.Response.Header.SetCanonical(s2b(hdrRequestID), rid)
		s.metrics.countDecision(ctx.Response.Header.Peek(hdrDecision))
		// ctx.Time: when fasthttp began serving the request. A stream ends
		// after the handler returns: its relay counts and times it.
		if r, ok := ctx.Response.BodyStream().(*relay); ok {
			r.rm, r.start = rm, ctx.Time()
		} else {
			rm.count(ctx.Response.StatusCode())
			rm.duration.observe(time.Since(ctx.Time()))
		}
	}()
	if !ok {
		badRequest(ctx, "the request path must be sent in normalized form (no dot segments or encoded separators)")
		return
	}
	switch ep {
	case epLiveness:
		s.liveness(ctx)
		return
	case epReadiness:
		s.readiness(ctx)
		return
	case epUnknown:
		noRoute(ctx)
		return
	case epAdmin, epFleetAdmin:
		if s.admitAdmin(ctx, adminKeyOnly) {
			s.adminEndpoint(ctx, path, ep)
		}
		return
	case epMetrics:
		if s.admitAdmin(ctx, adminKeyOnly) {
			ctx.SetContentType("text/plain; version=0.0.4")
			s.WriteMetrics(ctx)
		}
		return
	}
	if !s.admitClient(ctx) {
		return
	}
	if ep == epModels {
		s.models(ctx)
		return
	}
	if !s.acquireSlot(ctx) {
		return
	}
	defer s.inflight.Add(-1)
	switch ep {
	case epChat:
		s.inference(ctx, reqview.Chat)
	case epCompletions:
		s.inference(ctx, reqview.Completions)
	case epResponses:
		s.inference(ctx, reqview.Responses)
	case epMessages:
		s.inference(ctx, reqview.Messages)
	case epGenerateTokens:
		s.inference(ctx, reqview.Generate)
	case epEmbeddings:
		s.inference(ctx, reqview.Other)
	case epResponseByID:
		s.responseByID(ctx, path[len(pathResponses)+1:])
	case epWorkerPath:
		s.passThrough(ctx)
	}
}

// acquireSlot counts the request against MaxConcurrentRequests, or answers
// 429 with Retry-After and returns false. The caller releases the slot.
func (s *Server) acquireSlot(ctx *fasthttp.RequestCtx) bool {
	n := s.inflight.Add(1)
	if limit := s.cfg.MaxConcurrentRequests; limit > 0 && n > int64(limit) {
		s.inflight.Add(-1)
		s.metrics.rejected.Inc()
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		writeError(ctx, fasthttp.StatusTooManyRequests, "rate_limit_error", "router_busy",
			"the router is at --max-concurrent-requests; retry shortly")
		return false
	}
	return true
}

// requestID returns the request's id: the first configured request-id
// header (in the order of RequestIDHeaders) whose first value the client
// sent as 1 to 128 printable ASCII bytes, else a generated one. The
// request then carries it as its only X-Request-Id, so that it also goes
// upstream. One pass over the headers finds it, rather than a lookup per
// configured name, each of which normalizes a copy of the name and scans
// every header. The result aliases the request header or buf.
func (s *Server) requestID(ctx *fasthttp.RequestCtx, buf *[128]byte) []byte {
	h := &ctx.Request.Header
	names := s.cfg.RequestIDHeaders
	var id []byte
	var seen uint64 // names whose first value was seen (New allows at most 64)
	best, rids := len(names), 0
	for k, v := range h.All() {
		if len(k) == len(hdrRequestID) && bytes.EqualFold(k, s2b(hdrRequestID)) {
			rids++
		}
		for i, name := range names[:best] {
			if len(k) != len(name) || seen&(1<<i) != 0 || !bytes.EqualFold(k, s2b(name)) {
				continue
			}
			seen |= 1 << i
			if len(v) > 0 && len(v) <= 128 && printableASCII(v) {
				id, best = v, i
			}
			break
		}
	}
	if id != nil && rids == 1 && len(names[best]) == len(hdrRequestID) && bytes.EqualFold(s2b(names[best]), s2b(hdrRequestID)) {
		return id
	}
	if id == nil {
		id = s.newRequestID((*[32]byte)(buf[:32]))
	} else {
		id = buf[:copy(buf[:], id)]
	}
	if rids > 0 {
		h.Del(hdrRequestID) // every copy: the worker sees one id
	}
	h.SetCanonical(s2b(hdrRequestID), id)
	return id
}

// maxRequestIDHeaders bounds Config.RequestIDHeaders (requestID marks the
// names it saw in one 64-bit word).
const maxRequestIDHeaders = 64

// newRequestID writes a fresh request id into buf and returns it: 32 hex
// digits of a per-process random prefix and a sequence number.
func (s *Server) newRequestID(buf *[32]byte) []byte {
	binary.LittleEndian.PutUint64(buf[16:24], s.ridSeq.Add(1))
	copy(buf[24:], s.ridPrefix[:])
	hex.Encode(buf[:], buf[16:])
	return buf[:]
}

func printableASCII(b []byte) bool {
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// inference routes a JSON inference request by its routing view.
func (s *Server) inference(ctx *fasthttp.RequestCtx, kind reqview.Kind) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	st := s.getState()
	defer s.releaseState(st)
	v := st.view
	if err := s.readView(st, ctx.PostBody(), kind); err != nil {
		badRequest(ctx, "request body is not a valid JSON object: "+err.Error())
		return
	}
	st.req = route.Request{
		Model:   st.modelName(),
		Session: sessionKey(&ctx.Request.Header, v, &st.scratch),
		Prefix:  routingKey(v, kind),
	}
	if kind == reqview.Generate && st.req.Model == "" {
		// The model is optional on /inference/v1/generate: the engine's own.
		if ms := s.cfg.Registry.Models(); len(ms) == 1 {
			st.req.Model = ms[0]
		}
	}
	st.kind = kind
	logical := s.cfg.Models != nil && s.cfg.Models.IsLogical(st.req.Model)
	if logical && !s.selectModel(ctx, st, s.health) {
		return
	}
	workers, ok := s.cfg.Registry.ForModel(s2b(st.req.Model))
	if !ok {
		if len(st.req.Model) > 0 {
			notFound(ctx, "model_not_found", "The model `"+clip(st.req.Model, 256)+"` does not exist.")
		} else {
			noWorker(ctx, nil)
		}
		return
	}
	st.req.Workers = workers
	s.fitContext(st, ctx.PostBody())
	forSAAR := logical || (kind == reqview.Responses && s.cfg.Models != nil)
	if forSAAR || s.ca != nil {
		st.obs = s.newObserver(st, forSAAR)
	}
	st.early = !forSAAR
	s.forward(ctx, st, v.Stream)
	if logical && s.failoverModel(ctx, st) {
		s.forward(ctx, st, v.Stream)
	}
	if logical {
		setModelHeaders(ctx, &st.sel)
	}
}

// routingKey is the key of kind's request in the prefix tree.
func routingKey(v *reqview.View, kind reqview.Kind) []byte {
	if kind == reqview.Completions {
		return v.Prompt
	}
	return v.History
}

// viewDepth is how much of a request body the routing needs.
type viewDepth uint8

const (
	readModel   viewDepth = iota // model and stream flag (round_robin, random, power_of_two)
	readSession                  // and the session fields (consistent_hash)
	readAll                      // the whole routing view with the history key (cache_aware)
)

// readView parses what the policy needs of body, validating all of it
// either way (docs/design.md §2): a policy that needs only the model reads
// only the model. The model step needs the whole view, so a logical model
// (or a Responses request when models are configured) is parsed in full.
func (s *Server) readView(st *reqState, body []byte, kind reqview.Kind) error {
	v := st.view
	var err error
	switch s.reads {
	case readAll:
		return reqview.Parse(v, body, kind)
	case readSession:
		err = reqview.Parse(v, body, sessionKind(kind))
	default:
		err = reqview.ParseModel(v, body)
	}
	if err != nil || s.cfg.Models == nil {
		return err
	}
	if kind == reqview.Responses || s.cfg.Models.IsLogical(st.modelName()) {
		v.Reset()
		return reqview.Parse(v, body, kind)
	}
	return nil
}

// sessionKind is the kind a policy that needs only the session fields
// parses as: Other, except Messages, whose metadata.user_id only its own
// kind reads.
func sessionKind(kind reqview.Kind) reqview.Kind {
	if kind == reqview.Messages {
		return kind
	}
	return reqview.Other
}

// clip returns at most n bytes of s, for echoing client input in errors.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// passThrough proxies a worker endpoint (workerPaths) to a policy-chosen
// worker of the body's model, if it names one the fleet serves.
func (s *Server) passThrough(ctx *fasthttp.RequestCtx) {
	st := s.getState()
	defer s.releaseState(st)
	v := st.view
	body := ctx.PostBody()
	if len(body) > 0 && reqview.Parse(v, body, reqview.Other) != nil {
		v.Reset() // not JSON: forward as is, route without a body identity
	}
	model := st.modelName()
	workers, ok := s.cfg.Registry.ForModel(s2b(model))
	if !ok || !s.cfg.Registry.Serves(model) {
		model, workers = "", s.cfg.Registry.Workers() // no routing state for a name the fleet does not serve
	}
	st.req = route.Request{
		Model:   model,
		Workers: workers,
		Session: sessionKey(&ctx.Request.Header, v, &st.scratch),
	}
	s.forward(ctx, st, v.Stream)
}

// getState returns a pooled request state holding a pooled View.
func (s *Server) getState() *reqState {
	st := s.states.Get().(*reqState)
	st.view = s.views.Get().(*reqview.View)
	return st
}

// dropView returns st's View to its pool. forward drops it as soon as the
// first choice is made when nothing later reads it (st.early): a View's
// buffers (the history key: about the body's size) then go to the next
// request while still in cache, instead of waiting out the upstream
// exchange while other requests' Views push them out (docs/design.md §7).
// The key is gone with it; a retry parses the body again (restoreView).
func (s *Server) dropView(st *reqState) {
	if st.view == nil {
		return
	}
	st.view.Reset()
	s.views.Put(st.view)
	st.view, st.req.Prefix = nil, nil
}

// restoreView parses the request body again into a fresh View after
// dropView, for a retry's selection. The body is the one parsed first
// (only a request without a model step drops its View, and only the model
// step changes the body), so it parses as it did then.
func (s *Server) restoreView(ctx *fasthttp.RequestCtx, st *reqState) {
	st.view = s.views.Get().(*reqview.View)
	if s.readView(st, ctx.PostBody(), st.kind) == nil {
		st.req.Prefix = routingKey(st.view, st.kind)
	}
}

func (s *Server) releaseState(st *reqState) {
	s.dropView(st)
	st.early = false
	st.req = route.Request{}
	st.tried = [8]*loadview.Worker{}
	clear(st.fit[:cap(st.fit)])
	st.fit = st.fit[:0]
	if cap(st.fit) > 1024 {
		st.fit = nil
	}
	st.sel = saar.Selection{}
	s.releaseObserver(st.obs) // nil when a relay took it
	st.pin, st.noRetry, st.obs, st.spliced = nil, false, nil, false
	if cap(st.model) > 4096 {
		st.model = nil
	}
	if cap(st.scratch) > 4096 {
		st.scratch = nil
	}
	if cap(st.body) > 1<<20 {
		st.body = nil
	}
	s.states.Put(st)
}

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
