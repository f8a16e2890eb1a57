package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warmroute/warmroute/simworker"
)

// probe is one row of the chaos table: run attacks a router it starts
// through env and records what it saw.
type probe struct {
	name  string
	what  string // one line: the attack and what the contract wants
	quick bool   // cheap enough for TestChaosQuick
	run   func(e *env)
}

// row is the outcome of one probe.
type row struct {
	name, what       string
	sent             int
	failures         int
	failNote         string // what the client-visible failures were, and why they are unavoidable
	pass             bool
	reason           string
	note             string // what the probe measured, shown with its verdict
	loadAfter        int
	rssBefore        int // kB
	rssAfter         int
	gorBefore        int
	gorAfter         int
	dur              time.Duration
	routerStartError bool
}

// env is what a probe works with. Problems make the probe FAIL; explained
// failures are the client-visible failures the attack makes unavoidable.
type env struct {
	bin       string
	r         *router
	client    *http.Client
	mu        sync.Mutex
	problems  []string
	explained map[string]int
	sent      int
	unexp     int // unexplained client-visible failures (also problems)
	cleanups  []func()
	// expectExit: the probe ends the router itself (SIGTERM).
	expectExit bool
	rssBefore  int
	gorBefore  int
	startErr   bool
	workerAddr []string // worker host:port strings that must never appear in an error body
	note       string   // what the probe measured (notef)
}

func newEnv(bin string) *env {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true, ResponseHeaderTimeout: 30 * time.Second}
	e := &env{bin: bin, explained: map[string]int{}, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
	e.defer_(tr.CloseIdleConnections)
	return e
}

func (e *env) defer_(f func()) { e.cleanups = append(e.cleanups, f) }

func (e *env) close() {
	if e.r != nil {
		e.r.kill()
	}
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// failf records a problem: the probe fails with this reason.
func (e *env) failf(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	for _, p := range e.problems { // one line per kind of problem
		if p == msg {
			return
		}
	}
	e.problems = append(e.problems, msg)
}

// explain counts a client-visible failure that the attack makes unavoidable.
func (e *env) explain(why string) {
	e.mu.Lock()
	e.explained[why]++
	e.mu.Unlock()
}

// unexpected counts a client-visible failure the contract does not allow.
func (e *env) unexpected(format string, args ...any) {
	e.mu.Lock()
	e.unexp++
	e.mu.Unlock()
	e.failf(format, args...)
}

// notef records what the probe measured, for the report.
func (e *env) notef(format string, args ...any) {
	e.mu.Lock()
	e.note = fmt.Sprintf(format, args...)
	e.mu.Unlock()
}

func (e *env) count(n int) {
	e.mu.Lock()
	e.sent += n
	e.mu.Unlock()
}

// sims starts n simulated workers (TimeScale scale) for this probe.
func (e *env) sims(n int, scale float64) ([]*simworker.Worker, []string) {
	var ws []*simworker.Worker
	var urls []string
	for range n {
		w, u, err := startSim(scale)
		if err != nil {
			e.failf("simworker: %v", err)
			continue
		}
		e.defer_(func() { w.Close() })
		ws = append(ws, w)
		urls = append(urls, u)
		e.workerAddr = append(e.workerAddr, strings.TrimPrefix(u, "http://"))
	}
	return ws, urls
}

// bad starts a bad worker for this probe.
func (e *env) bad(mode string) *badWorker {
	b, err := startBad(mode)
	if err != nil {
		e.failf("bad worker: %v", err)
		return nil
	}
	e.defer_(b.close)
	e.workerAddr = append(e.workerAddr, b.addr)
	return b
}

// start runs the router with workers and flags; false (and a problem) when
// it does not come up. Before-probe RSS and goroutines are taken here.
func (e *env) start(workers []string, args ...string) bool {
	return e.startOpts(routerOpts{workers: workers, args: args})
}

func (e *env) startOpts(o routerOpts) bool {
	o.args = append([]string{"--retry-initial-backoff-ms", "10", "--retry-max-backoff-ms", "100"}, o.args...)
	r, err := startRouter(e.bin, o)
	if err != nil {
		e.startErr = true
		e.failf("%v", err)
		return false
	}
	e.r = r
	e.rssBefore, e.gorBefore = r.rssKB(), r.goroutines()
	return true
}

// resp is one HTTP exchange as the client saw it.
type resp struct {
	status int
	header http.Header
	body   []byte
	err    error
	dur    time.Duration
}

func (r resp) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	return fmt.Sprintf("%d %s", r.status, oneLine(string(r.body)))
}

