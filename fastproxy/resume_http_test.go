package fastproxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
)

// story is the answer every scripted worker gives, one token a chunk.
var story = []string{"Once", " upon", " a", " time", " a", " \"router\"", " kept", " the", " answer", "."}

// cutter is a worker double that streams story as vLLM does and misbehaves
// on a first attempt as told: it cuts the stream (closes the connection),
// resets it, ends it without [DONE], or stalls, after `after` tokens. A
// continuation (continue_final_message) it answers from where the
// assistant message ends, as vLLM continues it.
type cutter struct {
	name  string
	fault string // cut, reset, truncate, stall, headers (never answers), busy (503 to all), none
	after int
	busy  bool // answers a continuation 503
	srv   *httptest.Server

	mu    sync.Mutex
	seen  []map[string]any // the bodies it received
	conns int              // connections open
}

func startCutter(t *testing.T, name, fault string, after int) *cutter {
	t.Helper()
	c := &cutter{name: name, fault: fault, after: after}
	c.srv = httptest.NewUnstartedServer(http.HandlerFunc(c.serve))
	c.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		c.mu.Lock()
		defer c.mu.Unlock()
		switch s {
		case http.StateNew:
			c.conns++
		case http.StateClosed, http.StateHijacked:
			c.conns--
		}
	}
	c.srv.Start()
	t.Cleanup(c.srv.Close)
	return c
}

func (c *cutter) bodies() []map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]map[string]any(nil), c.seen...)
}

func (c *cutter) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		return
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		return
	}
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	c.mu.Lock()
	c.seen = append(c.seen, body)
	c.mu.Unlock()
	from, cont := 0, body["continue_final_message"] == true
	if cont {
		msgs := body["messages"].([]any)
		prefix := msgs[len(msgs)-1].(map[string]any)["content"].(string)
		for from < len(story) && strings.HasPrefix(prefix, strings.Join(story[:from+1], "")) {
			from++
		}
		if strings.Join(story[:from], "") != prefix || body["add_generation_prompt"] != false {
			http.Error(w, "bad continuation", 400)
			return
		}
	}
	if cont && c.busy || c.fault == "busy" {
		http.Error(w, "busy", http.StatusServiceUnavailable)
		return
	}
	if !cont && c.fault == "headers" {
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	f := w.(http.Flusher)
	event := func(v string) {
		fmt.Fprintf(w, "data: %s\n\n", v)
		f.Flush()
	}
	head := fmt.Sprintf(`"id":"chatcmpl-%s","object":"chat.completion.chunk","created":%d,"model":"m","system_fingerprint":"fp-%s"`,
		c.name, len(c.name), c.name)
	event(`{` + head + `,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`)
	for i := from; i < len(story); i++ {
		if !cont && c.fault != "none" && i-from == c.after {
			c.misbehave(w, r)
			return
		}
		s, _ := json.Marshal(story[i])
		event(`{` + head + `,"choices":[{"index":0,"delta":{"content":` + string(s) + `},"logprobs":null,"finish_reason":null}]}`)
	}
	event(`{` + head + `,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`)
	if so, _ := body["stream_options"].(map[string]any); so["include_usage"] == true {
		p, n := 10+from, len(story)-from
		event(fmt.Sprintf(`{%s,"choices":[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}`, head, p, p+n, n))
	}
	event("[DONE]")
}

func (c *cutter) misbehave(w http.ResponseWriter, r *http.Request) {
	switch c.fault {
	case "cut":
		panic(http.ErrAbortHandler) // the connection closes mid-body
	case "reset":
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.(*net.TCPConn).SetLinger(0) //nolint:errcheck
			conn.Close()
		}
	case "truncate": // the body ends, without [DONE]
	case "stall":
		<-r.Context().Done()
	}
}

// sseText reads a chat stream's events: the text, the roles, the chunk
// ids, the usage, the [DONE]s and any error event.
type sseText struct {
	text, errors      strings.Builder
	roles, dones      int
	ids, fingerprints map[string]int
	usage             map[string]float64
}

