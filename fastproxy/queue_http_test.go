package fastproxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
)

// gatedWorker is a worker double that holds every chat request until the
// test lets one go, and records, in arrival order, each request's name
// (header X-Test-Name) and its body's "priority" as a JSON parser reads it
// (the last member of that name; nil: none, or not an integer). Its
// /metrics says what the test sets (vLLM's load gauges).
type gatedWorker struct {
	srv     *httptest.Server
	gate    chan struct{} // one receive lets one request answer
	metrics atomic.Value  // string
	usage   atomic.Value  // string: the answers' usage object

	mu       sync.Mutex
	names    []string
	priority []*int
	released int // requests let go so far (the test's goroutine only)
	openOnce sync.Once
}

func newGatedWorker(t *testing.T) *gatedWorker {
	t.Helper()
	g := &gatedWorker{gate: make(chan struct{})}
	g.metrics.Store("")
	g.usage.Store(`{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}`)
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/metrics":
			io.WriteString(w, g.metrics.Load().(string)) //nolint:errcheck
			return
		case "/v1/models":
			io.WriteString(w, `{"data":[{"id":"m"}]}`) //nolint:errcheck
			return
		}
		b, _ := io.ReadAll(r.Body)
		g.mu.Lock()
		g.names = append(g.names, r.Header.Get("X-Test-Name"))
		var p struct{ Priority *int }
		json.Unmarshal(b, &p) //nolint:errcheck // a body that is not JSON has no priority
		g.priority = append(g.priority, p.Priority)
		g.mu.Unlock()
		select {
		case <-g.gate:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":`+g.usage.Load().(string)+`}`) //nolint:errcheck
	}))
	t.Cleanup(func() {
		g.open()
		g.srv.Close()
	})
	return g
}

// open lets every request still held, and every later one, answer.
func (g *gatedWorker) open() { g.openOnce.Do(func() { close(g.gate) }) }

func (g *gatedWorker) seen() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.names...)
}

// queueRouter is a router in front of one gated worker that holds one
// request in flight at a time: every other request waits in the queue.
func queueRouter(t *testing.T, policy string, mod func(*fastproxy.Config)) (*testRouter, *gatedWorker) {
	t.Helper()
	g := newGatedWorker(t)
	tr := startRouter(t, []string{g.srv.URL}, policy, func(fc *fastproxy.Config, _ *loadview.Config) {
		fc.MaxConcurrentRequests, fc.QueueSize, fc.QueueTimeout = 1, 100, 10*time.Second
		if mod != nil {
			mod(fc)
		}
	})
	t.Cleanup(g.open) // before the router's shutdown, which waits for what the worker holds
	return tr, g
}

// result is one client request's answer, sent in the background.
type result struct {
	name   string
	status int
	code   string
	hdr    http.Header
}

var errCode = regexp.MustCompile(`"code":"([a-z_]+)"`)

// send posts body as name with hdr in the background; its answer goes to out.
func send(url, name, body string, hdr map[string]string, out chan<- result) {
	go func() {
		req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Test-Name", name)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- result{name: name, status: -1, code: err.Error()}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r := result{name: name, status: resp.StatusCode, hdr: resp.Header}
		if m := errCode.FindSubmatch(b); m != nil {
			r.code = string(m[1])
		}
		out <- r
	}()
}

// queued is how many requests wait in tr's queue.
func queued(tr *testRouter) int {
	var b strings.Builder
	tr.srv.WriteMetrics(&b)
	n := 0
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, "vllm_router_queue_depth{") {
			v, _ := strconv.Atoi(line[strings.LastIndexByte(line, ' ')+1:])
			n += v
		}
	}
	return n
}

func waitQueued(t *testing.T, tr *testRouter, n int) {
	t.Helper()
	testwait.Until(t, fmt.Sprintf("%d queued", n), func() bool { return queued(tr) == n })
}

// releaseAll lets the worker answer requests one after the other, each
// once it arrived, until n have been answered in all, and returns the
// order it saw them in.
func (g *gatedWorker) releaseAll(t *testing.T, n int) []string {
	t.Helper()
	for ; g.released < n; g.released++ {
		i := g.released
		testwait.Until(t, fmt.Sprintf("request %d at the worker", i+1), func() bool { return len(g.seen()) > i })
		g.gate <- struct{}{}
	}
	return g.seen()
}

