package simworker

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

var anthropicTools = []any{
	msg{"name": "web_search", "input_schema": msg{"type": "object"}},
	msg{"name": "get_weather", "description": "weather", "input_schema": msg{"type": "object", "properties": msg{"city": msg{"type": "string"}}}},
}

// messagesPromptTokens returns the tokens of req's prompt at the default 4
// bytes a token.
func messagesPromptTokens(t *testing.T, req msg) int { return (messagesPromptBytes(t, req) + 3) / 4 }

// fullBlockTokens returns the tokens in the full 64-byte blocks (the
// default 16 tokens of 4 bytes) of req's prompt: what a later request
// extending it finds cached.
func fullBlockTokens(t *testing.T, req msg) int { return messagesPromptBytes(t, req) / 64 * 16 }

// messagesPromptBytes renders req as the worker does and returns its length.
func messagesPromptBytes(t *testing.T, req msg) int {
	t.Helper()
	raw, _ := json.Marshal(req)
	var r messagesRequest
	if err := api.Unmarshal(raw, &r); err != nil {
		t.Fatal(err)
	}
	tools := make([]toolDef, len(r.Tools))
	for i, tl := range r.Tools {
		tools[i] = toolDef{Name: tl.Name, Description: tl.Description, Parameters: tl.InputSchema}
	}
	sortTools(tools)
	p, _, _, bad := renderMessages(tools, r.System, r.Messages)
	if bad != "" {
		t.Fatal(bad)
	}
	return len(p)
}

// checkAnthropicUsage checks that input + cache_read + cache_creation is
// the rendered prompt and that cache_read is cached.
func checkAnthropicUsage(t *testing.T, u any, req msg, cached, output int) {
	t.Helper()
	in, read, create, out := num(path(u, "input_tokens")), num(path(u, "cache_read_input_tokens")), num(path(u, "cache_creation_input_tokens")), num(path(u, "output_tokens"))
	if want := messagesPromptTokens(t, req); in+read+create != want || read != cached || create != 0 || out != output {
		t.Fatalf("usage %v: want prompt %d (cached %d), output %d", u, want, cached, output)
	}
}

func TestMessagesNonStreamed(t *testing.T) {
	_, url := startWorker(t, Config{})
	req := msg{"model": "sim-model", "max_tokens": 5, "system": "Be brief.", "metadata": msg{"user_id": "u1"},
		"messages": []any{msg{"role": "user", "content": []any{msg{"type": "text", "text": "hi"}, msg{"type": "image", "source": msg{"type": "base64"}}}}}}
	code, b := post(t, url+"/v1/messages", req)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	m := decodeJSON(t, b)
	if id, _ := m["id"].(string); !strings.HasPrefix(id, "msg_") || m["type"] != "message" || m["role"] != "assistant" || m["model"] != "sim-model" {
		t.Fatalf("envelope: %s", b)
	}
	if _, ok := m["stop_sequence"]; !ok || m["stop_sequence"] != nil || m["stop_reason"] != "max_tokens" {
		t.Fatalf("stop: %s", b)
	}
	if path(m, "content", 0, "type") != "text" || path(m, "content", 0, "text") != fillerText(5) || path(m, "content", 1) != nil {
		t.Fatalf("content: %s", b)
	}
	checkAnthropicUsage(t, m["usage"], req, 0, 5)

	// A limit at or above the natural length ends the turn there.
	req["max_tokens"] = 32000
	code, b = post(t, url+"/v1/messages", req)
	m = decodeJSON(t, b)
	if code != 200 || m["stop_reason"] != "end_turn" || num(path(m, "usage", "output_tokens")) != 64 {
		t.Fatalf("natural end: %d %s", code, b)
	}
}

