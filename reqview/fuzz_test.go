package reqview

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bytedance/sonic/encoder"
)

// seedBodies are the fuzz seeds shared by the fuzz targets (and by
// TestHistoryGolden).
var seedBodies = []string{
	`{}`, `[]`, `{"model":"m","stream":true}`, `{"model":"a\\\"b","user":"x\\"}`,
	`{"mod\u0065l":"m","session_params":{"session_id":"s"},"session_id":"t","conversation_id":"c","user_id":"u","user":"v","previous_response_id":"r"}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"r"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
	`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"},{"type":"reasoning","encrypted_content":"e"}],"instructions":"i","input":"x"}`,
	`{"prompt":["a","b"],"text":"t","reasoning":{"effort":"high"}}`,
	`{"a":"\u12"}`, "{\"a\":\"\x01\"}", `{"a":[1,{"b":"}"}]}`,
	`{"model":"\q"}`, `{"session_id":"a\u00zz"}`, "{\"user\":\"\x1f\"}", `{"m\qodel":"m"}`,
	`{"messages":[{"role":"user","content":"a\qb"},{"role":"tool","tool_call_id":"c\x","content":"\q"}]}`,
	`{"input":[{"type":"function_call_output","call_id":"\u12","output":"\q"}],"instructions":"\q"}`,
}

func fuzzSeeds(f *testing.F) {
	for _, s := range seedBodies {
		f.Add([]byte(s))
	}
	f.Add(fuzzWarmBody)
	// Opaque reasoning artifacts (not in seedBodies: view.golden predates them).
	f.Add([]byte(`{"messages":[{"role":"assistant","content":[{"signature":"s\/1","type":"thinking","thinking":"t"},{"type":"redacted_thinking","data":"d"}],"thinking_blocks":[{"type":"thinking","signature":"x"}],"reasoning_details":[{"type":"reasoning.encrypted","data":"\q"}],"encrypted_content":"e"}]}`))
}

// FuzzParse: (a) Parse never panics (nor does the unvalidated scanner, run
// on the raw input); (b) on a valid JSON object (encoding/json) Parse
// succeeds and its scalar fields agree with a reference decode; (c) whatever
// Parse accepts, sonic's structural validator accepts (content strings are
// not validated: see "Validation"), and it is a JSON object; (d) when Parse
// accepts a body, every interpreted string it returns (model, ids, roles,
// efforts, tool result ids) is valid JSON string content — an invalid one
// makes Parse fail (TestParseValidation checks the offsets); (e) a View
// that parsed other bodies before gives the same result as a fresh one (its
// tools memo).
func FuzzParse(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		watchdog := time.AfterFunc(5*time.Second, func() { panic(fmt.Sprintf("FuzzParse hangs on %q", data)) })
		defer watchdog.Stop()
		var v View
		jvalid := json.Valid(data)
		var m map[string]any
		jerr := json.Unmarshal(data, &m)
		for kind := Chat; kind <= Other; kind++ {
			// The raw scanner must be total on any bytes.
			v.Reset()
			v.parse(data, skipWS(data, 0), kind)

			err := Parse(&v, data, kind)
			if err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("error %v is not ErrMalformed", err)
				}
				var me *MalformedError
				// (sonic may report an offset past the end of a blank body)
				if !errors.As(err, &me) || me.Offset < 0 {
					t.Fatalf("error %v: bad offset for %d bytes", err, len(data))
				}
				if jvalid && jerr == nil && m != nil && depth(data) <= 4000 {
					t.Fatalf("Parse rejected a valid object: %v: %q", err, data)
				}
				continue
			}
			// (c)
			if ok, _ := encoder.Valid(data); !ok {
				t.Fatalf("Parse accepted what sonic rejects: %q", data)
			}
			if i := skipWS(data, 0); !isByte(data, i, '{') {
				t.Fatalf("Parse accepted a non-object: %q", data)
			}
			// (d)
			for _, s := range [][]byte{v.Model, v.SessionParamsID, v.SessionID, v.ConversationID, v.UserID,
				v.User, v.PreviousResponseID, v.ReasoningEffort, v.LastRole} {
				if !validString(s) {
					t.Fatalf("Parse accepted an invalid interpreted string %q: %q", s, data)
				}
			}
			if !v.ReasoningID.IsZero() && !v.OpaqueReasoning {
				t.Fatalf("a reasoning id without opaque reasoning: %q", data)
			}
			for _, s := range v.ToolResultIDs {
				if !validString(s) {
					t.Fatalf("Parse accepted an invalid tool_call_id %q: %q", s, data)
				}
			}
			// (b)
			if !jvalid {
				continue
			}
			if jerr != nil || m == nil {
				t.Fatalf("Parse accepted valid JSON that is not an object (%v): %q", jerr, data)
			}
			checkRef(t, &v, m, kind, data)
		}
		// (e) A View that met a tools array before — the sample seed's,
		// then data's own — parses data as a fresh View does (toolsMemo).
		for kind := Chat; kind <= Other; kind++ {
			var warm, fresh View
			_ = Parse(&warm, fuzzWarmBody, Chat)
			want := viewDigest(&fresh, data, kind)
			if got := viewDigest(&warm, data, kind); got != want {
				t.Fatalf("%v: a View warmed on the sample differs from a fresh one: %q", kind, data)
			}
			if got := viewDigest(&warm, data, kind); got != want {
				t.Fatalf("%v: a View that met data before differs from a fresh one: %q", kind, data)
			}
		}
		// ParseModel keeps and recalls arrays whose structure alone it
		// checked; Parse must not take its tools from those.
		var warm, fresh View
		_ = ParseModel(&warm, fuzzWarmBody)
		for range 2 {
			if got, want := modelDigest(&warm, data), modelDigest(&fresh, data); got != want {
				t.Fatalf("ParseModel: a warmed View reads %s, a fresh one %s: %q", got, want, data)
			}
		}
		var pristine View // fresh has a memo of data's tools by now
		if got, want := viewDigest(&warm, data, Chat), viewDigest(&pristine, data, Chat); got != want {
			t.Fatalf("Parse after ParseModel differs from a fresh Parse: %q", data)
		}
	})
}

