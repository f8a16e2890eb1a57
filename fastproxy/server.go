// Package fastproxy is warmroute's HTTP front end: the endpoint table, the
// routing view of each request body, upstream proxying with retries and
// streaming, the router's response headers, OpenAI-style errors, admin
// endpoints and the Prometheus/pprof listener.
package fastproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
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
}

func (c *Config) setDefaults() {
	if c.MaxPayloadSize <= 0 {
		c.MaxPayloadSize = 256 << 20
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
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Rand == nil {
		c.Rand = rand.Uint64
	}
}

// Server routes and proxies requests. Safe for concurrent use.
type Server struct {
	cfg    Config
	srv    *fasthttp.Server
	bearer string
	rm     map[string]*routeMetrics
	rmAll  *routeMetrics // paths outside the table
	states sync.Pool     // *reqState
	health saar.Health   // the model step's view of the fleet
}

// reqState is the pooled per-request scratch: the routing view and buffers.
type reqState struct {
	view    reqview.View
	req     route.Request
	scratch []byte
	tried   [8]*loadview.Worker
	sel     saar.Selection   // the model step's choice (logical models)
	body    []byte           // the original body after a model splice; reused as the next splice buffer
	pin     *loadview.Worker // a worker the request must go to first (provider state)
	noRetry bool             // only the pinned worker may serve
	obs     *observer        // learns from the response, when the model step needs it
	spliced bool             // body holds a spliced model name; the original is in body
	model   []byte           // the JSON-unescaped model name, when it had escapes
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
	s := &Server{cfg: cfg, rm: map[string]*routeMetrics{}}
	if cfg.APIKey != "" {
		s.bearer = "Bearer " + cfg.APIKey
	}
	for _, p := range []string{pathChat, pathCompletions, pathResponses, pathEmbeddings, pathGenerate} {
		s.rm[p] = newRouteMetrics(p)
	}
	s.rmAll = newRouteMetrics("other")
	s.states.New = func() any { return new(reqState) }
	s.health = s.newHealth()
	s.srv = &fasthttp.Server{
		Handler:               s.Handler,
		ErrorHandler:          s.errorHandler,
		Name:                  "warmroute",
		MaxRequestBodySize:    cfg.MaxPayloadSize,
		ReadTimeout:           cfg.ReadTimeout,
		WriteTimeout:          cfg.RequestTimeout,
		IdleTimeout:           cfg.IdleTimeout,
		ReadBufferSize:        16 << 10,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
		Logger:                slogPrintf{cfg.Logger},
	}
	return s, nil
}

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error { return s.srv.Serve(ln) }

// Shutdown stops accepting connections and waits for in-flight requests
// (streams included) until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.ShutdownWithContext(ctx) }

const (
	pathChat        = "/v1/chat/completions"
	pathCompletions = "/v1/completions"
	pathResponses   = "/v1/responses"
	pathEmbeddings  = "/v1/embeddings"
	pathGenerate    = "/generate"
)

// Handler is the fasthttp handler for the router's listener.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	path := b2s(ctx.Path())
	rm := s.rm[path]
	if rm == nil {
		rm = s.rmAll
	}
	defer func() {
		if p := recover(); p != nil {
			panicsTotal.Inc()
			s.cfg.Logger.Error("handler panic", "path", path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			ctx.Response.Reset()
			writeError(ctx, fasthttp.StatusInternalServerError, "internal_error", "internal_error", "internal router error")
		}
		rm.count(ctx.Response.StatusCode())
		countDecision(ctx.Response.Header.Peek(hdrDecision))
		// ctx.Time: when fasthttp began serving the request. A stream ends
		// after the handler returns: its relay observes the duration.
		if r, ok := ctx.Response.BodyStream().(*relay); ok {
			r.hist, r.start = &rm.duration, ctx.Time()
		} else {
			rm.duration.observe(time.Since(ctx.Time()))
		}
	}()
	switch path {
	case pathChat:
		s.inference(ctx, reqview.Chat)
	case pathCompletions, pathGenerate:
		s.inference(ctx, reqview.Completions)
	case pathResponses:
		s.inference(ctx, reqview.Responses)
	case pathEmbeddings:
		s.inference(ctx, reqview.Other)
	case "/v1/models":
		s.models(ctx)
	case "/health", "/liveness":
		s.liveness(ctx)
	case "/readiness":
		s.readiness(ctx)
	case "/v1/router_replay":
		s.routerReplay(ctx)
	case "/workers", "/list_workers", "/add_worker", "/remove_worker":
		s.admin(ctx, path)
	default:
		switch {
		case strings.HasPrefix(path, pathResponses+"/"):
			s.responseByID(ctx, path[len(pathResponses)+1:])
		case strings.HasPrefix(path, "/workers/"):
			s.admin(ctx, path)
		default:
			s.passThrough(ctx)
		}
	}
}

// inference routes a JSON inference request by its routing view.
func (s *Server) inference(ctx *fasthttp.RequestCtx, kind reqview.Kind) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	st := s.states.Get().(*reqState)
	defer s.releaseState(st)
	v := &st.view
	if err := reqview.Parse(v, ctx.PostBody(), kind); err != nil {
		badRequest(ctx, "request body is not a valid JSON object: "+err.Error())
		return
	}
	prefix := v.History
	if kind == reqview.Completions {
		prefix = v.Prompt
	}
	st.req = route.Request{
		Model:   st.modelName(),
		Session: sessionKey(&ctx.Request.Header, v, &st.scratch),
		Prefix:  prefix,
	}
	logical := s.cfg.Models != nil && s.cfg.Models.IsLogical(st.req.Model)
	if logical && !s.selectModel(ctx, st, s.health) {
		return
	}
	workers, ok := s.cfg.Registry.ForModel(s2b(st.req.Model))
	if !ok {
		if len(st.req.Model) > 0 {
			notFound(ctx, "model_not_found", "The model `"+st.req.Model+"` does not exist.")
		} else {
			noWorker(ctx, nil)
		}
		return
	}
	st.req.Workers = workers
	if logical || (kind == reqview.Responses && s.cfg.Models != nil) {
		st.obs = s.newObserver(st)
	}
	s.forward(ctx, st, v.Stream)
	if logical && s.failoverModel(ctx, st) {
		s.forward(ctx, st, v.Stream)
	}
	if logical {
		setModelHeaders(ctx, &st.sel)
	}
}

