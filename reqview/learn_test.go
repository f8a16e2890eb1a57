package reqview

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func learnedString(l *Learned) string {
	ids := make([]string, len(l.ToolCallIDs))
	for i, id := range l.ToolCallIDs {
		ids[i] = string(id)
	}
	s := fmt.Sprintf("id=%s calls=%s prompt=%d cached=%d completion=%d usage=%v",
		l.ResponseID, strings.Join(ids, ","), l.PromptTokens, l.CachedTokens, l.CompletionTokens, l.HasUsage)
	for _, r := range l.ReasoningIDs {
		s += fmt.Sprintf(" reasoning=%x", r[:4])
	}
	return s
}

func TestScanResponse(t *testing.T) {
	f := func(body, want string) {
		t.Helper()
		var l Learned
		if err := ScanResponse(&l, []byte(body)); err != nil {
			t.Fatalf("ScanResponse(%s): %v", body, err)
		}
		if got := learnedString(&l); got != want {
			t.Fatalf("body %s\n got %s\nwant %s", body, got, want)
		}
	}
	f(`{}`, "id= calls= prompt=0 cached=0 completion=0 usage=false")
	f(`{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
		"usage":{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105,"prompt_tokens_details":{"cached_tokens":64}}}`,
		"id=chatcmpl-1 calls= prompt=100 cached=64 completion=5 usage=true")
	f(`{"choices":[{"message":{"tool_calls":[{"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"id\":\"no\"}"}},{"function":{},"id":"call_b"}]}},
		{"message":{"tool_calls":[{"id":"call_a"}]}}],"id":"chatcmpl-2"}`,
		"id=chatcmpl-2 calls=call_a,call_b prompt=0 cached=0 completion=0 usage=false")
	f(`{"id":"resp_1","object":"response","output":[{"type":"reasoning","id":"rs_1","summary":[]},
		{"type":"function_call","id":"fc_1","call_id":"call_x","name":"f","arguments":"{}"},
		{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"t"}]},
		{"call_id":"call_y","type":"custom_tool_call","input":"x"}],
		"usage":{"input_tokens":300,"input_tokens_details":{"cached_tokens":256},"output_tokens":20,"output_tokens_details":{"reasoning_tokens":5},"total_tokens":320}}`,
		"id=resp_1 calls=call_x,call_y prompt=300 cached=256 completion=20 usage=true")
	// Wrong types and odd numbers are ignored.
	f(`{"id":5,"usage":{"prompt_tokens":1.5,"completion_tokens":-1,"prompt_tokens_details":null},"choices":{"x":1},"output":"x"}`,
		"id= calls= prompt=0 cached=0 completion=0 usage=true")
	f(`{"usage":null,"metadata":{"id":"nested","usage":{"prompt_tokens":9}}}`, "id= calls= prompt=0 cached=0 completion=0 usage=false")
	f(`{"id":"a\"b\\"}`, `id=a\"b\\ calls= prompt=0 cached=0 completion=0 usage=false`)

	var l Learned
	for _, bad := range []string{``, `[]`, `{"id":"x"`, `{"id":"x"} x`} {
		if err := ScanResponse(&l, []byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Fatalf("ScanResponse(%q) = %v", bad, err)
		}
	}
}

// TestScanUsage: the token counts only; keys and structure are validated
// as by ScanResponse, ids and types are not read.
func TestScanUsage(t *testing.T) {
	var l Learned
	if err := ScanUsage(&l, []byte(toolCallAnswer)); err != nil {
		t.Fatal(err)
	}
	if got, want := learnedString(&l), "id= calls= prompt=15000 cached=14800 completion=20 usage=true"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	l.Reset()
	if err := ScanUsage(&l, []byte(`{"id":"\u00zz","usage":{"prompt_tokens":7}}`)); err != nil || l.PromptTokens != 7 {
		t.Fatalf("an id ScanUsage does not read: %v, prompt %d", err, l.PromptTokens)
	}
	for _, bad := range []string{``, `[]`, `{"usage":{"prompt_tokens":7}} x`, `{"u\zsage":{}}`, `{"usage":{"prompt_tokens":7},"x":[}`,
		`{"usage":{"prompt_\u00zztokens":7}}`} {
		l.Reset()
		if err := ScanUsage(&l, []byte(bad)); !errors.Is(err, ErrMalformed) || l.HasUsage || l.PromptTokens != 0 {
			t.Fatalf("ScanUsage(%q) = %v, learned %s", bad, err, learnedString(&l))
		}
	}
}

