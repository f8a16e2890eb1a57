package simworker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
)

// startWorker serves a new Worker on a loopback port until the test ends.
func startWorker(t *testing.T, cfg Config) (*Worker, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := New(cfg)
	go w.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { w.Close() })
	return w, "http://" + ln.Addr().String()
}

var client = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// post sends body (marshalled unless already []byte) with optional header
// pairs and returns the status and body.
func post(t *testing.T, url string, body any, hdr ...string) (int, []byte) {
	t.Helper()
	resp, err := send(url, body, hdr...)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read: %v", url, err)
	}
	return resp.StatusCode, b
}

func send(url string, body any, hdr ...string) (*http.Response, error) {
	b, ok := body.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return client.Do(req)
}

func get(t *testing.T, method, url string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func decodeJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return m
}

// path walks decoded JSON: keys for objects, ints for arrays.
func path(v any, p ...any) any {
	for _, k := range p {
		switch k := k.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			a, _ := v.([]any)
			if k >= len(a) {
				return nil
			}
			v = a[k]
		}
	}
	return v
}

func num(v any) int { f, _ := v.(float64); return int(f) }

type msg = map[string]any

func user(s string) msg { return msg{"role": "user", "content": s} }

var weatherTools = []any{
	msg{"type": "function", "function": msg{"name": "web_search", "parameters": msg{"type": "object"}}},
	msg{"type": "function", "function": msg{"name": "get_weather", "description": "weather", "parameters": msg{"type": "object", "properties": msg{"city": msg{"type": "string"}}}}},
}

// sseEvent is one "data:" line of an event stream.
type sseEvent struct {
	event string
	data  string
	at    time.Duration
}

// readSSE reads an event stream to its end; err is the read error (nil at a
// clean EOF).
func readSSE(resp *http.Response, start time.Time) (evs []sseEvent, err error) {
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	event := ""
	for {
		line, err := r.ReadString('\n')
		if line = strings.TrimRight(line, "\r\n"); line != "" {
			switch {
			case strings.HasPrefix(line, "event: "):
				event = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				evs = append(evs, sseEvent{event: event, data: line[len("data: "):], at: time.Since(start)})
				event = ""
			}
		}
		if err != nil {
			if err == io.EOF {
				return evs, nil
			}
			return evs, err
		}
	}
}

func TestRenderPrefixAcrossTurns(t *testing.T) {
	dec := func(s string) chatRequest {
		t.Helper()
		var r chatRequest
		if err := api.UnmarshalFromString(s, &r); err != nil {
			t.Fatal(err)
		}
		sortTools(r.Tools)
		return r
	}
	tools := `"tools":[{"type":"function","function":{"name":"zeta","parameters":{"type": "object"}}},{"type":"function","function":{"name":"alpha"}}]`
	turn1 := `{"model":"m",` + tools + `,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"weather?"}]}`
	turn2 := `{"model":"m",` + tools + `,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"weather?"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_m_1","type":"function","function":{"name":"alpha","arguments":"{\"x\":1}"}}]},` +
		`{"role":"tool","tool_call_id":"call_m_1","content":"sunny"}]}`
	turn3 := `{"model":"m",` + tools + `,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"weather?"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_m_1","type":"function","function":{"name":"alpha","arguments":"{\"x\":1}"}}]},` +
		`{"role":"tool","tool_call_id":"call_m_1","content":"sunny"},{"role":"assistant","content":"It is sunny."},` +
		`{"role":"user","content":[{"type":"text","text":"and "},{"type":"text","text":"tomorrow?"}]}]}`
	var prompts [][]byte
	for _, s := range []string{turn1, turn2, turn3} {
		r := dec(s)
		prompts = append(prompts, renderChat(nil, r.Tools, r.Messages))
	}
	for i := 1; i < len(prompts); i++ {
		if !bytes.HasPrefix(prompts[i], prompts[i-1]) {
			t.Fatalf("turn %d prompt does not extend turn %d:\n%s\n---\n%s", i+1, i, prompts[i-1], prompts[i])
		}
	}
	want := `<|tools|>{"name":"alpha","description":"","parameters":null}` + "\n" +
		`<|tools|>{"name":"zeta","description":"","parameters":{"type":"object"}}` + "\n" +
		"<|system|>be brief\n<|user|>weather?\n<|assistant|>"
	if string(prompts[0]) != want {
		t.Fatalf("turn 1 prompt\n got %q\nwant %q", prompts[0], want)
	}
	if !bytes.Contains(prompts[2], []byte(`<|tool_call|>alpha {"x":1}`+"\n<|tool|>sunny\n<|assistant|>It is sunny.\n<|user|>and tomorrow?\n")) {
		t.Fatalf("turn 3 prompt lacks the tool call, result or parts: %q", prompts[2])
	}
	// Deterministic.
	r := dec(turn3)
	if again := renderChat(nil, r.Tools, r.Messages); !bytes.Equal(again, prompts[2]) {
		t.Fatal("rendering is not deterministic")
	}
}

func TestAppendJSONString(t *testing.T) {
	f := func(s string) {
		t.Helper()
		got := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil || back != s {
			t.Fatalf("appendJSONString(%q) = %s (back %q, %v)", s, got, back, err)
		}
	}
	f("")
	f("plain")
	f(`quote " backslash \ newline` + "\n\t\r\x01\x1f")
	f("unicode é 😀")
}

