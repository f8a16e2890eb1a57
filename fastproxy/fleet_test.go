package fastproxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/warmroute/warmroute/route"
)

// TestAnthropicConversationStaysOnItsWorker: a multi-turn Anthropic
// Messages conversation without any session id, sent with the official SDK
// (plain and streamed turns), stays on the worker that holds its history
// and hits that worker's prefix cache (docs/design.md §8.4).
func TestAnthropicConversationStaysOnItsWorker(t *testing.T) {
	cfg := fastSim()
	cfg.MaxTokens = 16
	_, urls := startSims(t, 4, cfg)
	r := startRouter(t, urls, "cache_aware", nil)
	var workers, decisions []string
	c := anthropic.NewClient(option.WithBaseURL(r.url), option.WithAPIKey("unused"), option.WithMaxRetries(0),
		option.WithMiddleware(func(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			resp, err := next(req)
			if err == nil {
				workers = append(workers, resp.Header.Get("x-vllm-router-worker"))
				decisions = append(decisions, resp.Header.Get("x-vllm-router-decision"))
			}
			return resp, err
		}))
	ctx := context.Background()
	system := []anthropic.TextBlockParam{{Text: strings.Repeat("You are a travel agent with tools for flights and hotels. ", 40)}}
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Find me a flight to Oslo on Friday."))}
	var cached []int64
	for turn := 0; turn < 4; turn++ {
		p := anthropic.MessageNewParams{Model: "m", MaxTokens: 16, System: system, Messages: msgs}
		var m anthropic.Message
		if turn%2 == 0 {
			got, err := c.Messages.New(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			m = *got
		} else {
			s := c.Messages.NewStreaming(ctx, p)
			for s.Next() {
				if err := m.Accumulate(s.Current()); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Err(); err != nil {
				t.Fatal(err)
			}
		}
		cached = append(cached, m.Usage.CacheReadInputTokens)
		msgs = append(msgs, m.ToParam(), anthropic.NewUserMessage(anthropic.NewTextBlock("And a hotel near the station, turn "+string(rune('a'+turn)))))
	}
	for i := 1; i < len(workers); i++ {
		if workers[i] != workers[0] {
			t.Fatalf("turn %d moved from %s to %s (decisions %v)", i, workers[0], workers[i], decisions)
		}
		if decisions[i] == route.LowMatchMinLoad || decisions[i] == route.NoTreeRandom {
			t.Fatalf("turn %d decided without its history: %v", i, decisions)
		}
		if cached[i] == 0 {
			t.Fatalf("turn %d found nothing in the prefix cache: %v", i, cached)
		}
	}
}

// TestLoRAAdapterRoutableWhenTheLoadCallAnswers: an adapter loaded through
// the router's fleet-wide admin call is routable as soon as the call
// answers 200, and an unloaded one is not (docs/design.md §8.4).
func TestLoRAAdapterRoutableWhenTheLoadCallAnswers(t *testing.T) {
	_, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	admin := r.adminURL(t)
	chat := func() int {
		resp, _ := do(t, "POST", r.url+chatPath, chatBody("support-bot", "hello", false), nil)
		return resp.StatusCode
	}
	if code := chat(); code != http.StatusNotFound {
		t.Fatalf("before loading: %d, want 404", code)
	}
	if resp, body := do(t, "POST", admin+"/v1/load_lora_adapter", `{"lora_name":"support-bot","lora_path":"/adapters/support"}`, nil); resp.StatusCode != 200 {
		t.Fatalf("load: %d %s", resp.StatusCode, body)
	}
	if code := chat(); code != http.StatusOK {
		t.Fatalf("right after the load call: %d, want 200", code)
	}
	if resp, body := do(t, "POST", admin+"/v1/unload_lora_adapter", `{"lora_name":"support-bot"}`, nil); resp.StatusCode != 200 {
		t.Fatalf("unload: %d %s", resp.StatusCode, body)
	}
	if code := chat(); code != http.StatusNotFound {
		t.Fatalf("right after the unload call: %d, want 404", code)
	}
}
