package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// probes is the chaos table, in the order of the report. Each probe starts
// its own router (and workers) so that one's damage cannot hide another's.
var probes = []probe{
	// Regression rows: attacks the router already survives.
	{name: "pipelining", what: "3 pipelined requests on one connection answer in order", quick: true, run: probePipelining},
	{name: "smuggling", what: "CL+TE, obs-folded TE, obs-fold: never two requests out of one", quick: true, run: probeSmuggling},
	{name: "slowloris", what: "40 conns trickle headers: cut by the read timeout, no goroutine growth, others served", run: probeSlowloris},
	{name: "client-stream-cut", what: "client drops a stream after one chunk: load released, router serves on", run: probeClientStreamCut},
	{name: "sigterm-drain", what: "SIGTERM during a stream: the stream completes, exit code 0", run: probeSigtermDrain},

	// Surface.
	{name: "unknown-paths", what: "unknown paths 404, CONNECT/TRACE 405|404, dot-dot and encoded separators 400|404, never admin", quick: true, run: probeUnknownPaths},
	{name: "admin-no-key", what: "no --admin-api-key: admin surfaces 404 on the inference port, open on loopback metrics listener", run: probeAdminNoKey},
	{name: "admin-key", what: "--admin-api-key: 401 without/with wrong bearer; allowlist and --max-workers enforced", run: probeAdminKey},
	{name: "client-api-keys", what: "--client-api-keys: inference needs a listed bearer; the key is not sent to workers", run: probeClientKeys},
	{name: "error-shape", what: "errors are OpenAI JSON (control bytes in model too), carry x-request-id, no secret", quick: true, run: probeErrorShape},
	{name: "oversized-headers", what: "64 KB of headers -> 431, router serves on", run: probeOversizedHeaders},
	{name: "no-leak", what: "garbage status line / 500 with raw bytes / echoed headers: error bodies carry none of it", run: probeNoLeak},
	{name: "upstream-headers", what: "workers get --api-key (not the client's bearer) and the request id", run: probeUpstreamHeaders},
	{name: "request-id", what: "generated/echoed x-request-id on errors; log lines of a failed-over request carry it", run: probeRequestID},

	// Faults.
	{name: "dial-failover", what: "a worker port with nothing listening: every request fails over, 0 client errors", run: probeDialFailover},
	{name: "connect-timeout", what: "a listener that never accepts, --connect-timeout-secs 1: fail over within ~1 s", run: probeConnectTimeout},
	{name: "first-byte-timeout", what: "a worker that accepts and never answers, --first-byte-timeout-secs 1: fail over within ~1 s + health probe", run: probeFirstByteTimeout},
	{name: "backpressure-failover", what: "429/503 workers: retried elsewhere, 0 client errors, never counted by the breaker", run: probeBackpressureFailover},
	{name: "backpressure-passthrough", what: "every worker 429 (or 503): client gets 429/503 + Retry-After, never 502", run: probeBackpressurePassthrough},
	{name: "request-fault-500", what: "7 requests that make every worker answer 500: answered 500, fleet not ejected", run: probeRequestFault},
	{name: "worker-restart", what: "a worker killed and restarted on its port serves again within ~3 s", run: probeWorkerRestart},
	{name: "client-cancel", what: "client leaves a non-streaming request: upstream connection closed, load released at once", run: probeClientCancel},
	{name: "worker-dies-mid-stream", what: "worker cuts a stream: alone, the stream ends with data: {\"error\":{…\"stream_cut\"}}, logged; with a second worker it goes on there, one well-formed answer", run: probeWorkerDiesMidStream},
	{name: "stream-resume", what: "50 streams in flight on 4 workers, one killed mid-stream 20 times: every continuable stream identical to the uninterrupted answer (>= 99 % of those cut), usage adds up, no error event; n=2 and logprobs streams end with stream_cut; resumes counted", run: probeStreamResume},
	{name: "stream-first-byte", what: "a worker that accepts a stream and never answers, --first-byte-timeout-secs 1: another worker serves within ~1 s; the default is 300 s", run: probeStreamFirstByte},
	{name: "stream-client-leaves", what: "4 clients leave streams whose worker stalls: load 0 and the upstream connections closed within 1 s", run: probeStreamClientLeaves},
	{name: "single-worker-500", what: "a model's only worker answers 500 to 12 requests: each an error (500 or 502), the next normal request served (no 503)", run: probeSingleWorker500},

	// A disaggregated prefill/decode fleet (pd.go): cmd/simworker processes, SIGKILLed.
	{name: "pd-decode-killed-mid-stream", what: "2 prefill + 2 decode workers, 64 streams in flight, the decode worker streaming to most SIGKILLed: every stream one well-formed answer identical to the uninterrupted one, continued whole on a prefill worker (resumes counted), no error; later streams decoded on the survivor", run: probePDDecodeKilled},
	{name: "pd-decode-fails-first-byte", what: "a decode worker answers 500, then resets, before any byte: every request (half streamed) decoded on the other with its one prefill; decode retries = failed legs", run: probePDDecodeFailsFirstByte},
	{name: "pd-prefill-killed", what: "24 clients (half streamed, ~2,000-token prompts), the prefill worker with the most legs in flight SIGKILLed: they fail over to the other, 0 client errors; later requests prefilled on the survivor", run: probePDPrefillKilled},
	{name: "pd-no-decode-left", what: "both decode workers SIGKILLed: no request fails (before they are marked down, within 15 s, the prefill worker that prefilled a request serves it whole), then every request served whole by a prefill worker (outcome=\"whole\")", run: probePDNoDecodeLeft},

	// Bounds.
	{name: "many-models", what: "5,000 distinct unknown model names: all 404, /metrics size and RSS flat", run: probeManyModels},
	{name: "max-sessions", what: "--max-sessions 512 with 1,500 sessions: vllm_router_sessions{model} <= 1.25 x 512", run: probeMaxSessions},
	{name: "max-payload", what: "--max-payload-size 64 KiB: 100 KiB body -> 413 JSON, router serves on", run: probeMaxPayload},
	{name: "fd-exhaustion", what: "RLIMIT_NOFILE 1024, 3,000 idle conns: router never exits, serves again once they close", run: probeFDExhaustion},
	{name: "idle-conns", what: "RLIMIT_NOFILE 1024, 770 zero-byte conns: new requests served within 2 s; --client-header-timeout-secs 1 closes zero-byte conns within ~1 s", run: probeIdleConns},
	{name: "concurrency-limit", what: "--max-concurrent-requests 8 without a queue, 32 slow requests: some 429 + Retry-After, none 5xx", run: probeConcurrencyLimit},
	{name: "queue-limit", what: "--max-concurrent-requests 8 --queue-size 8, 32 slow requests: the waiting served with x-vllm-router-queue-ms, the rest 429 queue_full + Retry-After, none 5xx", run: probeQueueLimit},
	{name: "metrics-valid", what: "/metrics after hostile traffic parses as Prometheus text", run: probeMetricsValid},
}