func TestCacheEvictsTailFirst(t *testing.T) {
	c := newPrefixCache(6)
	prompt := func(ch byte) []byte { return bytes.Repeat([]byte{ch}, 4*8) }
	a := blockHashes(nil, 1, prompt('a'), 8)
	b := blockHashes(nil, 1, prompt('b'), 8)
	if len(a) != 4 || a[1] == a[0] || a[0] == b[0] { // chained: equal blocks hash apart; content matters
		t.Fatalf("chain %v", a)
	}
	if got := c.lookupInsert(a, nil); got != 0 {
		t.Fatalf("cold lookup = %d", got)
	}
	if got := c.lookupInsert(a, nil); got != 4 {
		t.Fatalf("warm lookup = %d, want 4", got)
	}
	c.lookupInsert(b, nil) // 8 blocks > 6: two of a's go, from its tail
	if got := c.contains(a); got != 2 {
		t.Fatalf("a keeps %d leading blocks, want 2", got)
	}
	if got := c.contains(b); got != 4 {
		t.Fatalf("b keeps %d blocks, want 4", got)
	}
	if c.used() != 6 {
		t.Fatalf("used = %d", c.used())
	}
	// A different salt (model) shares nothing.
	if got := c.contains(blockHashes(nil, 2, prompt('b'), 8)); got != 0 {
		t.Fatalf("other model hit %d blocks", got)
	}
	// A partial trailing block is not cached.
	if n := len(blockHashes(nil, 1, make([]byte, 8*3+7), 8)); n != 3 {
		t.Fatalf("full blocks = %d, want 3", n)
	}
}

func TestRepeatedPromptCachedAndFaster(t *testing.T) {
	// 4000 uncached tokens at 200 µs cost one 806 ms engine step; at
	// TimeScale 0.5 a cold request takes ~400 ms to the first token, a warm
	// one ~3 ms (margins for a loaded machine).
	w, url := startWorker(t, Config{TimeScale: 0.5, PerToken: 200 * time.Microsecond, MaxTokens: 1})
	body := msg{"model": "sim-model", "messages": []any{user(strings.Repeat("lorem ipsum ", 1333))}}
	r := chatRequest{Messages: []chatMessage{{Role: "user", Content: strings.Repeat("lorem ipsum ", 1333)}}}
	prompt := renderChat(nil, nil, r.Messages)
	fullBlocks := len(prompt) / (16 * 4)

	timed := func() (time.Duration, map[string]any) {
		start := time.Now()
		code, b := post(t, url+"/v1/chat/completions", body)
		if code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		return time.Since(start), decodeJSON(t, b)
	}
	cold, m1 := timed()
	warm, m2 := timed()
	if got := num(path(m1, "usage", "prompt_tokens_details", "cached_tokens")); got != 0 {
		t.Fatalf("cold cached_tokens = %d", got)
	}
	if got, want := num(path(m2, "usage", "prompt_tokens")), (len(prompt)+3)/4; got != want {
		t.Fatalf("prompt_tokens = %d, want %d", got, want)
	}
	if got := num(path(m2, "usage", "prompt_tokens_details", "cached_tokens")); got < fullBlocks*16 {
		t.Fatalf("warm cached_tokens = %d, want >= %d", got, fullBlocks*16)
	}
	if warm*2 > cold {
		t.Fatalf("warm TTFT %v not well below cold %v", warm, cold)
	}
	if cold < 300*time.Millisecond {
		t.Fatalf("cold TTFT %v below the modelled ~400ms", cold)
	}
	st := w.Stats()
	if st.PrefixHits != uint64(fullBlocks*16) || st.PrefixQueries != uint64(2*num(path(m2, "usage", "prompt_tokens"))) {
		t.Fatalf("stats %+v", st)
	}
}

func TestTurnTwoHitsTurnOne(t *testing.T) {
	_, url := startWorker(t, Config{})
	turn1 := []any{msg{"role": "system", "content": strings.Repeat("You are helpful. ", 40)}, user("What is the weather in Paris?")}
	code, b := post(t, url+"/v1/chat/completions", msg{"model": "sim-model", "messages": turn1, "tools": weatherTools})
	if code != 200 {
		t.Fatalf("turn 1: %d %s", code, b)
	}
	m := decodeJSON(t, b)
	call, _ := path(m, "choices", 0, "message", "tool_calls", 0).(map[string]any)
	if call == nil || path(m, "choices", 0, "finish_reason") != "tool_calls" {
		t.Fatalf("turn 1 did not call a tool: %s", b)
	}
	// First tool by name order.
	if name := path(call, "function", "name"); name != "get_weather" {
		t.Fatalf("tool %v, want get_weather", name)
	}
	id, _ := call["id"].(string)
	if !strings.HasPrefix(id, "call_sim-model_") {
		t.Fatalf("tool call id %q", id)
	}
	turn2 := append(append([]any{}, turn1...),
		msg{"role": "assistant", "content": nil, "tool_calls": []any{call}},
		msg{"role": "tool", "tool_call_id": id, "content": "sunny, 21C"})
	code, b = post(t, url+"/v1/chat/completions", msg{"model": "sim-model", "messages": turn2, "tools": weatherTools})
	if code != 200 {
		t.Fatalf("turn 2: %d %s", code, b)
	}
	m = decodeJSON(t, b)
	if path(m, "choices", 0, "message", "content") == nil || path(m, "choices", 0, "finish_reason") != "stop" {
		t.Fatalf("turn 2 after a tool result should answer text: %s", b)
	}

	var r1 chatRequest
	raw, _ := json.Marshal(msg{"messages": turn1, "tools": weatherTools})
	if err := api.Unmarshal(raw, &r1); err != nil {
		t.Fatal(err)
	}
	sortTools(r1.Tools)
	want := len(renderChat(nil, r1.Tools, r1.Messages)) / 64 * 16
	if got := num(path(m, "usage", "prompt_tokens_details", "cached_tokens")); got != want {
		t.Fatalf("turn 2 cached_tokens = %d, want turn 1's full blocks %d", got, want)
	}
}