func body(priority string) string {
	p := ""
	if priority != "" {
		p = `"priority":` + priority + `,`
	}
	return `{"model":"m",` + p + `"messages":[{"role":"user","content":"hi"}]}`
}

// Released by priority, lower first; the header wins over the body.
func TestQueueReleasesByPriority(t *testing.T) {
	tr, g := queueRouter(t, "round_robin", nil)
	out := make(chan result, 8)
	send(tr.url, "holder", body(""), nil, out)
	testwait.Until(t, "the holder at the worker", func() bool { return len(g.seen()) == 1 })
	send(tr.url, "batch", body("10"), nil, out)
	waitQueued(t, tr, 1)
	send(tr.url, "interactive", body("0"), nil, out)
	waitQueued(t, tr, 2)
	send(tr.url, "header-wins", body("20"), map[string]string{"X-Request-Priority": "-1"}, out)
	waitQueued(t, tr, 3)
	got := strings.Join(g.releaseAll(t, 4), " ")
	if got != "holder header-wins interactive batch" {
		t.Fatalf("the worker saw %q", got)
	}
	for range 4 {
		r := <-out
		if r.status != 200 {
			t.Fatalf("%s: %d %s", r.name, r.status, r.code)
		}
		if waited := r.hdr.Get("X-Vllm-Router-Queue-Ms"); (r.name == "holder") != (waited == "") {
			t.Fatalf("%s: queue header %q", r.name, waited)
		}
	}
}

// Two tenants (named client keys) share the queue: a flood of one does
// not hold the other back.
func TestQueueTenantsShare(t *testing.T) {
	tr, g := queueRouter(t, "round_robin", func(fc *fastproxy.Config) {
		fc.ClientAPIKeys = []string{"alice:ka", "bob:kb"}
	})
	out := make(chan result, 8)
	key := func(k string) map[string]string { return map[string]string{"Authorization": "Bearer " + k} }
	send(tr.url, "holder", body(""), key("ka"), out)
	testwait.Until(t, "the holder at the worker", func() bool { return len(g.seen()) == 1 })
	for i := range 4 {
		send(tr.url, fmt.Sprint("a", i), body(""), key("ka"), out)
		waitQueued(t, tr, i+1)
	}
	send(tr.url, "b0", body(""), key("kb"), out)
	waitQueued(t, tr, 5)
	send(tr.url, "b1", body(""), key("kb"), out)
	waitQueued(t, tr, 6)
	if got := strings.Join(g.releaseAll(t, 7), " "); got != "holder a0 b0 a1 b1 a2 a3" {
		t.Fatalf("the worker saw %q", got)
	}
}

// A turn mid tool loop whose session's worker holds its history goes
// before a new session's first turn that came earlier.
func TestQueueWarmToolLoopFirst(t *testing.T) {
	tr, g := queueRouter(t, "cache_aware", nil)
	out := make(chan result, 8)
	session := map[string]string{"X-Session-ID": "agent-1"}
	send(tr.url, "turn1", body(""), session, out)
	g.releaseAll(t, 1) // the session is bound to the worker now
	<-out
	send(tr.url, "holder", body(""), nil, out)
	testwait.Until(t, "the holder at the worker", func() bool { return len(g.seen()) == 2 })
	send(tr.url, "new-session", body(""), map[string]string{"X-Session-ID": "agent-2"}, out)
	waitQueued(t, tr, 1)
	toolTurn := `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_1","content":"42"}]}`
	send(tr.url, "tool-result", toolTurn, session, out)
	waitQueued(t, tr, 2)
	if got := strings.Join(g.releaseAll(t, 4), " "); got != "turn1 holder tool-result new-session" {
		t.Fatalf("the worker saw %q", got)
	}
}