var bg = context.Background()

// ---- regression rows ----

func probePipelining(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls) {
		return
	}
	body := string(chatBody(model, "pipelined", false, 0))
	payload := "GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n" +
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body +
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
	e.count(3)
	out, err := raw(e.r.addr, payload, 3*time.Second)
	if err != nil {
		e.unexpected("pipelining: %v", err)
		return
	}
	if got := strings.Join(statuses(out), ","); got != "200,200,200" {
		e.unexpected("pipelined statuses %q, want 200,200,200", got)
	}
}

func probeSmuggling(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls) {
		return
	}
	js := string(chatBody(model, "smuggle", false, 0))
	smuggled := "GET /smuggled-9d2 HTTP/1.1\r\nHost: x\r\n\r\n"
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(js), js) + smuggled
	cases := []struct{ name, payload string }{
		{"CL+TE", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Content-Length: " + strconv.Itoa(len(chunked)) + "\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked},
		{"TE+CL", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n" +
			"Content-Length: " + strconv.Itoa(len(chunked)) + "\r\nContent-Type: application/json\r\n\r\n" + chunked},
		{"obs-fold TE", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
			"Content-Length: " + strconv.Itoa(len(chunked)) + "\r\nTransfer-Encoding:\r\n chunked\r\n\r\n" + chunked},
		{"obs-fold header", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Folded: a\r\n b\r\n" +
			"Content-Length: " + strconv.Itoa(len(js)) + "\r\n\r\n" + js + smuggled},
	}
	for _, c := range cases {
		e.count(1)
		out, err := raw(e.r.addr, c.payload, 1500*time.Millisecond)
		if err != nil {
			e.unexpected("%s: %v", c.name, err)
			continue
		}
		st := statuses(out)
		switch {
		case len(st) == 0:
			e.failf("%s: no response at all", c.name)
		case len(st) > 1 && c.name != "obs-fold header":
			e.failf("%s: smuggled request served (%d responses: %v)", c.name, len(st), st)
		case c.name == "obs-fold header" && len(st) > 1 && st[0] != "400":
			// a plain second request after a complete body is pipelining,
			// but only when the folded header was accepted as one header.
		}
		if st0 := first(st); st0 != "" && st0 != "400" && st0 != "200" {
			e.failf("%s: status %s, want 400 (or 200 with one request)", c.name, st0)
		}
		if first(st) == "400" {
			e.explain("400 for an ambiguous framing (intended)")
		}
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func probeSlowloris(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls) {
		return
	}
	const n = 40
	before := e.r.goroutines()
	var cut atomic.Int64
	var wg sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	stop := make(chan struct{})
	deadline := time.Now().Add(80 * time.Second)
	for range n {
		c, err := net.DialTimeout("tcp", e.r.addr, 2*time.Second)
		if err != nil {
			e.failf("dial: %v", err)
			continue
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		e.count(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "); err != nil {
				cut.Add(1)
				return
			}
			// Detect the router closing the connection.
			closed := make(chan struct{})
			go func() {
				c.SetReadDeadline(deadline)
				io.Copy(io.Discard, c)
				close(closed)
			}()
			t := time.NewTicker(2 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-closed:
					cut.Add(1)
					return
				case <-stop:
					return
				case <-t.C:
					if time.Now().After(deadline) {
						return
					}
					if _, err := io.WriteString(c, "a"); err != nil {
						cut.Add(1)
						return
					}
				}
			}
		}()
	}
	// Meanwhile, normal requests keep being served.
	for time.Now().Before(deadline) && cut.Load() < int64(len(conns)) {
		if r := e.chat(model, nil); r.err != nil || r.status != 200 {
			e.unexpected("request during slowloris: %s", r)
		}
		time.Sleep(5 * time.Second)
	}
	close(stop)
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	wg.Wait()
	if got := cut.Load(); got < int64(len(conns)) {
		e.failf("only %d of %d trickling connections were cut within 80 s", got, len(conns))
	} else {
		e.explain("trickling connection cut by the read timeout (intended)")
		// the explain above counts once; count the rest
		for range len(conns) - 1 {
			e.explain("trickling connection cut by the read timeout (intended)")
		}
	}
	// fasthttp keeps idle workers up to 2 × 10 s: poll up to 25 s for the count to fall back.
	after := e.r.goroutines()
	for t0 := time.Now(); before >= 0 && after > before+10 && time.Since(t0) < 25*time.Second; after = e.r.goroutines() {
		time.Sleep(500 * time.Millisecond)
	}
	if before >= 0 && after > before+10 {
		e.failf("goroutines %d -> %d 25 s after the slowloris connections closed (%s)", before, after, e.r.goroutineTop())
	}
}

