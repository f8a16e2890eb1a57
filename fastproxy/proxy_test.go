package fastproxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/simworker"
)

func TestNonStreamedByteExactAndHeaders(t *testing.T) {
	want := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("é\\n", 3000) + `"}}]}`)
	up := startEcho(t, want, nil, 0)
	r := startRouter(t, []string{up.url}, "round_robin", nil)
	body := `{"model":"m",  "messages":[{"role":"user","content":"hi \u00e9 \"q\""}], "x_extra": [1, 2.5e3, null]}`
	resp, got := do(t, "POST", r.url+"/v1/chat/completions", body, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("response body changed by the proxy: %d bytes vs %d", len(got), len(want))
	}
	if fwd := <-up.got; string(fwd) != body {
		t.Fatalf("forwarded body differs:\n got %s\nwant %s", fwd, body)
	}
	for h, v := range map[string]string{
		"x-vllm-router-worker": up.url, "x-vllm-router-base-worker": up.url, "x-vllm-router-decision": "round_robin",
	} {
		if g := resp.Header.Get(h); g != v {
			t.Errorf("%s = %q, want %q", h, g, v)
		}
	}
	if resp.Header.Get("x-vllm-router-dp-rank") != "" {
		t.Error("dp-rank header without data parallelism")
	}
	waitIdle(t, r.reg)
}

func TestStreamedByteExactChunkByChunk(t *testing.T) {
	var chunks [][]byte
	var all []byte
	for i := 0; i < 12; i++ {
		c := []byte(fmt.Sprintf("data: {\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i))
		chunks = append(chunks, c)
		all = append(all, c...)
	}
	chunks = append(chunks, []byte("data: [DONE]\n\n"))
	all = append(all, "data: [DONE]\n\n"...)
	up := startEcho(t, nil, chunks, 40*time.Millisecond)
	r := startRouter(t, []string{up.url}, "cache_aware", nil)

	start := time.Now()
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody("m", "hi", true)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("x-vllm-router-decision") == "" || resp.Header.Get("x-vllm-router-worker") != up.url {
		t.Fatalf("missing router headers on a stream: %v", resp.Header)
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	ttfb := time.Since(start)
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	total := time.Since(start)
	if got := append(first, rest...); !bytes.Equal(got, all) {
		t.Fatalf("stream changed by the proxy:\n got %q\nwant %q", got, all)
	}
	// 12 gaps of 40 ms: the first byte must not wait for the end.
	if ttfb > total/3 {
		t.Fatalf("first byte after %v of %v: the stream was buffered", ttfb, total)
	}
	waitIdle(t, r.reg)
}

func TestSimulatedWorkerStreamAndUsage(t *testing.T) {
	_, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hello there", true), map[string]string{"X-Session-ID": "s1"})
	if resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") || !strings.Contains(string(body), `"usage"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	waitIdle(t, r.reg)
}

func TestLoadReleasedOnClientDisconnectMidStream(t *testing.T) {
	cfg := fastSim()
	cfg.TimeScale = 1
	cfg.InterToken = 20 * time.Millisecond
	cfg.MaxTokens = 500 // 10 s of streaming
	_, urls := startSims(t, 1, cfg)
	r := startRouter(t, urls, "round_robin", nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := chatBody("m", "long answer please", true)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(conn)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "the request in flight", func() bool { return r.reg.Workers()[0].Load() == 1 })
	conn.Close()
	waitIdle(t, r.reg)
}

func TestLoadReleasedOnUpstreamDropMidStream(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "round_robin", nil)
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "x", true)))
	if err == nil {
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
	}
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody("m", "y", true)))
	req.Header.Set(simworker.FaultHeader, "drop")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "[DONE]") {
			t.Fatalf("a dropped stream arrived complete: %s", b)
		}
		if !strings.Contains(string(b), `"code":"stream_cut"`) {
			t.Fatalf("a stream cut by the worker ended without an error event: %s", b)
		}
	}
	waitIdle(t, r.reg)
}