func TestQueueBounds(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		tr, g := queueRouter(t, "round_robin", func(fc *fastproxy.Config) { fc.QueueTimeout = 100 * time.Millisecond })
		out := make(chan result, 2)
		send(tr.url, "holder", body(""), nil, out)
		testwait.Until(t, "the holder at the worker", func() bool { return len(g.seen()) == 1 })
		send(tr.url, "late", body(""), nil, out)
		r := <-out
		if r.status != 503 || r.code != "queue_timeout" || r.hdr.Get("Retry-After") == "" {
			t.Fatalf("%s: %d %s Retry-After %q", r.name, r.status, r.code, r.hdr.Get("Retry-After"))
		}
	})
	t.Run("full", func(t *testing.T) {
		tr, g := queueRouter(t, "round_robin", func(fc *fastproxy.Config) { fc.QueueSize = 1 })
		out := make(chan result, 3)
		send(tr.url, "holder", body(""), nil, out)
		testwait.Until(t, "the holder at the worker", func() bool { return len(g.seen()) == 1 })
		send(tr.url, "waits", body(""), nil, out)
		waitQueued(t, tr, 1)
		send(tr.url, "refused", body(""), nil, out)
		r := <-out
		if r.name != "refused" || r.status != 429 || r.code != "queue_full" || r.hdr.Get("Retry-After") != "1" {
			t.Fatalf("%s: %d %s", r.name, r.status, r.code)
		}
	})
}

// A client that leaves while its request waits takes it out of the queue:
// nothing of it reaches a worker.
func TestQueueClientGoneSendsNothing(t *testing.T) {
	tr, g := queueRouter(t, "round_robin", nil)
	out := make(chan result, 2)
	send(tr.url, "holder", body(""), nil, out)
	testwait.Until(t, "the holder at the worker", func() bool { return len(g.seen()) == 1 })
	conn, err := net.Dial("tcp", strings.TrimPrefix(tr.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	b := body("")
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nX-Test-Name: gone\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
	waitQueued(t, tr, 1)
	conn.Close()
	testwait.Until(t, "the gone client out of the queue", func() bool { return queued(tr) == 0 })
	send(tr.url, "after", body(""), nil, out)
	if got := strings.Join(g.releaseAll(t, 2), " "); got != "holder after" {
		t.Fatalf("the worker saw %q", got)
	}
}

// vLLM refuses a priority it does not schedule by: the router removes it,
// unless told to forward it. Forwarded, the worker gets the priority the
// router ordered by: X-Request-Priority wins over the body (vLLM reads only
// the body), written over its member or added after the last one.
func TestPriorityStrippedUnlessForwarded(t *testing.T) {
	ten, three := 10, 3
	for _, c := range []struct {
		name    string
		forward bool
		body    string
		hdr     string
		want    *int
	}{
		{"stripped", false, body("3"), "", nil},
		{"stripped, header too", false, body("3"), "10", nil},
		{"kept", true, body("3"), "", &three},
		{"header over the body's", true, body("3"), "10", &ten},
		{"header added", true, body(""), "10", &ten},
		{"header added to a spaced body", true, `{"model":"m", "messages":[{"role":"user","content":"hi"}] }` + "\n", "10", &ten},
		{"header wins over an unread member", true, `{"model":"m","priority":3.0,"messages":[{"role":"user","content":"hi"}]}`, "10", &ten},
		{"header as the body says", true, body("10"), "10", &ten},
		{"header at vLLM's default", true, body(""), "0", nil},
		{"header clamped", true, body(""), "99999", ptr(reqview.MaxPriority)},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, g := queueRouter(t, "round_robin", func(fc *fastproxy.Config) { fc.ForwardPriority = c.forward })
			out := make(chan result, 1)
			var hdr map[string]string
			if c.hdr != "" {
				hdr = map[string]string{"X-Request-Priority": c.hdr}
			}
			send(tr.url, "p", c.body, hdr, out)
			g.releaseAll(t, 1)
			if r := <-out; r.status != 200 {
				t.Fatalf("%d %s", r.status, r.code)
			}
			g.mu.Lock()
			got := g.priority[0]
			g.mu.Unlock()
			if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
				t.Fatalf("the worker read priority %v, want %v", deref(got), deref(c.want))
			}
		})
	}
}

func ptr(n int) *int { return &n }

func deref(p *int) any {
	if p == nil {
		return "none"
	}
	return *p
}

