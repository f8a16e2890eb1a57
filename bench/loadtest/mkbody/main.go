// Command mkbody writes the request bodies of the load test: realistic agentic
// chat bodies (reqview.SampleChatBodyOfSize: system prompt, tool schemas, user
// turns, tool calls, tool results with escaped JSON) of at least the given
// sizes, one file per size, named chat-<size>.json.
//
// --kinds writes bodies of other kinds, one file per kind, named
// chat-<kind>.json: esc16k is a coding agent's conversation of exactly
// 16 KB, dense with escapes (quotes, tabs, newlines, backslashes, non-ASCII
// raw and as \uXXXX), with the system prompt and tools of the 16 KB sample
// body (see withEscapeDense).
//
// With --variants K (K > 1) it also writes chat-<size>.jsonl (and
// chat-<kind>.jsonl): K bodies of the same size, one per line, that differ
// in their tools (the first tool's description) and in their conversation
// from the first user message on (a tag in front of it); the system prompt
// is shared, as in an agent fleet running one application. chat.lua sends
// session s the body s mod K, so a session keeps its body and the bodies in
// flight carry different tools.
//
//	mkbody --out DIR --sizes 1024,16384,65536 [--kinds esc16k] --model sample-model --max-tokens 16 [--stream] [--variants K]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/warmroute/warmroute/reqview"
)

func main() {
	out := flag.String("out", ".", "output directory")
	sizes := flag.String("sizes", "1024,16384,65536", "body sizes in bytes (comma list; may be empty)")
	kinds := flag.String("kinds", "", "body kinds (comma list): esc16k, a 16 KB coding agent's body dense with escapes")
	model := flag.String("model", "sample-model", "model name in the bodies")
	maxTokens := flag.Int("max-tokens", 16, "max_tokens of each request (the response length)")
	stream := flag.Bool("stream", false, "ask for SSE streaming responses")
	variants := flag.Int("variants", 1, "also write chat-<size>.jsonl with this many bodies differing in tools and conversation")
	flag.Parse()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	sample := func(size int) map[string]json.RawMessage {
		return sampleBody(size, *model, *stream, *maxTokens)
	}
	for s := range strings.SplitSeq(*sizes, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		size, err := strconv.Atoi(s)
		if err != nil {
			fail(err)
		}
		writeBodies(*out, s, sample(size), *variants)
	}
	for k := range strings.SplitSeq(*kinds, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		size, ok := escapeKinds[k]
		if !ok {
			fail(fmt.Errorf("unknown body kind %q (known: esc16k)", k))
		}
		m, err := withEscapeDense(sample(size), size)
		if err != nil {
			fail(err)
		}
		writeBodies(*out, k, m, *variants)
	}
}

// sampleBody returns reqview's sample chat body of at least size bytes as
// its members, with the given model, stream and max_tokens and no "user"
// (the session comes from X-Session-ID).
func sampleBody(size int, model string, stream bool, maxTokens int) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(reqview.SampleChatBodyOfSize(size), &m); err != nil {
		fail(err)
	}
	m["model"], _ = json.Marshal(model)
	m["stream"], _ = json.Marshal(stream)
	m["max_tokens"], _ = json.Marshal(maxTokens)
	delete(m, "user")
	return m
}

// writeBodies writes body m as DIR/chat-<name>.json and, with variants > 1,
// its variants as DIR/chat-<name>.jsonl.
func writeBodies(dir, name string, m map[string]json.RawMessage, variants int) {
	b, err := json.Marshal(m)
	if err != nil {
		fail(err)
	}
	write(filepath.Join(dir, "chat-"+name+".json"), b)
	if variants > 1 {
		var lines []byte
		for v := range variants {
			lines = append(append(lines, variant(m, v)...), '\n')
		}
		write(filepath.Join(dir, "chat-"+name+".jsonl"), lines)
	}
}

// variant returns body m as variant v: v's tag in the first tool's
// description and in front of the first user message, at a fixed width so
// that every variant has the same size. The other messages keep their bytes
// (their escapes as they were written).
func variant(m map[string]json.RawMessage, v int) []byte {
	var tools []map[string]any
	var msgs []json.RawMessage
	if json.Unmarshal(m["tools"], &tools) != nil || json.Unmarshal(m["messages"], &msgs) != nil || len(tools) == 0 {
		fail(fmt.Errorf("variant: the sample body has no tools or messages"))
	}
	tag := fmt.Sprintf("[agent %06d] ", v)
	fn := tools[0]["function"].(map[string]any)
	fn["description"] = tag + fn["description"].(string)
	for i, raw := range msgs {
		var msg map[string]any
		if json.Unmarshal(raw, &msg) != nil || msg["role"] != "user" {
			continue
		}
		msg["content"] = tag + msg["content"].(string)
		msgs[i], _ = json.Marshal(msg)
		break
	}
	c := make(map[string]json.RawMessage, len(m))
	for k, raw := range m {
		c[k] = raw
	}
	c["tools"], _ = json.Marshal(tools)
	c["messages"], _ = json.Marshal(msgs)
	b, err := json.Marshal(c)
	if err != nil {
		fail(err)
	}
	return b
}

func write(name string, b []byte) {
	if err := os.WriteFile(name, b, 0o644); err != nil {
		fail(err)
	}
	fmt.Printf("%s %d\n", name, len(b))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mkbody:", err)
	os.Exit(1)
}
