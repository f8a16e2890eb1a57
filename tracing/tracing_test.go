package tracing

import (
	"context"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestEndpointOptions(t *testing.T) {
	for _, c := range []struct {
		in string
		n  int // options; -1: refused
	}{
		{"", 0},
		{"collector:4318", 2},           // the vLLM router's form: plain HTTP
		{"[::1]:4318", 2},               //
		{"http://collector:4318", 3},    // path /v1/traces, insecure
		{"https://collector:4318/x", 2}, // TLS
		{"http://collector:4318/v1/traces", 3},
		{"collector", -1},
		{":4318", -1},
		{"grpc://collector:4317", -1},
		{"http://user:pw@collector:4318", -1},
		{"http://collector:4318/?a=b", -1},
		{"http://:4318", -1},
	} {
		opts, err := EndpointOptions(c.in)
		if c.n < 0 {
			if err == nil {
				t.Errorf("%q: accepted", c.in)
			} else if strings.Contains(err.Error(), "pw") {
				t.Errorf("%q: the error repeats the password", c.in)
			}
			continue
		}
		if err != nil || len(opts) != c.n {
			t.Errorf("%q: %d options, %v; want %d", c.in, len(opts), err, c.n)
		}
	}
}

func FuzzEndpointOptions(f *testing.F) {
	for _, s := range []string{"", "h:1", "http://h:1/v1/traces", "https://[::1]:4318", "http://%zz", "a://b", "h:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		opts, err := EndpointOptions(s)
		if err == nil && s != "" && len(opts) == 0 {
			t.Fatalf("%q: accepted without options", s)
		}
		if err == nil {
			_, _ = otlptracehttp.New(context.Background(), opts...) // must not panic
		}
	})
}

// TestPropagation: the server span of a request with a traceparent joins
// the client's trace, and the headers set for a worker carry the child's
// span id, replacing the client's; an excluded path is known.
func TestPropagation(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr, err := New(Config{Exporter: exp, SamplingRatio: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background()) //nolint:errcheck
	var h fasthttp.RequestHeader
	h.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.Set("tracestate", "congo=t61rcWkgMzE")
	ctx := tr.Extract(context.Background(), &h)
	ctx, sp := tr.Tracer().Start(ctx, "s", trace.WithSpanKind(trace.SpanKindClient))
	if !sp.SpanContext().IsSampled() { // ratio 0, but the parent is sampled
		t.Fatal("the client's sampling decision was not followed")
	}
	tr.Inject(ctx, &h)
	want := "00-0af7651916cd43dd8448eb211c80319c-" + sp.SpanContext().SpanID().String() + "-01"
	if got := string(h.Peek("traceparent")); got != want {
		t.Fatalf("traceparent %q, want %q", got, want)
	}
	if got := string(h.Peek("tracestate")); got != "congo=t61rcWkgMzE" {
		t.Fatalf("tracestate %q", got)
	}
	sp.End()
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != 1 {
		t.Fatalf("%d spans exported", n)
	}

	// A root the router starts at ratio 0 is not sampled; its worker hears so.
	var h2 fasthttp.RequestHeader
	ctx, sp = tr.Tracer().Start(tr.Extract(context.Background(), &h2), "root")
	tr.Inject(ctx, &h2)
	if sp.SpanContext().IsSampled() || !strings.HasSuffix(string(h2.Peek("traceparent")), "-00") {
		t.Fatalf("ratio 0 sampled a new trace: %q", h2.Peek("traceparent"))
	}
	if !tr.Excluded("/health") || !tr.Excluded("/metrics") || tr.Excluded("/v1/chat/completions") || tr.Excluded("/health/x") {
		t.Fatal("default excluded paths")
	}
	if _, err := New(Config{Exporter: exp, SamplingRatio: 1.5}); err == nil {
		t.Fatal("ratio 1.5 accepted")
	}
	own, _ := New(Config{Exporter: exp, ExcludedPaths: []string{"/x"}})
	defer own.Shutdown(context.Background()) //nolint:errcheck
	if own.Excluded("/health") || !own.Excluded("/x") {
		t.Fatal("a list given replaces the defaults")
	}
}
