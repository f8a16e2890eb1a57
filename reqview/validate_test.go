package reqview

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/bytedance/sonic/encoder"
)

// verdict is Parse's answer as comparable data: -1 accepted, else the
// offset of the *MalformedError.
func verdict(t *testing.T, err error) int {
	t.Helper()
	if err == nil {
		return -1
	}
	var me *MalformedError
	if !errors.As(err, &me) {
		t.Fatalf("error %v is not a *MalformedError", err)
	}
	return me.Offset
}

// checkAgainstSonic is the differential check of Parse's single validating
// pass (docs/design.md §7) against sonic's validator: Parse rejects what
// sonic rejects, at sonic's offset, and accepts what sonic accepts unless an
// interpreted string is bad (then the offset is that string's raw control
// byte or backslash; see "Validation"). ParseModel answers as Parse(Other).
func checkAgainstSonic(t *testing.T, data []byte) {
	t.Helper()
	ok, soff := encoder.Valid(data)
	object := isByte(data, skipWS(data, 0), '{')
	want := soff // the offset when !ok || !object
	if ok || !object && skipWS(data, 0) < soff {
		want = skipWS(data, 0) // valid JSON, not an object; or the first byte already is no object
	}
	if blank := skipWS(data, 0) == len(data); blank {
		want = len(data) // where a value was due (sonic says one byte before, or 0)
	}
	var v View
	for kind := Chat; kind <= Other; kind++ {
		got := verdict(t, Parse(&v, data, kind))
		switch {
		case !ok || !object:
			if got != want {
				t.Fatalf("kind %v: %q: Parse offset %d, sonic (ok=%v) %d", kind, data, got, ok, soff)
			}
		case got >= 0:
			if got >= len(data) || data[got] != '\\' && data[got] >= 0x20 {
				t.Fatalf("kind %v: Parse rejects %q at %d, which sonic accepts and is no bad string byte", kind, data, got)
			}
		}
	}
	pOther := verdict(t, Parse(&v, data, Other))
	model, ms, me, stream := bytes.Clone(v.Model), v.ModelStart, v.ModelEnd, v.Stream
	if got := verdict(t, ParseModel(&v, data)); got != pOther {
		t.Fatalf("%q: ParseModel %d, Parse(Other) %d", data, got, pOther)
	}
	if !bytes.Equal(v.Model, model) || v.ModelStart != ms || v.ModelEnd != me || v.Stream != stream {
		t.Fatalf("%q: ParseModel read %q %d:%d %v, Parse %q %d:%d %v", data, v.Model, v.ModelStart, v.ModelEnd, v.Stream, model, ms, me, stream)
	}
	// ScanResponse validates in its one walk too (sonic only says where a
	// broken body breaks): it rejects what Parse rejects, at Parse's
	// offset, and then learns nothing; a valid object fails only on a bad
	// interpreted string.
	var l Learned
	got := verdict(t, ScanResponse(&l, data))
	switch {
	case (!ok || !object) && got != want:
		t.Fatalf("%q: ScanResponse offset %d, want %d (sonic: ok=%v at %d)", data, got, want, ok, soff)
	case ok && object && got >= 0 && (got >= len(data) || data[got] != '\\' && data[got] >= 0x20):
		t.Fatalf("ScanResponse rejects %q at %d, which sonic accepts and is no bad string byte", data, got)
	case got >= 0 && (l.ResponseID != nil || len(l.ToolCallIDs) != 0 || len(l.ReasoningIDs) != 0 || l.HasUsage || l.CachedKnown):
		t.Fatalf("ScanResponse rejected %q at %d but learned %+v", data, got, l)
	}
}

// validateSeeds are FuzzValidate's own seeds (also read by
// TestHistoryGolden).
var validateSeeds = []string{
	`{"a":-0.5e+3,"b":[true,false,null,{}],"c":""}`, `{"a":01}`, `{"a":1.}`, `{"a":[1,]}`, `{"a":{"b":1,}}`,
	`{"a":tru}`, `{"a":truex}`, `{"a":-}`, `{"a":1e}`, "{\"a\":1}\x00", "{\"a\":1}\f", `{"a":1} {}`, `{"a" 1}`,
	`{"a":"\"}`, `{"a":[[[[]]]]`, `{"a"::1}`, `{,"a":1}`, `{"a":1,,"b":2}`, `{"messages":[{"role":"user","content":[1,]}]}`,
}

