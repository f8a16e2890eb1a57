package fastproxy_test

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/simworker"
)

// Issue 33's surprises: what a new operator met in front of a fleet the
// project did not write.

// vllm_router_retries_total counts retries, not attempts: a request that
// every one of three workers pushed back (429) was tried 3 times and
// retried twice, even with attempts to spare (--retry-max-retries 5).
func TestRetriesCountRetriesNotAttempts(t *testing.T) {
	var urls []string
	for range 3 {
		up := startEcho(t, []byte(`{"error":"busy"}`), nil, 0)
		up.status = 429
		urls = append(urls, up.url)
	}
	r := startRouter(t, urls, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) { c.RetryMaxRetries = 5 })
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
	if resp.StatusCode != 429 {
		t.Fatalf("every worker pushed back: %d %s", resp.StatusCode, body)
	}
	if got := r.counter(`vllm_router_upstream_errors_total{kind="backpressure"}`); got != 3 {
		t.Errorf("attempts pushed back %d, want 3", got)
	}
	if got := r.counter("vllm_router_retries_total"); got != 2 {
		t.Errorf("vllm_router_retries_total %d after 3 attempts, want 2", got)
	}
}

// workerHeaderNames are the response headers that name a worker.
var workerHeaderNames = []string{"X-Vllm-Router-Worker", "X-Vllm-Router-Base-Worker", "X-Vllm-Router-Dp-Rank",
	"X-Vllm-Router-Prefill-Worker", "X-Vllm-Router-Decode-Worker"}

func workerHeadersOf(h http.Header) []string {
	var got []string
	for _, k := range workerHeaderNames {
		if v := h.Get(k); v != "" {
			got = append(got, k+": "+v)
		}
	}
	return got
}

// The router's own error answers never name a worker, whatever
// --expose-worker-headers says; they keep the decision label.
func TestRouterErrorsNameNoWorker(t *testing.T) {
	var busy []string
	for range 2 {
		up := startEcho(t, []byte(`{"error":"busy"}`), nil, 0)
		up.status = 429
		busy = append(busy, up.url)
	}
	_, bad := startSims(t, 2, func() simworker.Config { c := fastSim(); c.ErrorRate = 1; return c }())
	_, ok := startSims(t, 1, fastSim())
	rBusy := startRouter(t, busy, "round_robin", nil)
	rBad := startRouter(t, bad, "round_robin", nil)
	rDead := startRouter(t, []string{deadURL(t)}, "round_robin", nil)
	for _, w := range rDead.reg.Workers() {
		rDead.reg.SetHealthy(w, true) // as if it had just died
	}
	rSlow := startRouter(t, ok, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) { c.RequestTimeout = 200 * time.Millisecond })
	_, pre := startSims(t, 1, fastSim())
	_, dec := faultySims(t, 2, "error")
	rPD := startPD(t, pre, dec, "round_robin", "round_robin", nil)
	for _, c := range []struct {
		name   string
		r      *testRouter
		hdr    map[string]string
		status int
		code   string
	}{
		{"every worker pushed back", rBusy, nil, 429, "upstream_rate_limited"},
		{"two workers failed it the same way", rBad, nil, 500, "request_failed_upstream"},
		{"upstream failed", rDead, nil, 502, "upstream_failed"},
		{"upstream timeout", rSlow, map[string]string{simworker.FaultHeader: "timeout"}, 504, "upstream_timeout"},
		{"two decode workers failed it the same way", rPD.testRouter, nil, 500, "request_failed_upstream"},
	} {
		resp, body := do(t, "POST", c.r.url+"/v1/chat/completions", chatBody("m", longText("e"), false), c.hdr)
		if resp.StatusCode != c.status || !strings.Contains(string(body), `"code":"`+c.code+`"`) {
			t.Errorf("%s: %d %s, want %d %s", c.name, resp.StatusCode, body, c.status, c.code)
			continue
		}
		if got := workerHeadersOf(resp.Header); len(got) > 0 {
			t.Errorf("%s: the router's %d names workers: %v", c.name, c.status, got)
		}
		if resp.Header.Get("X-Vllm-Router-Decision") == "" {
			t.Errorf("%s: no decision label on the router's error", c.name)
		}
	}
}