func probeClientStreamCut(e *env) {
	ws, urls := e.sims(1, 1)
	if !e.start(urls) {
		return
	}
	ctx, cancel := context.WithCancel(bg)
	st, _, lines, err := e.streamChat(ctx, chatBody(model, "long stream", true, 300), nil, func(string) bool { return false })
	cancel()
	if err != nil || st != 200 || len(lines) == 0 {
		e.unexpected("stream start: status %d, %d lines, %v", st, len(lines), err)
	}
	e.explain("stream the client itself cut (intended)")
	t0 := time.Now()
	if n := e.r.settleLoad(2 * time.Second); n != 0 {
		e.failf("load %d 2 s after the client cut its stream", n)
	} else if d := time.Since(t0); d > time.Second {
		e.failf("load released only after %s", d.Round(time.Millisecond))
	}
	deadline := time.Now().Add(4 * time.Second)
	for ws[0].Stats().Running > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := ws[0].Stats().Running; n > 0 {
		e.failf("worker still generating for the cut stream after 4 s")
	}
	if r := e.chat(model, nil); r.status != 200 {
		e.unexpected("request after the cut: %s", r)
	}
}

func probeSigtermDrain(e *env) {
	_, urls := e.sims(1, 1)
	if !e.start(urls, "--shutdown-grace-secs", "10") {
		return
	}
	e.expectExit = true
	var signaled bool
	st, _, lines, err := e.streamChat(bg, chatBody(model, "drain me", true, 150), nil, func(string) bool {
		if !signaled {
			signaled = true
			e.r.cmd.Process.Signal(syscall.SIGTERM)
		}
		return true
	})
	if err != nil || st != 200 {
		e.unexpected("stream during SIGTERM: status %d: %v", st, err)
	}
	if len(lines) == 0 || lines[len(lines)-1] != "data: [DONE]" {
		e.unexpected("the in-flight stream did not complete (%d lines, last %q)", len(lines), clip(last(lines), 80))
	}
	select {
	case <-e.r.done:
		if e.r.exitCode != 0 {
			e.failf("exit code %d after SIGTERM, want 0", e.r.exitCode)
		}
	case <-time.After(10 * time.Second):
		e.failf("router still running 10 s after SIGTERM")
	}
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

// ---- surface ----

func probeUnknownPaths(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls) {
		return
	}
	cases := []struct {
		line string
		want []string
	}{
		{"GET /foo HTTP/1.1", []string{"404"}},
		{"GET /admin HTTP/1.1", []string{"404"}},
		{"GET /v1/unknown HTTP/1.1", []string{"404"}},
		{"POST /v1/chat/completions/extra HTTP/1.1", []string{"404"}},
		{"GET /metrics HTTP/1.1", []string{"404"}},
		{"CONNECT 127.0.0.1:22 HTTP/1.1", []string{"405", "404", "400"}},
		{"TRACE / HTTP/1.1", []string{"405", "404"}},
		{"GET /../workers HTTP/1.1", []string{"400", "404"}},
		{"GET /v1/../workers HTTP/1.1", []string{"400", "404"}},
		{"GET /v1/%2e%2e/workers HTTP/1.1", []string{"400", "404"}},
		{"GET /%2e%2e%2f%2e%2e%2fworkers HTTP/1.1", []string{"400", "404"}},
		{"GET /v1%2fmodels HTTP/1.1", []string{"400", "404"}},
		{"GET /v1/chat%2fcompletions HTTP/1.1", []string{"400", "404"}},
		{"GET /list_workers/%2e%2e HTTP/1.1", []string{"400", "404"}},
	}
	for _, c := range cases {
		e.count(1)
		out, err := raw(e.r.addr, c.line+"\r\nHost: x\r\nConnection: close\r\n\r\n", time.Second)
		if err != nil {
			e.unexpected("%s: %v", c.line, err)
			continue
		}
		st := first(statuses(out))
		okSt := false
		for _, w := range c.want {
			okSt = okSt || st == w
		}
		if !okSt {
			e.unexpected("%q -> %q, want %v", c.line, st, c.want)
			continue
		}
		e.explain("404/405/400 for a path or method outside the table (intended)")
		body := rawBody(out)
		if strings.Contains(body, `"workers"`) || strings.Contains(body, `"urls"`) {
			e.failf("%q reached an admin surface", c.line)
		}
		if strings.HasPrefix(body, "{") && errorShape([]byte(body)) != nil && !strings.Contains(out, "chunked") {
			e.failf("%q: error body is not OpenAI JSON: %q", c.line, clip(body, 80))
		}
	}
}