// FuzzValidate: Parse (all kinds) and ParseModel against sonic's validator
// on arbitrary bytes (checkAgainstSonic).
func FuzzValidate(f *testing.F) {
	fuzzSeeds(f)
	for _, s := range validateSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkAgainstSonic(t, data) })
}

// TestValidateDepth: the nesting bound is sonic's (4096, the body's object
// being depth 1), wherever the deep value sits — skipped at the top, or
// inside the messages, parts and tool calls the scanner walks.
func TestValidateDepth(t *testing.T) {
	for _, w := range []struct{ pre, post string }{
		{`{"x":`, `}`},
		{`{"messages":[{"role":"user","content":[{"type":"text","x":`, `}]}]}`},
		{`{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":`, `}}]}]}`},
		{`{"input":[{"type":"function_call","arguments":`, `}]}`},
		{`{"tools":[{"function":{"parameters":`, `}}]}`},
		{`{"tools":[`, `]}`},
		// responses (ScanResponse)
		{`{"choices":[{"message":{"tool_calls":[{"id":"c","function":`, `}]}}]}`},
		{`{"choices":[{"delta":{"thinking_blocks":[{"type":"thinking","x":`, `}]}}]}`},
		{`{"usage":{"prompt_tokens_details":{"x":`, `}}}`},
		{`{"response":{"output":[{"type":"function_call","arguments":`, `}]}}`},
		{`{"message":{"content":[{"type":"tool_use","input":`, `}]}}`},
		{`{"item":{"type":"x","y":`, `}}`},
	} {
		for _, n := range []int{4085, 4089, 4090, 4091, 4092, 4093, 4094, 4095, 4096} {
			body := []byte(w.pre + strings.Repeat("[", n) + strings.Repeat("]", n) + w.post)
			checkAgainstSonic(t, body)
		}
	}
}

func TestValidateCases(t *testing.T) {
	for _, s := range []string{
		``, ` `, `{}`, ` {} `, `{"a":-0.5e+3,"b":[true,false,null,{}],"c":""}`, `{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":[1,]}`,
		`{"a":{"b":1,}}`, `{"a":tru}`, `{"a":truex}`, `{"a":-}`, `{"a":1e}`, `{"a":1E+2}`, "{\"a\":1}\x00", "{\"a\":1}\f", `{"a":1} {}`,
		`{"a" 1}`, `{"a":"\"}`, `{"a":[[[[]]]]`, `{"a"::1}`, `{,"a":1}`, `{"a":1,,"b":2}`, `{"a":[1 2]}`, `{"a":{"b"}}`,
		`{"messages":[{"role":"user","content":[1,]}]}`, `{"messages":[{"role":"user","content":"x"},]}`, `{"model":"m","stream":tru}`,
		`{"tools":[{"function":{"name":"f","parameters":{"a":[1,2,{"b":nul}]}}}]}`, `[]`, `"x"`, `1`, `{"a":"` + "\xff\x01" + `\q"}`,
		"{\"model\":\"m\",\n \"messages\" : [ { \"role\" : \"user\" , \"content\" : \"x\" } ] }",
	} {
		checkAgainstSonic(t, []byte(s))
	}
	checkAgainstSonic(t, SampleChatBodyOfSize(64<<10))
}

// TestParseModelMatchesParse: ParseModel reads what Parse reads, on the
// package's sample and validation bodies.
func TestParseModelMatchesParse(t *testing.T) {
	bodies := []string{
		`{"model":"m","stream":true}`, `{"stream":true,"model":"a","model":1}`, `{"mod\u0065l":"x"}`,
		`{"reasoning_effort":"low","reasoning":{"effort":"\q"}}`, `{"reasoning":{"effort":"\q"},"reasoning_effort":"low"}`,
		`{"session_params":{"effort":"\q","session_id":"s"}}`, `{"session_params":{"session_id":"\q"}}`, `{"user":"\q"}`,
		`{"messages":[{"role":"\q"}],"model":"m"}`, `{"model":"m"}x`, `{"model":"m","x":[1,]}`,
	}
	for _, b := range bodies {
		checkAgainstSonic(t, []byte(b))
	}
	var v View
	body := SampleChatBodyOfSize(16 << 10)
	if err := ParseModel(&v, body); err != nil || string(v.Model) != "sample-model" || !v.Stream || v.History != nil || v.User != nil {
		t.Fatalf("ParseModel: %v %q %v", err, v.Model, v.Stream)
	}
}
