package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/warmroute/warmroute/reqview"
)

// TestVariants: the bodies of --variants have one size, parse, and differ
// in their tools and their history key while sharing the system prompt.
func TestVariants(t *testing.T) {
	for _, size := range []int{1024, 16384} {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(reqview.SampleChatBodyOfSize(size), &m); err != nil {
			t.Fatal(err)
		}
		var first []byte
		tools := map[string]bool{}
		keys := map[string]bool{}
		for _, v := range []int{0, 7, 42, 1000} { // numbers of every width
			b := variant(m, v)
			if first == nil {
				first = b
			} else if len(b) != len(first) {
				t.Fatalf("size %d: variant %d is %d bytes, variant 0 %d", size, v, len(b), len(first))
			}
			var view reqview.View
			if err := reqview.Parse(&view, b, reqview.Chat); err != nil {
				t.Fatalf("size %d: variant %d does not parse: %v", size, v, err)
			}
			var body struct {
				Tools    json.RawMessage `json:"tools"`
				Messages []struct {
					Role    string          `json:"role"`
					Content json.RawMessage `json:"content"`
				} `json:"messages"`
			}
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatal(err)
			}
			tools[string(body.Tools)] = true
			keys[string(view.History)] = true
			if body.Messages[0].Role != "system" || !bytes.Equal(body.Messages[0].Content, mustSystem(t, m)) {
				t.Fatalf("size %d: variant %d changed the system prompt", size, v)
			}
		}
		if len(tools) != 4 || len(keys) != 4 {
			t.Fatalf("size %d: 4 variants gave %d tool arrays and %d history keys, want 4 of each", size, len(tools), len(keys))
		}
	}
}

func mustSystem(t *testing.T, m map[string]json.RawMessage) json.RawMessage {
	t.Helper()
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(m["messages"], &msgs); err != nil || len(msgs) == 0 {
		t.Fatalf("sample body without messages: %v", err)
	}
	return msgs[0].Content
}
