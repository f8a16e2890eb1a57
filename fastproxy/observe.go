package fastproxy

import (
	"io"
	"net"
	"sort"
	"strconv"

	"github.com/VictoriaMetrics/metrics"
	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/route"
)

// ObservabilityHandler serves the metrics listener: /metrics (Prometheus
// text), always open for scraping, and the admin surfaces (worker
// management, /v1/router_replay, the fleet-wide engine calls, /debug/pprof/,
// /debug/sessions) and the operator's page at / and /ui (docs/design.md
// §8.4): open when the listener is bound to loopback (loopback), else
// behind the admin key as on the inference port.
func (s *Server) ObservabilityHandler(loopback bool) fasthttp.RequestHandler {
	access := adminKeyOnly
	if loopback {
		access = adminOpen
	}
	ops := s.newOpsView()
	return func(ctx *fasthttp.RequestCtx) {
		var ridBuf [128]byte
		rid := s.requestID(ctx, &ridBuf)
		defer ctx.Response.Header.SetCanonical(s2b(hdrRequestID), rid)
		path, ep, ok := s.endpointOf(ctx)
		switch {
		case !ok:
			badRequest(ctx, "the request path must be sent in normalized form (no dot segments or encoded separators)")
		case path == "/metrics":
			ctx.SetContentType("text/plain; version=0.0.4")
			s.WriteMetrics(ctx)
		case path == "/" || path == "/ui":
			if s.admitAdmin(ctx, access) {
				ops.serve(ctx)
			}
		case ep == epAdmin || ep == epFleetAdmin:
			if s.admitAdmin(ctx, access) {
				s.adminEndpoint(ctx, path, ep)
			}
		default:
			noRoute(ctx)
		}
	}
}

// ServeObservability serves ObservabilityHandler on ln until Shutdown of
// the returned server; admin surfaces are open only when ln is loopback.
func (s *Server) ServeObservability(ln net.Listener) *fasthttp.Server {
	loopback := false
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		loopback = a.IP.IsLoopback()
	}
	srv := &fasthttp.Server{
		Handler:               s.ObservabilityHandler(loopback),
		Name:                  "warmroute",
		ReadTimeout:           s.cfg.ReadTimeout,
		IdleTimeout:           s.cfg.IdleTimeout,
		MaxRequestBodySize:    1 << 20,
		NoDefaultServerHeader: true,
		SecureErrorLogMessage: true,
		Logger:                slogPrintf{s.cfg.Logger},
	}
	go func() {
		if err := srv.Serve(newLimitListener(ln, 256, s.cfg.Logger)); err != nil {
			s.cfg.Logger.Error("metrics listener failed", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return srv
}

// WriteMetrics writes every series of the router in Prometheus text format:
// the server's own set, process metrics, the registry's per-worker gauges,
// request durations, the routing memory and the model step.
func (s *Server) WriteMetrics(w io.Writer) {
	s.metrics.set.WritePrometheus(w)
	metrics.WriteProcessMetrics(w)
	s.cfg.Registry.WriteMetrics(w)
	s.writeDurations(w)
	if ca, ok := s.cfg.Policy.(*route.CacheAware); ok {
		ca.WriteMetrics(w)
	}
	if s.cfg.Models != nil {
		s.cfg.Models.WriteMetrics(w)
	}
}

func (s *Server) debugSessions(ctx *fasthttp.RequestCtx) {
	ca, ok := s.cfg.Policy.(*route.CacheAware)
	if !ok {
		notFound(ctx, "not_cache_aware", "session memory exists only with --policy cache_aware")
		return
	}
	recent, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("recent")))
	if recent <= 0 {
		recent = 20
	}
	all := ca.Summaries(min(recent, 1000))
	model := string(ctx.QueryArgs().Peek("model"))
	out := all[:0]
	for _, sm := range all {
		if model == "" || sm.Model == model {
			out = append(out, sm)
		}
	}
	b, err := sonic.Marshal(map[string]any{"models": out})
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, "internal_error", "encode_failed", "cannot encode the response")
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// writeDurations writes vllm_router_request_duration_seconds{route}.
func (s *Server) writeDurations(w io.Writer) {
	routes := make([]string, 0, len(s.rm)+1)
	for p := range s.rm {
		routes = append(routes, p)
	}
	sort.Strings(routes)
	for _, p := range routes {
		s.rm[p].duration.write(w, "vllm_router_request_duration_seconds", `route="`+p+`"`)
	}
	s.rmAll.duration.write(w, "vllm_router_request_duration_seconds", `route="other"`)
}
