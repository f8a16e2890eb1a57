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

// inMemoryRouter is a cache_aware router over in-memory workers, one per
// host ("name:80"), each answering every path with serve.
func inMemoryRouter(t *testing.T, serve map[string]fasthttp.RequestHandler, mods ...func(*fastproxy.Config)) (*fastproxy.Server, route.Policy, *loadview.Registry) {
	t.Helper()
	lns := map[string]*fasthttputil.InmemoryListener{}
	for host, h := range serve {
		ln := fasthttputil.NewInmemoryListener()
		t.Cleanup(func() { ln.Close() })
		lns[host] = ln
		go fasthttp.Serve(ln, h) //nolint:errcheck
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{Dial: func(addr string) (net.Conn, error) { return lns[addr].Dial() }, Logger: quiet})
	policy, _ := route.New("cache_aware", reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()})
	cfg := fastproxy.Config{Registry: reg, Policy: policy, Logger: quiet, QueueSize: 100} // the queue on, as the binary runs it
	for _, m := range mods {
		m(&cfg)
	}
	srv, err := fastproxy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv, policy, reg
}

// handlerAllocs runs a 16 KB chat request (with sessionID when not empty)
// through srv's handler until warm, checking every answer with check, and
// returns the allocations per request in steady state.
func handlerAllocs(srv *fastproxy.Server, sessionID string, check func(*fasthttp.Response), hdr ...string) float64 {
	var req fasthttp.Request
	req.SetRequestURI("http://router/v1/chat/completions")
	req.Header.SetMethod("POST")
	if sessionID != "" {
		req.Header.Set("X-Session-ID", sessionID)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	req.SetBody(benchBody(16 << 10))
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, nil, nil) // Init itself allocates: once
	run := func() {
		req.CopyTo(&ctx.Request)
		ctx.Response.Reset()
		srv.Handler(&ctx)
		check(&ctx.Response)
	}
	for range 10 {
		run()
	}
	return testing.AllocsPerRun(200, run)
}

// oneWorker is a router in front of one healthy worker of model m that
// answers every request with answer.
func oneWorker(t *testing.T, answer string, mods ...func(*fastproxy.Config)) (*fastproxy.Server, route.Policy) {
	srv, policy, reg := inMemoryRouter(t, map[string]fasthttp.RequestHandler{
		"upstream:80": func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(answer) },
	}, mods...)
	ws, _ := reg.Add(context.Background(), "http://upstream:80", []string{"m"})
	reg.SetHealthy(ws[0], true)
	return srv, policy
}

// TestHandlerAllocatesNothing: a session-hit chat request through the whole
// handler (scan, routing, teaching, proxying a buffered response, headers,
// metrics) makes no allocation in steady state.
func TestHandlerAllocatesNothing(t *testing.T) {
	srv, _ := oneWorker(t, `{"choices":[]}`)
	hit := false // the last answer was a session hit (compared without allocating)
	n := handlerAllocs(srv, "alloc-test", func(r *fasthttp.Response) {
		d := r.Header.Peek("x-vllm-router-decision")
		if r.StatusCode() != 200 || len(d) == 0 {
			t.Fatalf("status %d", r.StatusCode())
		}
		hit = string(d) == route.SessionIDMatch
	})
	if !hit {
		t.Fatal("not a session hit")
	}
	if n != 0 {
		t.Fatalf("the handler allocates %.1f times per session-hit request", n)
	}
}

// TestHandlerClientKeyWithoutLimitsAllocatesNothing: with client keys,
// a tenant without limits takes no limiter path and allocates nothing; a
// limited tenant's allocations are logged (docs/design.md §8, "Tenant
// limits").
func TestHandlerClientKeyWithoutLimitsAllocatesNothing(t *testing.T) {
	keys := func(c *fastproxy.Config) {
		c.ClientAPIKeys = []string{"free:kf", "metered:km rpm=1000000000 tpm=1000000000000"}
	}
	srv, _ := oneWorker(t, `{"choices":[],"usage":{"prompt_tokens":4000,"completion_tokens":4}}`, keys)
	ok := func(r *fasthttp.Response) {
		if r.StatusCode() != 200 {
			t.Fatalf("status %d", r.StatusCode())
		}
	}
	if n := handlerAllocs(srv, "alloc-key", ok, "Authorization", "Bearer kf"); n != 0 {
		t.Fatalf("the handler allocates %.1f times per request of a tenant without limits", n)
	}
	n := handlerAllocs(srv, "alloc-key", func(r *fasthttp.Response) {
		ok(r)
		if len(r.Header.Peek("x-ratelimit-remaining-tokens")) == 0 {
			t.Fatal("no rate-limit headers")
		}
	}, "Authorization", "Bearer km")
	t.Logf("a limited tenant's request (local counts, buffered answer with usage): %.1f allocations", n)
}

// TestHandlerWithUsageAllocatesNothing: a session-hit request whose answer
// carries usage with cached_tokens (so the cache-aware policy learns from
// it through the pooled observer) makes no allocation in steady state.
func TestHandlerWithUsageAllocatesNothing(t *testing.T) {
	srv, policy := oneWorker(t, `{"choices":[],"usage":{"prompt_tokens":4000,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":3900}}}`)
	n := handlerAllocs(srv, "alloc-usage", func(r *fasthttp.Response) {
		if r.StatusCode() != 200 {
			t.Fatalf("status %d", r.StatusCode())
		}
	})
	if n != 0 {
		t.Fatalf("the handler allocates %.1f times per request with usage", n)
	}
	if s := policy.(route.Summarizer).Summaries(0); len(s) == 0 || len(s[0].Workers) == 0 || s[0].Workers[0].Rates == nil || s[0].Workers[0].Rates.Samples == 0 {
		t.Fatalf("the policy learned nothing: %+v", s)
	}
}

// TestContextFitAllocatesNothing: a request too long for one of two
// workers is narrowed to the other without allocating in steady state.
func TestContextFitAllocatesNothing(t *testing.T) {
	models := func(maxLen string) fasthttp.RequestHandler {
		list := `{"object":"list","data":[{"id":"m","object":"model","root":"m","parent":null,"max_model_len":` + maxLen + `}]}`
		return func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/v1/models" {
				ctx.SetBodyString(list)
				return
			}
			ctx.SetBodyString(`{"choices":[]}`)
		}
	}
	srv, _, reg := inMemoryRouter(t, map[string]fasthttp.RequestHandler{"small:80": models("1024"), "large:80": models("131072")})
	for _, u := range []string{"http://small:80", "http://large:80"} {
		if _, err := reg.Add(context.Background(), u, nil); err != nil {
			t.Fatal(err)
		}
	}
	reg.CheckOnce(context.Background())
	if reg.ByURL("http://small:80").MaxModelLen("m") != 1024 {
		t.Fatal("models not discovered")
	}
	// No session id: the tree decides within the fitting workers.
	n := handlerAllocs(srv, "", func(r *fasthttp.Response) {
		if r.StatusCode() != 200 || string(r.Header.Peek("x-vllm-router-worker")) != "http://large:80" {
			t.Fatalf("status %d, worker %s", r.StatusCode(), r.Header.Peek("x-vllm-router-worker"))
		}
	})
	if n != 0 {
		t.Fatalf("a narrowed request allocates %.1f times", n)
	}
}