func readSSE(t *testing.T, body string) *sseText {
	t.Helper()
	s := &sseText{ids: map[string]int{}, fingerprints: map[string]int{}}
	for _, ev := range strings.Split(body, "\n\n") {
		ev = strings.TrimSpace(ev)
		if ev == "" {
			continue
		}
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			t.Fatalf("not an SSE data event: %q", ev)
		}
		if data == "[DONE]" {
			s.dones++
			continue
		}
		var c struct {
			ID      string `json:"id"`
			FP      string `json:"system_fingerprint"`
			Error   any
			Choices []struct {
				Delta struct{ Role, Content string }
			}
			Usage map[string]float64
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if c.Error != nil {
			s.errors.WriteString(data)
			continue
		}
		s.ids[c.ID]++
		s.fingerprints[c.FP]++
		if c.Usage != nil {
			s.usage = c.Usage
		}
		for _, ch := range c.Choices {
			if ch.Delta.Role != "" {
				s.roles++
			}
			s.text.WriteString(ch.Delta.Content)
		}
	}
	return s
}

// resumeRouter starts a router in front of two cutters, the first attempt
// going to the first (it holds the session), with short waits.
func resumeRouter(t *testing.T, fault string, after int, mod func(*fastproxy.Config)) (*testRouter, *cutter, *cutter) {
	t.Helper()
	a, b := startCutter(t, "a", fault, after), startCutter(t, "b", fault, after)
	r := startRouter(t, []string{a.srv.URL, b.srv.URL}, "round_robin", func(fc *fastproxy.Config, lc *loadview.Config) {
		fc.UpstreamStallTimeout = 300 * time.Millisecond
		fc.FirstByteTimeout = 300 * time.Millisecond
		if mod != nil {
			mod(fc)
		}
	})
	return r, a, b
}

const storyRequest = `{"model":"m","stream":true,"max_tokens":50,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"tell a story"}]}`

