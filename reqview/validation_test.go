package reqview

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// badOffset is where the first bad byte of body sits: the marker `\q` (a
// bad escape), `\u12"` (a truncated \u) or a raw control byte \x01.
func badOffset(body string) int {
	off := -1
	for _, m := range []string{`\q`, `\u12"`, "\x01"} {
		if k := strings.Index(body, m); k >= 0 && (off < 0 || k < off) {
			off = k
		}
	}
	return off
}

// TestParseValidation: the strings the router interprets are validated,
// content strings are only delimited (see "Validation" in the package
// documentation).
func TestParseValidation(t *testing.T) {
	reject := func(body string, kind Kind) {
		t.Helper()
		var v View
		err := Parse(&v, []byte(body), kind)
		var me *MalformedError
		if !errors.Is(err, ErrMalformed) || !errors.As(err, &me) {
			t.Fatalf("Parse(%q, %v) = %v, want a *MalformedError", body, kind, err)
		}
		if want := badOffset(body); me.Offset != want {
			t.Fatalf("Parse(%q, %v): offset %d, want %d", body, kind, me.Offset, want)
		}
		if v.Model != nil || v.Messages != 0 || len(v.History) != 0 || v.User != nil {
			t.Fatalf("Parse(%q) failed but left %+v", body, v)
		}
	}
	for _, bad := range []string{`\q`, `a\qb`, `\u12"`, `x\u12"`, "a\x01", `\u00e9\q`, `\\\q`} {
		bad = strings.TrimSuffix(bad, `"`) // the closing quote is the body's
		s := `"` + bad + `"`
		for _, body := range []string{
			`{"model":` + s + `}`,
			`{"stream":true,"model":"ok","model":` + s + `}`,
			`{"session_params":{"session_id":` + s + `}}`,
			`{"session_id":` + s + `}`,
			`{"conversation_id":` + s + `}`,
			`{"user_id":` + s + `}`,
			`{"user":` + s + `}`,
			`{"previous_response_id":` + s + `}`,
			`{"reasoning_effort":` + s + `}`,
			`{"reasoning":{"effort":` + s + `}}`,
			// Keys, at the top and in walked objects.
			`{` + s + `:1}`,
			`{"model":"m","stream":true,` + s + `:1}`,
		} {
			for kind := Chat; kind <= Other; kind++ {
				reject(body, kind)
			}
		}
		for _, body := range []string{
			`{"messages":[{` + s + `:"user","content":"x"}]}`,
			`{"messages":[{"role":"user","content":[{"type":"text",` + s + `:"a"}]}]}`,
			`{"messages":[{"role":` + s + `,"content":"x"}]}`,
			`{"messages":[{"role":"user","content":[{"type":` + s + `,"text":"a"}]}]}`,
			`{"messages":[{"role":"assistant","content":[{"type":` + s + `,"signature":"s"}]}]}`,
			`{"messages":[{"role":"tool","tool_call_id":` + s + `,"content":"r"}]}`,
			`{"messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"name":` + s + `,"arguments":"{}"}}]}]}`,
			`{"messages":[{"role":"assistant","tool_calls":[{"function":{` + s + `:"f"}}]}]}`,
			`{"tools":[{"type":"function","function":{"name":` + s + `}}]}`,
			`{"tools":[{"type":"function","name":` + s + `}]}`,
		} {
			reject(body, Chat)
		}
		for _, body := range []string{
			`{"input":[{"role":` + s + `,"content":"x"}]}`,
			`{"input":[{"type":` + s + `}]}`,
			`{"input":[{"type":"function_call","call_id":` + s + `,"name":"f","arguments":"{}"}]}`,
			`{"input":[{"type":"function_call","call_id":"c","name":` + s + `,"arguments":"{}"}]}`,
			`{"input":[{"type":"function_call_output","call_id":` + s + `,"output":"o"}]}`,
			`{"input":[{"role":"user","content":[{"type":` + s + `,"text":"a"}]}]}`,
			`{"tools":[{"type":"function","name":` + s + `}],"input":"x"}`,
		} {
			reject(body, Responses)
		}
	}
	// The first offending byte is reported, whatever the walk order
	// (tool calls before the role are walked after it).
	reject(`{"user":"\q","model":"`+"\x01"+`"}`, Chat)
	reject(`{"messages":[{"tool_calls":[{"function":{"name":"\q"}}],"role":"`+"\x01"+`"}]}`, Chat)
	// A bad content string before it is not an error.
	body := `{"messages":[{"role":"user","content":"a\q"},{"role":"` + "\x01" + `"}]}`
	var me *MalformedError
	if err := Parse(new(View), []byte(body), Chat); !errors.As(err, &me) || me.Offset != strings.Index(body, "\x01") {
		t.Fatalf("Parse(%q) = %v", body, err)
	}

	accept := func(body string, kind Kind, history string) {
		t.Helper()
		var v View
		if err := Parse(&v, []byte(body), kind); err != nil {
			t.Fatalf("Parse(%q, %v): %v", body, kind, err)
		}
		if history != "-" && string(v.History) != history {
			t.Fatalf("Parse(%q, %v): history %q, want %q", body, kind, v.History, history)
		}
	}
	// Content strings: forwarded raw, for the worker to reject.
	accept(`{"model":"m","messages":[{"role":"user","content":"a\qb`+"\x01"+`c\u12"}]}`, Chat, "\x04\x1ea\\qb\x01c\\u12")
	accept(`{"messages":[{"role":"user","content":[{"type":"text","text":"\q"}]}]}`, Chat, "\x04\x1e\\q")
	accept(`{"messages":[{"role":"assistant","tool_calls":[{"id":"\q","function":{"name":"f","arguments":"{\q}"}}]}]}`, Chat, "\x05\x1df\x1c{\\q}")
	accept(`{"messages":[{"role":"assistant","content":"x","reasoning_content":"\q","encrypted_content":"\q"}]}`, Chat, "\x05\x1ex")
	accept(`{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"\q","signature":"\q"}]}]}`, Chat, "")
	accept(`{"tools":[{"type":"function","function":{"name":"f","description":"\q","parameters":{"\q":"`+"\x01"+`"}}}]}`, Chat, "-")
	accept(`{"metadata":{"\q":"\q"},"model":{"x":"\q"},"stream_options":{"include_usage":"\q"},"x":["\q"]}`, Chat, "")
	accept(`{"instructions":"\q","input":"\q"}`, Responses, "\x08\x1e\\q\x04\x1e\\q")
	accept(`{"input":[{"type":"function_call_output","call_id":"c","output":"\q"}]}`, Responses, "\x06\x1e\\q")
	accept(`{"prompt":"\q","text":"\q"}`, Completions, "")
	accept(`{"prompt":["\q"]}`, Completions, "")
	// Members not read for the kind are not interpreted.
	accept(`{"messages":[{"role":"\q"}],"input":[{"type":"\q"}],"prompt":"\q"}`, Other, "")
	accept(`{"input":[{"type":"\q"}]}`, Chat, "")
	accept(`{"messages":[{"role":"\q"}]}`, Responses, "")
}