// TestLearnedOwnsBytes: what Learned keeps survives the body.
func TestLearnedOwnsBytes(t *testing.T) {
	body := []byte(`{"id":"resp_abc","output":[{"type":"function_call","call_id":"call_abc"}]}`)
	var l Learned
	if err := ScanResponse(&l, body); err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 'X'
	}
	if string(l.ResponseID) != "resp_abc" || string(l.ToolCallIDs[0]) != "call_abc" {
		t.Fatalf("learned aliases the body: %s", learnedString(&l))
	}
	l.Reset()
	if l.ResponseID != nil || len(l.ToolCallIDs) != 0 || l.HasUsage {
		t.Fatalf("Reset: %s", learnedString(&l))
	}
}

const chatStream = "data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
	": keep-alive comment\n\n" +
	"data: {\"id\":\"chatcmpl-9\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]}}]}\n\n" +
	"data: {\"id\":\"chatcmpl-9\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"a\\\":\"}}]}}]}\n\n" +
	"data:{\"id\":\"chatcmpl-9\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_2\",\"function\":{\"name\":\"g\"}}]}}]}\r\n\r\n" +
	"data: {\"id\":\"chatcmpl-9\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"usage\":null}\n\n" +
	"data: {\"id\":\"chatcmpl-9\",\"choices\":[],\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":12,\"prompt_tokens_details\":{\"cached_tokens\":512}}}\n\n" +
	"data: [DONE]\n\n"

const responsesStream = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_7\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n" +
	"event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"output_index\":0,\"item\":{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_r1\",\"name\":\"f\",\"arguments\":\"\"}}\n\n" +
	"event: response.function_call_arguments.delta\ndata: {\"type\":\"response.function_call_arguments.delta\",\"item_id\":\"fc_1\",\"delta\":\"{}\"}\n\n" +
	"event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"item\":{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_r1\",\"name\":\"f\",\"arguments\":\"{}\"}}\n\n" +
	"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_7\",\"status\":\"completed\",\"output\":[{\"type\":\"function_call\",\"call_id\":\"call_r1\"},{\"type\":\"function_call\",\"call_id\":\"call_r2\"}],\"usage\":{\"input_tokens\":50,\"input_tokens_details\":{\"cached_tokens\":32},\"output_tokens\":7}}}\n\n"

// checkStream feeds stream to an SSEScanner whole, cut in two at every
// byte, and byte by byte, and checks that each learns want.
func checkStream(t *testing.T, stream, want string) {
	t.Helper()
	var s SSEScanner
	var l Learned
	s.Write([]byte(stream), &l)
	if got := learnedString(&l); got != want {
		t.Fatalf("whole stream\n got %s\nwant %s", got, want)
	}
	for cut := 0; cut <= len(stream); cut++ {
		s.Reset()
		l.Reset()
		s.Write([]byte(stream[:cut]), &l)
		s.Write([]byte(stream[cut:]), &l)
		if got := learnedString(&l); got != want {
			t.Fatalf("cut at %d\n got %s\nwant %s", cut, got, want)
		}
	}
	s.Reset()
	l.Reset()
	for i := 0; i < len(stream); i++ {
		s.Write([]byte{stream[i]}, &l)
	}
	if got := learnedString(&l); got != want {
		t.Fatalf("byte by byte\n got %s\nwant %s", got, want)
	}
}