func TestMessagesErrors(t *testing.T) {
	_, url := startWorker(t, Config{})
	check := func(name string, code int, b []byte, status int, typ string) {
		t.Helper()
		m := decodeJSON(t, b)
		if code != status || m["type"] != "error" || path(m, "error", "type") != typ || path(m, "error", "message") == "" {
			t.Fatalf("%s: %d %s, want %d %s", name, code, b, status, typ)
		}
	}
	ok := msg{"model": "sim-model", "max_tokens": 4, "messages": []any{user("hi")}}
	code, b := post(t, url+"/v1/messages", msg{"model": "nope", "max_tokens": 4, "messages": []any{user("hi")}})
	check("unknown model", code, b, 404, "not_found_error")
	code, b = post(t, url+"/v1/messages", []byte(`{"model":`))
	check("malformed", code, b, 400, "invalid_request_error")
	code, b = post(t, url+"/v1/messages", msg{"model": "sim-model", "messages": []any{user("hi")}})
	check("no max_tokens", code, b, 400, "invalid_request_error")
	code, b = post(t, url+"/v1/messages", msg{"model": "sim-model", "max_tokens": 4, "messages": []any{}})
	check("no messages", code, b, 400, "invalid_request_error")
	code, b = post(t, url+"/v1/messages", msg{"model": "sim-model", "max_tokens": 4, "messages": []any{msg{"role": "system", "content": "x"}}})
	check("bad role", code, b, 400, "invalid_request_error")
	code, b = post(t, url+"/v1/messages", msg{"model": "sim-model", "max_tokens": 4, "messages": []any{msg{"role": "user", "content": 3}}})
	check("bad content", code, b, 400, "invalid_request_error")
	code, b = post(t, url+"/v1/messages", ok, FaultHeader, "error")
	check("error fault", code, b, 500, "api_error")
	code, b = post(t, url+"/v1/messages", ok, FaultHeader, "unavailable")
	check("unavailable fault", code, b, 503, "overloaded_error")
	code, b = get(t, http.MethodGet, url+"/v1/messages")
	check("GET", code, b, 405, "invalid_request_error")
	// Other routes keep the OpenAI shape.
	code, b = post(t, url+"/v1/chat/completions", msg{"model": "nope", "messages": []any{user("hi")}})
	if code != 404 || path(decodeJSON(t, b), "error", "code") != "model_not_found" {
		t.Fatalf("chat error shape: %d %s", code, b)
	}
}

// messagesStream posts req with stream true and returns its events, each
// checked to name its own data type.
func messagesStream(t *testing.T, url string, req msg, hdr ...string) ([]sseEvent, []map[string]any, error) {
	t.Helper()
	req["stream"] = true
	resp, err := send(url+"/v1/messages", req, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("stream: %d %q", resp.StatusCode, ct)
	}
	evs, rerr := readSSE(resp, time.Now())
	data := make([]map[string]any, len(evs))
	for i, e := range evs {
		data[i] = decodeJSON(t, []byte(e.data))
		if data[i]["type"] != e.event {
			t.Fatalf("event %d: name %q, data type %v", i, e.event, data[i]["type"])
		}
	}
	return evs, data, rerr
}

// eventNames lists the event names of evs, runs of content_block_delta as one.
func eventNames(evs []sseEvent) string {
	var names []string
	for _, e := range evs {
		if e.event == "content_block_delta" && len(names) > 0 && names[len(names)-1] == "delta*" {
			continue
		}
		n := e.event
		if n == "content_block_delta" {
			n = "delta*"
		}
		names = append(names, n)
	}
	return strings.Join(names, ",")
}

func TestMessagesStreaming(t *testing.T) {
	_, url := startWorker(t, Config{})
	req := msg{"model": "sim-model", "max_tokens": 7, "system": []any{msg{"type": "text", "text": strings.Repeat("Stay on topic. ", 20)}},
		"messages": []any{user("Tell me a story.")}}
	evs, data, err := messagesStream(t, url, req)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := eventNames(evs), "message_start,content_block_start,ping,delta*,content_block_stop,message_delta,message_stop"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	start := data[0]["message"]
	if path(start, "role") != "assistant" || path(start, "stop_reason") != nil || len(path(start, "content").([]any)) != 0 {
		t.Fatalf("message_start: %s", evs[0].data)
	}
	checkAnthropicUsage(t, path(start, "usage"), req, 0, 1)
	if path(data[1], "content_block", "type") != "text" || path(data[1], "index") != 0.0 {
		t.Fatalf("content_block_start: %s", evs[1].data)
	}
	var text strings.Builder
	deltas := 0
	for i, e := range evs {
		if e.event == "content_block_delta" {
			deltas++
			if path(data[i], "delta", "type") != "text_delta" {
				t.Fatalf("delta: %s", e.data)
			}
			text.WriteString(path(data[i], "delta", "text").(string))
		}
	}
	if deltas != 7 || text.String() != fillerText(7) {
		t.Fatalf("%d deltas %q", deltas, text.String())
	}
	md := data[len(data)-2]
	if path(md, "delta", "stop_reason") != "max_tokens" {
		t.Fatalf("message_delta: %v", md)
	}
	checkAnthropicUsage(t, md["usage"], req, 0, 7)

	// Same prompt again: its full blocks are cached, in message_start too.
	_, data, err = messagesStream(t, url, req)
	if err != nil {
		t.Fatal(err)
	}
	cached := fullBlockTokens(t, req)
	checkAnthropicUsage(t, path(data[0], "message", "usage"), req, cached, 1)

	// A drop fault cuts the stream after the first step's events.
	evs, _, err = messagesStream(t, url, req, FaultHeader, "drop")
	if err == nil || len(evs) == 0 || evs[0].event != "message_start" || evs[len(evs)-1].event == "message_stop" {
		t.Fatalf("drop: err %v, events %s", err, eventNames(evs))
	}
}