// modelDigest is what ParseModel made of body.
func modelDigest(v *View, body []byte) string {
	err := ParseModel(v, body)
	return fmt.Sprintf("%v %q %d:%d %v %d", err, v.Model, v.ModelStart, v.ModelEnd, v.Stream, v.MaxTokens)
}

// fuzzWarmBody is the seed whose tools FuzzParse's warmed Views remember.
var fuzzWarmBody = SampleChatBody(3, 200)

// validString: s is valid JSON string content, by encoding/json.
func validString(s []byte) bool {
	return json.Valid([]byte(`"` + string(s) + `"`))
}

func depth(b []byte) int {
	d, maxd := 0, 0
	for _, c := range b {
		switch c {
		case '{', '[':
			d++
			maxd = max(maxd, d)
		case '}', ']':
			d--
		}
	}
	return maxd
}

func decodeRaw(t *testing.T, raw []byte) string {
	t.Helper()
	var s string
	if err := json.Unmarshal([]byte(`"`+string(raw)+`"`), &s); err != nil {
		t.Fatalf("raw %q does not decode: %v", raw, err)
	}
	return s
}

func checkRef(t *testing.T, v *View, m map[string]any, kind Kind, data []byte) {
	t.Helper()
	str := func(field string, got []byte, want any) {
		t.Helper()
		ws, ok := want.(string)
		if !ok {
			if got != nil {
				t.Fatalf("%s: got %q, reference has %T: %q", field, got, want, data)
			}
			return
		}
		if got == nil || decodeRaw(t, got) != ws {
			t.Fatalf("%s: got %q, want %q: %q", field, got, ws, data)
		}
	}
	str("model", v.Model, m["model"])
	if v.Model != nil && string(data[v.ModelStart:v.ModelEnd]) != `"`+string(v.Model)+`"` {
		t.Fatalf("model offsets %d:%d: %q", v.ModelStart, v.ModelEnd, data)
	}
	if v.Stream != (m["stream"] == true) {
		t.Fatalf("stream %v, reference %v: %q", v.Stream, m["stream"], data)
	}
	var sp any
	if o, ok := m["session_params"].(map[string]any); ok {
		sp = o["session_id"]
	}
	str("session_params.session_id", v.SessionParamsID, sp)
	str("session_id", v.SessionID, m["session_id"])
	str("conversation_id", v.ConversationID, m["conversation_id"])
	str("user_id", v.UserID, m["user_id"])
	str("user", v.User, m["user"])
	str("previous_response_id", v.PreviousResponseID, m["previous_response_id"])
	tools, _ := m["tools"].([]any)
	if v.HasTools != (len(tools) > 0) {
		t.Fatalf("HasTools %v, reference %v: %q", v.HasTools, m["tools"], data)
	}
	want := 0
	switch kind {
	case Chat:
		a, _ := m["messages"].([]any)
		want = len(a)
	case Responses:
		switch in := m["input"].(type) {
		case []any:
			want = len(in)
		case string:
			want = 1
		}
	}
	if v.Messages != want {
		t.Fatalf("Messages %d, reference %d (kind %v): %q", v.Messages, want, kind, data)
	}
	if kind != Chat && kind != Responses && len(v.History) != 0 {
		t.Fatalf("history for kind %v", kind)
	}
}