// On shutdown a request still waiting when the grace period ends gets 503
// shutting_down, with Retry-After.
func TestQueueShutdownAnswersTheWaiting(t *testing.T) {
	tr, g := queueRouter(t, "round_robin", nil)
	out := make(chan result, 2)
	send(tr.url, "holder", body(""), nil, out)
	testwait.Until(t, "the holder at the worker", func() bool { return len(g.seen()) == 1 })
	send(tr.url, "waiting", body(""), nil, out)
	waitQueued(t, tr, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	tr.srv.Shutdown(ctx) //nolint:errcheck // the holder is still in flight: the grace ends
	r := <-out
	if r.name != "waiting" || r.status != 503 || r.code != "shutting_down" || r.hdr.Get("Retry-After") == "" {
		t.Fatalf("%s: %d %s", r.name, r.status, r.code)
	}
}

// --client-api-keys lines name their tenant, or are bare keys.
func TestClientKeyLines(t *testing.T) {
	tr, _ := queueRouter(t, "round_robin", func(fc *fastproxy.Config) {
		fc.ClientAPIKeys = []string{"alice:ka", "bare-key-without-name"}
	})
	for _, k := range []string{"ka", "bare-key-without-name"} {
		req, _ := http.NewRequest("GET", tr.url+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+k)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("key %q: %d", k, resp.StatusCode)
		}
	}
	req, _ := http.NewRequest("GET", tr.url+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer alice") // the name is not a key
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("a key's name accepted as a key: %d", resp.StatusCode)
	}
}

// A saturated pool holds requests in the queue whatever the router's own
// bound: the worker's /metrics shows a queue of its own, so the request
// waits, and goes once a report shows a free slot.
func TestQueueHoldsWhileTheWorkersQueue(t *testing.T) {
	g := newGatedWorker(t)
	tr := startRouter(t, []string{g.srv.URL}, "cache_aware", func(fc *fastproxy.Config, lc *loadview.Config) {
		fc.QueueSize, fc.QueueTimeout = 100, 10*time.Second
		lc.LoadScrapeInterval = time.Hour // scraped by the test, below
	})
	t.Cleanup(g.open)
	report := func(running, waiting int) {
		g.metrics.Store(fmt.Sprintf("vllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} %d\n", running, waiting))
		tr.reg.ScrapeLoadOnce(context.Background())
	}
	report(1, 1) // it runs one at once, and one waits there: saturated
	out := make(chan result, 1)
	send(tr.url, "held", body(""), nil, out)
	waitQueued(t, tr, 1)
	if len(g.seen()) != 0 {
		t.Fatal("a request reached a saturated worker")
	}
	report(0, 0) // its slot is free
	g.releaseAll(t, 1)
	if r := <-out; r.status != 200 || r.hdr.Get("X-Vllm-Router-Queue-Ms") == "" {
		t.Fatalf("%d %s, queue header %q", r.status, r.code, r.hdr.Get("X-Vllm-Router-Queue-Ms"))
	}
}

