package reqview

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestReasoningID: the request view's id of the last opaque artifact of
// the history, for every kind and shape (docs/design.md §5).
func TestReasoningID(t *testing.T) {
	for _, c := range []struct {
		kind Kind
		body string
		want string // raw string content hashed; "" none
	}{
		{Responses, `{"input":[{"role":"user","content":"hi"},{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA+1/x=="},{"role":"user","content":"more"}]}`, "gAAA+1/x=="},
		{Responses, `{"input":[{"type":"reasoning","encrypted_content":"first"},{"type":"message","role":"assistant","content":"a"},{"encrypted_content":"second","type":"reasoning"}]}`, "second"},
		{Responses, `{"input":[{"type":"reasoning","encrypted_content":"first"},{"type":"reasoning","encrypted_content":""}]}`, "first"},
		{Responses, `{"input":[{"type":"reasoning","encrypted_content":"e\/scaped\u002b"}]}`, `e\/scaped\u002b`},
		{Responses, `{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"t"}]}]}`, ""},
		{Responses, `{"input":"hi"}`, ""},
		{Chat, `{"messages":[{"role":"assistant","content":"a","encrypted_content":"enc"},{"role":"user","content":"u"}]}`, "enc"},
		{Chat, `{"messages":[{"role":"assistant","content":"a","thinking_blocks":[{"signature":"sig1","type":"thinking","thinking":"x"}]}]}`, "sig1"},
		{Chat, `{"messages":[{"role":"assistant","content":"a","reasoning_details":[{"type":"reasoning.encrypted","data":"d1"}]}]}`, "d1"},
		{Chat, `{"messages":[{"role":"assistant","content":"a","reasoning_content":"plain"}]}`, ""},
		{Messages, `{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"signature":"EqQB","type":"thinking","thinking":"t"},{"type":"text","text":"a"}]},{"role":"user","content":"q2"}]}`, "EqQB"},
		{Messages, `{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t","signature":"old"}]},{"role":"assistant","content":[{"type":"redacted_thinking","data":"red"}]}]}`, "red"},
		{Messages, `{"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t"}]}]}`, ""},
	} {
		var v View
		if err := Parse(&v, []byte(c.body), c.kind); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		want := reasoningIDOf([]byte(c.want))
		if v.ReasoningID != want || (!v.ReasoningID.IsZero() && !v.OpaqueReasoning) {
			t.Errorf("%s: id %x opaque %v, want %x (of %q)", c.body, v.ReasoningID, v.OpaqueReasoning, want, c.want)
		}
		// A reused View forgets it.
		if err := Parse(&v, []byte(`{"input":"x","messages":[]}`), c.kind); err != nil || !v.ReasoningID.IsZero() {
			t.Errorf("reused view keeps %x (%v)", v.ReasoningID, err)
		}
	}
}

// echo builds a follow-up request the way an SDK does: it decodes the
// response's items (blocks) and encodes them back with encoding/json.
func echo(t *testing.T, items []json.RawMessage, key, head, tail string) []byte {
	t.Helper()
	var decoded []any
	for _, it := range items {
		var x any
		if err := json.Unmarshal(it, &x); err != nil {
			t.Fatal(err)
		}
		decoded = append(decoded, x)
	}
	b, err := json.Marshal(decoded)
	if err != nil {
		t.Fatal(err)
	}
	if key == "messages" {
		return []byte(`{"model":"m","messages":[` + head + `,{"role":"assistant","content":` + string(b) + `},` + tail + `]}`)
	}
	return []byte(`{"model":"m","input":[` + head + `,` + strings.Trim(string(b), "[]") + `,` + tail + `]}`)
}