var adminSurfaces = []struct{ method, path string }{
	{"GET", "/workers"}, {"POST", "/workers"}, {"GET", "/list_workers"},
	{"POST", "/add_worker?url=http://127.0.0.1:9"}, {"POST", "/remove_worker?url=http://127.0.0.1:9"},
	{"DELETE", "/workers/http%3A%2F%2F127.0.0.1%3A9"}, {"GET", "/v1/router_replay"},
	{"GET", "/debug/pprof/"}, {"GET", "/debug/sessions"},
}

func probeAdminNoKey(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls) {
		return
	}
	for _, a := range adminSurfaces {
		r := e.do(nil, a.method, a.path, nil, nil)
		e.checkError("inference port "+a.method+" "+a.path, r, 404)
		if r.status == 404 {
			e.explain("404 for an admin surface on the inference port (intended)")
		}
	}
	// The metrics listener: /metrics open, admin open on loopback.
	for _, p := range []string{"/metrics", "/workers", "/list_workers"} {
		r := e.doURL(nil, "GET", e.r.mbase+p, nil, nil)
		if r.status != 200 {
			e.unexpected("metrics listener GET %s: %s, want 200 (open on loopback)", p, r)
		}
	}
	if ws, err := e.r.workers(e.r.mbase, ""); err != nil || len(ws) != 2 {
		e.failf("metrics listener GET /workers: %d workers, %v (want the 2 workers, {workers,total})", len(ws), err)
	}
}

func probeAdminKey(e *env) {
	_, urls := e.sims(4, 0.05)
	if len(urls) < 4 || !e.start(urls[:2], "--admin-api-key", "ADMIN-K", "--worker-allowlist", "127.0.0.1", "--max-workers", "3") {
		return
	}
	for _, a := range adminSurfaces {
		for _, key := range []string{"", "WRONG"} {
			h := map[string]string{}
			if key != "" {
				h["Authorization"] = "Bearer " + key
			}
			r := e.do(nil, a.method, a.path, nil, h)
			e.checkError(fmt.Sprintf("%s %s bearer=%q", a.method, a.path, key), r, 401)
			if r.status == 401 {
				e.explain("401 without the admin key (intended)")
			}
		}
	}
	auth := map[string]string{"Authorization": "Bearer ADMIN-K"}
	if r := e.do(nil, "GET", "/workers", nil, auth); r.status != 200 {
		e.unexpected("GET /workers with the admin key: %s", r)
	}
	t0 := time.Now()
	r := e.do(nil, "POST", "/add_worker?url=http://10.255.255.1:8000", nil, auth)
	e.checkError("add_worker outside the allowlist", r, 400, 403)
	if r.status == 400 || r.status == 403 {
		e.explain("403/400 for a worker outside the allowlist (intended)")
	}
	if d := time.Since(t0); d > 2*time.Second {
		e.failf("add_worker outside the allowlist took %s (it dialed?)", d.Round(time.Millisecond))
	}
	if r := e.do(nil, "POST", "/add_worker?url="+urls[2], nil, auth); r.status != 200 {
		e.unexpected("add_worker #3 (allowed): %s", r)
	}
	r = e.do(nil, "POST", "/add_worker?url="+urls[3], nil, auth)
	e.checkError("add_worker past --max-workers 3", r, 400, 403, 409, 422, 429)
	if r.status >= 400 && r.status < 500 {
		e.explain("4xx past --max-workers (intended)")
	}
}

func probeClientKeys(e *env) {
	echo := e.bad(modeEcho)
	if echo == nil {
		return
	}
	f := filepath.Join(os.TempDir(), fmt.Sprintf("chaos-client-keys-%d", os.Getpid()))
	os.WriteFile(f, []byte("ck-live-1\nck-live-2\n"), 0o600)
	e.defer_(func() { os.Remove(f) })
	if !e.start([]string{echo.url}, "--client-api-keys", f) {
		return
	}
	for _, key := range []string{"", "ck-wrong"} {
		h := map[string]string{}
		if key != "" {
			h["Authorization"] = "Bearer " + key
		}
		r := e.chat(model, h)
		e.checkError("chat with bearer "+strconv.Quote(key), r, 401)
		if r.status == 401 {
			e.explain("401 without a client key (intended)")
		}
	}
	r := e.chat(model, map[string]string{"Authorization": "Bearer ck-live-2"})
	if r.status != 200 {
		e.unexpected("chat with a listed client key: %s", r)
		return
	}
	if strings.Contains(string(r.body), "ck-live-2") {
		e.failf("the client's key was forwarded to the worker")
	}
	if echo.inference.Load() != 1 {
		e.failf("worker saw %d inference requests, want 1 (the unauthorized ones must not reach it)", echo.inference.Load())
	}
}