func TestEvictionAtCapacity(t *testing.T) {
	// Legacy model: 64-byte blocks, 8 blocks: three 256-byte prompts do not fit.
	w, url := startWorker(t, Config{LatencyModel: LatencyLegacy, CacheBlocks: 8})
	cached := func(prompt string) int {
		t.Helper()
		code, b := post(t, url+"/v1/completions", msg{"model": "sim-model", "prompt": prompt, "max_tokens": 1})
		if code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		return num(path(decodeJSON(t, b), "usage", "prompt_tokens_details", "cached_tokens"))
	}
	a, b, c := strings.Repeat("a", 256), strings.Repeat("b", 256), strings.Repeat("c", 256)
	cached(a)
	cached(b)
	if w.Stats().CacheBlocksUsed != 8 {
		t.Fatalf("used %d blocks, want 8", w.Stats().CacheBlocksUsed)
	}
	cached(c) // evicts a, the least recently used
	if got := cached(c); got != 64 {
		t.Fatalf("newest prompt cached %d tokens, want 64", got)
	}
	if got := cached(b); got != 64 {
		t.Fatalf("second prompt cached %d tokens, want 64", got)
	}
	if got := cached(a); got != 0 {
		t.Fatalf("oldest prompt still cached: %d tokens", got)
	}
	if st := w.Stats(); st.CacheBlocksUsed != 8 {
		t.Fatalf("used %d blocks after eviction", st.CacheBlocksUsed)
	}
}

func TestStreamingChunksArriveEarly(t *testing.T) {
	// 20 tokens, one per 10 ms engine step at TimeScale 0.5: 5 ms each.
	_, url := startWorker(t, Config{TimeScale: 0.5, MaxTokens: 20, StepBase: 10 * time.Millisecond, DecodePerSeq: -1})
	start := time.Now()
	resp, err := send(url+"/v1/chat/completions", msg{"model": "sim-model", "messages": []any{user("hi")},
		"stream": true, "stream_options": msg{"include_usage": true}})
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	evs, err := readSSE(resp, start)
	total := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if total < 19*5*time.Millisecond {
		t.Fatalf("stream took %v, want >= 95ms", total)
	}
	if first := evs[0].at; first > total/2 {
		t.Fatalf("first chunk at %v of %v: not streamed", first, total)
	}
	if evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("last event %q", evs[len(evs)-1].data)
	}
	var text strings.Builder
	var usage map[string]any
	for i, ev := range evs[:len(evs)-1] {
		m := decodeJSON(t, []byte(ev.data))
		if m["object"] != "chat.completion.chunk" {
			t.Fatalf("event %d: %s", i, ev.data)
		}
		if u, ok := m["usage"].(map[string]any); ok {
			if i != len(evs)-2 {
				t.Fatalf("usage chunk at %d of %d", i, len(evs))
			}
			usage = u
			continue
		}
		if i == 0 && path(m, "choices", 0, "delta", "role") != "assistant" {
			t.Fatalf("first chunk without role: %s", ev.data)
		}
		s, _ := path(m, "choices", 0, "delta", "content").(string)
		text.WriteString(s)
	}
	if usage == nil || num(usage["completion_tokens"]) != 20 || num(usage["prompt_tokens"]) == 0 {
		t.Fatalf("usage chunk %v", usage)
	}
	if text.String() != fillerText(20) {
		t.Fatalf("text %q", text.String())
	}
}

func TestStreamingToolCall(t *testing.T) {
	_, url := startWorker(t, Config{Models: []string{"small", "large"}})
	start := time.Now()
	resp, err := send(url+"/v1/chat/completions", msg{"model": "large", "messages": []any{user("weather?")},
		"tools": weatherTools, "stream": true})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readSSE(resp, start)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 4 || evs[3].data != "[DONE]" {
		t.Fatalf("events %v", evs)
	}
	m := decodeJSON(t, []byte(evs[0].data))
	id, _ := path(m, "choices", 0, "delta", "tool_calls", 0, "id").(string)
	if !strings.HasPrefix(id, "call_large_") || path(m, "choices", 0, "delta", "tool_calls", 0, "function", "name") != "get_weather" {
		t.Fatalf("first delta %s", evs[0].data)
	}
	if args := path(decodeJSON(t, []byte(evs[1].data)), "choices", 0, "delta", "tool_calls", 0, "function", "arguments"); args != "{}" {
		t.Fatalf("arguments delta %s", evs[1].data)
	}
	if fr := path(decodeJSON(t, []byte(evs[2].data)), "choices", 0, "finish_reason"); fr != "tool_calls" {
		t.Fatalf("finish %s", evs[2].data)
	}
}