// FuzzSSE: chunking a stream at random boundaries learns the same as feeding
// it whole; ScanResponse never panics.
func FuzzSSE(f *testing.F) {
	f.Add([]byte(chatStream), uint64(1), uint8(0))
	f.Add([]byte(responsesStream), uint64(2), uint8(40))
	f.Add([]byte(anthStream), uint64(4), uint8(0))
	f.Add([]byte("data: {\"type\":\"response.output_item.done\",\"item\":{\"type\":\"reasoning\",\"encrypted_content\":\"e\\/1\"}}\n\ndata: {\"delta\":{\"type\":\"signature_delta\",\"signature\":\"s\"}}\n\n"), uint64(5), uint8(0))
	f.Add([]byte("data: {\"id\":\"x\"}\r\n\r\ndata: [DONE]\n\n"), uint64(3), uint8(5))
	f.Fuzz(func(t *testing.T, stream []byte, seed uint64, maxLine uint8) {
		var l0 Learned
		_ = ScanResponse(&l0, stream)

		max := int(maxLine) // 0: default
		whole := SSEScanner{MaxLine: max}
		var lw Learned
		whole.Write(stream, &lw)

		r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		chunked := SSEScanner{MaxLine: max}
		var lc Learned
		for rest := stream; len(rest) > 0; {
			n := 1 + r.IntN(len(rest))
			if r.IntN(3) == 0 {
				n = 1 + r.IntN(min(len(rest), 8))
			}
			chunked.Write(rest[:n], &lc)
			rest = rest[n:]
		}
		if a, b := learnedString(&lw), learnedString(&lc); a != b {
			t.Fatalf("whole: %s\nchunked: %s\nstream %q", a, b, stream)
		}
		for _, id := range lw.ToolCallIDs {
			if bytes.Contains(id, []byte{'\n'}) {
				t.Fatalf("id with a newline: %q", id)
			}
		}
	})
}

// FuzzScanUsage: ScanUsage learns the token counts ScanResponse learns from
// every body ScanResponse accepts, accepts every such body, and rejects only
// bodies ScanResponse rejects too.
func FuzzScanUsage(f *testing.F) {
	for _, s := range []string{zeroWorkAnswer, toolCallAnswer, anthResponse,
		`{"id":"resp_1","output":[{"type":"function_call","call_id":"c"}],"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":2},"output_tokens":1}}`,
		`{"response":{"usage":{"prompt_tokens":4}},"message":{"usage":{"output_tokens":2}}}`,
		`{"usage":null,"metadata":{"usage":{"prompt_tokens":9}}}`, `{"id":"x"} x`, `{"a":[1,2}`, `{"id":"\u00zz"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var full, usage Learned
		errFull, errUsage := ScanResponse(&full, body), ScanUsage(&usage, body)
		if errUsage != nil {
			if errFull == nil {
				t.Fatalf("ScanUsage rejects what ScanResponse accepts: %v\n%q", errUsage, body)
			}
			if !errors.Is(errUsage, ErrMalformed) {
				t.Fatalf("ScanUsage: %v", errUsage)
			}
			if usage.HasUsage || usage.PromptTokens != 0 || usage.CachedKnown || usage.CompletionTokens != 0 {
				t.Fatalf("a rejected body taught %s", learnedString(&usage))
			}
			return
		}
		if errFull != nil {
			return // an id or type ScanUsage does not read is invalid
		}
		want := fmt.Sprintf("prompt=%d cached=%d/%v completion=%d usage=%v",
			full.PromptTokens, full.CachedTokens, full.CachedKnown, full.CompletionTokens, full.HasUsage)
		got := fmt.Sprintf("prompt=%d cached=%d/%v completion=%d usage=%v",
			usage.PromptTokens, usage.CachedTokens, usage.CachedKnown, usage.CompletionTokens, usage.HasUsage)
		if got != want || usage.ResponseID != nil || len(usage.ToolCallIDs) != 0 || len(usage.ReasoningIDs) != 0 {
			t.Fatalf("ScanUsage %s (ids %q %q), ScanResponse %s\n%q", got, usage.ResponseID, usage.ToolCallIDs, want, body)
		}
	})
}
