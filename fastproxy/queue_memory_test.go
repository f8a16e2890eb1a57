//go:build !race

package fastproxy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// queuedRequestBytes is what one small waiting request may hold at most,
// body excluded: its handler goroutine's stack, its fasthttp request and
// the router's pooled state and queue entry (docs/reference.md, "The queue").
const queuedRequestBytes = 24 << 10

// 100,000 small requests wait in front of a stalled fleet: the memory they
// hold stays within queuedRequestBytes each, and the router's own
// endpoints answer at once meanwhile. (Not under -race: its detector
// allows 8,128 goroutines.)
func TestQueueMemory100k(t *testing.T) {
	const n = 100_000
	stall := make(chan struct{})
	ln := fasthttputil.NewInmemoryListener()
	t.Cleanup(func() { ln.Close() })
	go fasthttp.Serve(ln, func(ctx *fasthttp.RequestCtx) { //nolint:errcheck // a worker that never answers a chat
		switch string(ctx.Path()) {
		case "/health":
		case "/v1/models":
			ctx.SetBodyString(`{"data":[{"id":"m"}]}`)
		default:
			<-stall
		}
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{Dial: func(string) (net.Conn, error) { return ln.Dial() }, Logger: quiet})
	if _, err := reg.Add(context.Background(), "http://stalled:80", nil); err != nil {
		t.Fatal(err)
	}
	policy, _ := route.New("round_robin", reg, route.Options{})
	srv, err := fastproxy.New(fastproxy.Config{Registry: reg, Policy: policy, Logger: quiet, AdminAPIKey: "k",
		MaxConcurrentRequests: 1, QueueSize: n, QueueTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(path, body string) int {
		var ctx fasthttp.RequestCtx
		var req fasthttp.Request
		req.SetRequestURI("http://router" + path)
		req.Header.Set("Authorization", "Bearer k")
		if body != "" {
			req.Header.SetMethod("POST")
			req.SetBodyString(body)
		}
		ctx.Init(&req, nil, nil)
		srv.Handler(&ctx)
		return ctx.Response.StatusCode()
	}
	before := heapAndStacks()
	body := `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	var wg sync.WaitGroup
	for range n + 1 { // one in flight, n waiting
		wg.Go(func() { serve("/v1/chat/completions", body) })
	}
	var queued int
	testwait.Within(t, time.Minute, fmt.Sprintf("%d requests waiting", n), func() bool {
		queued = queueDepth(srv)
		return queued == n
	}, func() string { return fmt.Sprint(queued, " waiting") })
	held := heapAndStacks() - before
	if per := held / n; per > queuedRequestBytes {
		t.Errorf("%d bytes held per waiting request, more than %d", per, queuedRequestBytes)
	}
	t.Logf("%d waiting requests hold %.1f MB (%d B each)", n, float64(held)/(1<<20), held/n)
	for _, path := range []string{"/health", "/readiness", "/workers", "/metrics"} {
		start := time.Now()
		if code := serve(path, ""); code != 200 {
			t.Errorf("%s answered %d while %d requests wait", path, code, n)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%s took %v while %d requests wait", path, d, n)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	srv.Shutdown(ctx) //nolint:errcheck // the waiting get 503 shutting_down
	close(stall)
	wg.Wait()
}

// heapAndStacks is the memory the process holds in heap and goroutine stacks.
func heapAndStacks() int {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int(m.HeapInuse + m.StackInuse)
}

func queueDepth(srv *fastproxy.Server) int {
	tr := &testRouter{srv: srv}
	return queued(tr)
}