// A stream counts in flight until its last byte, not only until its
// headers: with room for one request, a second one gets 429 router_busy
// while the first still streams, and goes through once the stream ended
// or its client left.
func TestStreamCountsInFlightUntilItEnds(t *testing.T) {
	gate := make(chan struct{})
	w := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/v1/models":
			io.WriteString(w, `{"data":[{"id":"m"}]}`) //nolint:errcheck
			return
		}
		b, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(b), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`) //nolint:errcheck
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"o\"}}]}\n\n") //nolint:errcheck
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: [DONE]\n\n") //nolint:errcheck
	}))
	t.Cleanup(w.Close)
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	tr := startRouter(t, []string{w.URL}, "round_robin", func(fc *fastproxy.Config, _ *loadview.Config) {
		fc.MaxConcurrentRequests, fc.QueueSize = 1, 0
	})

	// stream opens a stream and reads its first event; while it is open, a
	// second request is refused.
	stream := func() *http.Response {
		t.Helper()
		req, _ := http.NewRequest("POST", tr.url+"/v1/chat/completions", strings.NewReader(chatBody("m", "hi", true)))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		first := make([]byte, 16)
		if _, err := io.ReadFull(resp.Body, first); err != nil || !strings.HasPrefix(string(first), "data: ") {
			t.Fatalf("the stream's first event: %q, %v", first, err)
		}
		r, b := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
		if r.StatusCode != 429 || !strings.Contains(string(b), `"router_busy"`) {
			t.Fatalf("while a stream is in flight: %d %s, want 429 router_busy", r.StatusCode, b)
		}
		return resp
	}
	servedAgain := func(after string) {
		t.Helper()
		testwait.Until(t, "a request served once the stream "+after, func() bool {
			r, _ := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
			return r.StatusCode == 200
		})
	}

	// A client that leaves mid-stream gives its slot back.
	stream().Body.Close()
	servedAgain("'s client left")

	// A stream that ends gives it back.
	resp := stream()
	defer resp.Body.Close()
	open()
	if rest, err := io.ReadAll(resp.Body); err != nil || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the stream's end: %q, %v", rest, err)
	}
	servedAgain("ended")
}

// A background turn whose session a full worker holds waits in the queue,
// though another worker has a free slot, and a later request with no
// history passes it to that slot; once its own worker has room it goes
// there. (Sent at once it would queue in its worker's engine, first come
// first served, ahead of the urgent turns of that worker's sessions.) One
// request in flight at a time, so that the test decides when the queue
// releases.
func TestQueueBackgroundWaitsForItsFullWorker(t *testing.T) {
	ga, gb := newGatedWorker(t), newGatedWorker(t)
	tr := startRouter(t, []string{ga.srv.URL, gb.srv.URL}, "cache_aware", func(fc *fastproxy.Config, lc *loadview.Config) {
		fc.MaxConcurrentRequests, fc.QueueSize, fc.QueueTimeout, fc.QueueHeadroom = 1, 100, 10*time.Second, -1
		lc.LoadScrapeInterval = time.Hour // scraped by the test, below
	})
	t.Cleanup(ga.open)
	t.Cleanup(gb.open)
	report := func(g *gatedWorker, running, waiting int) {
		g.metrics.Store(fmt.Sprintf("vllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} %d\n", running, waiting))
	}
	scrape := func() { tr.reg.ScrapeLoadOnce(context.Background()) }
	report(ga, 1, 1) // each runs one at a time: learned from a report with one waiting
	report(gb, 1, 1)
	scrape()
	report(ga, 0, 0)
	report(gb, 0, 0)
	scrape()

	out := make(chan result, 3)
	send(tr.url, "turn1", body(""), map[string]string{"X-Session-ID": "agent-1"}, out)
	testwait.Until(t, "turn1 at a worker", func() bool { return len(ga.seen())+len(gb.seen()) == 1 })
	home, other := ga, gb
	if len(gb.seen()) == 1 {
		home, other = gb, ga
	}
	send(tr.url, "turn2", body(""), map[string]string{"X-Session-ID": "agent-1", "X-Request-Priority": "10"}, out)
	waitQueued(t, tr, 1)
	stranger := `{"model":"m","messages":[{"role":"user","content":"a history held nowhere"}]}`
	send(tr.url, "stranger", stranger, map[string]string{"X-Session-ID": "agent-2", "X-Request-Priority": "10"}, out)
	waitQueued(t, tr, 2)
	report(home, 1, 1) // full, one waiting there: no room once turn1 ends
	scrape()
	home.releaseAll(t, 1)
	testwait.Until(t, "the stranger at the free worker", func() bool { return len(other.seen()) == 1 })
	if got := other.seen()[0]; got != "stranger" || queued(tr) != 1 || len(home.seen()) != 1 {
		t.Fatalf("the free worker saw %q, %d queued, the full one saw %q: want the stranger there and turn2 waiting",
			got, queued(tr), home.seen())
	}
	report(home, 0, 0)
	scrape()
	other.releaseAll(t, 1)
	if got := home.releaseAll(t, 2); got[1] != "turn2" {
		t.Fatalf("the session's worker saw %q", got)
	}
	for range 3 {
		if r := <-out; r.status != 200 {
			t.Fatalf("%s: %d %s", r.name, r.status, r.code)
		}
	}
}