func probeErrorShape(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls) {
		return
	}
	h := map[string]string{"Authorization": "Bearer " + secret}
	cases := []struct {
		name   string
		method string
		body   string
		want   []int
	}{
		{"unknown model with control bytes", "POST", `{"model":"m\u0001\u0007\u001b[31m\"x\\\n","messages":[{"role":"user","content":"hi"}]}`, []int{404}},
		{"raw control byte in JSON", "POST", "{\"model\":\"m\x01\",\"messages\":[]}", []int{400}},
		{"truncated JSON", "POST", `{"model":`, []int{400}},
		{"empty body", "POST", ``, []int{400}},
		{"wrong method", "GET", ``, []int{405}},
	}
	for _, c := range cases {
		var body []byte
		if c.body != "" {
			body = []byte(c.body)
		}
		r := e.do(nil, c.method, "/v1/chat/completions", body, h)
		e.checkError(c.name, r, c.want...)
		if r.status >= 400 && r.status < 500 {
			e.explain("4xx for a malformed request (intended)")
		}
	}
	if r := e.chat(model, h); r.status != 200 {
		e.unexpected("a good request: %s", r)
	} else {
		e.checkLeaks("a good request", r)
	}
}

func probeOversizedHeaders(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls) {
		return
	}
	big := strings.Repeat("b", 64<<10)
	r := e.do(nil, "GET", "/v1/models", nil, map[string]string{"X-Big": big})
	e.checkError("one 64 KB header", r, 431)
	if r.status == 431 {
		e.explain("431 for oversized headers (intended)")
	}
	var sb strings.Builder
	sb.WriteString("GET /v1/models HTTP/1.1\r\nHost: x\r\n")
	for i := range 200 {
		fmt.Fprintf(&sb, "X-H%d: %s\r\n", i, strings.Repeat("h", 400))
	}
	sb.WriteString("Connection: close\r\n\r\n")
	e.count(1)
	out, err := raw(e.r.addr, sb.String(), time.Second)
	if st := first(statuses(out)); err != nil || st != "431" {
		e.unexpected("200 headers of 400 bytes: status %q (%v), want 431", st, err)
	} else {
		e.explain("431 for oversized headers (intended)")
	}
	if r := e.chat(model, nil); r.status != 200 {
		e.unexpected("request after: %s", r)
	}
}

func probeNoLeak(e *env) {
	garbage, b500, echo := e.bad(modeGarbage), e.bad(mode500), e.bad(modeEcho500)
	if garbage == nil || b500 == nil || echo == nil {
		return
	}
	if !e.start([]string{garbage.url, b500.url, echo.url}, "--policy", "round_robin", "--cb-failure-threshold", "0") {
		return
	}
	h := map[string]string{"Authorization": "Bearer " + secret, echoMarkerName: echoMarker}
	for i := range 6 {
		r := e.chat(model, h)
		e.checkError(fmt.Sprintf("request %d to a fleet of broken workers", i), r, 500, 502)
		if r.status >= 500 {
			e.explain("5xx: every worker is broken (intended)")
		}
	}
	// Each kind alone: the same failure on every attempt.
	for _, m := range []string{modeGarbage, mode500, modeEcho500} {
		r := e.chat(model, map[string]string{"Authorization": "Bearer " + secret, echoMarkerName: echoMarker, "x-bad": m})
		e.checkError("every worker "+m, r, 500, 502)
		if r.status >= 500 {
			e.explain("5xx: every worker is broken (intended)")
		}
	}
}

func probeUpstreamHeaders(e *env) {
	echo := e.bad(modeEcho)
	if echo == nil || !e.start([]string{echo.url}, "--api-key", "WORKER-KEY") {
		return
	}
	r := e.chat(model, map[string]string{"Authorization": "Bearer " + secret, "X-Request-ID": "rid-echo-1"})
	if r.status != 200 {
		e.unexpected("echo request: %s", r)
		return
	}
	var v struct {
		H map[string]string `json:"echo_headers"`
	}
	if err := jsonUnmarshal(r.body, &v); err != nil {
		e.failf("echo body: %v", err)
		return
	}
	if got := v.H["authorization"]; got != "Bearer WORKER-KEY" {
		e.failf("worker got Authorization %q, want the --api-key bearer", clip(got, 40))
	}
	if got := v.H["x-request-id"]; got != "rid-echo-1" {
		e.failf("worker got x-request-id %q, want the client's rid-echo-1", got)
	}
	if got := r.header.Get("X-Request-Id"); got != "rid-echo-1" {
		e.failf("response x-request-id %q, want rid-echo-1", got)
	}
}