// TestReasoningEcho: a request echoing a response's artifact, re-encoded
// by the client, gets the id the response scan learned, whole or streamed.
func TestReasoningEcho(t *testing.T) {
	const enc = "gAAAAABo+9x/Zq3==" // base64 with '+', '/' and '='
	const sig = "EqQBCkgIARABGAIiQL/ab+cd=="
	respItems := []json.RawMessage{
		json.RawMessage(`{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"` + enc + `"}`),
		json.RawMessage(`{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"ok"}]}`),
	}
	whole := `{"id":"resp_1","object":"response","output":[` + string(respItems[0]) + `,` + string(respItems[1]) + `]}`
	stream := "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"item\":{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[]}}\n\n" +
		"event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"item\":" + string(respItems[0]) + "}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":" + whole + "}\n\n"
	blocks := []json.RawMessage{
		json.RawMessage(`{"type":"thinking","thinking":"let me think","signature":"` + sig + `"}`),
		json.RawMessage(`{"type":"text","text":"ok"}`),
	}
	anth := `{"id":"msg_1","type":"message","role":"assistant","content":[` + string(blocks[0]) + `,` + string(blocks[1]) + `]}`
	anthSSE := "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"let me think\"}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"" + sig + "\"}}\n\n" +
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
	redacted := []json.RawMessage{json.RawMessage(`{"type":"redacted_thinking","data":"` + sig + `"}`)}

	for _, c := range []struct {
		name     string
		resp     string
		sse      bool
		kind     Kind
		request  []byte
		wantLast int // index in ReasoningIDs
	}{
		{"responses", whole, false, Responses, echo(t, respItems, "input", `{"role":"user","content":"q"}`, `{"role":"user","content":"q2"}`), 0},
		{"responses stream", stream, true, Responses, echo(t, respItems, "input", `{"role":"user","content":"q"}`, `{"role":"user","content":"q2"}`), 0},
		{"messages", anth, false, Messages, echo(t, blocks, "messages", `{"role":"user","content":"q"}`, `{"role":"user","content":"q2"}`), 0},
		{"messages stream", anthSSE, true, Messages, echo(t, blocks, "messages", `{"role":"user","content":"q"}`, `{"role":"user","content":"q2"}`), 0},
		{"redacted", `{"type":"message","content":` + "[" + string(redacted[0]) + "]}", false, Messages, echo(t, redacted, "messages", `{"role":"user","content":"q"}`, `{"role":"user","content":"q2"}`), 0},
	} {
		var l Learned
		if c.sse {
			var s SSEScanner
			for i := 0; i < len(c.resp); i += 7 { // chunked
				s.Write([]byte(c.resp[i:min(i+7, len(c.resp))]), &l)
			}
		} else if err := ScanResponse(&l, []byte(c.resp)); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(l.ReasoningIDs) != c.wantLast+1 {
			t.Fatalf("%s: learned %d reasoning ids", c.name, len(l.ReasoningIDs))
		}
		var v View
		if err := Parse(&v, c.request, c.kind); err != nil {
			t.Fatalf("%s: %v: %s", c.name, err, c.request)
		}
		if v.ReasoningID.IsZero() || v.ReasoningID != l.ReasoningIDs[c.wantLast] {
			t.Fatalf("%s: request id %x, response ids %x\n%s", c.name, v.ReasoningID, l.ReasoningIDs, c.request)
		}
	}
}

// TestReasoningIDsBounded: a response's reasoning ids are deduplicated and
// bounded.
func TestReasoningIDsBounded(t *testing.T) {
	var sb strings.Builder
	sb.WriteString(`{"output":[`)
	for i := range MaxReasoningIDs + 5 {
		if i > 0 {
			sb.WriteString(",")
		}
		sb.WriteString(`{"type":"reasoning","encrypted_content":"e` + string(rune('a'+i)) + `"},{"type":"reasoning","encrypted_content":"ea"}`)
	}
	sb.WriteString(`]}`)
	var l Learned
	if err := ScanResponse(&l, []byte(sb.String())); err != nil {
		t.Fatal(err)
	}
	if len(l.ReasoningIDs) != MaxReasoningIDs || l.ReasoningIDs[0] != reasoningIDOf([]byte("ea")) || l.ReasoningIDs[1] != reasoningIDOf([]byte("eb")) {
		t.Fatalf("ids %x", l.ReasoningIDs)
	}
}

func TestAllocationReasoning(t *testing.T) {
	body := []byte(`{"model":"m","input":[{"role":"user","content":"q"},{"type":"reasoning","summary":[],"encrypted_content":"` + strings.Repeat("gAAAAB", 500) + `"},{"role":"user","content":"q2"}]}`)
	var v View
	if err := Parse(&v, body, Responses); err != nil || v.ReasoningID.IsZero() {
		t.Fatal(err, v.ReasoningID)
	}
	if n := testing.AllocsPerRun(100, func() { _ = Parse(&v, body, Responses) }); n != 0 {
		t.Fatalf("%v allocs per Parse with a reasoning item", n)
	}
	resp := []byte(`{"id":"resp_1","output":[{"type":"reasoning","summary":[],"encrypted_content":"abc"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`)
	var l Learned
	_ = ScanResponse(&l, resp)
	if n := testing.AllocsPerRun(100, func() { l.Reset(); _ = ScanResponse(&l, resp) }); n != 0 || len(l.ReasoningIDs) != 1 {
		t.Fatalf("%v allocs per ScanResponse with a reasoning item (%d ids)", n, len(l.ReasoningIDs))
	}
}