// TestHistoryPrefixBadContent: a conversation whose content strings hold bad
// escapes and raw control bytes is accepted turn after turn, and each key is
// a prefix of the next.
func TestHistoryPrefixBadContent(t *testing.T) {
	msgs := []string{
		`{"role":"system","content":"sys \q prompt \u12"}`,
		`{"role":"user","content":"what \x is ` + "\x01\x1e\x04" + ` this?"}`,
		`{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{\"a\":\q}"}}]}`,
		`{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"r \u00zz"}]}`,
		`{"role":"assistant","content":"done \q"}`,
		`{"role":"user","content":"more"}`,
	}
	tools := `"tools":[{"type":"function","function":{"name":"f","description":"\q"}}]`
	var prev []byte
	for n := 1; n <= len(msgs); n++ {
		body := `{"model":"m",` + tools + `,"messages":[` + strings.Join(msgs[:n], ",") + `]}`
		var v View
		if err := Parse(&v, []byte(body), Chat); err != nil {
			t.Fatalf("turn %d: %v", n, err)
		}
		if v.Messages != n || !bytes.HasPrefix(v.History, prev) {
			t.Fatalf("turn %d: messages %d, key\n%q\nis not a prefix of\n%q", n, v.Messages, prev, v.History)
		}
		prev = append(prev[:0], v.History...)
	}
	if !bytes.Contains(prev, []byte(`sys \q prompt \u12`)) || !bytes.HasSuffix(prev, []byte("\x04\x1emore")) {
		t.Fatalf("key %q", prev)
	}
}

