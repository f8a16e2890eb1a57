// Package tracing is the router's OpenTelemetry tracing (docs/design.md
// §8.7): a tracer provider that exports spans over OTLP/HTTP in batches, a
// parent-based ratio sampler, the paths that get no span, and W3C
// trace-context propagation (traceparent, tracestate) over fasthttp
// request headers.
package tracing

import (
	"context"
	"errors"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// DefaultExcludedPaths get no span unless --otel-excluded-paths names
// others: the vLLM router's (its health probes) and the router's own
// readiness and metrics paths, which probes and scrapers call all day.
var DefaultExcludedPaths = []string{"/health", "/health_generate", "/liveness", "/readiness", "/health/ready", "/metrics"}

// Config configures a Tracer.
type Config struct {
	// Endpoint (--otlp-traces-endpoint) is where spans go: the vLLM
	// router's host:port (plain HTTP, path /v1/traces) or a URL
	// http(s)://host:port[/path] (path /v1/traces when none). Empty: the
	// OTLP exporter's environment (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
	// OTEL_EXPORTER_OTLP_ENDPOINT), else localhost:4318.
	Endpoint string
	// SamplingRatio (--otel-sampling-ratio) of the traces the router starts,
	// 0 to 1; a request whose client sent a traceparent follows the
	// client's sampling decision.
	SamplingRatio float64
	// ExcludedPaths (--otel-excluded-paths) get no span (exact paths); nil:
	// DefaultExcludedPaths.
	ExcludedPaths []string
	// ServiceName is the resource's service.name (default "warmroute").
	ServiceName string
	// Exporter replaces the OTLP/HTTP exporter (benchmarks); nil: OTLP/HTTP.
	Exporter sdktrace.SpanExporter
}

// Tracer starts the router's spans and exports them.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	excluded []string
	prop     propagation.TraceContext
}

// New builds a Tracer that exports in the background until Shutdown.
func New(cfg Config) (*Tracer, error) {
	if cfg.SamplingRatio < 0 || cfg.SamplingRatio > 1 {
		return nil, errors.New("the sampling ratio must be in [0, 1]")
	}
	exp := cfg.Exporter
	if exp == nil {
		opts, err := EndpointOptions(cfg.Endpoint)
		if err != nil {
			return nil, err
		}
		if exp, err = otlptracehttp.New(context.Background(), opts...); err != nil {
			return nil, err
		}
	}
	name := cfg.ServiceName
	if name == "" {
		name = "warmroute"
	}
	excluded := cfg.ExcludedPaths
	if excluded == nil {
		excluded = DefaultExcludedPaths
	}
	p := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SamplingRatio))),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", name))),
	)
	return &Tracer{provider: p, tracer: p.Tracer("github.com/warmroute/warmroute"), excluded: slices.Clone(excluded)}, nil
}

// EndpointOptions are the exporter's options for an --otlp-traces-endpoint
// value (see Config.Endpoint); none for "".
func EndpointOptions(endpoint string) ([]otlptracehttp.Option, error) {
	if endpoint == "" {
		return nil, nil
	}
	if !strings.Contains(endpoint, "://") { // the vLLM router's host:port
		host, port, err := net.SplitHostPort(endpoint)
		if err != nil || host == "" || port == "" {
			return nil, errors.New("want host:port or http(s)://host:port[/path]")
		}
		return []otlptracehttp.Option{otlptracehttp.WithEndpoint(endpoint), otlptracehttp.WithInsecure()}, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.RawQuery != "" || u.Fragment != "" || u.Hostname() == "" {
		return nil, errors.New("want host:port or http(s)://host:port[/path]")
	}
	path := u.Path
	if path == "" || path == "/" {
		path = "/v1/traces"
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	return opts, nil
}

// Tracer is the tracer the router's spans start from.
func (t *Tracer) Tracer() trace.Tracer { return t.tracer }

// Excluded reports whether path gets no span.
func (t *Tracer) Excluded(path string) bool {
	for _, p := range t.excluded {
		if p == path {
			return true
		}
	}
	return false
}

// Flush exports the spans ended so far.
func (t *Tracer) Flush(ctx context.Context) error { return t.provider.ForceFlush(ctx) }

// Shutdown exports the spans ended so far and stops exporting.
func (t *Tracer) Shutdown(ctx context.Context) error { return t.provider.Shutdown(ctx) }

// Extract returns ctx with the remote span context of h's traceparent and
// tracestate, when valid.
func (t *Tracer) Extract(ctx context.Context, h *fasthttp.RequestHeader) context.Context {
	return t.prop.Extract(ctx, requestCarrier{h})
}

// Inject sets h's traceparent and tracestate to ctx's span, replacing the
// client's.
func (t *Tracer) Inject(ctx context.Context, h *fasthttp.RequestHeader) {
	t.prop.Inject(ctx, requestCarrier{h})
}

// requestCarrier reads and writes the trace-context headers of a fasthttp
// request.
type requestCarrier struct{ h *fasthttp.RequestHeader }

func (c requestCarrier) Get(key string) string { return string(c.h.Peek(key)) }

func (c requestCarrier) Set(key, value string) { c.h.Set(key, value) }

func (c requestCarrier) Keys() []string {
	var keys []string
	for k := range c.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}
