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

// TestContextFitAllocatesNothing: a request too long for one of two
// workers is narrowed to the other without allocating in steady state.
func TestContextFitAllocatesNothing(t *testing.T) {
	lns := map[string]*fasthttputil.InmemoryListener{}
	for host, maxLen := range map[string]string{"small:80": "1024", "large:80": "131072"} {
		ln := fasthttputil.NewInmemoryListener()
		defer ln.Close()
		lns[host] = ln
		models := `{"object":"list","data":[{"id":"m","object":"model","root":"m","parent":null,"max_model_len":` + maxLen + `}]}`
		go fasthttp.Serve(ln, func(ctx *fasthttp.RequestCtx) { //nolint:errcheck
			if string(ctx.Path()) == "/v1/models" {
				ctx.SetBodyString(models)
				return
			}
			ctx.SetBodyString(`{"choices":[]}`)
		})
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{Dial: func(addr string) (net.Conn, error) { return lns[addr].Dial() }, Logger: quiet})
	for _, u := range []string{"http://small:80", "http://large:80"} {
		if _, err := reg.Add(context.Background(), u, nil); err != nil {
			t.Fatal(err)
		}
	}
	reg.CheckOnce(context.Background())
	if reg.ByURL("http://small:80").MaxModelLen("m") != 1024 {
		t.Fatal("models not discovered")
	}
	policy, _ := route.New("cache_aware", reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()})
	srv, _ := fastproxy.New(fastproxy.Config{Registry: reg, Policy: policy, Logger: quiet})

	var req fasthttp.Request
	req.SetRequestURI("http://router/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.SetBody(benchBody(16 << 10)) // no session id: the tree decides within the fitting workers
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil)
	run := func() {
		req.CopyTo(&ctx.Request)
		ctx.Response.Reset()
		srv.Handler(&ctx)
		if ctx.Response.StatusCode() != 200 || string(ctx.Response.Header.Peek("x-vllm-router-worker")) != "http://large:80" {
			t.Fatalf("status %d, worker %s", ctx.Response.StatusCode(), ctx.Response.Header.Peek("x-vllm-router-worker"))
		}
	}
	for i := 0; i < 10; i++ {
		run()
	}
	if n := testing.AllocsPerRun(200, run); n != 0 {
		t.Fatalf("a narrowed request allocates %.1f times", n)
	}
}
