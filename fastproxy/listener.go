package fastproxy

import (
	"io"
	"net"
	"sort"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
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
		defer ctx.Response.Header.SetCanonical(bytesconv.S2B(hdrRequestID), rid)
		path, ep, ok := s.endpointOf(ctx)
		switch {
		case !ok:
			badRequest(ctx, "the request path must be sent in normalized form (no dot segments or encoded separators)")
		case path == "/metrics":
			ctx.SetContentType("text/plain; version=0.0.4")
			s.WriteMetrics(ctx)
		case path == "/" || path == "/ui":
			s.serveAdmin(ctx, access, path, rid, func() { ops.serve(ctx) })
		case ep == epAdmin || ep == epFleetAdmin:
			s.serveAdmin(ctx, access, path, rid, func() { s.adminEndpoint(ctx, path, ep) })
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
		ConnState:             connState,
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
	s.admit.ctl.WriteMetrics(w)
	if pm, ok := s.cfg.Policy.(route.MetricsWriter); ok {
		pm.WriteMetrics(w)
	}
	if s.cfg.Models != nil {
		s.cfg.Models.WriteMetrics(w)
	}
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