func TestQueueing(t *testing.T) {
	// Legacy model: one slot; each request holds it for 50 ms.
	w, url := startWorker(t, Config{LatencyModel: LatencyLegacy, MaxNumSeqs: 1, TimeScale: 1, Overhead: 50 * time.Millisecond, MaxTokens: 1})
	const n = 4
	var wg sync.WaitGroup
	durs := make([]time.Duration, n)
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			code, b := post(t, url+"/v1/completions", msg{"prompt": "x"})
			if code != 200 {
				t.Errorf("%d %s", code, b)
			}
			durs[i] = time.Since(start)
		})
	}
	defer wg.Wait() // also when the wait below fails: the requests report to t
	testwait.Until(t, "waiting requests in the stats and the metrics", func() bool {
		st := w.Stats()
		if st.Running > 1 {
			t.Errorf("running %d > MaxNumSeqs", st.Running)
		}
		if st.Waiting == 0 {
			return false
		}
		_, b := get(t, http.MethodGet, url+"/metrics")
		return metricValue(t, b, "vllm:num_requests_waiting") > 0
	})
	wg.Wait()
	slowest := max(durs[0], durs[1], durs[2], durs[3])
	if slowest < 3*50*time.Millisecond {
		t.Fatalf("slowest request %v: queueing did not delay it (%v)", slowest, durs)
	}
	if st := w.Stats(); st.Waiting != 0 || st.Running != 0 {
		t.Fatalf("after: %+v", st)
	}
}

// metricValue returns the value of the first sample of name in Prometheus
// text, or -1.
func metricValue(t *testing.T, text []byte, name string) float64 {
	t.Helper()
	for line := range strings.SplitSeq(string(text), "\n") {
		if !strings.HasPrefix(line, name) ||
			(!strings.Contains(name, "{") && len(line) > len(name) && line[len(name)] != '{' && line[len(name)] != ' ') {
			continue
		}
		var v float64
		if err := json.Unmarshal([]byte(line[strings.LastIndexByte(line, ' ')+1:]), &v); err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		return v
	}
	return -1
}

func TestMetrics(t *testing.T) {
	w, url := startWorker(t, Config{CacheBlocks: 100})
	other := New(Config{}) // a second worker in the process has its own metrics
	defer other.Close()
	prompt := strings.Repeat("p", 640) // 160 tokens, 10 blocks
	for range 3 {
		if code, b := post(t, url+"/v1/completions", msg{"prompt": prompt, "max_tokens": 2}); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	post(t, url+"/v1/completions", msg{"prompt": prompt}, FaultHeader, "error")
	code, b := get(t, http.MethodGet, url+"/metrics")
	if code != 200 {
		t.Fatal(code)
	}
	f := func(name string, want float64) {
		t.Helper()
		if got := metricValue(t, b, name); got != want {
			t.Fatalf("%s = %v, want %v\n%s", name, got, want, b)
		}
	}
	f("vllm:prefix_cache_queries_total", 3*160)
	f("vllm:prefix_cache_hits_total", 2*160)
	f("vllm:num_requests_running", 0)
	f("vllm:num_requests_waiting", 0)
	f("vllm:kv_cache_usage_perc", 0) // nothing running holds a block; the 10 cached ones count as free, as in vLLM
	f(`vllm:request_success_total{finished_reason="length"`, 3)
	f("vllm:generation_tokens_total", 6)
	// The cache configuration as vLLM states it: capacity = blocks × block size.
	for _, l := range []string{`block_size="16"`, `num_gpu_blocks="100"`, `engine="0"`, `cache_dtype="auto"`, `enable_prefix_caching="True"`} {
		if !regexp.MustCompile(`(?m)^vllm:cache_config_info\{[^}\n]*` + regexp.QuoteMeta(l) + `[^}\n]*\} 1$`).Match(b) {
			t.Fatalf("no vllm:cache_config_info with %s, value 1\n%s", l, b)
		}
	}
	if !strings.Contains(string(b), "vllm:time_to_first_token_seconds_bucket") {
		t.Fatal("no TTFT histogram")
	}
	st := w.Stats()
	if st.Requests != 4 || st.Errors != 1 || st.Successful != 3 || st.CompletionTokens != 6 || st.CacheBlocksUsed != 10 || st.CacheBlocksHeld != 0 {
		t.Fatalf("stats %+v", st)
	}
	if os := other.Stats(); os.PrefixQueries != 0 {
		t.Fatalf("other worker shares counters: %+v", os)
	}
}

func TestModelsHealthAndErrors(t *testing.T) {
	w, url := startWorker(t, Config{Models: []string{"a", "b"}, Name: "w1"})
	code, b := get(t, http.MethodGet, url+"/v1/models")
	m := decodeJSON(t, b)
	if code != 200 || m["object"] != "list" || path(m, "data", 0, "id") != "a" || path(m, "data", 1, "id") != "b" {
		t.Fatalf("models %d %s", code, b)
	}
	if code, _ := get(t, http.MethodGet, url+"/health"); code != 200 {
		t.Fatalf("health %d", code)
	}
	w.SetHealthy(false)
	if code, _ := get(t, http.MethodGet, url+"/health"); code != 503 {
		t.Fatalf("unhealthy health %d", code)
	}
	w.SetHealthy(true)
	if code, _ := get(t, http.MethodGet, url+"/health"); code != 200 {
		t.Fatalf("health back %d", code)
	}

	errCase := func(code int, b []byte, wantCode int, wantErrCode string) {
		t.Helper()
		if code != wantCode {
			t.Fatalf("status %d, want %d: %s", code, wantCode, b)
		}
		m := decodeJSON(t, b)
		e, ok := m["error"].(map[string]any)
		if !ok || e["message"] == "" || e["type"] == nil {
			t.Fatalf("not an OpenAI error: %s", b)
		}
		if _, ok := e["param"]; !ok {
			t.Fatalf("error without param: %s", b)
		}
		if wantErrCode != "" && e["code"] != wantErrCode {
			t.Fatalf("code %v, want %s", e["code"], wantErrCode)
		}
	}
	code, b = post(t, url+"/v1/chat/completions", msg{"model": "nope", "messages": []any{user("x")}})
	errCase(code, b, 404, "model_not_found")
	code, b = post(t, url+"/v1/chat/completions", []byte(`{"model":`))
	errCase(code, b, 400, "")
	code, b = get(t, http.MethodGet, url+"/v1/chat/completions")
	errCase(code, b, 405, "method_not_allowed")
	code, b = get(t, http.MethodPost, url+"/v1/models")
	errCase(code, b, 405, "method_not_allowed")
	code, b = get(t, http.MethodGet, url+"/nowhere")
	errCase(code, b, 404, "")
	code, b = post(t, url+"/v1/chat/completions", msg{"model": "a", "messages": []any{}})
	errCase(code, b, 400, "")
	code, b = post(t, url+"/v1/chat/completions", msg{"model": "a", "messages": []any{user("x")}}, FaultHeader, "bogus")
	errCase(code, b, 400, "")

	// Another model on the same worker, named ids.
	code, b = post(t, url+"/v1/chat/completions", msg{"model": "b", "messages": []any{user("x")}, "max_tokens": 3})
	m = decodeJSON(t, b)
	if code != 200 || m["model"] != "b" || !strings.HasPrefix(m["id"].(string), "chatcmpl-w1_") ||
		path(m, "choices", 0, "finish_reason") != "length" || num(path(m, "usage", "completion_tokens")) != 3 {
		t.Fatalf("chat on b: %d %s", code, b)
	}
	// Metrics are labelled per model.
	_, b = get(t, http.MethodGet, url+"/metrics")
	if v := metricValue(t, b, `vllm:request_success_total{finished_reason="length",model_name="b"}`); v != 1 {
		t.Fatalf("success on b = %v\n%s", v, b)
	}
	if v := metricValue(t, b, `vllm:generation_tokens_total{model_name="a"}`); v != 0 {
		t.Fatalf("generation on a = %v", v)
	}
}

func TestZeroLatencyMode(t *testing.T) {
	w, url := startWorker(t, Config{TimeScale: 0, MaxNumSeqs: 2, MaxTokens: 1000})
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 5 {
				if code, b := post(t, url+"/v1/chat/completions", msg{"messages": []any{user("x")}}); code != 200 {
					t.Errorf("%d %s", code, b)
				}
			}
		})
	}
	wg.Wait()
	// 40 requests of 1000 tokens would take 40 × 10 s at real time.
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("zero-latency mode took %v", d)
	}
	if st := w.Stats(); st.Successful != 40 || st.CompletionTokens != 40000 {
		t.Fatalf("stats %+v", st)
	}
}

