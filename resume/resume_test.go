package resume

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func chunk(id, content string) string {
	c, _ := json.Marshal(content)
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":7,"model":"m","system_fingerprint":"fp-` + id +
		`","choices":[{"index":0,"delta":{"content":` + string(c) + `},"logprobs":null,"finish_reason":null}]}` + "\n\n"
}

func role(id string) string {
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n"
}

// TestChatAnswerSplicesIntoOne: the events of a continuation carry the
// first attempt's id, created and fingerprint; its role chunk goes; its
// usage counts the tokens delivered before; the continuation's request
// holds the text delivered (escapes kept), continues it, and asks for what
// is left of max_tokens.
func TestChatAnswerSplicesIntoOne(t *testing.T) {
	var a Answer
	a.Reset(Chat, 1<<10)
	for _, ev := range []string{role("a"), chunk("a", `He said "hi"`), chunk("a", " twice")} {
		a.Observe([]byte(ev))
	}
	if a.Why() != "" || a.Ended() {
		t.Fatalf("why %q, ended %v", a.Why(), a.Ended())
	}
	body, err := a.Body([]byte(`{"model":"m","max_tokens":10,"max_completion_tokens":null,"stream":true,"messages":[{"role":"user","content":"go"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		MaxTokens           int   `json:"max_tokens"`
		Continue            bool  `json:"continue_final_message"`
		AddGenerationPrompt *bool `json:"add_generation_prompt"`
		Messages            []struct{ Role, Content string }
	}
	if err := json.Unmarshal(body, &req); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	last := req.Messages[len(req.Messages)-1]
	if req.MaxTokens != 8 || !req.Continue || req.AddGenerationPrompt == nil || *req.AddGenerationPrompt ||
		last.Role != "assistant" || last.Content != `He said "hi" twice` || len(req.Messages) != 2 {
		t.Fatalf("continuation body %s", body)
	}
	a.Continue()
	var out []byte
	for _, ev := range []string{role("b"), chunk("b", " more"),
		`data: {"id":"b","object":"chat.completion.chunk","created":9,"model":"m","choices":[],"usage":{"prompt_tokens":14,"total_tokens":17,"completion_tokens":3}}` + "\n\n",
		"data: [DONE]\n\n"} {
		out = a.Rewrite(out, []byte(ev))
	}
	want := strings.Replace(chunk("a", " more"), `"created":7`, `"created":7`, 1) +
		`data: {"id":"a","object":"chat.completion.chunk","created":7,"model":"m","choices":[],"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5}}` + "\n\n" +
		"data: [DONE]\n\n"
	if string(out) != want {
		t.Fatalf("rewritten\n%s\nwant\n%s", out, want)
	}
	if !a.Ended() || a.ContinuationPromptTokens() != 14 {
		t.Fatalf("ended %v, continuation prompt tokens %d", a.Ended(), a.ContinuationPromptTokens())
	}
}

// TestWhatCannotBeContinued: what the events delivered, or the request
// asked for, makes an answer one no continuation reproduces.
func TestWhatCannotBeContinued(t *testing.T) {
	events := map[string]string{
		"tool call": `data: {"id":"a","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]},"finish_reason":null}]}` + "\n\n",
		"reasoning": `data: {"id":"a","choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}` + "\n\n",
		"logprobs":  `data: {"id":"a","choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[]},"finish_reason":null}]}` + "\n\n",
		"choice 1":  `data: {"id":"a","choices":[{"index":1,"delta":{"content":"x"},"finish_reason":null}]}` + "\n\n",
		"finish":    `data: {"id":"a","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n",
		"not JSON":  "data: {oops\n\n",
		"too long":  chunk("a", strings.Repeat("x", 100)),
	}
	for name, ev := range events {
		var a Answer
		a.Reset(Chat, 64)
		a.Observe([]byte(ev))
		if a.Why() == "" {
			t.Errorf("%s: continuable", name)
		}
	}
	bodies := map[string]string{
		"n":               `{"n":3,"messages":[{"role":"user","content":"x"}]}`,
		"logprobs":        `{"logprobs":true,"messages":[{"role":"user","content":"x"}]}`,
		"guided":          `{"guided_json":{},"messages":[{"role":"user","content":"x"}]}`,
		"response_format": `{"response_format":{"type":"json_schema"},"messages":[{"role":"user","content":"x"}]}`,
		"max reached":     `{"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`,
		"no messages":     `{"messages":[]}`,
	}
	for name, body := range bodies {
		var a Answer
		a.Reset(Chat, 64)
		a.Observe([]byte(chunk("a", "y")))
		if _, err := a.Body([]byte(body)); !Not(err) {
			t.Errorf("%s: %v", name, err)
		}
	}
	var c Answer
	c.Reset(Completions, 64)
	if _, err := c.Body([]byte(`{"prompt":[1,2,3]}`)); !Not(err) {
		t.Errorf("token-id prompt: %v", err)
	}
}

// TestCompletionsPromptGoesOn: a completions continuation's prompt is the
// prompt followed by the text delivered.
func TestCompletionsPromptGoesOn(t *testing.T) {
	for _, prompt := range []string{`"Say: "`, `["Say: "]`} {
		var a Answer
		a.Reset(Completions, 64)
		a.Observe([]byte(`data: {"id":"a","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a\nb","logprobs":null,"finish_reason":null}]}` + "\n\n"))
		body, err := a.Body([]byte(`{"model":"m","prompt":` + prompt + `,"stream":true}`))
		if err != nil || !strings.Contains(string(body), `"Say: a\nb"`) {
			t.Fatalf("%s: %s %v", prompt, body, err)
		}
	}
}

// TestMessagesBlocksGoOn: an Anthropic continuation's message_start goes,
// the start of the block that continues the open one goes, the indices of
// later blocks go on from the client's, and the output tokens add up.
func TestMessagesBlocksGoOn(t *testing.T) {
	ev := func(typ, data string) string { return "event: " + typ + "\ndata: " + data + "\n\n" }
	var a Answer
	a.Reset(Messages, 1<<10)
	for _, e := range []string{
		ev("message_start", `{"type":"message_start","message":{"id":"msg_a","usage":{"input_tokens":20,"output_tokens":1}}}`),
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`),
	} {
		a.Observe([]byte(e))
	}
	body, err := a.Body([]byte(`{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":"So: "}]}`))
	if err != nil || !strings.Contains(string(body), `{"role":"assistant","content":"So: Hi"}`) || !strings.Contains(string(body), `"max_tokens":8`) {
		t.Fatalf("%s %v", body, err)
	}
	a.Continue()
	var out []byte
	for _, e := range []string{
		ev("message_start", `{"type":"message_start","message":{"id":"msg_b","usage":{"input_tokens":21,"output_tokens":1}}}`),
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`),
		ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there"}}`),
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`),
		ev("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`),
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":2}}`),
		ev("message_stop", `{"type":"message_stop"}`),
	} {
		out = a.Rewrite(out, []byte(e))
	}
	want := ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there"}}`) +
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`) +
		ev("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`) +
		ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":3}}`) +
		ev("message_stop", `{"type":"message_stop"}`)
	if string(out) != want || !a.Ended() {
		t.Fatalf("rewritten\n%s\nwant\n%s", out, want)
	}
}

// TestObserveAllocatesNothing: following a stream with no fault costs no
// allocation per event.
func TestObserveAllocatesNothing(t *testing.T) {
	var a Answer
	a.Reset(Chat, 1<<20)
	ev := []byte(chunk("a", " token"))
	a.Observe(ev)
	if n := testing.AllocsPerRun(1000, func() { a.Observe(ev) }); n > 0.01 {
		t.Fatalf("%.2f allocations per event", n)
	}
}

// FuzzRewrite: any event, first or continued, is followed and rewritten
// without panicking, and a rewritten event is whole (ends as it came).
func FuzzRewrite(f *testing.F) {
	f.Add(chunk("a", "x"), true)
	f.Add("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":3,\"delta\":{\"text\":\"x\"}}\n\n", false)
	f.Add(`data: {"choices":[{"delta":{"role":"assistant"}}],"usage":{"prompt_tokens":1}}`+"\n\n", true)
	f.Fuzz(func(t *testing.T, ev string, chat bool) {
		api := Messages
		if chat {
			api = Chat
		}
		var a Answer
		a.Reset(api, 1<<10)
		a.Observe([]byte(ev))
		_, _ = a.Body([]byte(`{"max_tokens":100,"messages":[{"role":"user","content":"x"}],"prompt":"p"}`))
		a.Continue()
		out := a.Rewrite(nil, []byte(ev))
		if len(out) > 0 && strings.HasSuffix(ev, "\n\n") && !strings.HasSuffix(string(out), "\n\n") {
			t.Fatalf("%q rewritten as %q", ev, out)
		}
	})
}

// TestCutBeforeTheFirstEvent: when the first attempt was cut before its
// first event reached the client, the continuation's role (message_start)
// and values are the client's first: kept, and carried on.
func TestCutBeforeTheFirstEvent(t *testing.T) {
	var a Answer
	a.Reset(Chat, 1<<10)
	a.Continue()
	var out []byte
	for _, ev := range []string{role("b"), chunk("b", "x")} {
		out = a.Rewrite(out, []byte(ev))
	}
	if string(out) != role("b")+chunk("b", "x") {
		t.Fatalf("first continuation\n%s", out)
	}
	a.Continue()
	out = out[:0]
	for _, ev := range []string{role("c"), chunk("c", "y")} {
		out = a.Rewrite(out, []byte(ev))
	}
	if string(out) != chunk("b", "y") {
		t.Fatalf("second continuation\n%s\nwant\n%s", out, chunk("b", "y"))
	}
	var m Answer
	m.Reset(Messages, 1<<10)
	m.Continue()
	start := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_b\",\"usage\":{\"input_tokens\":3}}}\n\n"
	if out := m.Rewrite(nil, []byte(start)); string(out) != start {
		t.Fatalf("message_start of the first continuation: %q", out)
	}
}

// TestContinuationKeepsCachedTokens: the whole answer's usage keeps the
// cached prompt tokens the continuation reported, at most the prompt it
// reports.
func TestContinuationKeepsCachedTokens(t *testing.T) {
	for _, c := range []struct{ reported, want int }{{9, 9}, {13, 12}} {
		var a Answer
		a.Reset(Chat, 1<<10)
		for _, ev := range []string{role("a"), chunk("a", "one"), chunk("a", " two")} {
			a.Observe([]byte(ev))
		}
		a.Continue()
		usage := fmt.Sprintf(`{"prompt_tokens":14,"total_tokens":17,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":%d}}`, c.reported)
		out := a.Rewrite(nil, []byte(`data: {"id":"b","object":"chat.completion.chunk","created":9,"model":"m","choices":[],"usage":`+usage+"}\n\n"))
		want := fmt.Sprintf(`"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":%d}}}`, c.want)
		if !strings.Contains(string(out), want) {
			t.Fatalf("cached %d: rewritten %s, want %s", c.reported, out, want)
		}
	}
}
