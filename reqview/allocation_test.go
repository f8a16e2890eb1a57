//go:build !race

package reqview

import "testing"

func TestAllocationParse(t *testing.T) {
	bodies := map[string][]byte{
		"chat64KB": SampleChatBodyOfSize(64 << 10),
		"responses": []byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},` +
			`{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"o"}],` +
			`"instructions":"i","tools":[{"type":"function","name":"f"},{"type":"function","name":"e"}],"m\u006fdel":"x"}`),
		"completions": []byte(`{"model":"m","prompt":["once upon a time"]}`),
		"messages":    []byte(anthBody(len(anthTurns), 1)),
	}
	kinds := map[string]Kind{"chat64KB": Chat, "responses": Responses, "completions": Completions, "messages": Messages}
	for name, body := range bodies {
		var v View
		kind := kinds[name]
		if err := Parse(&v, body, kind); err != nil {
			t.Fatal(err)
		}
		n := testing.AllocsPerRun(100, func() {
			if err := Parse(&v, body, kind); err != nil {
				t.Fatal(err)
			}
		})
		if n != 0 {
			t.Fatalf("%s: %v allocs per Parse with a reused View", name, n)
		}
	}
}

func TestAllocationParseModel(t *testing.T) {
	body := SampleChatBodyOfSize(64 << 10)
	var v View
	if err := ParseModel(&v, body); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if err := ParseModel(&v, body); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocs per ParseModel with a reused View", n)
	}
}

func TestAllocationScanResponse(t *testing.T) {
	for _, body := range [][]byte{[]byte(`{"id":"resp_1","output":[{"type":"function_call","call_id":"call_x"}],"choices":[{"message":{"tool_calls":[{"id":"call_y"}]}}],` +
		`"usage":{"input_tokens":300,"input_tokens_details":{"cached_tokens":256},"output_tokens":20}}`), []byte(anthResponse)} {
		var l Learned
		if err := ScanResponse(&l, body); err != nil {
			t.Fatal(err)
		}
		for name, scan := range map[string]func(*Learned, []byte) error{"ScanResponse": ScanResponse, "ScanUsage": ScanUsage} {
			n := testing.AllocsPerRun(100, func() {
				l.Reset()
				if err := scan(&l, body); err != nil {
					t.Fatal(err)
				}
			})
			if n != 0 {
				t.Fatalf("%v allocs per %s with a reused Learned: %.40s", n, name, body)
			}
		}
	}
}

func TestAllocationSSE(t *testing.T) {
	stream := []byte(chatStream + responsesStream + anthStream)
	var s SSEScanner
	var l Learned
	feed := func() {
		s.Reset()
		l.Reset()
		for i := 0; i < len(stream); i += 37 {
			s.Write(stream[i:min(i+37, len(stream))], &l)
		}
	}
	feed()
	if n := testing.AllocsPerRun(100, feed); n != 0 {
		t.Fatalf("%v allocs per chunked stream with a reused scanner", n)
	}
}
