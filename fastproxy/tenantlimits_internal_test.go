package fastproxy

import (
	"testing"
	"time"
)

// TestAppendReset: the reset headers are written as time.Duration.String
// writes the duration rounded to the millisecond, which OpenAI's clients
// parse.
func TestAppendReset(t *testing.T) {
	for _, d := range []time.Duration{0, 400 * time.Microsecond, time.Millisecond, 12 * time.Millisecond, 999 * time.Millisecond,
		999600 * time.Microsecond, time.Second, 1500 * time.Millisecond, 23456 * time.Millisecond, 23400 * time.Millisecond,
		20 * time.Second, 59999 * time.Millisecond, time.Minute} {
		want := d.Round(time.Millisecond).String()
		if got := string(appendReset(nil, d)); got != want {
			t.Errorf("%v: %q, want %q", d, got, want)
		}
	}
}

// TestTenantMeter: the tokens of a stream as the client read it, in any
// pieces: its usage when it reports one (chat, Anthropic, Responses),
// else its text events and the request's bytes over 4.
func TestTenantMeter(t *testing.T) {
	const chunk = `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	for _, tc := range []struct {
		name   string
		stream string
		want   int64
	}{
		{"chat without usage", `data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n" +
			chunk + chunk + chunk + `data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\ndata: [DONE]\n\n", 3 + 100},
		{"chat with usage", chunk + chunk + `data: {"id":"c","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2}}` + "\n\ndata: [DONE]\n\n", 42},
		{"anthropic", "event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"usage\":{\"input_tokens\":30,\"cache_read_input_tokens\":20,\"output_tokens\":1}}}\r\n\r\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", 57},
		{"responses", `data: {"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"Hel"}` + "\n\n" +
			`data: {"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"lo"}` + "\n\n", 2 + 100},
		{"responses with usage", `data: {"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"Hel"}` + "\n\n" +
			`data: {"type":"response.completed","response":{"id":"resp_1","object":"response","usage":{"input_tokens":11,"output_tokens":5,"total_tokens":16}}}` + "\n\n", 16},
	} {
		for _, step := range []int{1, 7, len(tc.stream)} {
			m := &tenantMeter{reqBytes: 397}
			for i := 0; i < len(tc.stream); i += step {
				m.write([]byte(tc.stream[i:min(i+step, len(tc.stream))]))
			}
			if got := m.tokens(); got != tc.want {
				t.Errorf("%s in pieces of %d: %d tokens, want %d", tc.name, step, got, tc.want)
			}
		}
	}
}
