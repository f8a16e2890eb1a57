package reqview

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/bytedance/sonic/encoder"
)

// Anthropic Messages request bodies (kind Messages), shaped as the official
// SDKs send them.
const (
	anthWeatherTool = `{"name":"get_weather","description":"Current weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}`
	anthAddTool     = `{"name":"add","description":"Add two numbers","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}`
	anthTools       = `"tools":[` + anthWeatherTool + `,` + anthAddTool + `]`
	anthSystem      = `"system":[{"type":"text","text":"You are a \"careful\" agent.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"Today is Monday."}]`
	anthHead        = "\x01" + anthAddTool + "\x01" + anthWeatherTool + "\x02\x1eYou are a \\\"careful\\\" agent.\x1eToday is Monday."
)

// anthTurns is one agent conversation, message by message.
var anthTurns = []string{
	`{"role":"user","content":"What is the weather in Paris?"}`,
	`{"role":"assistant","content":[{"type":"thinking","thinking":"The user wants weather.","signature":"EqoBCkgIARAB"},{"type":"text","text":"Let me check."},{"type":"tool_use","id":"toolu_01A","name":"get_weather","input":{"city":"Paris"}}]}`,
	`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01A","content":"18°C, sunny"}]}`,
	`{"role":"assistant","content":[{"type":"text","text":"It is 18°C and sunny."}]}`,
	`{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},{"type":"text","text":"And here?"}]}`,
	`{"role":"assistant","content":[{"type":"redacted_thinking","data":"EmwKAhgBEgy3"},{"type":"tool_use","id":"toolu_02","name":"add","input":{"a":1,"b":2}},{"type":"tool_use","id":"toolu_03","name":"get_weather","input":{"city":"Rome"}}]}`,
	`{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_02","content":[{"type":"text","text":"3"},{"type":"image","source":{"type":"url","url":"https://x/y.png"}}]},{"type":"tool_result","tool_use_id":"toolu_03","is_error":true,"content":"timeout"},{"type":"text","text":"Go on."}]}`,
	`{"role":"assistant","content":"Done: 3, and Rome timed out."}`,
}

// anthKeys is the key each message of anthTurns appends.
var anthKeys = []string{
	"\x04\x1eWhat is the weather in Paris?",
	"\x05\x1eLet me check.\x1dget_weather\x1c{\"city\":\"Paris\"}",
	"\x04\x06\x1e18°C, sunny",
	"\x05\x1eIt is 18°C and sunny.",
	"\x04\x1eAnd here?",
	"\x05\x1dadd\x1c{\"a\":1,\"b\":2}\x1dget_weather\x1c{\"city\":\"Rome\"}",
	"\x04\x06\x1e3\x0b\x1etimeout\x1eGo on.",
	"\x05\x1eDone: 3, and Rome timed out.",
}

// anthBody is the request of turn n (its first n messages), with the
// members in one of three orders: system and tools first (TypeScript SDK),
// after the messages (Go SDK: struct order), or between.
func anthBody(n, order int) string {
	msgs := `"messages":[` + strings.Join(anthTurns[:n], ",") + `]`
	switch order {
	case 0:
		return `{"model":"claude-x","max_tokens":1024,` + anthSystem + `,` + anthTools + `,` + msgs + `,"metadata":{"user_id":"u-1"},"stream":true}`
	case 1:
		return `{"max_tokens":1024,` + msgs + `,"model":"claude-x","metadata":{"user_id":"u-1"},"stream":true,` + anthSystem + `,"thinking":{"type":"enabled","budget_tokens":2048},` + anthTools + `}`
	default:
		return `{"model":"claude-x",` + anthTools + `,` + msgs + `,` + anthSystem + `}`
	}
}