func probeRequestID(e *env) {
	_, urls := e.sims(1, 0.05)
	dead := e.bad(modeOK)
	if dead == nil || len(urls) == 0 || !e.start(append(urls, dead.url), "--policy", "round_robin") {
		return
	}
	dead.kill()
	mark := e.r.logs.mark()
	for i := range 6 {
		r := e.chat(model, map[string]string{"X-Request-ID": fmt.Sprintf("rid-fo-%d", i)})
		if r.status != 200 {
			e.unexpected("failover request: %s", r)
		}
	}
	r := e.chat("no-such-model", nil)
	e.checkError("unknown model, no client id", r, 404)
	e.explain("404 for an unknown model (intended)")
	r = e.chat("no-such-model", map[string]string{"X-Request-ID": "rid-404-abc"})
	e.checkError("unknown model, client id", r, 404)
	e.explain("404 for an unknown model (intended)")
	if got := r.header.Get("X-Request-Id"); got != "rid-404-abc" {
		e.failf("error x-request-id %q, want the client's rid-404-abc", got)
	}
	time.Sleep(200 * time.Millisecond)
	var about []string // lines about the dead worker
	for _, l := range e.r.logs.since(mark) {
		if strings.Contains(l, dead.addr) {
			about = append(about, l)
		}
	}
	if len(about) == 0 {
		e.failf("no log line names the failed worker %s", dead.addr)
	}
	for _, l := range about {
		if strings.Contains(l, "health") {
			continue // health checks belong to no request
		}
		if !strings.Contains(l, "rid-fo-") {
			e.failf("a failover log line lacks the request id: %q", clip(l, 140))
			break
		}
	}
}

// ---- faults ----

func probeDialFailover(e *env) {
	_, urls := e.sims(2, 0.05)
	dead := e.bad(modeOK)
	if dead == nil || !e.start(append(urls, dead.url), "--policy", "round_robin") {
		return
	}
	dead.kill()
	parallel(8, 60, func(i int) {
		if r := e.chat(model, nil); r.status != 200 {
			e.unexpected("request with a dead worker in the fleet: %s", r)
		} else if r.dur > 2*time.Second {
			e.failf("a failover took %s", r.dur.Round(time.Millisecond))
		}
	})
}

// parallel runs fn(0..n-1) on c goroutines.
func parallel(c, n int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}

func probeConnectTimeout(e *env) {
	_, urls := e.sims(2, 0.05)
	hole := e.bad(modeOK)
	if hole == nil || !e.start(append(urls, hole.url), "--policy", "round_robin", "--connect-timeout-secs", "1") {
		return
	}
	if err := hole.becomeBlackhole(); err != nil {
		e.failf("could not build the never-accepting listener: %v", err)
		return
	}
	for range 9 {
		r := e.chat(model, nil)
		if r.status != 200 {
			e.unexpected("request with a never-accepting worker: %s", r)
		} else if r.dur > 2500*time.Millisecond {
			e.failf("failover past a connect timeout took %s, want ~1 s", r.dur.Round(time.Millisecond))
		}
	}
}

func probeFirstByteTimeout(e *env) {
	_, urls := e.sims(2, 0.05)
	hang := e.bad(modeHang)
	if hang == nil || !e.start(append(urls, hang.url), "--policy", "round_robin", "--first-byte-timeout-secs", "1") {
		return
	}
	h0 := hang.health.Load()
	for range 9 {
		r := e.chat(model, nil)
		if r.status != 200 {
			e.unexpected("request with a hanging worker: %s", r)
		} else if r.dur > 2500*time.Millisecond {
			e.failf("failover past a hanging worker took %s, want ~1 s", r.dur.Round(time.Millisecond))
		}
	}
	if hang.inference.Load() == 0 {
		e.failf("the hanging worker was never tried")
		return
	}
	// A probe starts at once unless one is already in flight to that worker
	// (a hanging /health holds it for --health-check-timeout-secs, 5 s).
	first := time.Unix(0, hang.firstHang.Load())
	after := hang.healthAfterHang.Load()
	if hang.health.Load() == h0 || after == 0 || time.Unix(0, after).Sub(first) > 6*time.Second {
		e.failf("the hanging worker got no health probe within 6 s of its first timeout")
	}
}

func probeBackpressureFailover(e *env) {
	_, urls := e.sims(1, 0.05)
	b429, b503 := e.bad(mode429), e.bad(mode503)
	if b429 == nil || b503 == nil || !e.start(append(urls, b429.url, b503.url), "--policy", "round_robin", "--cb-failure-threshold", "2") {
		return
	}
	for range 30 {
		if r := e.chat(model, nil); r.status != 200 {
			e.unexpected("request with 429/503 workers in the fleet: %s", r)
		}
	}
	for _, b := range []*badWorker{b429, b503} {
		if h, ok := e.r.healthOf(b.url); ok && !h {
			e.failf("back pressure ejected %s (breaker counted 429/503)", b.url)
		}
	}
}