func TestOtherEndpoints(t *testing.T) {
	_, url := startWorker(t, Config{MaxTokens: 4})
	code, b := post(t, url+"/v1/completions", msg{"model": "sim-model", "prompt": "once upon a time"})
	m := decodeJSON(t, b)
	if code != 200 || m["object"] != "text_completion" || path(m, "choices", 0, "text") != fillerText(4) ||
		num(path(m, "usage", "prompt_tokens")) != 4 || path(m, "choices", 0, "finish_reason") != "stop" {
		t.Fatalf("completions %d %s", code, b)
	}
	code, b = post(t, url+"/generate", msg{"text": "once upon a time", "sampling_params": msg{"max_new_tokens": 2}})
	m = decodeJSON(t, b)
	if code != 200 || m["text"] != fillerText(2) || num(path(m, "meta_info", "cached_tokens")) != 0 || num(path(m, "meta_info", "prompt_tokens")) != 4 {
		t.Fatalf("generate %d %s", code, b)
	}
	code, b = post(t, url+"/v1/embeddings", msg{"model": "sim-model", "input": []any{"a", "b"}})
	m = decodeJSON(t, b)
	if vec, _ := path(m, "data", 1, "embedding").([]any); code != 200 || len(vec) != embeddingDims || num(path(m, "usage", "prompt_tokens")) != 2 {
		t.Fatalf("embeddings %d %s", code, b)
	}
	// Streamed completions and generate end with [DONE].
	for _, c := range []struct {
		path string
		body msg
	}{
		{"/v1/completions", msg{"prompt": "x", "stream": true, "stream_options": msg{"include_usage": true}}},
		{"/generate", msg{"text": "x", "stream": true}},
	} {
		resp, err := send(url+c.path, c.body)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := readSSE(resp, time.Now())
		if err != nil || len(evs) < 5 || evs[len(evs)-1].data != "[DONE]" {
			t.Fatalf("%s stream: %v %v", c.path, evs, err)
		}
	}
}

