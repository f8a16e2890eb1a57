package reqview

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func mustParse(t *testing.T, body string, kind Kind) *View {
	t.Helper()
	var v View
	if err := Parse(&v, []byte(body), kind); err != nil {
		t.Fatalf("Parse(%q): %v", body, err)
	}
	return &v
}

func TestParseScalars(t *testing.T) {
	type want struct {
		model, sessParams, sess, conv, userID, user, prev, effort string
		stream, tools                                             bool
	}
	f := func(body string, kind Kind, w want) {
		t.Helper()
		v := mustParse(t, body, kind)
		got := want{string(v.Model), string(v.SessionParamsID), string(v.SessionID), string(v.ConversationID),
			string(v.UserID), string(v.User), string(v.PreviousResponseID), string(v.ReasoningEffort), v.Stream, v.HasTools}
		if got != w {
			t.Fatalf("body %s\n got %+v\nwant %+v", body, got, w)
		}
		if v.Model == nil {
			if v.ModelStart != -1 || v.ModelEnd != -1 {
				t.Fatalf("absent model: offsets %d %d", v.ModelStart, v.ModelEnd)
			}
		} else if s := body[v.ModelStart:v.ModelEnd]; s != `"`+w.model+`"` {
			t.Fatalf("model offsets select %q, want %q", s, `"`+w.model+`"`)
		}
	}
	f(`{}`, Chat, want{})
	f(`{"model":"m1","stream":true}`, Chat, want{model: "m1", stream: true})
	f(`{"stream":false,"model":"m1"}`, Other, want{model: "m1"})
	f(` { "stream" : true , "model" : "m1" } `, Completions, want{model: "m1", stream: true})
	f("{\n\t\"model\":\r\n\"m1\"\n}\n", Responses, want{model: "m1"})
	// Escaped quotes and backslashes, strings ending with a backslash.
	f(`{"model":"a\\\"b","user":"x\\"}`, Chat, want{model: `a\\\"b`, user: `x\\`})
	f(`{"model":"\\\\","user":"\""}`, Chat, want{model: `\\\\`, user: `\"`})
	f(`{"model":"\u00e9\ud83d\ude00","user":"naïve 日本語 🙂"}`, Chat, want{model: `\u00e9\ud83d\ude00`, user: "naïve 日本語 🙂"})
	// Session fields.
	f(`{"session_params":{"x":{"session_id":"no"},"session_id":"sp"},"session_id":"s","conversation_id":"c","user_id":"u","user":"uu"}`, Chat,
		want{sessParams: "sp", sess: "s", conv: "c", userID: "u", user: "uu"})
	f(`{"previous_response_id":"resp_1","reasoning":{"effort":"high","summary":"auto"}}`, Responses, want{prev: "resp_1", effort: "high"})
	f(`{"reasoning_effort":"low","reasoning":{"effort":"high"}}`, Chat, want{effort: "low"})
	f(`{"reasoning":{"effort":"high"},"reasoning_effort":"low"}`, Chat, want{effort: "low"})
	// Nested objects and arrays with look-alike keys are skipped.
	f(`{"metadata":{"model":"no","stream":true,"session_id":"no"},"x":[{"model":"no"},"model",["stream"]],"model":"yes"}`, Chat, want{model: "yes"})
	f(`{"a":"}\"{[","b":[[[{}]],{"c":"]"}],"model":"yes","n":-1.5e3,"t":true,"f":null}`, Chat, want{model: "yes"})
	// Wrong types are ignored.
	f(`{"model":7,"stream":"true","session_id":1,"user":null,"session_params":"x","reasoning":"high","tools":{}}`, Chat, want{})
	f(`{"session_params":{"session_id":5}}`, Chat, want{})
	// Duplicate keys: the last one wins (as encoding/json into a map).
	f(`{"model":"a","model":"b"}`, Chat, want{model: "b"})
	f(`{"model":"a","model":1}`, Chat, want{})
	// Escaped keys are decoded before comparison.
	f(`{"mod\u0065l":"m","\u0073tream":true,"us\u0065r":"u"}`, Chat, want{model: "m", stream: true, user: "u"})
	f(`{"mo\"del":"m","model ":"x"}`, Chat, want{})
	// Tools.
	f(`{"tools":[]}`, Chat, want{})
	f(`{"tools":[{"type":"function","function":{"name":"a"}}]}`, Chat, want{tools: true})
	f(`{"tools":[1]}`, Completions, want{tools: true})
	f(`{"tools":[{"type":"web_search"}]}`, Responses, want{tools: true})
}