func probeBackpressurePassthrough(e *env) {
	b1, b2 := e.bad(mode429), e.bad(mode429)
	if b1 == nil || b2 == nil || !e.start([]string{b1.url, b2.url}) {
		return
	}
	for _, m := range []string{mode429, mode503} {
		for range 3 {
			r := e.chat(model, map[string]string{"x-bad": m})
			want, _ := strconv.Atoi(m)
			e.checkError("every worker "+m, r, want)
			if r.status == want {
				e.explain(m + " passed through: every worker pushes back (intended)")
			}
			if r.header.Get("Retry-After") == "" {
				e.failf("%s passed through without Retry-After", m)
			}
		}
	}
}

func probeRequestFault(e *env) {
	_, urls := e.sims(3, 0.05)
	if !e.start(urls, "--policy", "round_robin", "--cb-failure-threshold", "3") {
		return
	}
	for range 7 {
		r := e.chat(model, map[string]string{"x-sim-fault": "error"})
		e.checkError("request that every worker fails with 500", r, 500)
		if r.status == 500 {
			e.explain("500: the request makes every worker fail (intended)")
		}
	}
	for range 3 {
		if r := e.chat(model, nil); r.status != 200 {
			e.unexpected("normal request after 7 poison requests: %s (fleet ejected)", r)
		}
	}
	for _, u := range urls {
		if h, ok := e.r.healthOf(u); ok && !h {
			e.failf("worker %s ejected by a request's own fault", u)
		}
	}
}

func probeWorkerRestart(e *env) {
	ws, urls := e.sims(2, 0.05)
	if len(ws) < 2 || !e.start(urls, "--policy", "round_robin", "--cb-failure-threshold", "3") {
		return
	}
	victim := strings.TrimPrefix(urls[1], "http://")
	ws[1].Close()
	for range 10 { // the router notices: failovers, breaker
		if r := e.chat(model, nil); r.status != 200 {
			e.unexpected("request while a worker is down: %s", r)
		}
	}
	w, err := restartSim(victim, 0.05)
	if err != nil {
		e.failf("restart on %s: %v", victim, err)
		return
	}
	e.defer_(func() { w.Close() })
	t0 := time.Now()
	for time.Since(t0) < 10*time.Second && w.Stats().Requests == 0 {
		if r := e.chat(model, nil); r.status != 200 {
			e.unexpected("request after the restart: %s", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if w.Stats().Requests == 0 {
		e.failf("the restarted worker got no request within 10 s")
	} else if d := time.Since(t0); d > 3500*time.Millisecond {
		e.failf("the restarted worker served again only after %s, want ~3 s", d.Round(100*time.Millisecond))
	}
}

func probeClientCancel(e *env) {
	hang := e.bad(modeHang)
	if hang == nil || !e.start([]string{hang.url}) {
		return
	}
	ctx, cancel := context.WithTimeout(bg, 500*time.Millisecond)
	r := e.do(ctx, "POST", "/v1/chat/completions", chatBody(model, "I will leave", false, 0), nil)
	cancel()
	left := time.Now()
	if r.err == nil {
		e.unexpected("request to a hanging worker answered: %s", r)
	} else {
		e.explain("the client gave up itself (intended)")
	}
	for time.Since(left) < 2*time.Second && hang.peerClosed.Load() == 0 {
		time.Sleep(20 * time.Millisecond)
	}
	if hang.peerClosed.Load() == 0 {
		e.failf("the hanging worker's connection was not closed within 2 s of the client leaving")
	} else if d := time.Unix(0, hang.lastClosed.Load()).Sub(left); d > time.Second {
		e.failf("upstream cancelled %s after the client left, want at once", d.Round(time.Millisecond))
	}
	if n := e.r.settleLoad(time.Second); n != 0 {
		e.failf("load %d one second after the client left", n)
	}
}

// ---- bounds ----

func probeManyModels(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls) {
		return
	}
	// Warm up with the same unknown name so buffers and pools settle.
	parallel(16, 1000, func(int) { e.chat("warm-unknown", nil) })
	m0, _ := e.r.metrics()
	rss0 := e.r.rssKB()
	var bad atomic.Int64
	parallel(16, 5000, func(i int) {
		if r := e.chat(fmt.Sprintf("no-such-model-%d", i), nil); r.status != 404 {
			bad.Add(1)
			e.unexpected("distinct unknown model: %s", r)
		}
	})
	for range 6000 - int(bad.Load()) {
		e.explain("404 for an unknown model (intended)")
	}
	m1, _ := e.r.metrics()
	rss1 := e.r.rssKB()
	if len(m1) > len(m0)+len(m0)/20+2048 {
		e.failf("/metrics grew %d -> %d bytes over 5,000 unknown models", len(m0), len(m1))
	}
	if rss1 > rss0+10<<10 {
		e.failf("RSS grew %d -> %d kB over 5,000 unknown models", rss0, rss1)
	}
}

func probeMaxSessions(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls, "--max-sessions", "512") {
		return
	}
	parallel(8, 1500, func(i int) {
		if r := e.chat(model, map[string]string{"X-Session-ID": fmt.Sprintf("cap-%d", i)}); r.status != 200 {
			e.unexpected("session request: %s", r)
		}
	})
	text, _ := e.r.metrics()
	samples := metricSamples(text, "vllm_router_sessions")
	if len(samples) == 0 {
		e.failf("no vllm_router_sessions samples")
	}
	for _, s := range samples {
		v, _ := strconv.ParseFloat(s[strings.LastIndexByte(s, ' ')+1:], 64)
		// The session map evicts in LRU batches of max(cap/8, 64): between
		// drops it may hold up to cap + 2 batches, 1.25× the cap here.
		if v > 512*1.25 {
			e.failf("%s exceeds --max-sessions 512 by more than the eviction batches", s)
		}
	}
}

func probeMaxPayload(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls, "--max-payload-size", "65536") {
		return
	}
	r := e.do(nil, "POST", "/v1/chat/completions", chatBody(model, strings.Repeat("x", 100<<10), false, 0), nil)
	e.checkError("100 KiB body", r, 413)
	if r.status == 413 {
		e.explain("413 for a body over --max-payload-size (intended)")
	}
	if r := e.chat(model, nil); r.status != 200 {
		e.unexpected("request after: %s", r)
	}
}