// TestStreamAwaitsItsFirstByteUntilItComes: a streamed request counts as
// awaiting its first byte (loadview.Worker.Awaiting, what the estimate
// weighs a new prefill by) from its send until the worker's first body
// byte, though the worker sent its headers at once, and then only as in
// flight until its end.
func TestStreamAwaitsItsFirstByteUntilItComes(t *testing.T) {
	prefilled, done := make(chan struct{}), make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/v1/chat/completions" {
			return // health
		}
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			w.Flush() //nolint:errcheck // the headers, before any token
			<-prefilled
			w.WriteString("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n") //nolint:errcheck
			w.Flush()                                                                   //nolint:errcheck
			<-done
			w.WriteString("data: [DONE]\n\n") //nolint:errcheck
		})
	}}
	go up.Serve(ln)                     //nolint:errcheck
	t.Cleanup(func() { up.Shutdown() }) //nolint:errcheck
	prefill, finish := sync.OnceFunc(func() { close(prefilled) }), sync.OnceFunc(func() { close(done) })
	t.Cleanup(finish) // before Shutdown, which waits for the handler
	t.Cleanup(prefill)
	r := startRouter(t, []string{"http://" + ln.Addr().String()}, "cache_aware", nil)
	w := r.reg.Workers()[0]
	got := make(chan error, 1)
	go func() {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "hello", true)))
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		got <- err
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		testwait.Until(t, what, cond, func() string { return fmt.Sprintf("in flight %d, awaiting %d", w.Load(), w.Awaiting()) })
	}
	waitFor("sent, no byte yet", func() bool { return w.Load() == 1 && w.Awaiting() == 1 })
	prefill()
	waitFor("first token relayed", func() bool { return w.Load() == 1 && w.Awaiting() == 0 })
	finish()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	waitIdle(t, r.reg)
}

// TestBodilessAnswerToAStreamReleasesItsWorker: a streamed request that
// the worker answers without a body (204, or 200 with Content-Length 0)
// comes back fully buffered; it is relayed as is, and the worker's counters
// of requests in flight and awaiting a first byte return to 0.
func TestBodilessAnswerToAStreamReleasesItsWorker(t *testing.T) {
	for _, status := range []int{http.StatusNoContent, http.StatusOK} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) == "/v1/chat/completions" {
				ctx.SetStatusCode(status)
			}
		}}
		go up.Serve(ln)                     //nolint:errcheck
		t.Cleanup(func() { up.Shutdown() }) //nolint:errcheck
		r := startRouter(t, []string{"http://" + ln.Addr().String()}, "cache_aware", nil)
		resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hello", true), nil)
		if resp.StatusCode != status || len(body) != 0 {
			t.Fatalf("answer %d relayed as %d with %q", status, resp.StatusCode, body)
		}
		waitIdle(t, r.reg)
	}
}

func TestRetryLandsOnAnotherWorker(t *testing.T) {
	bad := fastSim()
	bad.ErrorRate = 1
	_, badURLs := startSims(t, 1, bad)
	_, goodURLs := startSims(t, 1, fastSim())
	r := startRouter(t, append(badURLs, goodURLs...), "round_robin", nil)
	before := r.counter("vllm_router_retries_total")
	for i := 0; i < 6; i++ {
		resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", i%2 == 0), nil)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d %s", i, resp.StatusCode, body)
		}
		if w := resp.Header.Get("x-vllm-router-worker"); w != goodURLs[0] {
			t.Fatalf("request %d served by %s, want the healthy %s", i, w, goodURLs[0])
		}
	}
	if d := r.counter("vllm_router_retries_total") - before; d < 3 {
		t.Fatalf("retries counted %d, want ≥ 3", d)
	}
	waitIdle(t, r.reg)
}