// do sends one request to the router's inference port and reads the whole
// answer (bounded by the client's 30 s timeout, or ctx).
func (e *env) do(ctx context.Context, method, path string, body []byte, hdr map[string]string) resp {
	return e.doURL(ctx, method, e.r.base+path, body, hdr)
}

func (e *env) doURL(ctx context.Context, method, url string, body []byte, hdr map[string]string) resp {
	e.count(1)
	if ctx == nil {
		ctx = context.Background()
	}
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return resp{err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		if strings.EqualFold(k, "host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	t0 := time.Now()
	res, err := e.client.Do(req)
	if err != nil {
		return resp{err: err, dur: time.Since(t0)}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, header: res.Header, body: b, err: err, dur: time.Since(t0)}
}

// chat posts a chat completion for `model` (or m) with optional headers.
func (e *env) chat(m string, hdr map[string]string) resp {
	return e.do(nil, "POST", "/v1/chat/completions", chatBody(m, "hello there", false, 0), hdr)
}

func chatBody(m, content string, stream bool, maxTokens int) []byte {
	v := map[string]any{"model": m, "messages": []map[string]string{{"role": "user", "content": content}}}
	if stream {
		v["stream"] = true
	}
	if maxTokens > 0 {
		v["max_tokens"] = maxTokens
	}
	b, _ := json.Marshal(v)
	return b
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

const secret = "SECRET-XYZ"

// checkError checks an error answer against the contract: one of the
// wanted statuses, an OpenAI JSON error, a request id header, and no
// secret, worker address, raw upstream bytes or echoed marker in it.
func (e *env) checkError(what string, r resp, want ...int) {
	if r.err != nil {
		e.unexpected("%s: %v", what, r.err)
		return
	}
	okStatus := false
	for _, w := range want {
		okStatus = okStatus || r.status == w
	}
	if !okStatus {
		e.unexpected("%s: status %d, want %v (%s)", what, r.status, want, oneLine(string(r.body)))
	}
	if r.status >= 400 {
		if err := errorShape(r.body); err != nil {
			e.failf("%s: error body %v: %q", what, err, clip(string(r.body), 120))
		}
		if r.header.Get("X-Request-Id") == "" {
			e.failf("errors carry no x-request-id header")
		}
	}
	e.checkLeaks(what, r)
}

// checkLeaks fails when a response carries the client's secret (anywhere),
// or, in an error body, a worker address, raw upstream bytes or an echoed
// request header.
func (e *env) checkLeaks(what string, r resp) {
	var hdr strings.Builder
	r.header.Write(&hdr)
	if strings.Contains(hdr.String(), secret) || bytes.Contains(r.body, []byte(secret)) {
		e.failf("%s: the client's Authorization secret is echoed in the response", what)
	}
	if r.status < 400 {
		return
	}
	for _, a := range e.workerAddr {
		if bytes.Contains(r.body, []byte(a)) {
			e.failf("%s: error body names a worker address (%s)", what, a)
			break
		}
	}
	for _, m := range []string{rawMarker, garbageMarker, echoMarker} {
		if bytes.Contains(r.body, []byte(m)) {
			e.failf("%s: error body carries upstream bytes (%s)", what, m)
		}
	}
}

// errorShape checks {"error":{"message","type","param","code"}}.
func errorShape(b []byte) error {
	var v map[string]json.RawMessage
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("is not valid JSON")
	}
	var inner map[string]json.RawMessage
	if err := json.Unmarshal(v["error"], &inner); err != nil {
		return fmt.Errorf("has no error object")
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := inner[k]; !ok {
			return fmt.Errorf("lacks error.%s", k)
		}
	}
	var msg string
	if json.Unmarshal(inner["message"], &msg) != nil {
		return fmt.Errorf("error.message is not a string")
	}
	return nil
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// raw sends payload on a fresh TCP connection to addr and returns what
// comes back until the peer closes or `wait` passes without new bytes.
func raw(addr, payload string, wait time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := io.WriteString(c, payload); err != nil {
		return "", err
	}
	var out bytes.Buffer
	buf := make([]byte, 32<<10)
	hard := time.Now().Add(10 * time.Second)
	for time.Now().Before(hard) {
		c.SetReadDeadline(time.Now().Add(wait))
		n, err := c.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return out.String(), nil
}

var statusLineRE = regexp.MustCompile(`HTTP/1\.[01] (\d{3})[ \r]`)

// statuses lists the status codes of the responses in a raw reply.
func statuses(s string) []string {
	var out []string
	for _, m := range statusLineRE.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// rawBody returns the body of the first response in a raw reply.
func rawBody(s string) string {
	_, b, _ := strings.Cut(s, "\r\n\r\n")
	return b
}

// streamChat posts a streaming chat request and calls fn for each SSE
// line; fn returns false to stop reading. It returns the status, the
// headers, and the lines read.
func (e *env) streamChat(ctx context.Context, body []byte, hdr map[string]string, fn func(line string) bool) (int, http.Header, []string, error) {
	e.count(1)
	req, _ := http.NewRequestWithContext(ctx, "POST", e.r.base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{DisableKeepAlives: true} // its own connection: the probe may cut it
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer res.Body.Close()
	var lines []string
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" {
			continue
		}
		lines = append(lines, l)
		if fn != nil && !fn(l) {
			return res.StatusCode, res.Header, lines, nil
		}
	}
	return res.StatusCode, res.Header, lines, sc.Err()
}

// finish turns env into a row, after the probe: load settled, RSS and
// goroutines read, the router checked to be alive.
func (e *env) finish(p probe, dur time.Duration) row {
	rw := row{name: p.name, what: p.what, sent: e.sent, dur: dur, loadAfter: -1, rssBefore: -1, rssAfter: -1, gorBefore: -1, gorAfter: -1}
	if e.r != nil {
		rw.rssBefore, rw.gorBefore = e.rssBefore, e.gorBefore
		if !e.r.exited() {
			rw.loadAfter = e.r.settleLoad(3 * time.Second)
			rw.rssAfter, rw.gorAfter = e.r.rssKB(), e.r.goroutines()
			if rw.loadAfter != 0 {
				e.failf("load counter %d after the probe, want 0", rw.loadAfter)
			}
		} else if !e.expectExit {
			e.failf("router exited during the probe (%s): %s", e.r.exitReason, oneLine(e.r.logs.tail(2)))
		} else {
			rw.loadAfter = 0
		}
	}
	var notes []string
	keys := make([]string, 0, len(e.explained))
	for k := range e.explained {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		rw.failures += e.explained[k]
		notes = append(notes, fmt.Sprintf("%d× %s", e.explained[k], k))
	}
	if e.unexp > 0 {
		rw.failures += e.unexp
		notes = append(notes, fmt.Sprintf("%d× unexplained (see reason)", e.unexp))
	}
	rw.failNote = strings.Join(notes, "; ")
	rw.pass = len(e.problems) == 0
	rw.note = e.note
	rw.routerStartError = e.startErr
	if rw.pass {
		rw.reason = "ok"
	} else {
		rw.reason = strings.Join(e.problems, "; ")
	}
	return rw
}

// runProbe runs one probe with a hard time bound and returns its row.
func runProbe(bin string, p probe, bound time.Duration) row {
	e := newEnv(bin)
	t0 := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if v := recover(); v != nil {
				e.failf("probe panicked: %v", v)
			}
		}()
		p.run(e)
	}()
	select {
	case <-done:
	case <-time.After(bound):
		e.failf("probe did not finish within %s", bound)
	}
	rw := e.finish(p, time.Since(t0))
	e.close()
	return rw
}