func TestFaultConfig(t *testing.T) {
	chat := msg{"messages": []any{user("x")}}
	_, url := startWorker(t, Config{ErrorRate: 1})
	code, b := post(t, url+"/v1/chat/completions", chat)
	if code != 500 || !strings.Contains(string(b), `"error"`) {
		t.Fatalf("ErrorRate=1: %d %s", code, b)
	}

	_, url = startWorker(t, Config{Unavailable: []Window{{0, 150 * time.Millisecond}}})
	if code, _ := post(t, url+"/v1/chat/completions", chat); code != 503 {
		t.Fatalf("in window: %d", code)
	}
	if code, _ := get(t, http.MethodGet, url+"/health"); code != 503 {
		t.Fatalf("health in window: %d", code)
	}
	testwait.Until(t, "the window, 150 ms from the start, to close", func() bool {
		code, b := post(t, url+"/v1/chat/completions", chat)
		if code != 200 && code != 503 {
			t.Fatalf("after window: %d %s", code, b)
		}
		return code == 200
	})

	_, url = startWorker(t, Config{DropRate: 1})
	resp, err := send(url+"/v1/chat/completions", msg{"messages": []any{user("x")}, "stream": true})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readSSE(resp, time.Now())
	if err == nil || len(evs) != 1 {
		t.Fatalf("DropRate=1: events %v, err %v: want one chunk then a truncated stream", evs, err)
	}

	_, url = startWorker(t, Config{SlowStart: time.Hour, SlowStartDelay: 100 * time.Millisecond, TimeScale: 1, Overhead: -1, MaxTokens: 1})
	start := time.Now()
	if code, _ := post(t, url+"/v1/completions", msg{"prompt": "x"}); code != 200 || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("slow start: %d after %v", code, time.Since(start))
	}
}

