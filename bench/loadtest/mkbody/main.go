// Command mkbody writes the request bodies of the load test: realistic agentic
// chat bodies (reqview.SampleChatBodyOfSize: system prompt, tool schemas, user
// turns, tool calls, tool results with escaped JSON) of at least the given
// sizes, one file per size, named chat-<size>.json.
//
//	mkbody --out DIR --sizes 1024,16384,65536 --model sample-model --max-tokens 16 [--stream]
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
	sizes := flag.String("sizes", "1024,16384,65536", "body sizes in bytes (comma list)")
	model := flag.String("model", "sample-model", "model name in the bodies")
	maxTokens := flag.Int("max-tokens", 16, "max_tokens of each request (the response length)")
	stream := flag.Bool("stream", false, "ask for SSE streaming responses")
	flag.Parse()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fail(err)
	}
	for s := range strings.SplitSeq(*sizes, ",") {
		size, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			fail(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(reqview.SampleChatBodyOfSize(size), &m); err != nil {
			fail(err)
		}
		m["model"], _ = json.Marshal(*model)
		m["stream"], _ = json.Marshal(*stream)
		m["max_tokens"], _ = json.Marshal(*maxTokens)
		delete(m, "user") // the session comes from X-Session-ID
		b, err := json.Marshal(m)
		if err != nil {
			fail(err)
		}
		name := filepath.Join(*out, fmt.Sprintf("chat-%d.json", size))
		if err := os.WriteFile(name, b, 0o644); err != nil {
			fail(err)
		}
		fmt.Printf("%s %d\n", name, len(b))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mkbody:", err)
	os.Exit(1)
}
