package reqview

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func history(t *testing.T, body string, kind Kind) string {
	t.Helper()
	return string(mustParse(t, body, kind).History)
}

func TestHistoryFormat(t *testing.T) {
	f := func(body string, kind Kind, want string) {
		t.Helper()
		if got := history(t, body, kind); got != want {
			t.Fatalf("body %s\n got %q\nwant %q", body, got, want)
		}
	}
	f(`{"messages":[{"role":"system","content":"S"},{"role":"developer","content":"D"},{"role":"user","content":"U"},{"role":"assistant","content":"A"},{"role":"tool","content":"T","tool_call_id":"x"},{"role":"function","content":"F"},{"role":"critic","content":"C"}]}`, Chat,
		"\x02\x1eS\x03\x1eD\x04\x1eU\x05\x1eA\x06\x1eT\x06\x1eF\x07\x1eC")
	// Assistant: content pieces then tool calls, whatever the key order.
	f(`{"messages":[{"tool_calls":[{"function":{"arguments":"{\"q\":1}","name":"f"},"id":"c1"},{"id":"c2","function":{"name":"g","arguments":"{}"}}],"content":"thinking","role":"assistant"}]}`, Chat,
		"\x05\x1ethinking\x1df\x1c{\\\"q\\\":1}\x1dg\x1c{}")
	f(`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{"q":1}}}]}]}`, Chat,
		"\x05\x1df\x1c{\"q\":1}")
	// Multi-part content: text parts only.
	f(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"u"}},{"type":"input_audio","input_audio":{}},{"type":"file","file":{}},{"type":"input_text","text":"b"},{"type":"refusal","refusal":"r"},{"text":"no type"}]}]}`, Chat,
		"\x04\x1ea\x1eb")
	// Escapes stay raw.
	f(`{"messages":[{"role":"user","content":"a\\\"b\n\u00e9 日本"}]}`, Chat, "\x04\x1ea\\\\\\\"b\\n\\u00e9 日本")
	// Non-object messages contribute nothing.
	f(`{"messages":[1,{"role":"user","content":"x"},null]}`, Chat, "\x04\x1ex")
	// Tools are name-sorted, raw, before the messages even when sent after.
	f(`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"b"}},{"function":{"name":"a"},"type":"function"}]}`, Chat,
		"\x01{\"function\":{\"name\":\"a\"},\"type\":\"function\"}\x01{\"type\":\"function\",\"function\":{\"name\":\"b\"}}\x04\x1ex")
	// Tools without text: tools and role tags.
	f(`{"tools":[{"type":"function","function":{"name":"a"}}],"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`, Chat,
		"\x01{\"type\":\"function\",\"function\":{\"name\":\"a\"}}\x04")
	f(`{"tools":[{"type":"function","function":{"name":"a"}}]}`, Chat, "\x01{\"type\":\"function\",\"function\":{\"name\":\"a\"}}")
	// No text, no tools: empty.
	f(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]},{"role":"user","content":""}]}`, Chat, "")
	f(`{"messages":[]}`, Chat, "")
	f(`{"model":"m"}`, Chat, "")
	f(`{"tools":[],"messages":[{"role":"user"}]}`, Chat, "")
	f(`{"prompt":"p"}`, Completions, "")
	f(`{"messages":[{"role":"user","content":"x"}]}`, Other, "")
}

// TestHistoryToolsBeforeAfter: the key does not depend on where the tools
// and instructions sit in the body, including heads larger than the reserve
// in front of the body section (the one-memmove path).
func TestHistoryToolsBeforeAfter(t *testing.T) {
	msgs := `"messages":[{"role":"system","content":"sys"},{"role":"user","content":"hello"}]`
	for _, n := range []int{1, 3, 50, 2000} {
		var tools strings.Builder
		tools.WriteString(`"tools":[`)
		for i := n - 1; i >= 0; i-- {
			if i != n-1 {
				tools.WriteByte(',')
			}
			tools.WriteString(`{"type":"function","function":{"name":"tool_` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + `","description":"` + strings.Repeat("d", 30) + `"}}`)
		}
		tools.WriteString(`]`)
		a := history(t, `{`+msgs+`,`+tools.String()+`}`, Chat)
		b := history(t, `{`+tools.String()+`,`+msgs+`}`, Chat)
		if a != b {
			t.Fatalf("n=%d: tools after messages gives\n%q\nbefore gives\n%q", n, a, b)
		}
		if !strings.HasSuffix(a, "\x02\x1esys\x04\x1ehello") || strings.Count(a, "\x01") != n {
			t.Fatalf("n=%d: bad key %q", n, a)
		}
		// Responses: instructions, tools, input; any member order.
		rt := strings.ReplaceAll(strings.ReplaceAll(tools.String(), `"function":{"name"`, `"x":{},"name"`), `"}}`, `"}`)
		in := `"input":[{"role":"user","content":"hello"}]`
		ins := `"instructions":"be terse"`
		ref := history(t, `{`+ins+`,`+rt+`,`+in+`}`, Responses)
		for _, body := range []string{`{` + in + `,` + ins + `,` + rt + `}`, `{` + in + `,` + rt + `,` + ins + `}`, `{` + rt + `,` + in + `,` + ins + `}`} {
			if got := history(t, body, Responses); got != ref {
				t.Fatalf("n=%d: responses %s\n got %q\nwant %q", n, body[:40], got, ref)
			}
		}
		if !strings.HasPrefix(ref, "\x08\x1ebe terse\x01") {
			t.Fatalf("responses key %q", ref[:20])
		}
	}
}

func TestHistoryToolsSorted(t *testing.T) {
	tool := func(name string) string {
		return `{"type":"function","function":{"name":"` + name + `","parameters":{"type":"object"}}}`
	}
	names := []string{"zeta", "alpha", "mid", "beta", "alpha2"}
	var want string
	for _, n := range []string{"alpha", "alpha2", "beta", "mid", "zeta"} {
		want += "\x01" + tool(n)
	}
	want += "\x04\x1ehi"
	for rot := range names {
		var parts []string
		for i := range names {
			parts = append(parts, tool(names[(i+rot)%len(names)]))
		}
		body := `{"tools":[` + strings.Join(parts, ",") + `],"messages":[{"role":"user","content":"hi"}]}`
		if got := history(t, body, Chat); got != want {
			t.Fatalf("rotation %d:\n got %q\nwant %q", rot, got, want)
		}
	}
}

func TestHistoryKeyOrderInsideMessages(t *testing.T) {
	variants := []string{
		`{"role":"assistant","content":"c","tool_calls":[{"id":"1","type":"function","function":{"name":"n","arguments":"a"}}]}`,
		`{"content":"c","role":"assistant","tool_calls":[{"function":{"arguments":"a","name":"n"},"type":"function","id":"1"}]}`,
		`{"tool_calls":[{"type":"function","id":"1","function":{"name":"n","arguments":"a"}}],"role":"assistant","content":"c"}`,
		`{"tool_calls":[{"function":{"name":"n","arguments":"a"}}],"content":"c","role":"assistant"}`,
		` { "tool_calls" : [ { "function" : { "name" : "n" , "arguments" : "a" } } ] , "content" : "c" , "role" : "assistant" } `,
	}
	want := "\x04\x1eq\x05\x1ec\x1dn\x1ca"
	for _, m := range variants {
		body := `{"messages":[{"role":"user","content":"q"},` + m + `]}`
		if got := history(t, body, Chat); got != want {
			t.Fatalf("message %s\n got %q\nwant %q", m, got, want)
		}
	}
}

func TestHistoryNoToolCallID(t *testing.T) {
	body := `{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[{"id":"call_SECRET1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"call_SECRET1","content":"r"}]}`
	h := history(t, body, Chat)
	if strings.Contains(h, "SECRET") {
		t.Fatalf("history contains a tool call id: %q", h)
	}
	body2 := strings.ReplaceAll(body, "SECRET1", "OTHER22")
	if h2 := history(t, body2, Chat); h2 != h {
		t.Fatalf("history depends on tool call ids:\n%q\n%q", h, h2)
	}
	rbody := `{"input":[{"type":"function_call","call_id":"call_SECRET","id":"fc_SECRET","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"call_SECRET","output":"r"}]}`
	if h := history(t, rbody, Responses); strings.Contains(h, "SECRET") || h != "\x1df\x1c{}\x06\x1er" {
		t.Fatalf("responses history %q", h)
	}
}

func TestHistoryDeterministic(t *testing.T) {
	body := SampleChatBody(12, 3000)
	var v1, v2 View
	if err := Parse(&v1, body, Chat); err != nil {
		t.Fatal(err)
	}
	h1 := append([]byte(nil), v1.History...)
	for i := 0; i < 3; i++ {
		if err := Parse(&v2, body, Chat); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(h1, v2.History) {
			t.Fatalf("parse %d differs", i)
		}
	}
	// A body that differs only in the order of members and in whitespace.
	other := `{"tools":[{"function":{"name":"f"},"type":"function"}],"model":"m","messages":[{"content":"hi","role":"user"}]}`
	pretty := "{\n  \"model\": \"m\",\n  \"messages\": [\n    {\"role\": \"user\", \"content\": \"hi\"}\n  ],\n  \"tools\": [{\"function\":{\"name\":\"f\"},\"type\":\"function\"}]\n}"
	if a, b := history(t, other, Chat), history(t, pretty, Chat); a != b {
		t.Fatalf("\n%q\n%q", a, b)
	}
}

// TestHistoryPrefix: a conversation growing turn by turn, through tool calls,
// tool results and a trailing assistant message: each request's key is a
// prefix of the next one's.
func TestHistoryPrefix(t *testing.T) {
	chat := []string{
		`{"role":"system","content":"You are helpful. \"Quote\" and back\\slash\\"}`,
		`{"role":"user","content":"What is the weather in Paris?"}`,
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Paris\"}"}}]}`,
		`{"role":"tool","tool_call_id":"call_1","content":"{\"temp\":21}"}`,
		`{"role":"assistant","content":"It is 21°C in Paris."}`,
		`{"role":"user","content":[{"type":"text","text":"And this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}`,
		`{"role":"assistant","content":"","tool_calls":[{"id":"call_2","type":"function","function":{"name":"vision","arguments":"{}"}},{"id":"call_3","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Rome\"}"}}]}`,
		`{"role":"tool","tool_call_id":"call_2","content":"a cat"}`,
		`{"role":"tool","tool_call_id":"call_3","content":[{"type":"text","text":"{\"temp\":25}"}]}`,
		`{"role":"assistant","content":"A cat, and 25°C in Rome."}`,
	}
	tools := `"tools":[{"type":"function","function":{"name":"weather"}},{"type":"function","function":{"name":"vision"}}]`
	check := func(name string, bodies []string, kind Kind) {
		t.Helper()
		var prev []byte
		for i, body := range bodies {
			var v View
			if err := Parse(&v, []byte(body), kind); err != nil {
				t.Fatalf("%s %d: %v", name, i, err)
			}
			if !bytes.HasPrefix(v.History, prev) {
				t.Fatalf("%s: key %d\n%q\nis not a prefix of key %d\n%q", name, i-1, prev, i, v.History)
			}
			prev = append(prev[:0], v.History...)
		}
	}
	var withTools, toolsAfter, noTools []string
	for n := 1; n <= len(chat); n++ {
		msgs := `"messages":[` + strings.Join(chat[:n], ",") + `]`
		withTools = append(withTools, `{"model":"m",`+tools+`,`+msgs+`}`)
		toolsAfter = append(toolsAfter, `{"model":"m",`+msgs+`,`+tools+`,"stream":true}`)
		noTools = append(noTools, `{`+msgs+`}`)
	}
	check("chat", withTools, Chat)
	check("chat tools after", toolsAfter, Chat)
	check("chat no tools", noTools, Chat)
	for i := range withTools {
		if history(t, withTools[i], Chat) != history(t, toolsAfter[i], Chat) {
			t.Fatalf("turn %d: tool position changes the key", i)
		}
	}

	items := []string{
		`{"role":"user","content":"What is the weather in Paris?"}`,
		`{"type":"reasoning","id":"rs_1","summary":[]}`,
		`{"type":"function_call","id":"fc_1","call_id":"call_1","name":"weather","arguments":"{\"city\":\"Paris\"}"}`,
		`{"type":"function_call_output","call_id":"call_1","output":"{\"temp\":21}"}`,
		`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"21°C.","annotations":[]}]}`,
		`{"role":"user","content":[{"type":"input_text","text":"Thanks"},{"type":"input_image","image_url":"x"}]}`,
	}
	var resp []string
	for n := 1; n <= len(items); n++ {
		resp = append(resp, `{"model":"m","instructions":"Be brief.","input":[`+strings.Join(items[:n], ",")+`],`+
			`"tools":[{"type":"function","name":"weather","parameters":{}}]}`)
	}
	check("responses", resp, Responses)
	// The synthetic sample conversation too.
	var sample []string
	for turns := 1; turns <= 8; turns++ {
		sample = append(sample, string(SampleChatBody(turns, 500)))
	}
	check("sample", sample, Chat)
}

// TestKeySetGeneralPath: a key of a keySet (or a role or type of a value
// set) written so that the word compares do not match it — spaces around
// the colon, an escape in the key — takes the general path of objIter.step
// and reads the same view as the compact form.
func TestKeySetGeneralPath(t *testing.T) {
	var sample map[string]any
	if err := json.Unmarshal(SampleChatBody(3, 200), &sample); err != nil {
		t.Fatal(err)
	}
	delete(sample, "tools") // their raw bytes are in the key
	noTools, _ := json.Marshal(sample)
	bodies := []string{
		string(noTools),
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_text","text":"b"}]},` +
			`{"role":"assistant","content":[{"type":"thinking","thinking":"x","signature":"s"},{"type":"text","text":"c"}],"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"1","content":"r"},{"role":"system","content":"s"},{"role":"user","content":"last"}]}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},` +
			`{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":[1,2]}"},{"type":"function_call_output","call_id":"c1","output":"o"},` +
			`{"type":"reasoning","encrypted_content":"e"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"t"}]}]}`,
	}
	keys := []string{"role", "content", "tool_calls", "tool_call_id", "function", "id", "type", "name", "arguments", "text", "signature", "call_id", "output"}
	variants := []func(k string) (string, string){
		func(k string) (string, string) { return `"` + k + `":`, `"` + k + `" :` },
		func(k string) (string, string) { return `"` + k + `":`, `"` + k + `": ` },
		func(k string) (string, string) { return `"` + k + `":`, "\"" + k + "\"\n:\t" },
		func(k string) (string, string) {
			return `"` + k + `":`, `"\u00` + fmt.Sprintf("%02x", k[0]) + k[1:] + `":`
		},
	}
	view := func(body string, kind Kind) string {
		var v View
		err := Parse(&v, []byte(body), kind)
		return fmt.Sprintf("%v %q %q %q %d %q %d %q %v %v", err, v.History, v.LastUserText, v.Model, v.Messages, v.LastRole,
			v.ToolResults, v.ToolResultIDs, v.OpaqueReasoning, v.HasReasoningContent)
	}
	for bi, body := range bodies {
		for kind := Chat; kind <= Other; kind++ {
			want := view(body, kind)
			for vi, f := range variants {
				for _, k := range keys {
					old, repl := f(k)
					if !strings.Contains(body, old) {
						continue
					}
					if got := view(strings.ReplaceAll(body, old, repl), kind); got != want {
						t.Errorf("body %d %v, variant %d of %q:\n got %s\nwant %s", bi, kind, vi, k, got, want)
					}
				}
			}
		}
	}
}
