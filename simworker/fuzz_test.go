package simworker

import (
	"bytes"
	"testing"
)

func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{"", "error", "drop,slow=10", "slow=", "timeout, unavailable", "slow=1e9", "cut=3", "reset=0,drop", "truncate=1,stall=2", "stall=-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if fl, err := parseFaults([]byte(s)); err == nil && (fl.slow < 0 || fl.stream.after < 0) {
			t.Fatalf("negative slow or chunk count from %q", s)
		}
	})
}

func FuzzParseWindows(f *testing.F) {
	for _, s := range []string{"", "1s-2s", "1s-2s,3m-4m", "-", "1s-", "2s-1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ws, err := ParseWindows(s)
		if err != nil {
			return
		}
		for _, w := range ws {
			if w.End <= w.Start {
				t.Fatalf("%q gave empty window %v", s, w)
			}
		}
	})
}

// FuzzRenderPrefix checks the prefix property: appending turns to a
// conversation never changes the rendering of the earlier turns.
func FuzzRenderPrefix(f *testing.F) {
	f.Add("sys", "hello", "tool_a", `{"x":1}`, "result", "next")
	f.Add("", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, system, user1, tool, args, result, user2 string) {
		tools := []toolDef{{Type: "function", Name: tool}}
		turn1 := []chatMessage{{Role: "system", Content: system}, {Role: "user", Content: user1}}
		call := chatToolCall{ID: "call_m_1", Type: "function"}
		call.Function.Name, call.Function.Arguments = tool, args
		turn2 := append(append([]chatMessage{}, turn1...),
			chatMessage{Role: "assistant", ToolCalls: []chatToolCall{call}},
			chatMessage{Role: "tool", ToolCallID: "call_m_1", Content: result},
			chatMessage{Role: "user", Content: []any{map[string]any{"type": "text", "text": user2}}})
		p1 := renderChat(nil, tools, turn1)
		p2 := renderChat(nil, tools, turn2)
		if !bytes.HasPrefix(p2, p1) {
			t.Fatalf("turn 2 does not extend turn 1:\n%q\n%q", p1, p2)
		}
	})
}

// FuzzContinuation checks what stream continuation rests on: a completions
// prompt extended by m tokens of its answer is answered m tokens further
// on; a chat conversation with its answer's text as an open final
// assistant message renders as the prompt plus that text.
func FuzzContinuation(f *testing.F) {
	f.Add("Q: hi\nA:", "hi", 3)
	f.Add("x The", " The simulated", 20)
	f.Add("", "", 0)
	f.Fuzz(func(t *testing.T, prompt, user string, m int) {
		m = min(max(m, 0), 100)
		j := fillerSuffix([]byte(prompt))
		if got := fillerSuffix([]byte(prompt + fillerRun(j, m))); got != j+m {
			t.Fatalf("%q answered from %d, plus %d tokens: answered from %d", prompt, j, m, got)
		}
		msgs := []chatMessage{{Role: "user", Content: user}}
		text := fillerText(m)
		p, body := renderContinue(nil, append(msgs, chatMessage{Role: "assistant", Content: text}))
		if string(p) != string(renderChat(nil, nil, msgs))+text || fillerPrefix(p[body:]) != m {
			t.Fatalf("open message %q: %q (body at %d)", text, p, body)
		}
	})
}