func TestParseMalformed(t *testing.T) {
	f := func(body string, off int) {
		t.Helper()
		var v View
		err := Parse(&v, []byte(body), Chat)
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("Parse(%q) = %v, want ErrMalformed", body, err)
		}
		var me *MalformedError
		if !errors.As(err, &me) {
			t.Fatalf("Parse(%q): %T is not a *MalformedError", body, err)
		}
		if off >= 0 && me.Offset != off {
			t.Fatalf("Parse(%q): offset %d, want %d", body, me.Offset, off)
		}
	}
	f(``, 0)
	f(`   `, -1)
	f(`{`, -1)
	f(`{"model":"m"`, -1)
	f(`{"model":"m`, -1)
	f(`{"model":"m"}x`, 13)
	f(`{"model":"m"} {}`, -1)
	f(`{"model":"m",}`, -1)
	f(`{"model" "m"}`, -1)
	f(`{model:"m"}`, -1)
	f(`{"a":[1,2}`, -1)
	f(`{"a":tru}`, -1)
	// Interpreted strings are validated (content strings are not: see
	// TestParseValidation).
	f(`{"model":"\x"}`, 10)
	f(`{"user":"\u12"}`, 9)
	f("{\"model\":\"\x01\"}", 10)
	f(`{"a":01}`, -1)
	f(`[]`, 0)
	f(`  [{"model":"m"}]`, 2)
	f(`"model"`, 0)
	f(`42`, 0)
	f(`null`, 0)
}

func TestParseChatMessages(t *testing.T) {
	type want struct {
		msgs                int
		lastRole, lastUser  string
		toolResults         string
		opaque, reasonPlain bool
	}
	f := func(messages string, w want) {
		t.Helper()
		v := mustParse(t, `{"model":"m","messages":`+messages+`}`, Chat)
		ids := make([]string, len(v.ToolResultIDs))
		for i, id := range v.ToolResultIDs {
			ids[i] = string(id)
		}
		got := want{v.Messages, string(v.LastRole), string(v.LastUserText), strings.Join(ids, ","), v.OpaqueReasoning, v.HasReasoningContent}
		if got != w {
			t.Fatalf("messages %s\n got %+v\nwant %+v", messages, got, w)
		}
	}
	f(`[]`, want{})
	f(`"x"`, want{})
	f(`[{"role":"user","content":"hi"}]`, want{msgs: 1, lastRole: "user", lastUser: "hi"})
	f(`[{"content":"hi","role":"user"}]`, want{msgs: 1, lastRole: "user", lastUser: "hi"})
	f(`[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c\"d"}]`,
		want{msgs: 3, lastRole: "user", lastUser: `c\"d`})
	f(`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}},{"text":"b","type":"text"}]}]`,
		want{msgs: 1, lastRole: "user", lastUser: `a\nb`})
	f(`[{"role":"user","content":"u1"},{"role":"assistant","content":"x"}]`, want{msgs: 2, lastRole: "assistant", lastUser: "u1"})
	f(`[1,"x",null]`, want{msgs: 3})
	f(`[{"role":"user","content":"u"},7]`, want{msgs: 2, lastUser: "u"})
	// Tool results after the last assistant message.
	f(`[{"role":"user","content":"q"},
		{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"r1"},
		{"role":"assistant","tool_calls":[{"id":"c2","function":{"name":"f","arguments":"{}"}},{"id":"c3","function":{"name":"g","arguments":"{}"}}]},
		{"tool_call_id":"c2","role":"tool","content":"r2"},
		{"role":"tool","content":"r3","tool_call_id":"c3"}]`,
		want{msgs: 6, lastRole: "tool", lastUser: "q", toolResults: "c2,c3"})
	f(`[{"role":"assistant","tool_calls":[]},{"role":"tool","tool_call_id":"c1","content":"r"},{"role":"user","content":"more"}]`,
		want{msgs: 3, lastRole: "user", lastUser: "more", toolResults: "c1"})
	f(`[{"role":"tool","tool_call_id":"c1","content":"r"},{"role":"assistant","content":"done"}]`,
		want{msgs: 2, lastRole: "assistant"})
	// Opaque reasoning.
	f(`[{"role":"assistant","content":"x","encrypted_content":"gAAA"}]`, want{msgs: 1, lastRole: "assistant", opaque: true})
	f(`[{"role":"assistant","content":"x","encrypted_content":""}]`, want{msgs: 1, lastRole: "assistant"})
	f(`[{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"EqQB"},{"type":"text","text":"x"}]}]`,
		want{msgs: 1, lastRole: "assistant", opaque: true})
	f(`[{"role":"assistant","content":[{"type":"thinking","thinking":"hmm"}]}]`, want{msgs: 1, lastRole: "assistant"})
	f(`[{"role":"assistant","content":[{"type":"redacted_thinking","data":"abc"}]}]`, want{msgs: 1, lastRole: "assistant", opaque: true})
	f(`[{"role":"assistant","content":"x","thinking_blocks":[{"signature":"s","type":"thinking","thinking":"t"}]}]`,
		want{msgs: 1, lastRole: "assistant", opaque: true})
	f(`[{"role":"assistant","content":"x","reasoning_details":[{"type":"reasoning.encrypted","data":"e"}]}]`,
		want{msgs: 1, lastRole: "assistant", opaque: true})
	f(`[{"role":"assistant","content":"x","reasoning_details":[{"type":"reasoning.text","text":"e"}]}]`,
		want{msgs: 1, lastRole: "assistant"})
	f(`[{"role":"assistant","content":"x","reasoning_content":"let me think"}]`, want{msgs: 1, lastRole: "assistant", reasonPlain: true})
	f(`[{"role":"user","content":"x","metadata":{"encrypted_content":"nested, not a message field"}}]`, want{msgs: 1, lastRole: "user", lastUser: "x"})
}