func TestMessagesTurnTwoHitsCache(t *testing.T) {
	_, url := startWorker(t, Config{})
	system := strings.Repeat("You are a careful assistant. ", 30)
	turn1 := msg{"model": "sim-model", "max_tokens": 8, "system": system, "messages": []any{user("Summarise the plot of Hamlet.")}}
	code, b := post(t, url+"/v1/messages", turn1)
	if code != 200 {
		t.Fatalf("turn 1: %d %s", code, b)
	}
	m := decodeJSON(t, b)
	checkAnthropicUsage(t, m["usage"], turn1, 0, 8)
	turn2 := msg{"model": "sim-model", "max_tokens": 8, "system": system, "messages": []any{
		user("Summarise the plot of Hamlet."),
		msg{"role": "assistant", "content": m["content"]},
		user("And Macbeth?"),
	}}
	code, b = post(t, url+"/v1/messages", turn2)
	if code != 200 {
		t.Fatalf("turn 2: %d %s", code, b)
	}
	want := fullBlockTokens(t, turn1)
	if want == 0 {
		t.Fatal("turn 1 too short to fill a block")
	}
	checkAnthropicUsage(t, decodeJSON(t, b)["usage"], turn2, want, 8)
}

func TestMessagesToolUse(t *testing.T) {
	_, url := startWorker(t, Config{StrictToolIDs: true})
	turn1 := msg{"model": "sim-model", "max_tokens": 100, "tools": anthropicTools, "tool_choice": msg{"type": "auto"},
		"system": strings.Repeat("Use tools. ", 20), "messages": []any{user("Weather in Paris?")}}
	code, b := post(t, url+"/v1/messages", turn1)
	if code != 200 {
		t.Fatalf("turn 1: %d %s", code, b)
	}
	m := decodeJSON(t, b)
	use, _ := path(m, "content", 0).(map[string]any)
	id, _ := use["id"].(string)
	if m["stop_reason"] != "tool_use" || use["type"] != "tool_use" || use["name"] != "get_weather" || !strings.HasPrefix(id, "toolu_sim-model_") {
		t.Fatalf("turn 1: %s", b)
	}
	if in, ok := use["input"].(map[string]any); !ok || len(in) != 0 {
		t.Fatalf("input: %s", b)
	}
	checkAnthropicUsage(t, m["usage"], turn1, 0, num(path(m, "usage", "output_tokens")))

	// tool_choice none and a forced tool.
	none := msg{"model": "sim-model", "max_tokens": 3, "tools": anthropicTools, "tool_choice": msg{"type": "none"}, "messages": []any{user("x")}}
	if code, b := post(t, url+"/v1/messages", none); code != 200 || path(decodeJSON(t, b), "content", 0, "type") != "text" {
		t.Fatalf("tool_choice none: %d %s", code, b)
	}
	forced := msg{"model": "sim-model", "max_tokens": 3, "tools": anthropicTools, "tool_choice": msg{"type": "tool", "name": "web_search"}, "messages": []any{user("x")}}
	if code, b := post(t, url+"/v1/messages", forced); code != 200 || path(decodeJSON(t, b), "content", 0, "name") != "web_search" {
		t.Fatalf("forced tool: %d %s", code, b)
	}

	result := func(id string) msg {
		return msg{"model": "sim-model", "max_tokens": 100, "tools": anthropicTools, "system": turn1["system"], "messages": []any{
			user("Weather in Paris?"),
			msg{"role": "assistant", "content": m["content"]},
			msg{"role": "user", "content": []any{msg{"type": "tool_result", "tool_use_id": id, "content": "sunny, 21C"}}},
		}}
	}
	turn2 := result(id)
	code, b = post(t, url+"/v1/messages", turn2)
	if code != 200 {
		t.Fatalf("turn 2: %d %s", code, b)
	}
	m2 := decodeJSON(t, b)
	if m2["stop_reason"] != "end_turn" || path(m2, "content", 0, "type") != "text" {
		t.Fatalf("turn 2 after a tool result should answer text: %s", b)
	}
	checkAnthropicUsage(t, m2["usage"], turn2, fullBlockTokens(t, turn1), 64)

	// An id this worker did not issue for the model: 400, Anthropic shape.
	code, b = post(t, url+"/v1/messages", result("toolu_other_1"))
	if e := decodeJSON(t, b); code != 400 || e["type"] != "error" || path(e, "error", "type") != "invalid_request_error" {
		t.Fatalf("foreign id: %d %s", code, b)
	}

	// Streamed tool use: a tool_use block start, then its input as JSON.
	evs, data, err := messagesStream(t, url, turn1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := eventNames(evs), "message_start,content_block_start,ping,delta*,content_block_stop,message_delta,message_stop"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	cb := path(data[1], "content_block")
	if path(cb, "type") != "tool_use" || path(cb, "name") != "get_weather" || !strings.HasPrefix(path(cb, "id").(string), "toolu_sim-model_") {
		t.Fatalf("content_block_start: %s", evs[1].data)
	}
	if path(data[3], "delta", "type") != "input_json_delta" || path(data[3], "delta", "partial_json") != "{}" {
		t.Fatalf("delta: %s", evs[3].data)
	}
	if path(data[len(data)-2], "delta", "stop_reason") != "tool_use" {
		t.Fatalf("message_delta: %s", evs[len(evs)-2].data)
	}
}

func TestMessagesStreamingTiming(t *testing.T) {
	// 20 tokens (max_tokens above the natural length), one per 10 ms engine
	// step at TimeScale 0.5: 5 ms each, streamed as produced.
	_, url := startWorker(t, Config{TimeScale: 0.5, MaxTokens: 20, StepBase: 10 * time.Millisecond, DecodePerSeq: -1})
	evs, data, err := messagesStream(t, url, msg{"model": "sim-model", "max_tokens": 4096, "messages": []any{user("hi")}})
	if err != nil {
		t.Fatal(err)
	}
	first, last := evs[0].at, evs[len(evs)-1].at
	// 19 steps after the first token take 95 ms nominally; the engine's
	// step clock may run a little short of it, so ask for 15 steps: a
	// reply sent all at once takes well under one.
	if last-first < 15*5*time.Millisecond || first > last/2 {
		t.Fatalf("message_start at %v, message_stop at %v: want >= 75ms apart, streamed", first, last)
	}
	if md := data[len(data)-2]; path(md, "delta", "stop_reason") != "end_turn" || num(path(md, "usage", "output_tokens")) != 20 {
		t.Fatalf("message_delta: %v", md)
	}
}

func TestRenderMessages(t *testing.T) {
	u := []anthropicMessage{{Role: "user", Content: "hi"}}
	for _, sys := range []any{nil, "", []any{}, []any{msg{"type": "text", "text": ""}}} {
		if p, _, _, bad := renderMessages(nil, sys, u); bad != "" || string(p) != "<|user|>hi\n<|assistant|>" {
			t.Fatalf("system %#v: %q %q", sys, p, bad)
		}
	}
	p1, user1, _, _ := renderMessages(nil, []any{msg{"type": "text", "text": "S"}}, u)
	if string(p1) != "<|system|>S\n<|user|>hi\n<|assistant|>" || !user1 {
		t.Fatalf("%q %v", p1, user1)
	}
	turn2 := append(u, anthropicMessage{Role: "assistant", Content: []any{
		msg{"type": "thinking", "thinking": "hmm", "signature": "x"},
		msg{"type": "tool_use", "id": "toolu_1", "name": "f", "input": msg{"a": 1.0}}}},
		anthropicMessage{Role: "user", Content: []any{msg{"type": "tool_result", "tool_use_id": "toolu_1", "content": []any{msg{"type": "text", "text": "r"}}}}})
	p2, user2, _, _ := renderMessages(nil, "S", turn2)
	if want := string(p1) + "<|tool_call|>f {\"a\":1}\n<|user|><|tool_result|>r\n<|assistant|>"; string(p2) != want || user2 {
		t.Fatalf("turn 2 %q (user turn %v), want %q", p2, user2, want)
	}
}