// --expose-worker-headers=false: no answer names a worker, not even one a
// worker made (a router behind the router), in whole or PD mode; the
// decision labels stay.
func TestWorkerHeadersCanBeHidden(t *testing.T) {
	hide := func(c *fastproxy.Config, _ *loadview.Config) { c.HideWorkerHeaders = true }
	up := startEcho(t, []byte(`{}`), nil, 0)
	up.header = map[string]string{"X-Vllm-Router-Worker": "http://10.0.0.7:8000", "X-Vllm-Router-Base-Worker": "http://10.0.0.7:8000"}
	shown := startRouter(t, []string{up.url}, "round_robin", nil)
	hidden := startRouter(t, []string{up.url}, "round_robin", hide)
	resp, _ := do(t, "POST", shown.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Vllm-Router-Worker") != up.url {
		t.Fatalf("by default: %d, worker %q, want %s", resp.StatusCode, resp.Header.Get("X-Vllm-Router-Worker"), up.url)
	}
	resp, _ = do(t, "POST", hidden.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
	if got := workerHeadersOf(resp.Header); resp.StatusCode != 200 || len(got) > 0 || resp.Header.Get("X-Vllm-Router-Decision") != "round_robin" {
		t.Fatalf("hidden: %d, worker headers %v, decision %q", resp.StatusCode, got, resp.Header.Get("X-Vllm-Router-Decision"))
	}
	_, pre := startSims(t, 1, fastSim())
	_, dec := startSims(t, 1, fastSim())
	pd := startPD(t, pre, dec, "round_robin", "round_robin", hide)
	for _, stream := range []bool{false, true} {
		resp, body := do(t, "POST", pd.url+"/v1/chat/completions", chatBody("m", longText("pd"), stream), nil)
		if got := workerHeadersOf(resp.Header); resp.StatusCode != 200 || len(got) > 0 || resp.Header.Get("X-Vllm-Router-Decode-Decision") == "" {
			t.Fatalf("PD, stream %v, hidden: %d, worker headers %v: %s", stream, resp.StatusCode, got, body)
		}
	}
	if n := pd.counter(`vllm_router_pd_requests_total{outcome="decoded"}`); n != 2 {
		t.Errorf("decoded %d, want 2", n)
	}
}

// A client the router authenticated keeps its credentials to itself: the
// worker sees the router's --api-key, never the client's Authorization,
// x-api-key (Anthropic's SDKs) or cookies. Without client keys the router
// authenticated nobody, and what is not Authorization passes (the workers
// may check it).
func TestClientCredentialsStayAtTheRouter(t *testing.T) {
	up := startEcho(t, []byte(`{}`), nil, 0)
	keyed := startRouter(t, []string{up.url}, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) {
		c.ClientAPIKeys, c.APIKey = []string{"alice:k-alice"}, "routerkey"
	})
	open := startRouter(t, []string{up.url}, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) { c.APIKey = "routerkey" })
	creds := "Authorization: Bearer k-alice\r\nX-Api-Key: sk-ant-client\r\nCookie: session=c00kie\r\nCookie: other=two\r\nX-Custom: kept\r\n"
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		body := chatBody("m", "hi", false)
		if path == "/v1/messages" {
			body = `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
		}
		status, head, _ := rawRequest(t, keyed.url, "POST", path, creds, body)
		if status != 200 {
			t.Fatalf("%s: %d\n%s", path, status, head)
		}
		got := strings.ToLower(<-up.gotHdr)
		<-up.got
		for _, secret := range []string{"k-alice", "sk-ant-client", "c00kie", "other=two", "x-api-key", "cookie:"} {
			if strings.Contains(got, secret) {
				t.Errorf("%s: the client's %q reached the worker:\n%s", path, secret, got)
			}
		}
		if strings.Count(got, "authorization:") != 1 || !strings.Contains(got, "authorization: bearer routerkey") || !strings.Contains(got, "x-custom: kept") {
			t.Errorf("%s: the worker got\n%s", path, got)
		}
	}
	if status, head, _ := rawRequest(t, open.url, "POST", "/v1/chat/completions", creds, chatBody("m", "hi", false)); status != 200 {
		t.Fatalf("no client keys: %d\n%s", status, head)
	}
	got := strings.ToLower(<-up.gotHdr)
	if !strings.Contains(got, "x-api-key: sk-ant-client") || !strings.Contains(got, "c00kie") || strings.Contains(got, "k-alice") {
		t.Errorf("no client keys: the worker got\n%s", got)
	}
}

// modelDouble is a worker whose /v1/models lists what the test says, and
// which counts how often it was asked.
type modelDouble struct {
	url       string
	models    atomic.Pointer[[]string]
	discovers atomic.Int64 // GET /v1/models received
}

func startModelDouble(t *testing.T, models ...string) *modelDouble {
	t.Helper()
	d := &modelDouble{}
	d.models.Store(&models)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		switch string(ctx.Path()) {
		case "/health":
		case "/v1/models":
			d.discovers.Add(1)
			var b strings.Builder
			for i, m := range *d.models.Load() {
				if i > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"id":%q,"object":"model"}`, m)
			}
			ctx.SetBodyString(`{"object":"list","data":[` + b.String() + `]}`)
		default:
			ctx.SetContentType("application/json")
			ctx.SetBodyString(`{"id":"x","object":"chat.completion","choices":[]}`)
		}
	}}
	go s.Serve(ln)                     //nolint:errcheck
	t.Cleanup(func() { s.Shutdown() }) //nolint:errcheck
	d.url = "http://" + ln.Addr().String()
	return d
}