func TestFaultHeaders(t *testing.T) {
	w, url := startWorker(t, Config{HangLimit: 10 * time.Second})
	chat := msg{"messages": []any{user("x")}, "max_tokens": 2}
	streamed := msg{"messages": []any{user("x")}, "max_tokens": 5, "stream": true}

	if code, _ := post(t, url+"/v1/chat/completions", chat, FaultHeader, "error"); code != 500 {
		t.Fatalf("error: %d", code)
	}
	if code, _ := post(t, url+"/v1/responses", msg{"input": "x"}, FaultHeader, "unavailable"); code != 503 {
		t.Fatalf("unavailable: %d", code)
	}
	start := time.Now()
	if code, _ := post(t, url+"/v1/chat/completions", chat, FaultHeader, "slow=120"); code != 200 || time.Since(start) < 120*time.Millisecond {
		t.Fatalf("slow: %d after %v", code, time.Since(start))
	}

	// drop, non-streamed: no response at all.
	if resp, err := send(url+"/v1/chat/completions", chat, FaultHeader, "drop"); err == nil {
		resp.Body.Close()
		t.Fatalf("drop: got a response %d", resp.StatusCode)
	}
	// drop, streamed: one chunk, then the connection closes mid-stream.
	resp, err := send(url+"/v1/chat/completions", streamed, FaultHeader, "drop")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readSSE(resp, time.Now())
	if !errors.Is(err, io.ErrUnexpectedEOF) || len(evs) != 1 || !strings.Contains(evs[0].data, "chat.completion.chunk") {
		t.Fatalf("drop stream: %v, %v", evs, err)
	}
	// The worker is fine afterwards and the slot was released.
	if code, _ := post(t, url+"/v1/chat/completions", chat); code != 200 {
		t.Fatalf("after drop: %d", code)
	}

	// timeout: the client gives up; Close unblocks the hanging handler.
	short := &http.Client{Timeout: 150 * time.Millisecond}
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"x"}]}`))
	req.Header.Set(FaultHeader, "timeout")
	start = time.Now()
	if resp, err := short.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("timeout: got %d", resp.StatusCode)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("client timeout took %v", d)
	}
	start = time.Now()
	w.Close()
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Close took %v with a hanging request", d)
	}
	st := w.Stats()
	if st.Dropped != 2 || st.Errors < 5 {
		t.Fatalf("stats %+v", st)
	}
}

func TestCloseUnblocksQueued(t *testing.T) {
	w, url := startWorker(t, Config{MaxNumSeqs: 1, TimeScale: 1, StepBase: time.Hour})
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			resp, err := send(url+"/v1/completions", msg{"prompt": "x"})
			if err == nil {
				resp.Body.Close()
			}
			errs <- err
		}()
	}
	testwait.Until(t, "a queued request", func() bool { return w.Stats().Waiting > 0 })
	start := time.Now()
	w.Close()
	<-errs
	<-errs
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Close took %v", d)
	}
}

func TestStrictToolIDs(t *testing.T) {
	_, url := startWorker(t, Config{StrictToolIDs: true, Models: []string{"m1"}})
	code, b := post(t, url+"/v1/chat/completions", msg{"model": "m1", "messages": []any{user("weather?")}, "tools": weatherTools})
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	call, _ := path(decodeJSON(t, b), "choices", 0, "message", "tool_calls", 0).(map[string]any)
	turn := func(id string) (int, []byte) {
		return post(t, url+"/v1/chat/completions", msg{"model": "m1", "tools": weatherTools, "messages": []any{
			user("weather?"),
			msg{"role": "assistant", "tool_calls": []any{msg{"id": id, "type": "function", "function": msg{"name": "get_weather", "arguments": "{}"}}}},
			msg{"role": "tool", "tool_call_id": id, "content": "sunny"},
		}})
	}
	if code, b := turn(call["id"].(string)); code != 200 {
		t.Fatalf("own id rejected: %d %s", code, b)
	}
	code, b = turn("call_m2_abc")
	if code != 400 || path(decodeJSON(t, b), "error", "code") != "invalid_tool_call_id" {
		t.Fatalf("foreign id: %d %s", code, b)
	}
	// Responses API function_call_output too.
	code, b = post(t, url+"/v1/responses", msg{"model": "m1", "input": []any{
		msg{"type": "function_call_output", "call_id": "call_other_1", "output": "x"}}})
	if code != 400 {
		t.Fatalf("responses foreign id: %d %s", code, b)
	}
}

func TestResponses(t *testing.T) {
	_, url := startWorker(t, Config{Name: "r1"})
	tools := []any{msg{"type": "function", "name": "lookup", "parameters": msg{"type": "object"}}}
	code, b := post(t, url+"/v1/responses", msg{"model": "sim-model", "instructions": strings.Repeat("Be concise. ", 20),
		"input": "find the answer", "tools": tools})
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	r1 := decodeJSON(t, b)
	id, _ := r1["id"].(string)
	if !strings.HasPrefix(id, "resp_r1_") || r1["status"] != "completed" || path(r1, "output", 0, "type") != "function_call" {
		t.Fatalf("response 1: %s", b)
	}
	callID, _ := path(r1, "output", 0, "call_id").(string)
	if !strings.HasPrefix(callID, "call_sim-model_") {
		t.Fatalf("call_id %q", callID)
	}

	// Unknown previous id: the session went to the wrong worker.
	code, b = post(t, url+"/v1/responses", msg{"input": "x", "previous_response_id": "resp_elsewhere_1"})
	if code != 400 || path(decodeJSON(t, b), "error", "code") != "previous_response_not_found" {
		t.Fatalf("unknown previous: %d %s", code, b)
	}

	// Known previous id: continues, and the prefix is cached.
	code, b = post(t, url+"/v1/responses", msg{"previous_response_id": id, "tools": tools,
		"input": []any{msg{"type": "function_call_output", "call_id": callID, "output": "42"}}})
	if code != 200 {
		t.Fatalf("continue: %d %s", code, b)
	}
	r2 := decodeJSON(t, b)
	if path(r2, "output", 0, "type") != "message" || path(r2, "output", 0, "content", 0, "type") != "output_text" ||
		r2["previous_response_id"] != id || num(path(r2, "usage", "input_tokens_details", "cached_tokens")) == 0 {
		t.Fatalf("response 2: %s", b)
	}

	code, b = get(t, http.MethodGet, url+"/v1/responses/"+id)
	if code != 200 || decodeJSON(t, b)["id"] != id {
		t.Fatalf("GET: %d %s", code, b)
	}
	if code, b = get(t, http.MethodDelete, url+"/v1/responses/"+id); code != 200 || decodeJSON(t, b)["deleted"] != true {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	if code, _ = get(t, http.MethodGet, url+"/v1/responses/"+id); code != 404 {
		t.Fatalf("GET after DELETE: %d", code)
	}
	if code, _ = get(t, http.MethodDelete, url+"/v1/responses/"+id); code != 404 {
		t.Fatalf("DELETE twice: %d", code)
	}
	if code, _ = post(t, url+"/v1/responses", msg{"input": "x", "previous_response_id": id}); code != 400 {
		t.Fatalf("previous after DELETE: %d", code)
	}
	// store:false is not kept.
	code, b = post(t, url+"/v1/responses", msg{"input": "x", "store": false})
	if code != 200 {
		t.Fatal(code)
	}
	if code, _ = get(t, http.MethodGet, url+"/v1/responses/"+decodeJSON(t, b)["id"].(string)); code != 404 {
		t.Fatalf("store:false kept: %d", code)
	}
}

func TestResponsesStoreBounded(t *testing.T) {
	_, url := startWorker(t, Config{MaxStoredResponses: 2})
	var ids []string
	for range 3 {
		_, b := post(t, url+"/v1/responses", msg{"input": "x", "max_output_tokens": 1})
		ids = append(ids, decodeJSON(t, b)["id"].(string))
	}
	if code, _ := get(t, http.MethodGet, url+"/v1/responses/"+ids[0]); code != 404 {
		t.Fatalf("oldest kept: %d", code)
	}
	if code, _ := get(t, http.MethodGet, url+"/v1/responses/"+ids[2]); code != 200 {
		t.Fatalf("newest lost: %d", code)
	}
}

func TestResponsesStreaming(t *testing.T) {
	w, url := startWorker(t, Config{MaxTokens: 3})
	var completion uint64
	for k, c := range []struct {
		name  string
		body  msg
		types []string
	}{
		{"text", msg{"input": "hi", "stream": true}, []string{"response.created", "response.in_progress", "response.output_item.added",
			"response.content_part.added", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
			"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}},
		{"tool", msg{"input": "hi", "stream": true, "tools": []any{msg{"type": "function", "name": "f"}}}, []string{"response.created",
			"response.in_progress", "response.output_item.added", "response.function_call_arguments.delta",
			"response.function_call_arguments.done", "response.output_item.done", "response.completed"}},
	} {
		resp, err := send(url+"/v1/responses", c.body)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := readSSE(resp, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for i, ev := range evs {
			m := decodeJSON(t, []byte(ev.data))
			if m["type"] != ev.event || num(m["sequence_number"]) != i {
				t.Fatalf("%s: event %d: %s / %s", c.name, i, ev.event, ev.data)
			}
			types = append(types, ev.event)
		}
		if strings.Join(types, " ") != strings.Join(c.types, " ") {
			t.Fatalf("%s: events\n got %v\nwant %v", c.name, types, c.types)
		}
		last := decodeJSON(t, []byte(evs[len(evs)-1].data))
		id, _ := path(last, "response", "id").(string)
		if path(last, "response", "status") != "completed" {
			t.Fatalf("%s: %s", c.name, evs[len(evs)-1].data)
		}
		if code, _ := get(t, http.MethodGet, url+"/v1/responses/"+id); code != 200 {
			t.Fatalf("%s: streamed response not stored: %d", c.name, code)
		}
		// One completed generation, counted once.
		completion += uint64(num(path(last, "response", "usage", "output_tokens")))
		if st := w.Stats(); st.Successful != uint64(k+1) || st.CompletionTokens != completion {
			t.Fatalf("%s: %d generations of %d tokens counted, want %d of %d", c.name, st.Successful, st.CompletionTokens, k+1, completion)
		}
	}
}

func TestParseWindows(t *testing.T) {
	f := func(s string, want []Window, wantErr bool) {
		t.Helper()
		got, err := ParseWindows(s)
		if (err != nil) != wantErr {
			t.Fatalf("ParseWindows(%q) error %v", s, err)
		}
		if !wantErr && len(got) != len(want) {
			t.Fatalf("ParseWindows(%q) = %v", s, got)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("ParseWindows(%q) = %v, want %v", s, got, want)
			}
		}
	}
	f("", nil, false)
	f("10s-20s", []Window{{10 * time.Second, 20 * time.Second}}, false)
	f("0s-1s, 1m-1m30s", []Window{{0, time.Second}, {time.Minute, 90 * time.Second}}, false)
	f("10s", nil, true)
	f("20s-10s", nil, true)
	f("x-1s", nil, true)
}

func TestParseFaults(t *testing.T) {
	f := func(s string, want faults, wantErr bool) {
		t.Helper()
		got, err := parseFaults([]byte(s))
		if (err != nil) != wantErr || (!wantErr && got != want) {
			t.Fatalf("parseFaults(%q) = %+v, %v", s, got, err)
		}
	}
	f("", faults{}, false)
	f("error", faults{err: true}, false)
	f("drop, slow=250", faults{drop: true, slow: 250 * time.Millisecond}, false)
	f("unavailable,timeout", faults{unavailable: true, timeout: true}, false)
	f("slow=abc", faults{}, true)
	f("explode", faults{}, true)
	f("cut=3", faults{stream: streamFault{faultCut, 3}}, false)
	f("reset=0,slow=1", faults{slow: time.Millisecond, stream: streamFault{faultReset, 0}}, false)
	f("truncate=7", faults{stream: streamFault{faultTruncate, 7}}, false)
	f("STALL=2", faults{stream: streamFault{faultStall, 2}}, false)
	f("cut=1,stall=2", faults{}, true)
	f("cut=-1", faults{}, true)
	f("cut", faults{}, true)
}

func TestSetUnavailable(t *testing.T) {
	w, url := startWorker(t, Config{TimeScale: 0})
	w.SetUnavailable(true)
	if code, _ := post(t, url+"/v1/chat/completions", []byte(`{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`)); code != 503 {
		t.Fatalf("unavailable worker answered %d", code)
	}
	w.SetUnavailable(false)
	if code, _ := post(t, url+"/v1/chat/completions", []byte(`{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`)); code != 200 {
		t.Fatalf("recovered worker answered %d", code)
	}
}

func TestZeroWork(t *testing.T) {
	w, url := startWorker(t, Config{ZeroWork: true, TimeScale: 1, Overhead: time.Hour, ErrorRate: 1})
	var first []byte
	for _, c := range []struct {
		path string
		body []byte
	}{
		{"/v1/chat/completions", []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`)},
		{"/v1/chat/completions", []byte(`{"model": not json at all`)},
		{"/v1/completions", []byte(`{"model":"nope","prompt":"x","stream":true}`)},
		{"/v1/responses", nil},
	} {
		start := time.Now()
		code, b := post(t, url+c.path, c.body)
		if code != 200 || time.Since(start) > 5*time.Second {
			t.Fatalf("%s %q: %d after %v: %s", c.path, c.body, code, time.Since(start), b)
		}
		if first == nil {
			first = b
		} else if !bytes.Equal(b, first) {
			t.Fatalf("%s: answer differs:\n%s\n%s", c.path, b, first)
		}
	}
	m := decodeJSON(t, first)
	if m["object"] != "chat.completion" || m["model"] != "sim-model" || path(m, "choices", 0, "finish_reason") != "stop" ||
		num(path(m, "usage", "total_tokens")) != 32 || path(m, "usage", "prompt_tokens_details", "cached_tokens") == nil {
		t.Fatalf("fixed answer %s", first)
	}
	if n := len(first); n < 320 || n > 380 {
		t.Fatalf("fixed answer is %d bytes, want about 346", n)
	}
	if code, _ := get(t, http.MethodGet, url+"/health"); code != 200 {
		t.Fatalf("health %d", code)
	}
	if code, b := get(t, http.MethodGet, url+"/v1/models"); code != 200 || path(decodeJSON(t, b), "data", 0, "id") != "sim-model" {
		t.Fatalf("models %d %s", code, b)
	}
	if code, _ := get(t, http.MethodGet, url+"/v1/chat/completions"); code != 405 {
		t.Fatalf("GET inference: %d", code)
	}
	st := w.Stats()
	if st.Requests != 4 || st.PrefixQueries != 0 || st.PromptTokens != 0 || st.Successful != 0 {
		t.Fatalf("stats %+v: zero-work did more than count", st)
	}
}
