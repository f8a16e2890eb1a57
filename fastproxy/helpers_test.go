package fastproxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

// startSims starts n simulated workers on loopback; they stop with the test.
func startSims(t *testing.T, n int, cfg simworker.Config) ([]*simworker.Worker, []string) {
	t.Helper()
	var ws []*simworker.Worker
	var urls []string
	for i := 0; i < n; i++ {
		c := cfg
		c.Seed = int64(i + 1)
		w, url, err := simworker.Start(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		ws = append(ws, w)
		urls = append(urls, url)
	}
	return ws, urls
}

// fastSim is a simulated worker config that answers in milliseconds.
func fastSim() simworker.Config {
	return simworker.Config{Models: []string{"m"}, TimeScale: 0.01, MaxTokens: 8}
}

type testRouter struct {
	url    string
	srv    *fastproxy.Server
	reg    *loadview.Registry
	policy route.Policy
}

// startRouter runs a real router over loopback in front of urls.
func startRouter(t *testing.T, urls []string, policy string, mod func(*fastproxy.Config, *loadview.Config)) *testRouter {
	t.Helper()
	return startRouterCA(t, urls, policy, route.DefaultCacheAwareConfig(), mod)
}

// startRouterCA is startRouter with explicit cache-aware settings.
func startRouterCA(t *testing.T, urls []string, policy string, ca route.CacheAwareConfig, mod func(*fastproxy.Config, *loadview.Config)) *testRouter {
	t.Helper()
	tr := &testRouter{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	lc := loadview.Config{HealthTimeout: time.Second, Logger: quiet}
	fc := fastproxy.Config{RetryMaxRetries: 3, RetryBackoff: time.Millisecond, RequestTimeout: 10 * time.Second, Logger: quiet}
	if mod != nil {
		mod(&fc, &lc)
	}
	tr.reg = loadview.NewRegistry(lc)
	p, err := route.New(policy, tr.reg, route.Options{CacheAware: ca})
	if err != nil {
		t.Fatal(err)
	}
	tr.policy = p
	for _, u := range urls {
		if _, err := tr.reg.Add(context.Background(), u, nil); err != nil {
			t.Fatal(err)
		}
	}
	fc.Registry, fc.Policy = tr.reg, p
	tr.serve(t, fc)
	return tr
}

// serve builds the router of fc and serves it on loopback until the test
// ends.
func (tr *testRouter) serve(t *testing.T, fc fastproxy.Config) {
	t.Helper()
	var err error
	if tr.srv, err = fastproxy.New(fc); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go tr.srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		tr.srv.Shutdown(ctx) //nolint:errcheck
	})
	tr.url = "http://" + ln.Addr().String()
}

// deadURL is a loopback URL where nothing listens (connections refused).
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

// counter reads one of the router's own counters.
func (tr *testRouter) counter(name string) uint64 {
	return tr.srv.Metrics().GetOrCreateCounter(name).Get()
}

// adminURL starts the router's metrics/admin listener on loopback (admin
// surfaces open there) and returns its base URL.
func (tr *testRouter) adminURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := tr.srv.ServeObservability(ln)
	t.Cleanup(func() { srv.Shutdown() }) //nolint:errcheck
	return "http://" + ln.Addr().String()
}

// do sends one request with net/http and returns the response and its body.
func do(t *testing.T, method, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func chatBody(model, text string, stream bool) string {
	s := `{"model":"` + model + `","messages":[{"role":"user","content":"` + text + `"}]`
	if stream {
		s += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return s + `}`
}

// waitIdle fails the test unless every worker's counters of requests in
// flight and awaiting a first byte return to 0.
func waitIdle(t *testing.T, reg *loadview.Registry) {
	t.Helper()
	busy := func() string {
		b := ""
		for _, w := range reg.Workers() {
			if l, a := w.Load(), w.Awaiting(); l != 0 || a != 0 {
				b += fmt.Sprintf("%s=%d (%d awaiting a first byte) ", w.URL(), l, a)
			}
		}
		return b
	}
	testwait.Until(t, "in-flight counters back to 0", func() bool { return busy() == "" }, busy)
}

// echoUpstream is a worker double that records the body it received and
// answers with a fixed body, streamed in chunks when the request says so.
type echoUpstream struct {
	url      string
	got      chan []byte
	gotHdr   chan string // the raw request headers it received
	response []byte
	chunks   [][]byte
	gap      time.Duration
	status   int               // 0: 200
	header   map[string]string // added to every response
}

func startEcho(t *testing.T, response []byte, chunks [][]byte, gap time.Duration) *echoUpstream {
	t.Helper()
	e := &echoUpstream{got: make(chan []byte, 16), gotHdr: make(chan string, 16), response: response, chunks: chunks, gap: gap}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/health":
			return
		case "/v1/models":
			ctx.SetBodyString(`{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		e.got <- append([]byte(nil), ctx.PostBody()...)
		e.gotHdr <- ctx.Request.Header.String()
		for k, v := range e.header {
			ctx.Response.Header.Set(k, v)
		}
		if e.status != 0 {
			ctx.SetStatusCode(e.status)
		}
		if !strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			ctx.SetContentType("application/json")
			ctx.SetBody(e.response)
			return
		}
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for _, c := range e.chunks {
				w.Write(c) //nolint:errcheck
				if w.Flush() != nil {
					return
				}
				time.Sleep(e.gap)
			}
		})
	}}
	go s.Serve(ln)                     //nolint:errcheck
	t.Cleanup(func() { s.Shutdown() }) //nolint:errcheck
	e.url = "http://" + ln.Addr().String()
	return e
}