func TestParseMessages(t *testing.T) {
	type want struct {
		last, lastUser string
		ids            []string
		results        int
		opaque, reason bool
	}
	wants := []want{
		{last: "user", lastUser: "What is the weather in Paris?"},
		{last: "assistant", lastUser: "What is the weather in Paris?", opaque: true, reason: true},
		{last: "tool", lastUser: "What is the weather in Paris?", ids: []string{"toolu_01A"}, results: 1, opaque: true, reason: true},
		{last: "assistant", lastUser: "What is the weather in Paris?", opaque: true, reason: true},
		{last: "user", lastUser: "And here?", opaque: true, reason: true},
		{last: "assistant", lastUser: "And here?", opaque: true, reason: true},
		{last: "tool", lastUser: "Go on.", ids: []string{"toolu_02", "toolu_03"}, results: 2, opaque: true, reason: true},
		{last: "assistant", lastUser: "Go on.", opaque: true, reason: true},
	}
	for n := 1; n <= len(anthTurns); n++ {
		key := anthHead + strings.Join(anthKeys[:n], "")
		w := wants[n-1]
		for order := range 3 {
			body := anthBody(n, order)
			v := mustParse(t, body, Messages)
			ids := []string{}
			for _, id := range v.ToolResultIDs {
				ids = append(ids, string(id))
			}
			if w.ids == nil {
				w.ids = []string{}
			}
			got := fmt.Sprintf("model=%s stream=%v tools=%v n=%d last=%s user=%s ids=%v results=%d opaque=%v reason=%v",
				v.Model, v.Stream, v.HasTools, v.Messages, v.LastRole, v.LastUserText, ids, v.ToolResults, v.OpaqueReasoning, v.HasReasoningContent)
			exp := fmt.Sprintf("model=claude-x stream=%v tools=true n=%d last=%s user=%s ids=%v results=%d opaque=%v reason=%v",
				order < 2, n, w.last, w.lastUser, w.ids, w.results, w.opaque, w.reason)
			if got != exp {
				t.Errorf("turn %d order %d:\n got %s\nwant %s", n, order, got, exp)
			}
			if string(v.History) != key {
				t.Errorf("turn %d order %d: history\n got %q\nwant %q", n, order, v.History, key)
			}
			if string(body[v.ModelStart:v.ModelEnd]) != `"claude-x"` {
				t.Errorf("turn %d order %d: model offsets %d:%d", n, order, v.ModelStart, v.ModelEnd)
			}
		}
	}
}