func TestErrorsAreOpenAIJSON(t *testing.T) {
	bad := fastSim()
	bad.ErrorRate = 1
	_, badURLs := startSims(t, 2, bad)
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) { c.MaxPayloadSize = 4096 })
	rBad := startRouter(t, badURLs, "round_robin", nil)
	rDead := startRouter(t, []string{deadURL(t), deadURL(t)}, "round_robin", func(_ *fastproxy.Config, l *loadview.Config) {
		l.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	})
	for _, w := range rDead.reg.Workers() {
		rDead.reg.SetHealthy(w, true) // as if they had just died
	}
	rSlow := startRouter(t, urls, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) { c.RequestTimeout = 200 * time.Millisecond })
	rNone := startRouter(t, urls, "round_robin", nil)
	for _, w := range rNone.reg.Workers() {
		rNone.reg.SetHealthy(w, false)
	}
	f := func(name string, r *testRouter, method, path, body string, hdr map[string]string, status int, code string) {
		t.Helper()
		resp, b := do(t, method, r.url+path, body, hdr)
		if resp.StatusCode != status {
			t.Errorf("%s: status %d, want %d (%s)", name, resp.StatusCode, status, b)
			return
		}
		if !strings.Contains(string(b), `"error":{"message":`) || !strings.Contains(string(b), `"code":"`+code+`"`) {
			t.Errorf("%s: not an OpenAI error with code %s: %s", name, code, b)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: content-type %q", name, ct)
		}
	}
	f("malformed", r, "POST", "/v1/chat/completions", `{"model":"m","messages":[`, nil, 400, "invalid_request")
	f("not an object", r, "POST", "/v1/chat/completions", `[1,2]`, nil, 400, "invalid_request")
	f("too large", r, "POST", "/v1/chat/completions", chatBody("m", strings.Repeat("a", 5000), false), nil, 413, "payload_too_large")
	f("unknown model", r, "POST", "/v1/chat/completions", chatBody("nope", "hi", false), nil, 404, "model_not_found")
	f("wrong method", r, "GET", "/v1/chat/completions", "", nil, 405, "method_not_allowed")
	f("no healthy worker", rNone, "POST", "/v1/chat/completions", chatBody("m", "hi", false), nil, 503, "no_healthy_worker")
	f("the request's own fault", rBad, "POST", "/v1/chat/completions", chatBody("m", "hi", false), nil, 500, "request_failed_upstream")
	f("upstream failed", rDead, "POST", "/v1/chat/completions", chatBody("m", "hi", false), nil, 502, "upstream_failed")
	f("upstream timeout", rSlow, "POST", "/v1/chat/completions", chatBody("m", "hi", false), map[string]string{simworker.FaultHeader: "timeout"}, 504, "upstream_timeout")
	for _, tr := range []*testRouter{r, rBad, rSlow, rDead} {
		waitIdle(t, tr.reg)
	}
}

func TestAdminAddRemoveAndHealthFlip(t *testing.T) {
	sims, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls[:1], "round_robin", nil)
	admin := r.adminURL(t)
	resp, b := do(t, "POST", admin+"/add_worker?url="+urls[1], "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("add_worker: %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, "POST", admin+"/add_worker?url="+urls[1], "", nil); resp.StatusCode != 409 {
		t.Fatalf("duplicate add: %d", resp.StatusCode)
	}
	seen := map[string]int{}
	for i := 0; i < 4; i++ {
		resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
		seen[resp.Header.Get("x-vllm-router-worker")]++
	}
	if seen[urls[0]] != 2 || seen[urls[1]] != 2 {
		t.Fatalf("round robin over the added worker: %v", seen)
	}
	// Health flip: worker 1 fails its checks and stops receiving requests.
	sims[1].SetHealthy(false)
	for i := 0; i < 3; i++ {
		r.reg.CheckOnce(context.Background())
	}
	for i := 0; i < 4; i++ {
		resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
		if w := resp.Header.Get("x-vllm-router-worker"); w != urls[0] {
			t.Fatalf("unhealthy worker %s still routed to", w)
		}
	}
	sims[1].SetHealthy(true)
	for i := 0; i < 2; i++ {
		r.reg.CheckOnce(context.Background())
	}
	if !r.reg.ByURL(urls[1]).Healthy() {
		t.Fatal("worker did not recover after passing health checks")
	}
	resp, b = do(t, "DELETE", admin+"/workers/"+urls[1], "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("delete: %d %s", resp.StatusCode, b)
	}
	_, b = do(t, "GET", admin+"/list_workers", "", nil)
	if strings.Contains(string(b), urls[1]) || !strings.Contains(string(b), urls[0]) {
		t.Fatalf("list after delete: %s", b)
	}
	if resp, _ := do(t, "POST", admin+"/remove_worker?url="+urls[1], "", nil); resp.StatusCode != 404 {
		t.Fatalf("removing an absent worker: %d", resp.StatusCode)
	}
}

func TestDataParallelRankHeader(t *testing.T) {
	up := startEcho(t, []byte(`{}`), nil, 0)
	r := startRouter(t, []string{up.url}, "round_robin", func(_ *fastproxy.Config, l *loadview.Config) { l.DPSize = 2 })
	ranks := map[string]bool{}
	for i := 0; i < 4; i++ {
		resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), map[string]string{"X-Data-Parallel-Rank": "7"})
		<-up.got
		got := strings.ToLower(<-up.gotHdr)
		rk := resp.Header.Get("x-vllm-router-dp-rank")
		if resp.Header.Get("x-vllm-router-worker") != up.url+"@"+rk || resp.Header.Get("x-vllm-router-base-worker") != up.url {
			t.Fatalf("worker headers: %v", resp.Header)
		}
		if strings.Count(got, "x-data-parallel-rank:") != 1 || !strings.Contains(got, "x-data-parallel-rank: "+rk+"\r\n") {
			t.Fatalf("rank %s: the worker saw\n%s", rk, got)
		}
		ranks[rk] = true
	}
	if !ranks["0"] || !ranks["1"] {
		t.Fatalf("ranks used: %v", ranks)
	}
}