func probeFDExhaustion(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.startOpts(routerOpts{workers: urls, nofile: 1024}) {
		return
	}
	var mu sync.Mutex
	var conns []net.Conn
	var refused atomic.Int64
	parallel(64, 3000, func(int) {
		c, err := net.DialTimeout("tcp", e.r.addr, time.Second)
		if err != nil {
			refused.Add(1)
			return
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	})
	e.count(3000) // connections, each counted as one request sent
	time.Sleep(2 * time.Second)
	if e.r.exited() {
		e.failf("router exited with %d idle connections open (%s)", len(conns), e.r.exitReason)
	}
	// A request while the fds are gone may be shed: explained.
	if r := e.chat(model, nil); r.status != 200 {
		e.explain("request shed while every fd is taken (intended)")
	}
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	n := len(conns)
	mu.Unlock()
	t0 := time.Now()
	var r resp
	for time.Since(t0) < 10*time.Second {
		if r = e.chat(model, nil); r.status == 200 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r.status != 200 {
		e.unexpected("router does not serve again 10 s after %d idle connections closed: %s", n, r)
	} else if d := time.Since(t0); d > 5*time.Second {
		e.failf("router served again only %s after the idle connections closed", d.Round(100*time.Millisecond))
	}
}

func probeConcurrencyLimit(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls, "--max-concurrent-requests", "8", "--queue-size", "0") {
		return
	}
	var ok, shed atomic.Int64
	parallel(32, 32, func(int) {
		r := e.chat(model, map[string]string{"x-sim-fault": "slow=1500"})
		switch {
		case r.status == 200:
			ok.Add(1)
		case r.status == 429:
			shed.Add(1)
			e.checkShed(r, "429 past --max-concurrent-requests (intended)")
		default:
			e.unexpected("slow request under the limit: %s", r)
		}
	})
	if shed.Load() == 0 {
		e.failf("32 concurrent requests, none shed (429) by --max-concurrent-requests 8")
	}
}

// checkShed checks a request the router shed: a well-formed 429 with
// Retry-After, explained by why.
func (e *env) checkShed(r resp, why string) {
	e.explain(why)
	if r.header.Get("Retry-After") == "" {
		e.failf("429 without Retry-After")
	}
	e.checkError("shed request", r, 429)
}

func probeQueueLimit(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls, "--max-concurrent-requests", "8", "--queue-size", "8") {
		return
	}
	var waited, shed atomic.Int64
	parallel(32, 32, func(int) {
		r := e.chat(model, map[string]string{"x-sim-fault": "slow=1500"})
		switch {
		case r.status == 200:
			if r.header.Get("X-Vllm-Router-Queue-Ms") != "" {
				waited.Add(1)
			}
		case r.status == 429:
			shed.Add(1)
			e.checkShed(r, "429 past --queue-size (intended)")
		default:
			e.unexpected("slow request under the queue's bounds: %s", r)
		}
	})
	if waited.Load() == 0 || shed.Load() == 0 {
		e.failf("32 concurrent requests past 8 in flight and 8 waiting: %d waited and were served, %d shed", waited.Load(), shed.Load())
	}
}

func probeMetricsValid(e *env) {
	_, urls := e.sims(2, 0.05)
	if !e.start(urls) {
		return
	}
	for i, m := range []string{model, "we\"ird\\mo\ndel", "ctl\x01\x7f", "ünï"} {
		e.chat(m, map[string]string{"X-Session-ID": fmt.Sprintf("s\"%d\\", i)})
		e.chat(model, map[string]string{"X-Session-ID": fmt.Sprintf("m-%d", i)})
	}
	e.explain("404 for a hostile unknown model name (intended)")
	e.explain("404 for a hostile unknown model name (intended)")
	e.explain("404 for a hostile unknown model name (intended)")
	text, err := e.r.metrics()
	if err != nil {
		e.failf("%v", err)
		return
	}
	tool, err := checkPromText(text)
	promChecker = tool
	if err != nil {
		e.failf("/metrics (%s): %v", tool, err)
	}
}