// TestMessagesHistoryPrefix: the key of turn N is a prefix of the key of
// turn N+1 (what the prefix tree routes on), whatever the member order, and
// for a conversation marshalled from Go values (keys sorted: content before
// role, system and tools after the messages) as for hand-written bodies.
func TestMessagesHistoryPrefix(t *testing.T) {
	for order := range 3 {
		var prev []byte
		for n := 1; n <= len(anthTurns); n++ {
			v := mustParse(t, anthBody(n, order), Messages)
			if len(v.History) <= len(prev) || !bytes.HasPrefix(v.History, prev) {
				t.Fatalf("order %d: key %d\n%q\nis not a proper prefix of key %d\n%q", order, n-1, prev, n, v.History)
			}
			prev = append(prev[:0], v.History...)
		}
	}
	var msgs []any
	var prev []byte
	for n, m := range anthTurns {
		var x any
		if err := json.Unmarshal([]byte(m), &x); err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, x)
		body, err := json.Marshal(map[string]any{
			"model": "claude-x", "max_tokens": 64, "messages": msgs, "system": "Be brief. " + strings.Repeat("x", 70<<10),
			"tools": []any{map[string]any{"name": "get_weather", "input_schema": map[string]any{"type": "object"}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		v := mustParse(t, string(body), Messages)
		if !bytes.HasPrefix(v.History, prev) || !bytes.HasPrefix(v.History, []byte("\x01{\"input_schema\":{\"type\":\"object\"},\"name\":\"get_weather\"}\x02\x1eBe brief. x")) {
			t.Fatalf("marshalled turn %d: key %q… does not extend %q…", n, clipKey(v.History, 80), clipKey(prev, 80))
		}
		prev = append(prev[:0], v.History...)
	}
}

func clipKey(b []byte, n int) []byte { return b[:min(len(b), n)] }

func TestMessagesHistoryFormat(t *testing.T) {
	f := func(body, want string) {
		t.Helper()
		if got := history(t, body, Messages); got != want {
			t.Fatalf("body %s\n got %q\nwant %q", body, got, want)
		}
	}
	// System as a string, empty, absent, or with non-text blocks.
	f(`{"system":"S","messages":[{"role":"user","content":"U"}]}`, "\x02\x1eS\x04\x1eU")
	f(`{"system":"","messages":[{"role":"user","content":"U"}]}`, "\x04\x1eU")
	f(`{"system":[{"type":"image"},{"text":"no type"},{"type":"text","text":""}],"messages":[]}`, "\x02\x1e")
	f(`{"system":"S"}`, "\x02\x1eS")
	// Key order inside messages and blocks does not matter; escapes stay raw.
	f(`{"messages":[{"content":[{"input":{"q":"a\"b"},"name":"f","type":"tool_use","id":"t1"}],"role":"assistant"}]}`, "\x05\x1df\x1c{\"q\":\"a\\\"b\"}")
	f(`{"messages":[{"content":[{"is_error":false,"content":"r","tool_use_id":"t1","type":"tool_result"}],"role":"user"}]}`, "\x04\x06\x1er")
	f(`{"messages":[{"role":"user","content":[{"content":[{"text":"a","type":"text"},{"type":"text","text":"b"}],"is_error":true,"type":"tool_result"}]}]}`, "\x04\x0b\x1ea\x1eb")
	// Images, documents, thinking: nothing; image-only: empty key.
	f(`{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AAAA"}},{"type":"document","source":{}}]}]}`, "")
	f(`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"s"}]}]}`, "")
	// Wrong-typed members are ignored; other kinds read no system.
	f(`{"system":5,"messages":[{"role":"user","content":5},{"role":"user","content":[1,{"type":"text","text":3}]}]}`, "")
	if got := history(t, `{"system":"S","messages":[{"role":"user","content":"U"}]}`, Chat); got != "\x04\x1eU" {
		t.Fatalf("chat read system: %q", got)
	}
	// A system larger than the reserve, after the messages.
	big := strings.Repeat("y", 80<<10)
	f(`{"messages":[{"role":"user","content":"U"}],"system":"`+big+`","tools":[{"name":"a"}]}`, "\x01{\"name\":\"a\"}\x02\x1e"+big+"\x04\x1eU")
}

func TestMessagesLocks(t *testing.T) {
	// A tool result after the last assistant message locks; one before does not.
	v := mustParse(t, `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"old"}]},{"role":"assistant","content":"x"},`+
		`{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"user","content":[{"type":"tool_result"},{"type":"tool_result","tool_use_id":"t\u0031"}]}]}`, Messages)
	if len(v.ToolResultIDs) != 1 || string(v.ToolResultIDs[0]) != `t\u0031` || v.ToolResults != 2 || string(v.LastRole) != "tool" || string(v.LastUserText) != "hi" {
		t.Fatalf("ids %q results %d last %q user %q", v.ToolResultIDs, v.ToolResults, v.LastRole, v.LastUserText)
	}
	// Thinking: a signature (or redaction) is opaque, text alone is portable.
	for body, want := range map[string]string{
		`{"type":"thinking","thinking":"t","signature":"s"}`: "true true",
		`{"type":"thinking","thinking":"t","signature":""}`:  "false true",
		`{"type":"thinking","thinking":"","signature":"s"}`:  "true false",
		`{"type":"redacted_thinking","data":"d"}`:            "true false",
		`{"type":"text","text":"t","signature":"s"}`:         "false false",
	} {
		v := mustParse(t, `{"messages":[{"role":"assistant","content":[`+body+`]}]}`, Messages)
		if got := fmt.Sprint(v.OpaqueReasoning, v.HasReasoningContent); got != want {
			t.Errorf("%s: opaque, reasoning = %s, want %s", body, got, want)
		}
	}
	// An invalid tool_use_id (a lock) fails the parse; a bad escape in text does not.
	var w View
	if err := Parse(&w, []byte(`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a\qb"}]}]}`), Messages); !errors.Is(err, ErrMalformed) {
		t.Fatalf("invalid tool_use_id: %v", err)
	}
	if err := Parse(&w, []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a\qb"}]}]}`), Messages); err != nil {
		t.Fatalf("bad escape in text: %v", err)
	}
}

// TestMessagesIdentity: the session-level body ids are read as for chat;
// metadata.user_id is a user-level id after user_id and user, and is read
// for Messages only.
func TestMessagesIdentity(t *testing.T) {
	body := `{"metadata":{"user_id":"meta","other":1},"session_params":{"session_id":"sp"},"session_id":"s","conversation_id":"c","user":"u","messages":[]}`
	v := mustParse(t, body, Messages)
	got := fmt.Sprintf("%s %s %s %q", v.SessionParamsID, v.SessionID, v.ConversationID, v.UserIDs())
	if want := `sp s c ["" "u" "meta"]`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	first := func(ids [3][]byte) string {
		for _, id := range ids {
			if len(id) > 0 {
				return string(id)
			}
		}
		return ""
	}
	for body, want := range map[string]string{
		`{"metadata":{"user_id":"meta"},"user_id":"uid","user":"u"}`: "uid",
		`{"user":"u","metadata":{"user_id":"meta"}}`:                 "u",
		`{"metadata":{"user_id":"meta"}}`:                            "meta",
		`{"metadata":{"user_id":"meta"},"metadata":{"tag":"x"}}`:     "",
		`{"metadata":{"user_id":5}}`:                                 "",
	} {
		if got := first(mustParse(t, body, Messages).UserIDs()); got != want {
			t.Errorf("%s: first user-level id %q, want %q", body, got, want)
		}
	}
	for _, kind := range []Kind{Chat, Responses, Other} {
		if v := mustParse(t, `{"metadata":{"user_id":"meta"}}`, kind); v.MetadataUserID != nil {
			t.Fatalf("%v read metadata.user_id", kind)
		}
	}
	var w View
	if err := Parse(&w, []byte(`{"metadata":{"user_id":"a\qb"}}`), Messages); !errors.Is(err, ErrMalformed) {
		t.Fatalf("invalid metadata.user_id: %v", err)
	}
	if Messages.String() != "messages" {
		t.Fatal(Messages.String())
	}
}

// FuzzMessages: Parse(…, Messages) never panics nor hangs (nor does the
// unvalidated walk); accepts every valid JSON object and only what sonic
// accepts; the interpreted strings it returns are valid; the message count
// and metadata.user_id agree with encoding/json; parsing twice gives the
// same key.
func FuzzMessages(f *testing.F) {
	for n := 1; n <= len(anthTurns); n++ {
		f.Add([]byte(anthBody(n, n%3)))
	}
	for _, s := range []string{`{}`, `{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text","text":"x"}]}]}],"system":[{"type":"text","text":"s"}]}`,
		`{"metadata":{"user_id":"\q"}}`, `{"messages":[{"content":[{"type":"tool_use","input":{"a":[1,{"b":null}]}}]}]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(checkMessages)
}

// TestMessagesMutations runs FuzzMessages' checks on deterministic
// mutations (inserted structure and escapes, deleted and flipped bytes,
// truncations) of a whole conversation, as TestHistoryGolden does for chat.
func TestMessagesMutations(t *testing.T) {
	base := []byte(anthBody(len(anthTurns), 1))
	ins := []string{`\`, `"`, `\"`, `{`, `}`, `[`, `]`, `,`, `:`, " ", "\x01", `\u00e9`, `\q`, `1`, `null`, `"type":"tool_result",`, `{"type":"text","text":"z"},`}
	for _, b := range mutations(base, ins, 99, 2000) {
		checkMessages(t, b)
	}
}

// checkMessages is FuzzMessages' property on one input.
func checkMessages(t *testing.T, data []byte) {
	watchdog := time.AfterFunc(5*time.Second, func() { panic(fmt.Sprintf("FuzzMessages hangs on %q", data)) })
	defer watchdog.Stop()
	var v View
	v.Reset()
	v.parse(data, skipWS(data, 0), Messages)
	err := Parse(&v, data, Messages)
	var m map[string]any
	jerr := json.Unmarshal(data, &m)
	if err != nil {
		if !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v is not ErrMalformed", err)
		}
		if jerr == nil && m != nil && depth(data) <= 4000 {
			t.Fatalf("Parse rejected a valid object: %v: %q", err, data)
		}
		return
	}
	if ok, _ := encoder.Valid(data); !ok || !isByte(data, skipWS(data, 0), '{') {
		t.Fatalf("Parse accepted what sonic rejects: %q", data)
	}
	for _, s := range append([][]byte{v.Model, v.MetadataUserID, v.LastRole, v.SessionID}, v.ToolResultIDs...) {
		if !validString(s) {
			t.Fatalf("Parse accepted an invalid interpreted string %q: %q", s, data)
		}
	}
	key := string(v.History)
	if Parse(&v, data, Messages) != nil || string(v.History) != key {
		t.Fatalf("second parse differs: %q", data)
	}
	if !json.Valid(data) {
		return
	}
	msgs, _ := m["messages"].([]any)
	var uid any
	if md, ok := m["metadata"].(map[string]any); ok {
		uid = md["user_id"]
	}
	if s, ok := uid.(string); v.Messages != len(msgs) || ok != (v.MetadataUserID != nil) || ok && decodeRaw(t, v.MetadataUserID) != s {
		t.Fatalf("messages %d (want %d), metadata.user_id %q (want %v): %q", v.Messages, len(msgs), v.MetadataUserID, uid, data)
	}
}

// Anthropic responses: a whole message and the same as an event stream.
const (
	anthResponse = `{"id":"msg_01","type":"message","role":"assistant","model":"claude-x","content":[{"type":"thinking","thinking":"t","signature":"s"},` +
		`{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_A","name":"get_weather","input":{"city":"Paris","id":"no"}},{"type":"tool_use","id":"toolu_B","name":"add","input":{}}],` +
		`"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":40}}`
	anthStream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-x\"," +
		"\"stop_reason\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":100,\"cache_read_input_tokens\":2000,\"output_tokens\":1}}}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"t\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"s\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
		"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Checking.\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"event: content_block_start\r\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_A\",\"name\":\"get_weather\",\"input\":{}}}\r\n\r\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n" +
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_B\",\"name\":\"add\",\"input\":{}}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":40}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	anthLearned = "id= calls=toolu_A,toolu_B prompt=2125 cached=2000 completion=40 usage=true reasoning=043a7187" // the signature "s"
)

func TestScanResponseMessages(t *testing.T) {
	var l Learned
	if err := ScanResponse(&l, []byte(anthResponse)); err != nil {
		t.Fatal(err)
	}
	if got := learnedString(&l); got != anthLearned || !l.CachedKnown {
		t.Fatalf("got %s known=%v\nwant %s", got, l.CachedKnown, anthLearned)
	}
	// Without the cache fields (vLLM may omit them): cached unknown.
	l.Reset()
	if err := ScanResponse(&l, []byte(`{"id":"msg_2","type":"message","content":[{"type":"text","text":"x"}],"usage":{"input_tokens":7,"output_tokens":2}}`)); err != nil {
		t.Fatal(err)
	}
	if got := learnedString(&l); got != "id= calls= prompt=7 cached=0 completion=2 usage=true" || l.CachedKnown {
		t.Fatalf("got %s known=%v", got, l.CachedKnown)
	}
	// An invalid tool_use id teaches nothing.
	l.Reset()
	if err := ScanResponse(&l, []byte(`{"content":[{"type":"tool_use","id":"a\qb"}]}`)); !errors.Is(err, ErrMalformed) || len(l.ToolCallIDs) != 0 {
		t.Fatalf("invalid id: %v %s", err, learnedString(&l))
	}
}

// TestSSEMessages: the Anthropic event stream, whole, cut at every byte and
// byte by byte, learns what the whole response teaches.
func TestSSEMessages(t *testing.T) {
	checkStream(t, anthStream, anthLearned)
	// The Anthropic API's cumulative message_delta usage agrees.
	checkStream(t, strings.Replace(anthStream, `"usage":{"output_tokens":40}`,
		`"usage":{"input_tokens":25,"cache_creation_input_tokens":100,"cache_read_input_tokens":2000,"output_tokens":40}`, 1), anthLearned)
}

// anthBodyOfSize is an Anthropic agent body of at least size bytes: a 6 KB
// system prompt, the tools, and anthTurns repeated.
func anthBodyOfSize(size int) []byte {
	sys := `"system":"` + strings.Repeat("You are a careful agent. ", 6<<10/25) + `"`
	var turns []string
	for {
		body := `{"model":"claude-x","max_tokens":4096,"stream":true,` + sys + `,` + anthTools + `,"messages":[` + strings.Join(turns, ",") + `]}`
		if len(body) >= size {
			return []byte(body)
		}
		turns = append(turns, anthTurns...)
	}
}

func BenchmarkParseMessages(b *testing.B) {
	body := anthBodyOfSize(64 << 10)
	var v View
	benchOp(b, body, func() error { return Parse(&v, body, Messages) })
	sinkInt += len(v.History)
}

func BenchmarkScanResponseMessages(b *testing.B) {
	body := []byte(anthResponse)
	var l Learned
	benchOp(b, body, func() error {
		l.Reset()
		return ScanResponse(&l, body)
	})
}