// TestRankNotCarriedToTheNextWorker: an attempt that sets a data-parallel
// rank on the request and fails over leaves no rank for a worker that has
// none.
func TestRankNotCarriedToTheNextWorker(t *testing.T) {
	ranked := startEcho(t, []byte(`{}`), nil, 0)
	ranked.status = 503 // back pressure: the request fails over
	plain := startEcho(t, []byte(`{}`), nil, 0)
	r := startRouter(t, []string{ranked.url + "@3", plain.url}, "round_robin", nil)
	retried := 0
	for range 4 {
		resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		select {
		case h := <-ranked.gotHdr:
			<-ranked.got
			if !strings.Contains(strings.ToLower(h), "x-data-parallel-rank: 3\r\n") {
				t.Fatalf("the ranked worker saw no rank:\n%s", h)
			}
			retried++
		default:
		}
		<-plain.got
		if h := strings.ToLower(<-plain.gotHdr); strings.Contains(h, "x-data-parallel-rank") {
			t.Fatalf("the rank of the failed attempt reached the next worker:\n%s", h)
		}
	}
	if retried == 0 {
		t.Fatal("no request failed over from the ranked worker")
	}
}

func TestShutdownWaitsForInFlightStream(t *testing.T) {
	cfg := fastSim()
	cfg.TimeScale = 1
	cfg.InterToken = 10 * time.Millisecond
	cfg.MaxTokens = 30
	_, urls := startSims(t, 1, cfg)
	r := startRouter(t, urls, "round_robin", nil)
	done, started := make(chan string, 1), make(chan struct{})
	go func() {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "x", true)))
		close(started) // the stream's headers arrived: it is in flight
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if got := <-done; !strings.Contains(got, "[DONE]") {
		t.Fatalf("in-flight stream cut by shutdown: %q", got)
	}
}