func TestParseResponses(t *testing.T) {
	type want struct {
		msgs               int
		lastRole, lastUser string
		toolResults        string
		opaque             bool
		history            string
	}
	f := func(body string, w want) {
		t.Helper()
		v := mustParse(t, body, Responses)
		ids := make([]string, len(v.ToolResultIDs))
		for i, id := range v.ToolResultIDs {
			ids[i] = string(id)
		}
		got := want{v.Messages, string(v.LastRole), string(v.LastUserText), strings.Join(ids, ","), v.OpaqueReasoning, string(v.History)}
		if got != w {
			t.Fatalf("body %s\n got %#v\nwant %#v", body, got, w)
		}
	}
	f(`{"model":"m","input":"hello"}`, want{msgs: 1, lastRole: "user", lastUser: "hello", history: "\x04\x1ehello"})
	f(`{"input":"hello","instructions":"be brief"}`, want{msgs: 1, lastRole: "user", lastUser: "hello", history: "\x08\x1ebe brief\x04\x1ehello"})
	f(`{"input":[{"role":"user","content":"hi"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"yo","annotations":[]}]}]}`,
		want{msgs: 2, lastRole: "assistant", lastUser: "hi", history: "\x04\x1ehi\x05\x1eyo"})
	f(`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"},{"type":"input_text","text":"b"}]}]}`,
		want{msgs: 1, lastRole: "user", lastUser: `a\nb`, history: "\x04\x1ea\x1eb"})
	f(`{"input":[{"role":"user","content":"q"},
		{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAAA"},
		{"type":"function_call","call_id":"call_1","name":"get","arguments":"{\"a\":1}"},
		{"arguments":"{}","name":"put","call_id":"call_2","type":"function_call"},
		{"type":"function_call_output","call_id":"call_1","output":"r1"},
		{"call_id":"call_2","output":[{"type":"input_text","text":"r2"}],"type":"function_call_output"}]}`,
		want{msgs: 6, lastRole: "tool", lastUser: "q", toolResults: "call_1,call_2", opaque: true,
			history: "\x04\x1eq\x1dget\x1c{\\\"a\\\":1}\x1dput\x1c{}\x06\x1er1\x06\x1er2"})
	f(`{"input":[{"type":"function_call_output","call_id":"c0","output":"old"},{"role":"user","content":"new"}]}`,
		want{msgs: 2, lastRole: "user", lastUser: "new", history: "\x06\x1eold\x04\x1enew"})
	f(`{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]}]}`, want{msgs: 1, lastRole: "assistant"})
	f(`{"input":[{"type":"item_reference","id":"msg_1"}]}`, want{msgs: 1, lastRole: "item_reference"})
	f(`{"input":[{"type":"web_search_call","id":"ws_1"}]}`, want{msgs: 1, lastRole: "assistant"})
	f(`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, want{msgs: 1, lastRole: "user"})
	f(`{"tools":[{"type":"function","name":"zeta","parameters":{}},{"type":"function","name":"alpha"}],"input":"x","instructions":"i"}`,
		want{msgs: 1, lastRole: "user", lastUser: "x",
			history: "\x08\x1ei\x01{\"type\":\"function\",\"name\":\"alpha\"}\x01{\"type\":\"function\",\"name\":\"zeta\",\"parameters\":{}}\x04\x1ex"})
	// Chat fields are not read for Responses, and vice versa.
	f(`{"messages":[{"role":"user","content":"x"}]}`, want{})
	v := mustParse(t, `{"input":"x","messages":[{"role":"user","content":"y"}]}`, Chat)
	if v.Messages != 1 || string(v.LastUserText) != "y" {
		t.Fatalf("chat read input: %d %q", v.Messages, v.LastUserText)
	}
}

func TestParseCompletions(t *testing.T) {
	f := func(body string, kind Kind, prompt string, promptSet bool) {
		t.Helper()
		v := mustParse(t, body, kind)
		if string(v.Prompt) != prompt || (v.Prompt != nil) != promptSet {
			t.Fatalf("body %s: prompt %q (set %v), want %q (set %v)", body, v.Prompt, v.Prompt != nil, prompt, promptSet)
		}
		if len(v.History) != 0 || v.Messages != 0 {
			t.Fatalf("body %s: history %q messages %d", body, v.History, v.Messages)
		}
	}
	f(`{"model":"m","prompt":"once upon\na time"}`, Completions, `once upon\na time`, true)
	f(`{"prompt":""}`, Completions, ``, true)
	f(`{"prompt":["first","second"]}`, Completions, `first`, true)
	f(`{"prompt":[[1,2,3]]}`, Completions, ``, false)
	f(`{"prompt":[1,2,3]}`, Completions, ``, false)
	f(`{"text":"generate me"}`, Completions, `generate me`, true)
	f(`{"text":"t","prompt":"p"}`, Completions, `p`, true)
	f(`{"prompt":"p","text":"t"}`, Completions, `p`, true)
	f(`{"prompt":"p","messages":[{"role":"user","content":"x"}]}`, Completions, `p`, true)
	f(`{"prompt":"p"}`, Chat, ``, false)
	f(`{"prompt":"p","tools":[{"type":"function","function":{"name":"f"}}]}`, Other, ``, false)
}

func TestViewReuse(t *testing.T) {
	var v View
	big := SampleChatBody(5, 500)
	if err := Parse(&v, big, Chat); err != nil {
		t.Fatal(err)
	}
	if err := Parse(&v, []byte(`{"model":"x"}`), Chat); err != nil {
		t.Fatal(err)
	}
	if v.Messages != 0 || v.HasTools || len(v.History) != 0 || v.LastRole != nil || len(v.ToolResultIDs) != 0 || v.User != nil {
		t.Fatalf("state leaked across Parse: %+v", v)
	}
	v.Reset()
	if v.ModelStart != -1 || v.Model != nil {
		t.Fatalf("Reset: %+v", v)
	}
}

func TestSampleChatBody(t *testing.T) {
	for _, size := range []int{1 << 10, 16 << 10, 64 << 10} {
		b := SampleChatBodyOfSize(size)
		if len(b) < size || len(b) > size*3/2 {
			t.Fatalf("SampleChatBodyOfSize(%d) = %d bytes", size, len(b))
		}
		v := mustParse(t, string(b), Chat)
		if !v.HasTools || string(v.LastRole) != "user" || len(v.History) == 0 {
			t.Fatalf("sample %d: %+v", size, v)
		}
	}
	if s := fmt.Sprint(Chat, Completions, Responses, Other); s != "chat completions responses other" {
		t.Fatal(s)
	}
}

func TestToolResultsCountedWithoutIDs(t *testing.T) {
	f := func(body string, kind Kind, results int, ids int) {
		t.Helper()
		v := mustParse(t, body, kind)
		if v.ToolResults != results || len(v.ToolResultIDs) != ids {
			t.Errorf("%s: %d tool results, %d ids; want %d, %d", body, v.ToolResults, len(v.ToolResultIDs), results, ids)
		}
	}
	f(`{"messages":[{"role":"user","content":"q"},{"role":"assistant","tool_calls":[]},{"role":"tool","content":"42"}]}`, Chat, 1, 0)
	f(`{"messages":[{"role":"assistant","content":"a"},{"role":"function","name":"f","content":"42"},{"role":"tool","tool_call_id":"c","content":"x"}]}`, Chat, 2, 1)
	f(`{"messages":[{"role":"tool","tool_call_id":"c","content":"x"},{"role":"assistant","content":"a"}]}`, Chat, 0, 0)
	f(`{"input":[{"type":"function_call_output","output":"x"},{"type":"function_call_output","call_id":"c","output":"y"}]}`, Responses, 2, 1)
}