// passThrough proxies a path outside the table to a policy-chosen worker,
// routing by whatever identity its body and headers carry.
func (s *Server) passThrough(ctx *fasthttp.RequestCtx) {
	st := s.states.Get().(*reqState)
	defer s.releaseState(st)
	v := &st.view
	body := ctx.PostBody()
	if len(body) > 0 && reqview.Parse(v, body, reqview.Other) != nil {
		v.Reset() // not JSON: forward as is, route without a body identity
	}
	model := st.modelName()
	workers, ok := s.cfg.Registry.ForModel(s2b(model))
	if !ok {
		workers = s.cfg.Registry.Workers()
	}
	st.req = route.Request{
		Model:   model,
		Workers: workers,
		Session: sessionKey(&ctx.Request.Header, v, &st.scratch),
	}
	s.forward(ctx, st, v.Stream)
}

func (s *Server) releaseState(st *reqState) {
	st.view.Reset()
	st.req = route.Request{}
	st.tried = [8]*loadview.Worker{}
	st.sel = saar.Selection{}
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

func (s *Server) errorHandler(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		ctx.SetConnectionClose()
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "payload_too_large",
			fmt.Sprintf("request body exceeds the router's --max-payload-size of %d bytes", s.cfg.MaxPayloadSize))
	default:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			writeError(ctx, fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout", "timed out reading the request")
			return
		}
		badRequest(ctx, "cannot parse the HTTP request: "+err.Error())
	}
}

// slogPrintf adapts slog to fasthttp's Logger.
type slogPrintf struct{ l *slog.Logger }

func (p slogPrintf) Printf(format string, args ...any) { p.l.Debug(fmt.Sprintf(format, args...)) }