func TestSSEScanner(t *testing.T) {
	f := func(stream, want string) {
		t.Helper()
		checkStream(t, stream, want)
	}
	f(chatStream, "id=chatcmpl-9 calls=call_1,call_2 prompt=1000 cached=512 completion=12 usage=true")
	f(responsesStream, "id=resp_7 calls=call_r1,call_r2 prompt=50 cached=32 completion=7 usage=true")
	f("data: [DONE]\n\n", "id= calls= prompt=0 cached=0 completion=0 usage=false")
	f("data: {\"id\":\"broken\"\n\ndata: {\"id\":\"ok\"}\n\n", "id=ok calls= prompt=0 cached=0 completion=0 usage=false")
	// An unterminated last line is discarded.
	f("data: {\"id\":\"a\"}\n\ndata: {\"id\":\"b\"}", "id=a calls= prompt=0 cached=0 completion=0 usage=false")
}

func TestSSEScannerLongLine(t *testing.T) {
	long := "data: {\"id\":\"big\",\"pad\":\"" + strings.Repeat("x", 200) + "\"}\n\n"
	stream := long + "data: {\"id\":\"small\"}\n\n" + long
	for _, max := range []int{50, 1000} {
		want := "id=small"
		if max == 1000 {
			want = "id=big" // the last line wins
		}
		for cut := 0; cut <= len(stream); cut += 7 {
			s := SSEScanner{MaxLine: max}
			var l Learned
			s.Write([]byte(stream[:cut]), &l)
			s.Write([]byte(stream[cut:]), &l)
			if got := learnedString(&l); !strings.HasPrefix(got, want+" ") {
				t.Fatalf("max %d cut %d: %s, want %s", max, cut, got, want)
			}
		}
	}
}

// TestCachedKnown: an absent cached_tokens (vLLM without
// --enable-prompt-tokens-details omits prompt_tokens_details) is told from
// a reported 0, for a buffered chat response, a Responses response and the
// final usage chunk of a chat SSE stream; Reset clears it.
func TestCachedKnown(t *testing.T) {
	for _, c := range []struct {
		details string // the *_tokens_details member, "" for none
		known   bool
		cached  int
	}{
		{"", false, 0},
		{`,"%s":{"cached_tokens":0}`, true, 0},
		{`,"%s":{"cached_tokens":5}`, true, 5},
		{`,"%s":{}`, false, 0},
		{`,"%s":null`, false, 0},
		{`,"%s":{"cached_tokens":null}`, false, 0},
		{`,"%s":{"cached_tokens":1.5}`, false, 0},
	} {
		detail := func(name string) string {
			if c.details == "" {
				return ""
			}
			return fmt.Sprintf(c.details, name)
		}
		chat := `{"id":"chatcmpl-1","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],` +
			`"usage":{"prompt_tokens":10,"completion_tokens":2` + detail("prompt_tokens_details") + `}}`
		resp := `{"id":"resp_1","output":[],"usage":{"input_tokens":10,"output_tokens":2` + detail("input_tokens_details") + `}}`
		stream := "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n" +
			"data: {\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2" +
			detail("prompt_tokens_details") + "}}\n\ndata: [DONE]\n\n"
		check := func(what string, l *Learned) {
			t.Helper()
			if !l.HasUsage || l.PromptTokens != 10 || l.CachedKnown != c.known || l.CachedTokens != c.cached {
				t.Fatalf("%s with %q: usage=%v prompt=%d cached=%d known=%v, want cached=%d known=%v",
					what, detail("x"), l.HasUsage, l.PromptTokens, l.CachedTokens, l.CachedKnown, c.cached, c.known)
			}
			l.Reset()
			if l.CachedKnown || l.CachedTokens != 0 {
				t.Fatalf("%s: Reset kept CachedKnown", what)
			}
		}
		var l Learned
		if err := ScanResponse(&l, []byte(chat)); err != nil {
			t.Fatal(err)
		}
		check("chat", &l)
		if err := ScanResponse(&l, []byte(resp)); err != nil {
			t.Fatal(err)
		}
		check("responses", &l)
		var s SSEScanner
		s.Write([]byte(stream), &l)
		check("chat stream", &l)
	}
}
