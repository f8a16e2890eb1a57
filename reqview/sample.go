package reqview

import (
	"encoding/json"
	"strconv"
)

// This file generates realistic, deterministic request bodies for tests and
// benchmarks (here and in other packages). Not for the hot path.

var sampleWords = []string{
	"the", "router", "keeps", "sessions", "warm", "on", "one", "worker", "so", "that",
	"prefix", "cache", "hits", "stay", "high", "while", "load", "is", "balanced", "across",
	"a", "fleet", "of", "GPUs", "serving", "models", "with", "long", "system", "prompts",
	"tool", "calls", "and", "results", "\"quoted\"", "path\\to\\file", "naïve", "café", "日本語", "emoji🙂",
}

// sampleText returns n bytes (about) of deterministic prose for seed.
func sampleText(seed, n int) string {
	x := uint64(seed)*0x9E3779B97F4A7C15 + 1
	b := make([]byte, 0, n+16)
	for len(b) < n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		if len(b) > 0 {
			b = append(b, ' ')
		}
		b = append(b, sampleWords[x%uint64(len(sampleWords))]...)
	}
	return string(b)
}

type sampleFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	Arguments   *string         `json:"arguments,omitempty"`
}

type sampleTool struct {
	Type     string         `json:"type"`
	Function sampleFunction `json:"function"`
}

type sampleToolCall struct {
	ID       string         `json:"id"`
	Type     string         `json:"type"`
	Function sampleFunction `json:"function"`
}

type sampleMessage struct {
	Role       string           `json:"role"`
	Content    any              `json:"content"`
	ToolCalls  []sampleToolCall `json:"tool_calls,omitempty"`
	ToolCallID string           `json:"tool_call_id,omitempty"`
}

type sampleChat struct {
	Model    string          `json:"model"`
	Messages []sampleMessage `json:"messages"`
	Tools    []sampleTool    `json:"tools,omitempty"`
	Stream   bool            `json:"stream"`
	User     string          `json:"user,omitempty"`
}

// sampleChatMessages returns the messages of a deterministic agentic chat
// conversation: a system prompt of about sysBytes bytes, then turns user
// turns; every turn but the last is answered by an assistant tool call, a tool
// result (JSON, so its text is full of escaped quotes) and an assistant reply.
// The messages for turns+1 extend those for turns.
func sampleChatMessages(turns, sysBytes int) []sampleMessage {
	msgs := []sampleMessage{{Role: "system", Content: sampleText(-1, sysBytes)}}
	for k := 0; k < turns; k++ {
		msgs = append(msgs, sampleMessage{Role: "user", Content: sampleText(4*k, 160+(k*37)%240)})
		if k == turns-1 {
			break
		}
		id := "call_" + strconv.Itoa(1000+k)
		args := string(mustJSON(map[string]any{"query": sampleText(4*k+1, 40), "limit": k % 10}))
		result := mustJSON(map[string]any{
			"status": "ok",
			"items": []map[string]any{
				{"id": k, "title": sampleText(4*k+2, 30), "body": sampleText(4*k+3, 200)},
				{"id": k + 1, "title": sampleText(4*k+5, 30), "score": 0.5},
			},
		})
		msgs = append(msgs,
			sampleMessage{Role: "assistant", Content: nil, ToolCalls: []sampleToolCall{{
				ID: id, Type: "function", Function: sampleFunction{Name: "search", Arguments: &args},
			}}},
			sampleMessage{Role: "tool", ToolCallID: id, Content: string(result)},
			sampleMessage{Role: "assistant", Content: sampleText(4*k+3, 300+(k*53)%400)},
		)
	}
	return msgs
}

func sampleTools() []sampleTool {
	params := json.RawMessage(`{"type":"object","properties":{"query":{"type":"string","description":"what to look for"},"limit":{"type":"integer","minimum":1,"maximum":50}},"required":["query"]}`)
	return []sampleTool{
		{Type: "function", Function: sampleFunction{Name: "search", Description: "Search the knowledge base.", Parameters: params}},
		{Type: "function", Function: sampleFunction{Name: "fetch_url", Description: "Fetch a web page and return its text.", Parameters: json.RawMessage(`{"type":"object","properties":{"url":{"type":"string"}},"required":["url"]}`)}},
		{Type: "function", Function: sampleFunction{Name: "run_python", Description: "Run a Python snippet in a sandbox.", Parameters: json.RawMessage(`{"type":"object","properties":{"code":{"type":"string"},"timeout":{"type":"number"}},"required":["code"]}`)}},
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// SampleChatBody returns a deterministic /v1/chat/completions body: model
// "sample-model", streaming, a system prompt of about sysBytes bytes, three
// tool schemas, and turns user turns (see the message layout above: the last
// message is a user message; the body for turns+1 extends the messages of the
// body for turns). Text includes escaped quotes, backslashes and non-ASCII.
func SampleChatBody(turns, sysBytes int) []byte {
	return mustJSON(sampleChat{
		Model:    "sample-model",
		Messages: sampleChatMessages(turns, sysBytes),
		Tools:    sampleTools(),
		Stream:   true,
		User:     "user-42",
	})
}

// SampleChatBodyOfSize returns the smallest SampleChatBody, with a system
// prompt of min(6 KB, size/8) bytes, whose length is at least size bytes.
func SampleChatBodyOfSize(size int) []byte {
	sys := min(6<<10, size/8)
	lo, hi := 1, 1
	for len(SampleChatBody(hi, sys)) < size {
		lo, hi = hi, hi*2
	}
	for lo < hi {
		mid := (lo + hi) / 2
		if len(SampleChatBody(mid, sys)) < size {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return SampleChatBody(lo, sys)
}
