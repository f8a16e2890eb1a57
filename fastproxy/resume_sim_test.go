package fastproxy_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/v2/option"
)

// simPair starts a simulated worker that cuts every stream after five
// chunks and one that does not, behind a round-robin router (of two
// requests, one at least is cut and continued), and returns the router and
// the URL of the worker that does not cut.
func simPair(t *testing.T) (*testRouter, string) {
	t.Helper()
	cfg := fastSim()
	cfg.MaxTokens = 24
	cutting := cfg
	cutting.DefaultFaults = "cut=5"
	_, a := startSims(t, 1, cutting)
	_, b := startSims(t, 1, cfg)
	return startRouter(t, []string{a[0], b[0]}, "round_robin", nil), b[0]
}

// streamTexts sends body to path at each of urls and returns the texts
// the client read (the SSE events' text fields) and their usage.
func streamTexts(t *testing.T, path, body string, urls ...string) (texts []string, usage []map[string]float64) {
	t.Helper()
	texts, usage = make([]string, len(urls)), make([]map[string]float64, len(urls))
	for i, u := range urls {
		resp, raw := do(t, "POST", u+path, body, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, raw)
		}
		var sb strings.Builder
		for _, ev := range strings.Split(string(raw), "\n\n") {
			data, ok := strings.CutPrefix(strings.TrimSpace(ev), "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var c struct {
				Error   any
				Choices []struct {
					Text  string
					Delta struct{ Content string }
				}
				Usage *struct {
					PromptTokens     float64 `json:"prompt_tokens"`
					CompletionTokens float64 `json:"completion_tokens"`
					TotalTokens      float64 `json:"total_tokens"`
				}
			}
			if err := json.Unmarshal([]byte(data), &c); err != nil || c.Error != nil {
				t.Fatalf("event %q (%v)", data, err)
			}
			for _, ch := range c.Choices {
				sb.WriteString(ch.Text + ch.Delta.Content)
			}
			if u := c.Usage; u != nil {
				usage[i] = map[string]float64{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens, "total_tokens": u.TotalTokens}
			}
		}
		texts[i] = sb.String()
	}
	return texts, usage
}

// TestSimulatedCutsContinueIdentically: on simulated workers that continue
// an answer as vLLM does, a chat or completions stream cut after five
// chunks and continued elsewhere reads exactly as the uninterrupted one,
// with the same usage.
func TestSimulatedCutsContinueIdentically(t *testing.T) {
	for path, body := range map[string]string{
		"/v1/chat/completions": `{"model":"m","stream":true,"max_tokens":20,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"tell me more"}]}`,
		"/v1/completions":      `{"model":"m","stream":true,"stream_options":{"include_usage":true},"prompt":"Once upon a time"}`,
	} {
		t.Run(path, func(t *testing.T) {
			r, whole := simPair(t)
			texts, usage := streamTexts(t, path, body, whole, r.url, r.url)
			for i := 1; i < len(texts); i++ {
				if texts[i] != texts[0] || texts[0] == "" {
					t.Fatalf("through the router %q, uninterrupted %q", texts[i], texts[0])
				}
				for _, k := range []string{"prompt_tokens", "completion_tokens", "total_tokens"} {
					if usage[i][k] != usage[0][k] || usage[0][k] == 0 {
						t.Fatalf("usage %v, uninterrupted %v", usage[i], usage[0])
					}
				}
			}
			if n := r.counter(`vllm_router_stream_resumes_total{outcome="resumed"}`); n == 0 {
				t.Fatal("no stream was continued")
			}
			waitIdle(t, r.reg)
		})
	}
}

// TestAnthropicSDKSeesOneMessageAcrossACut: the Anthropic Go SDK's
// accumulator gets one well-formed message across a cut: one
// message_start, one text block with the uninterrupted text, the output
// tokens of the whole answer, one message_stop.
func TestAnthropicSDKSeesOneMessageAcrossACut(t *testing.T) {
	r, whole := simPair(t)
	var got [3]anthropic.Message
	for i, u := range []string{whole, r.url, r.url} {
		c := anthropic.NewClient(anthropicopt.WithBaseURL(u), anthropicopt.WithAPIKey("unused"), anthropicopt.WithMaxRetries(0))
		s := c.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "m", MaxTokens: 20,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("tell me more"))}})
		starts, stops := 0, 0
		for s.Next() {
			ev := s.Current()
			switch ev.Type {
			case "message_start":
				starts++
			case "message_stop":
				stops++
			}
			if err := got[i].Accumulate(ev); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Err(); err != nil || starts != 1 || stops != 1 {
			t.Fatalf("err %v, %d message_start, %d message_stop", err, starts, stops)
		}
	}
	b := got[0]
	for _, a := range got[1:] {
		if len(a.Content) != 1 || len(b.Content) != 1 || a.Content[0].Text != b.Content[0].Text || a.Usage.OutputTokens != 20 ||
			b.Usage.OutputTokens != 20 || a.StopReason != b.StopReason || a.Usage.InputTokens != b.Usage.InputTokens {
			t.Fatalf("through the router %s\nuninterrupted %s", a.RawJSON(), b.RawJSON())
		}
	}
	if n := r.counter(`vllm_router_stream_resumes_total{outcome="resumed"}`); n == 0 {
		t.Fatal("no stream was continued")
	}
	waitIdle(t, r.reg)
}

// TestOperatorPageCountsCutStreams: the operator's page shows the cut
// streams and what became of them.
func TestOperatorPageCountsCutStreams(t *testing.T) {
	r, _ := simPair(t)
	streamTexts(t, "/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"go on"}]}`, r.url, r.url)
	resp, page := do(t, "GET", r.adminURL(t)+"/ui", "", nil)
	resumed := r.counter(`vllm_router_stream_resumes_total{outcome="resumed"}`)
	want := `<tr><td class="n">` + strconv.FormatUint(resumed, 10) + `</td><td class="n">` + strconv.FormatUint(resumed, 10) + `</td><td class="n">0</td><td class="n">0</td></tr>`
	if resp.StatusCode != 200 || resumed == 0 || !strings.Contains(string(page), want) {
		t.Fatalf("%d streams continued; the page:\n%s", resumed, page)
	}
}
