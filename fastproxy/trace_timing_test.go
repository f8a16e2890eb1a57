package fastproxy_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/tracing"
)

// discardExporter takes the batches of spans and drops them: what tracing
// costs a request, short of the OTLP encoding and the network, which the
// exporter's goroutine does apart from the requests.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkProxyTraced is BenchmarkProxy's warmroute case (16 KB) with
// tracing off, on and sampled (every span recorded and batched), and on
// but not sampled (--otel-sampling-ratio 0: spans are started, ids made
// and the traceparent sent, nothing is recorded):
//
//	go test -run '^$' -bench ProxyTraced -benchmem -count 6 ./fastproxy | tee trace.txt
//	benchstat -col /trace trace.txt
func BenchmarkProxyTraced(b *testing.B) {
	dialUp := chatUpstream(b)
	body := benchBody(16 << 10)
	for _, c := range []struct {
		name  string
		ratio float64 // < 0: tracing off
	}{{"off", -1}, {"sampled", 1}, {"unsampled", 0}} {
		b.Run("trace="+c.name, func(b *testing.B) {
			var tr *tracing.Tracer
			if c.ratio >= 0 {
				var err error
				if tr, err = tracing.New(tracing.Config{Exporter: discardExporter{}, SamplingRatio: c.ratio}); err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { tr.Shutdown(context.Background()) }) //nolint:errcheck
			}
			benchChats(b, benchTracedRouter(b, dialUp, tr).Handler, body, -1)
		})
	}
}

// benchTracedRouter is benchRouter with tr (nil: tracing off).
func benchTracedRouter(b *testing.B, dial fasthttp.DialFunc, tr *tracing.Tracer) *fastproxy.Server {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{Dial: dial, Logger: quiet})
	ws, _ := reg.Add(context.Background(), "http://upstream:80", []string{"m"})
	reg.SetHealthy(ws[0], true)
	policy, _ := route.New("cache_aware", reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()})
	srv, err := fastproxy.New(fastproxy.Config{Registry: reg, Policy: policy, Logger: quiet, QueueSize: 100, Tracer: tr})
	if err != nil {
		b.Fatal(err)
	}
	return srv
}