func (d *modelDouble) list(models ...string) { d.models.Store(&models) }

// An adapter loaded on a worker directly, not through the router, is
// routable at the next request: a model no worker lists makes the router
// ask the workers' /v1/models once more before its 404, without waiting
// for a health check (none runs here).
func TestAdapterLoadedOnAWorkerIsRoutedAtOnce(t *testing.T) {
	sims, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	if err := sims[1].LoadAdapter("sql-lora", "/adapters/sql"); err != nil {
		t.Fatal(err)
	}
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("sql-lora", "hi", false), nil)
	if resp.StatusCode != 200 || resp.Header.Get("x-vllm-router-worker") != urls[1] {
		t.Fatalf("the adapter's first request: %d on %q, want 200 on %s: %s", resp.StatusCode, resp.Header.Get("x-vllm-router-worker"), urls[1], body)
	}
	if n := r.counter("vllm_router_model_rediscoveries_total"); n != 1 {
		t.Errorf("rediscoveries %d, want 1", n)
	}
	// A name nobody serves is still 404, after the same kind of round, at
	// most one per interval (1 s by default).
	resp, body = do(t, "POST", r.url+"/v1/chat/completions", chatBody("nobody-serves-it", "hi", false), nil)
	if resp.StatusCode != 404 || !strings.Contains(string(body), "model_not_found") {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
	if n := r.counter("vllm_router_model_rediscoveries_total"); n > 2 {
		t.Errorf("rediscoveries %d after two requests, want at most 2", n)
	}
}

// A flood of requests for models no worker lists is one round of
// /v1/models per worker, not one per request: the requests that come
// while it runs wait for it, and those for a model it finds are served.
func TestUnknownModelsAreOneRediscoveryRound(t *testing.T) {
	a, b := startModelDouble(t, "m"), startModelDouble(t, "m")
	r := startRouter(t, []string{a.url, b.url}, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) {
		c.ModelRediscoveryInterval = time.Minute // one round for the whole test, however slow the machine
	})
	a0, b0 := a.discovers.Load(), b.discovers.Load() // Add's own discovery
	b.list("m", "new-adapter")
	const n = 40
	var wg sync.WaitGroup
	status := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			model := fmt.Sprintf("ghost-%d", i)
			if i%2 == 0 {
				model = "new-adapter"
			}
			resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(model, "hi", false)))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			status[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	for i, s := range status {
		if want := map[bool]int{true: 200, false: 404}[i%2 == 0]; s != want {
			t.Errorf("request %d (%s): %d, want %d", i, map[bool]string{true: "new-adapter", false: "ghost"}[i%2 == 0], s, want)
		}
	}
	if da, db := a.discovers.Load()-a0, b.discovers.Load()-b0; da != 1 || db != 1 {
		t.Errorf("%d requests for unlisted models asked the workers' /v1/models %d and %d times, want once each", n, da, db)
	}
	if got := r.counter("vllm_router_model_rediscoveries_total"); got != 1 {
		t.Errorf("rediscoveries %d, want 1", got)
	}
}