func TestBadAt(t *testing.T) {
	f := func(s string, want int) {
		t.Helper()
		if got := badAt([]byte(s)); got != want {
			t.Fatalf("badAt(%q) = %d, want %d", s, got, want)
		}
		if validStr([]byte(s)) != (want < 0) {
			t.Fatalf("validStr(%q)", s)
		}
	}
	f(``, -1)
	f(`plain`, -1)
	f(`\" \\ \/ \b \f \n \r \t \u00e9 \uABCD \uabcd`, -1)
	f("naïve 日本語 🙂 \x7f \xff", -1)
	f(`\`, 0)
	f(`a\`, 1)
	f(`\q`, 0)
	f(`\u`, 0)
	f(`\u123`, 0)
	f(`ab\u12g4`, 2)
	f(`\\\`, 2)
	f("\x00", 0)
	f("\x1f", 0)
	f(" \x20", -1)
	// Every position, around the 8- and 32-byte steps.
	for n := 0; n < 80; n++ {
		for k := 0; k < n; k++ {
			for _, c := range []byte{0x00, 0x01, 0x1f, '\\'} {
				s := bytes.Repeat([]byte{'a'}, n)
				for j := range s {
					s[j] = "a\x80é~ "[j%5] // some bytes >= 0x80 and around 0x20
				}
				s[k] = c // a control byte, or a backslash before a bad escape or the end
				if got := badAt(s); got != k {
					t.Fatalf("badAt(%q) = %d, want %d", s, got, k)
				}
				if got := special(s); got != k {
					t.Fatalf("special(%q) = %d, want %d", s, got, k)
				}
			}
		}
	}
}

func TestScanResponseValidation(t *testing.T) {
	var l Learned
	good := `{"id":"resp_1","output":[{"type":"function_call","call_id":"call_1"}],"usage":{"input_tokens":3}}`
	if err := ScanResponse(&l, []byte(good)); err != nil {
		t.Fatal(err)
	}
	want := learnedString(&l)
	for _, body := range []string{
		`{"id":"r\q"}`,
		`{"id":"r2","usage":{"input_tokens":9},"output":[{"type":"function_call","call_id":"c\q"}]}`,
		`{"id":"r2","output":[{"type":"function_call","call_id":"c2"},{"type":"x\u12"}]}`,
		`{"id":"r2","choices":[{"message":{"tool_calls":[{"id":"c2"},{"id":"c3` + "\x01" + `"}]}}]}`,
		`{"id":"r2","usage":{"prompt_tokens":9,"pr\qompt":1}}`,
		`{"response":{"id":"r2","output":[{"type":"function_call","call_id":"c2"}]},"\q":1}`,
	} {
		err := ScanResponse(&l, []byte(body))
		var me *MalformedError
		if !errors.As(err, &me) || me.Offset != badOffset(body) {
			t.Fatalf("ScanResponse(%q) = %v, want offset %d", body, err, badOffset(body))
		}
		if got := learnedString(&l); got != want {
			t.Fatalf("ScanResponse(%q) failed but changed l:\n got %s\nwant %s", body, got, want)
		}
	}
	// Content is not validated.
	if err := ScanResponse(&l, []byte(`{"id":"resp_1","choices":[{"message":{"content":"\q","tool_calls":[{"id":"call_2","function":{"arguments":"\q"}}]}}],"metadata":{"\q":"\q"}}`)); err != nil {
		t.Fatal(err)
	}
	if got := learnedString(&l); got != "id=resp_1 calls=call_1,call_2 prompt=3 cached=0 completion=0 usage=true" {
		t.Fatal(got)
	}
	// A streamed event with an invalid id teaches nothing; the others do.
	stream := "data: {\"id\":\"a\",\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c1\"}]}}]}\n\n" +
		"data: {\"id\":\"b\",\"usage\":{\"prompt_tokens\":5},\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c\\q\"}]}}]}\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"\\q\",\"tool_calls\":[{\"id\":\"c2\"}]}}]}\n\n"
	var s SSEScanner
	var ls Learned
	s.Write([]byte(stream), &ls)
	if got := learnedString(&ls); got != "id=a calls=c1,c2 prompt=0 cached=0 completion=0 usage=false" {
		t.Fatal(got)
	}
}

// TestStrEnd: strEnd against a byte-by-byte reference, on strings dense in
// quotes and backslashes, at every length and alignment.
func TestStrEnd(t *testing.T) {
	ref := func(b []byte, i int) int {
		for ; i < len(b); i++ {
			switch b[i] {
			case '\\':
				i++
			case '"':
				return i
			}
		}
		return -1
	}
	r := uint64(1)
	for n := 0; n < 20000; n++ {
		r ^= r << 13
		r ^= r >> 7
		r ^= r << 17
		l := int(r % 70)
		b := make([]byte, 0, l+4)
		b = append(b, "x:\""[:1+int(r>>8)%3]...) // the opening quote at 0, 1 or 2
		start := len(b)
		b[start-1] = '"'
		x := r
		for k := 0; k < l; k++ {
			x = x*6364136223846793005 + 1442695040888963407
			switch x >> 61 {
			case 0, 1:
				b = append(b, '\\')
			case 2:
				b = append(b, '"')
			default:
				b = append(b, "ab\x01é"[x>>40&3])
			}
		}
		if got, want := strEnd(b, start), ref(b, start); got != want {
			t.Fatalf("strEnd(%q, %d) = %d, want %d", b, start, got, want)
		}
	}
}
