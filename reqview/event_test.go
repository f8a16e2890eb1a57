package reqview

import "testing"

var tokenEvents = []string{
	`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" to\"ken"},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"c","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","logprobs":null,"finish_reason":null,"stop_reason":null}]}`,
	`{"type":"content_block_delta","index":12,"delta":{"type":"text_delta","text":"Hi\n"}}`,
}

var otherEvents = []string{
	`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":"stop"}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[]},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":1}}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null},{"index":1,"delta":{"content":"y"}}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"x","tool_calls":[{"id":"t"}]},"logprobs":null}]}`,
	`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}`,
}

// TestTokenText: the common one-token events are read without a walk, with
// the text a walk finds; anything else is left to the walk.
func TestTokenText(t *testing.T) {
	for _, ev := range tokenEvents {
		var e StreamEvent
		s, ok := TokenText([]byte(ev))
		if !ok || !ScanStreamEvent(&e, []byte(ev)) || s != e.Text || e.Opaque || e.Finished || e.Usage.Has() {
			t.Errorf("%s: fast %v %v, walked %+v", ev, s, ok, e)
		}
	}
	for _, ev := range otherEvents {
		if s, ok := TokenText([]byte(ev)); ok {
			t.Errorf("%s: read as one token %v", ev, s)
		}
	}
}

// FuzzTokenText: whatever TokenText reads as one token of text, the walk
// reads as the same text and nothing a continuation must know of (when
// the event is one the walk reads: TokenText does not check the members
// before the choices, which the router forwards as they are, and reads no
// usage there).
func FuzzTokenText(f *testing.F) {
	for _, ev := range append(tokenEvents, otherEvents...) {
		f.Add(ev)
	}
	f.Fuzz(func(t *testing.T, ev string) {
		s, ok := TokenText([]byte(ev))
		var e StreamEvent
		walked := ScanStreamEvent(&e, []byte(ev))
		if ok && walked && (s != e.Text || e.Opaque || e.Finished || e.Usage.Has() && e.Usage.Start > s.End) {
			t.Fatalf("%q: fast %v, walked %v %+v", ev, s, walked, e)
		}
	})
}

// TestSSEScannerSkipsOnlyWhatTeachesNothing: the learning room's scanner
// passes one-token events by their shape, yet learns the response id from
// a stream whose first event is one, and the usage and tool-call ids of
// the events that carry them.
func TestSSEScannerSkipsOnlyWhatTeachesNothing(t *testing.T) {
	var s SSEScanner
	var l Learned
	stream := "data: " + tokenEvents[0] + "\n\n" +
		"data: " + tokenEvents[0] + "\n\n" +
		`data: {"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]},"finish_reason":null}]}` + "\n\n" +
		`data: {"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}` + "\n\n" +
		"data: [DONE]\n\n"
	s.Write([]byte(stream), &l)
	if string(l.ResponseID) != "c" || len(l.ToolCallIDs) != 1 || string(l.ToolCallIDs[0]) != "call_1" ||
		!l.HasUsage || l.CompletionTokens != 3 {
		t.Fatalf("learned id %q, tool calls %q, usage %v %d", l.ResponseID, l.ToolCallIDs, l.HasUsage, l.CompletionTokens)
	}
}