// TestCutStreamContinuesOnAnotherWorker: whatever way the worker cuts a
// stream (closes the connection, resets it, ends the body without its
// terminator, stalls), the client sees one whole answer: the text of the
// uninterrupted one, one role, the first worker's id and fingerprint on
// every chunk, usage that adds the two attempts up, one [DONE], no error
// event. The continuation carries the text delivered, continues it, and
// asks for what was left of max_tokens.
func TestCutStreamContinuesOnAnotherWorker(t *testing.T) {
	for _, fault := range []string{"cut", "reset", "truncate", "stall"} {
		t.Run(fault, func(t *testing.T) {
			r, a, b := resumeRouter(t, fault, 4, nil)
			resp, body := do(t, "POST", r.url+"/v1/chat/completions", storyRequest, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			s := readSSE(t, string(body))
			first, second := a, b
			if len(a.bodies()) == 0 || s.ids["chatcmpl-b"] > 0 && s.ids["chatcmpl-a"] == 0 {
				first, second = b, a
			}
			want := strings.Join(story, "")
			if got := s.text.String(); got != want || s.errors.Len() > 0 {
				t.Fatalf("client text %q (errors %q), want %q", got, s.errors.String(), want)
			}
			if s.roles != 1 || s.dones != 1 || len(s.ids) != 1 || s.ids["chatcmpl-"+first.name] == 0 || len(s.fingerprints) != 1 {
				t.Fatalf("roles %d, [DONE]s %d, ids %v, fingerprints %v: want one of each, the first worker's", s.roles, s.dones, s.ids, s.fingerprints)
			}
			if u := s.usage; u["prompt_tokens"] != 10 || u["completion_tokens"] != float64(len(story)) || u["total_tokens"] != float64(10+len(story)) {
				t.Fatalf("usage %v, want 10 prompt and %d completion tokens", u, len(story))
			}
			cont := second.bodies()
			if len(cont) != 1 {
				t.Fatalf("the second worker got %d requests, want the continuation", len(cont))
			}
			msgs := cont[0]["messages"].([]any)
			last := msgs[len(msgs)-1].(map[string]any)
			if last["role"] != "assistant" || last["content"] != strings.Join(story[:4], "") || cont[0]["max_tokens"] != float64(46) {
				t.Fatalf("continuation %v", cont[0])
			}
			if n := r.counter(`vllm_router_stream_resumes_total{outcome="resumed"}`); n != 1 {
				t.Fatalf("resumed counted %d times", n)
			}
			waitIdle(t, r.reg)
			testwait.Until(t, "the continuation's prompt tokens (10 + 4) counted once the relay closed", func() bool {
				return r.counter("vllm_router_stream_resume_prompt_tokens_total") == 14
			})
		})
	}
}

// TestOpenAISDKSeesOneAnswerAcrossACut: the OpenAI Go SDK's streaming
// accumulator gets one well-formed answer across a cut.
func TestOpenAISDKSeesOneAnswerAcrossACut(t *testing.T) {
	r, _, _ := resumeRouter(t, "cut", 3, nil)
	client := openai.NewClient(option.WithBaseURL(r.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         "m",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell a story")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		if !acc.AddChunk(stream.Current()) {
			t.Fatalf("the accumulator refused chunk %+v", stream.Current())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0].Message.Content; got != strings.Join(story, "") || acc.Usage.CompletionTokens != int64(len(story)) || acc.ID != "chatcmpl-a" && acc.ID != "chatcmpl-b" {
		t.Fatalf("accumulated %q, id %q, usage %+v", got, acc.ID, acc.Usage)
	}
	waitIdle(t, r.reg)
}

// TestStreamThatCannotBeContinuedEndsWithTheErrorEvent: a request whose
// answer no continuation reproduces (several choices, logprobs), and any
// request with --stream-resume-attempts 0, ends as before: the error event.
func TestStreamThatCannotBeContinuedEndsWithTheErrorEvent(t *testing.T) {
	for name, c := range map[string]struct {
		body     string
		attempts int
	}{
		"n=2":        {strings.Replace(storyRequest, `"stream":true`, `"stream":true,"n":2`, 1), 1},
		"logprobs":   {strings.Replace(storyRequest, `"stream":true`, `"stream":true,"logprobs":true`, 1), 1},
		"attempts=0": {storyRequest, -1},
	} {
		t.Run(name, func(t *testing.T) {
			r, a, b := resumeRouter(t, "cut", 2, func(fc *fastproxy.Config) { fc.StreamResumeAttempts = c.attempts })
			_, body := do(t, "POST", r.url+"/v1/chat/completions", c.body, nil)
			s := readSSE(t, string(body))
			if !strings.Contains(s.errors.String(), "stream_cut") || s.text.String() != strings.Join(story[:2], "") {
				t.Fatalf("text %q, errors %q: want the two tokens and the error event", s.text.String(), s.errors.String())
			}
			if n := len(a.bodies()) + len(b.bodies()); n != 1 {
				t.Fatalf("%d requests reached the workers, want 1", n)
			}
			if n := r.counter(`vllm_router_stream_resumes_total{outcome="not_continuable"}`); c.attempts > 0 && n != 1 {
				t.Fatalf("not_continuable counted %d times", n)
			}
			waitIdle(t, r.reg)
		})
	}
}

// TestStreamFirstByteTimeoutFailsOver: --first-byte-timeout-secs applies to
// streams: a worker that takes the request and never answers is left for
// another one before any byte reached the client.
func TestStreamFirstByteTimeoutFailsOver(t *testing.T) {
	a, b := startCutter(t, "a", "headers", 0), startCutter(t, "b", "none", 0)
	r := startRouter(t, []string{a.srv.URL, b.srv.URL}, "round_robin", func(fc *fastproxy.Config, lc *loadview.Config) {
		fc.FirstByteTimeout = 300 * time.Millisecond
	})
	for range 2 { // round robin: one of them goes to a first
		resp, body := do(t, "POST", r.url+"/v1/chat/completions", storyRequest, nil)
		if s := readSSE(t, string(body)); resp.StatusCode != 200 || s.text.String() != strings.Join(story, "") {
			t.Fatalf("status %d, text %q", resp.StatusCode, s.text.String())
		}
	}
	if n := r.counter(`vllm_router_upstream_errors_total{kind="first_byte_timeout"}`); n == 0 || n != uint64(len(a.bodies())) {
		t.Fatalf("first-byte timeouts counted %d, for %d requests to the worker that never answers", n, len(a.bodies()))
	}
	waitIdle(t, r.reg)
}

// TestClientLeavingAStalledStreamReleasesItsWorker: clients that leave
// streams whose worker sends nothing more release the worker's load and
// the upstream connection at once, not when the stall or request timeout
// ends.
func TestClientLeavingAStalledStreamReleasesItsWorker(t *testing.T) {
	a := startCutter(t, "a", "stall", 1)
	r := startRouter(t, []string{a.srv.URL}, "round_robin", func(fc *fastproxy.Config, lc *loadview.Config) {
		fc.UpstreamStallTimeout = -1 // nothing but the client's leaving ends these streams
		fc.StreamResumeAttempts = -1
	})
	for range 4 {
		conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(storyRequest), storyRequest)
		br := bufio.NewReader(conn)
		for line := ""; !strings.Contains(line, "Once"); {
			if line, err = br.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
		conn.Close()
	}
	waitIdle(t, r.reg)
	testwait.Until(t, "the worker's connections closed", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.conns == 0
	})
}

// TestCutStreamWithNoWorkerLeft: a continuable stream whose model has no
// other worker ends with the error event, counted as failed.
func TestCutStreamWithNoWorkerLeft(t *testing.T) {
	a := startCutter(t, "a", "cut", 3)
	r := startRouter(t, []string{a.srv.URL}, "round_robin", nil)
	_, body := do(t, "POST", r.url+"/v1/chat/completions", storyRequest, nil)
	s := readSSE(t, string(body))
	if !strings.Contains(s.errors.String(), "stream_cut") || s.text.String() != strings.Join(story[:3], "") {
		t.Fatalf("text %q, errors %q: want three tokens and the error event", s.text.String(), s.errors.String())
	}
	if n := r.counter(`vllm_router_stream_resumes_total{outcome="failed"}`); n != 1 {
		t.Fatalf("failed continuations counted %d", n)
	}
	waitIdle(t, r.reg)
}

// TestContinuationRefused: a worker that answers the continuation with
// another status than 200 is left, and with no worker left the stream ends
// with the error event, counted as a failed continuation.
func TestContinuationRefused(t *testing.T) {
	a, b := startCutter(t, "a", "cut", 3), startCutter(t, "b", "cut", 3)
	a.busy, b.busy = true, true
	r := startRouter(t, []string{a.srv.URL, b.srv.URL}, "round_robin", nil)
	_, body := do(t, "POST", r.url+"/v1/chat/completions", storyRequest, nil)
	s := readSSE(t, string(body))
	if !strings.Contains(s.errors.String(), "stream_cut") || s.text.String() != strings.Join(story[:3], "") {
		t.Fatalf("text %q, errors %q: want three tokens and the error event", s.text.String(), s.errors.String())
	}
	if n, m := len(a.bodies()), len(b.bodies()); n+m != 2 {
		t.Fatalf("the workers got %d and %d requests, want the first attempt and one continuation", n, m)
	}
	if n := r.counter(`vllm_router_stream_resumes_total{outcome="failed"}`); n != 1 {
		t.Fatalf("failed continuations counted %d", n)
	}
	waitIdle(t, r.reg)
}

// TestContinuationSkipsWorkersAlreadyFailed: a worker that pushed a
// request back before its stream began is not asked to continue it.
func TestContinuationSkipsWorkersAlreadyFailed(t *testing.T) {
	x, b := startCutter(t, "x", "busy", 0), startCutter(t, "b", "cut", 3)
	r := startRouter(t, []string{x.srv.URL, b.srv.URL}, "round_robin", nil)
	for i := range 4 { // round robin: some go to x first, some to b
		do(t, "POST", r.url+"/v1/chat/completions", strings.Replace(storyRequest, "tell a story", "tell story "+strconv.Itoa(i), 1), nil)
	}
	met := 0
	for i := range 4 {
		user := "tell story " + strconv.Itoa(i)
		first, continued := false, false
		for _, body := range x.bodies() {
			msgs := body["messages"].([]any)
			if msgs[0].(map[string]any)["content"] != user {
				continue
			}
			if body["continue_final_message"] == true {
				continued = true
			} else {
				first = true
			}
		}
		if first {
			met++
			if continued {
				t.Fatalf("%q: the worker that pushed it back was asked to continue it", user)
			}
		}
	}
	if met == 0 {
		t.Fatal("no request went to the busy worker first: the case was not met")
	}
	waitIdle(t, r.reg)
}