func TestMetricsListener(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hello metrics", false), map[string]string{"X-Session-ID": "mx"})
	obsURL := r.adminURL(t)
	_, body := do(t, "GET", obsURL+"/metrics", "", nil)
	for _, want := range []string{
		`vllm_router_request_duration_seconds_count{route="/v1/chat/completions"} 1`,
		`vllm_router_running_requests{worker="` + urls[0] + `"} 0`,
		`vllm_router_worker_health{worker="` + urls[0] + `"} 1`,
		`vllm_router_sessions{model="m"} 1`,
		`vllm_router_requests_total{route="/v1/chat/completions",status="200"}`,
		`vllm_router_cache_aware_decisions_total{decision="no_tree_random"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	_, body = do(t, "GET", obsURL+"/debug/sessions?model=m", "", nil)
	if !strings.Contains(string(body), `"session":"mx"`) || !strings.Contains(string(body), `"tree_chars"`) {
		t.Errorf("/debug/sessions: %s", body)
	}
	if resp, _ := do(t, "GET", obsURL+"/debug/pprof/", "", nil); resp.StatusCode != 200 {
		t.Errorf("pprof index: %d", resp.StatusCode)
	}
}

func TestOnlyKnownPathsAreProxied(t *testing.T) {
	_, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls, "round_robin", nil)
	for _, path := range []string{"/ping", "/metrics", "/sleep", "/workers", "/v1/router_replay", "/debug/pprof/"} {
		resp, body := do(t, "GET", r.url+path, "", nil)
		if resp.StatusCode != 404 || resp.Header.Get("x-vllm-router-decision") != "" {
			t.Fatalf("GET %s: %d %v %s", path, resp.StatusCode, resp.Header, body)
		}
	}
	for _, path := range []string{"/v1/chat/completions/../../workers", "/%2e%2e%2f%2e%2e%2fworkers", "/v1%2fmodels", "//v1/models"} {
		status, head, body := rawRequest(t, r.url, "GET", path, "", "")
		if status != 400 && status != 404 {
			t.Fatalf("GET %s: %d\n%s\n%s", path, status, head, body)
		}
	}
	status, head, _ := rawRequest(t, r.url, "CONNECT", "127.0.0.1:22", "", "")
	if status != 400 && status != 404 && status != 405 {
		t.Fatalf("CONNECT: %d\n%s", status, head)
	}
	// A documented worker endpoint is proxied, with the router's headers.
	resp, body := do(t, "POST", r.url+"/tokenize", `{"model":"m","prompt":"hi"}`, nil)
	if resp.Header.Get("x-vllm-router-decision") != "round_robin" {
		t.Fatalf("POST /tokenize was not proxied: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	waitIdle(t, r.reg)
}

func TestSlowClientIsCut(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) { c.ReadTimeout = 200 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Headers promise a body that never comes.
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":")
	conn.SetReadDeadline(time.Now().Add(3 * time.Second)) //nolint:errcheck
	start := time.Now()
	b, _ := io.ReadAll(conn) // returns when the router closes the connection
	if time.Since(start) > 2*time.Second {
		t.Fatalf("stalled client not cut after %v", time.Since(start))
	}
	if len(b) > 0 && !strings.Contains(string(b), "408") {
		t.Fatalf("stalled client got %q", b)
	}
	waitIdle(t, r.reg)
}

// A keep-alive connection's second request is cut by the read timeout too,
// not by the longer idle timeout armed between requests (the deadlines are
// armed lazily: lazydeadline).
func TestSlowKeepAliveRequestIsCut(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) {
		c.ReadTimeout = 200 * time.Millisecond
		c.IdleTimeout = time.Minute
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := chatBody("m", "first", false)
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	// The second request's body never comes.
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck
	start := time.Now()
	rest, _ := io.ReadAll(br) // returns when the router closes the connection
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("stalled second request not cut after %v", took)
	}
	if len(rest) > 0 && !strings.Contains(string(rest), "408") {
		t.Fatalf("stalled second request got %q", rest)
	}
	waitIdle(t, r.reg)
}

// rawRequest sends one HTTP/1.1 request byte for byte (header names in the
// case the caller wrote) and returns the response head and body.
func rawRequest(t *testing.T, url, method, path, headers, body string) (status int, head, respBody string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\n%scontent-length: %d\r\n\r\n%s",
		method, path, headers, len(body), body)
	b, _ := io.ReadAll(conn)
	h, rest, _ := strings.Cut(string(b), "\r\n\r\n")
	fmt.Sscanf(h, "HTTP/1.1 %d", &status)
	return status, h, rest
}

func TestHeaderNamesAreCaseInsensitive(t *testing.T) {
	_, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	body := chatBody("m", "lowercase headers", false)
	_, h1, _ := rawRequest(t, r.url, "POST", "/v1/chat/completions", "x-session-id: lower-1\r\n", body)
	_, h2, _ := rawRequest(t, r.url, "POST", "/v1/chat/completions", "X-SESSION-ID: lower-1\r\n", body+" ")
	if !strings.Contains(strings.ToLower(h2), "x-vllm-router-decision: session_id_match") {
		t.Fatalf("a session sent as x-session-id then X-SESSION-ID was not one session:\n%s\n---\n%s", h1, h2)
	}
}

func TestForwardedHeadersAreTheRouters(t *testing.T) {
	up := startEcho(t, []byte(`{}`), nil, 0)
	up.header = map[string]string{"X-Vllm-Router-Decision": "upstream_tier", "Connection": "close", "Keep-Alive": "timeout=5",
		"Proxy-Authenticate": "Basic", "Upgrade": "h2c"}
	r := startRouter(t, []string{up.url}, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) { c.APIKey = "routerkey" })
	status, head, _ := rawRequest(t, r.url, "POST", "/v1/chat/completions",
		"authorization: Bearer client\r\nx-data-parallel-rank: 7\r\nkeep-alive: 300\r\nte: trailers\r\nconnection: x-hop\r\nx-hop: secret\r\n"+
			"proxy-connection: keep-alive\r\nproxy-authorization: Basic c2VjcmV0\r\nupgrade: h2c\r\ntrailer: x-checksum\r\n", chatBody("m", "hi", false))
	if status != 200 {
		t.Fatalf("status %d\n%s", status, head)
	}
	got := strings.ToLower(<-up.gotHdr)
	if strings.Count(got, "authorization:") != 1 || !strings.Contains(got, "authorization: bearer routerkey") {
		t.Errorf("upstream authorization headers:\n%s", got)
	}
	for _, h := range []string{"x-data-parallel-rank", "keep-alive", "te:", "x-hop", "proxy-", "upgrade", "trailer"} { // x-hop: named by Connection
		if strings.Contains(got, h) {
			t.Errorf("client header %s reached the worker:\n%s", h, got)
		}
	}
	lh := strings.ToLower(head)
	if strings.Count(lh, "x-vllm-router-decision:") != 1 || !strings.Contains(lh, "x-vllm-router-decision: round_robin") {
		t.Errorf("decision headers on the response:\n%s", head)
	}
	for _, h := range []string{"keep-alive: timeout", "proxy-authenticate", "upgrade"} {
		if strings.Contains(lh, h) {
			t.Errorf("the worker's hop-by-hop header %s reached the client:\n%s", h, head)
		}
	}
}

func TestRouterErrorsDoNotCarryTheWorkersHeaders(t *testing.T) {
	up := startEcho(t, []byte(`{"error":"busy"}`), nil, 0)
	up.status, up.header = 503, map[string]string{"Set-Cookie": "a=b", "Retry-After": "120", "Content-Encoding": "gzip"}
	r := startRouter(t, []string{up.url}, "round_robin", nil)
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
	// 503 is back pressure: passed on as the router's own 503 with the
	// worker's Retry-After, and nothing else of the worker's answer.
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "120" || !strings.Contains(string(body), `"code":"upstream_unavailable"`) {
		t.Fatalf("status %q retry-after %q: %s", resp.Status, resp.Header.Get("Retry-After"), body)
	}
	for _, h := range []string{"Set-Cookie", "Content-Encoding"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("router's 503 carries the worker's %s: %s", h, v)
		}
	}
	if resp.Header.Get("x-vllm-router-decision") != "round_robin" {
		t.Errorf("decision header missing on the router's error: %v", resp.Header)
	}
}

func TestEscapedModelName(t *testing.T) {
	cfg := fastSim()
	cfg.Models = []string{"org/model"}
	_, urls := startSims(t, 1, cfg)
	r := startRouter(t, urls, "round_robin", nil)
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", `{"model":"org\/model","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("escaped model name: %d %s", resp.StatusCode, body)
	}
}

func TestStreamDurationAndPassThroughStreaming(t *testing.T) {
	var chunks [][]byte
	for i := 0; i < 8; i++ {
		chunks = append(chunks, []byte(fmt.Sprintf("data: {\"n\":%d}\n\n", i)))
	}
	up := startEcho(t, nil, chunks, 40*time.Millisecond)
	r := startRouter(t, []string{up.url}, "round_robin", nil)
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		start := time.Now()
		req, _ := http.NewRequest("POST", r.url+path, strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		first := make([]byte, 1)
		io.ReadFull(resp.Body, first) //nolint:errcheck
		ttfb := time.Since(start)
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
		if total := time.Since(start); ttfb > total/3 {
			t.Errorf("%s: first byte after %v of %v: buffered", path, ttfb, total)
		}
	}
	obsURL := r.adminURL(t)
	_, m := do(t, "GET", obsURL+"/metrics", "", nil)
	var sum float64
	for _, line := range strings.Split(string(m), "\n") {
		if strings.HasPrefix(line, `vllm_router_request_duration_seconds_sum{route="/v1/chat/completions"}`) {
			fmt.Sscanf(line[strings.LastIndexByte(line, ' ')+1:], "%g", &sum)
		}
	}
	if sum < 0.25 { // 8 chunks 40 ms apart
		t.Fatalf("a 0.3 s stream was timed %g s: only up to its headers", sum)
	}
}

func TestLongSessionKeysAreHashed(t *testing.T) {
	_, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	long := strings.Repeat("k", 10000)
	do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "a", false), map[string]string{"X-Session-ID": long})
	resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "b", false), map[string]string{"X-Session-ID": long})
	if resp.Header.Get("x-vllm-router-decision") != "session_id_match" {
		t.Fatalf("a long session id did not stick: %s", resp.Header.Get("x-vllm-router-decision"))
	}
	obsURL := r.adminURL(t)
	_, body := do(t, "GET", obsURL+"/debug/sessions", "", nil)
	if strings.Contains(string(body), long[:300]) || !strings.Contains(string(body), "sha256:") {
		t.Fatalf("the router stored the 10 KB key itself: %.300s", body)
	}
}
