//go:build !race

package fastproxy_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// TestHandlerWithUsageAllocatesNothing: a session-hit request whose answer
// carries usage with cached_tokens (so the cache-aware policy learns from
// it through the pooled observer) makes no allocation in steady state.
func TestHandlerWithUsageAllocatesNothing(t *testing.T) {
	upstream := fasthttputil.NewInmemoryListener()
	defer upstream.Close()
	go fasthttp.Serve(upstream, func(ctx *fasthttp.RequestCtx) { //nolint:errcheck
		ctx.SetBodyString(`{"choices":[],"usage":{"prompt_tokens":4000,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":3900}}}`)
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{Dial: func(string) (net.Conn, error) { return upstream.Dial() }, Logger: quiet})
	ws, _ := reg.Add(context.Background(), "http://upstream:80", []string{"m"})
	reg.SetHealthy(ws[0], true)
	policy, _ := route.New("cache_aware", reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()})
	srv, _ := fastproxy.New(fastproxy.Config{Registry: reg, Policy: policy, Logger: quiet})

	var req fasthttp.Request
	req.SetRequestURI("http://router/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.Header.Set("X-Session-ID", "alloc-usage")
	req.SetBody(benchBody(16 << 10))
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil)
	run := func() {
		req.CopyTo(&ctx.Request)
		ctx.Response.Reset()
		srv.Handler(&ctx)
		if ctx.Response.StatusCode() != 200 {
			t.Fatalf("status %d", ctx.Response.StatusCode())
		}
	}
	for i := 0; i < 10; i++ {
		run()
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("the handler allocates %.1f times per request with usage", n)
	}
	if s := policy.(*route.CacheAware).Summaries(0); len(s) == 0 || len(s[0].Workers) == 0 || s[0].Workers[0].Rates == nil || s[0].Workers[0].Rates.Samples == 0 {
		t.Fatalf("the policy learned nothing: %+v", s)
	}
}
