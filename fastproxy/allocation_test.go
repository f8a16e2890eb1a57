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

// TestHandlerAllocatesNothing: a session-hit chat request through the whole
// handler (scan, routing, teaching, proxying a buffered response, headers,
// metrics) makes no allocation in steady state.
func TestHandlerAllocatesNothing(t *testing.T) {
	upstream := fasthttputil.NewInmemoryListener()
	defer upstream.Close()
	go fasthttp.Serve(upstream, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"choices":[]}`) }) //nolint:errcheck
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{Dial: func(string) (net.Conn, error) { return upstream.Dial() }, Logger: quiet})
	ws, _ := reg.Add(context.Background(), "http://upstream:80", []string{"m"})
	reg.SetHealthy(ws[0], true)
	policy, _ := route.New("cache_aware", reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()})
	srv, _ := fastproxy.New(fastproxy.Config{Registry: reg, Policy: policy, Logger: quiet})

	var req fasthttp.Request
	req.SetRequestURI("http://router/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.Header.Set("X-Session-ID", "alloc-test")
	req.SetBody(benchBody(16 << 10))
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil) // Init itself allocates: once
	run := func() {
		req.CopyTo(&ctx.Request)
		ctx.Response.Reset()
		srv.Handler(&ctx)
		if ctx.Response.StatusCode() != 200 || string(ctx.Response.Header.Peek("x-vllm-router-decision")) == "" {
			t.Fatalf("status %d", ctx.Response.StatusCode())
		}
	}
	for i := 0; i < 10; i++ {
		run()
	}
	if string(ctx.Response.Header.Peek("x-vllm-router-decision")) != route.SessionIDMatch {
		t.Fatalf("not a session hit: %s", ctx.Response.Header.Peek("x-vllm-router-decision"))
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("the handler allocates %.1f times per session-hit request", n)
	}
}
