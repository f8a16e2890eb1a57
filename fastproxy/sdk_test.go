package fastproxy_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
)

// TestOfficialOpenAIGoSDK proves that an unmodified OpenAI client works
// through the router, streaming and not, errors included.
func TestOfficialOpenAIGoSDK(t *testing.T) {
	_, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	var raw *http.Response
	client := openai.NewClient(
		option.WithBaseURL(r.url+"/v1/"),
		option.WithAPIKey("unused"),
		option.WithHeader("X-Session-ID", "sdk-session"),
		option.WithMaxRetries(0),
		option.WithResponseInto(&raw),
	)
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:     "m",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(strings.Repeat("You are a terse assistant. ", 20)), openai.UserMessage("hello")},
		MaxTokens: param.NewOpt[int64](8),
	}
	resp, err := client.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Usage.PromptTokens == 0 {
		t.Fatalf("unexpected completion: %+v", resp)
	}
	first := raw.Header.Get("x-vllm-router-worker")

	params.Messages = append(params.Messages, openai.AssistantMessage(resp.Choices[0].Message.Content), openai.UserMessage("more"))
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: param.NewOpt(true)}
	stream := client.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if chunks < 2 || acc.Choices[0].Message.Content == "" {
		t.Fatalf("stream: %d chunks, content %q", chunks, acc.Choices[0].Message.Content)
	}
	if acc.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatal("turn 2 of the session reported no cached tokens: it did not reach turn 1's worker")
	}
	if raw.Header.Get("x-vllm-router-worker") != first || raw.Header.Get("x-vllm-router-decision") != "session_id_match" {
		t.Fatalf("turn 2 went to %s (%s), turn 1 to %s", raw.Header.Get("x-vllm-router-worker"), raw.Header.Get("x-vllm-router-decision"), first)
	}

	_, err = client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "absent", Messages: params.Messages})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model through the SDK: %v", err)
	}
}

// TestOfficialAnthropicGoSDKWithClientKey: Anthropic's SDK, which sends
// its key as x-api-key, passes a router with client keys, streaming and
// not, and reads the tenant's rate-limit headers; a wrong key is a 401
// the SDK reports as an authentication error; with the OpenAI SDK the
// same key works as a bearer token.
func TestOfficialAnthropicGoSDKWithClientKey(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "cache_aware", func(c *fastproxy.Config, _ *loadview.Config) {
		c.ClientAPIKeys = []string{"claude:sk-ant-router-key rpm=100"}
	})
	var raw *http.Response
	client := anthropic.NewClient(anthropicopt.WithBaseURL(r.url), anthropicopt.WithAPIKey("sk-ant-router-key"),
		anthropicopt.WithMaxRetries(0), anthropicopt.WithResponseInto(&raw))
	ctx := context.Background()
	params := anthropic.MessageNewParams{Model: "m", MaxTokens: 8,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hello"))}}
	m, err := client.Messages.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Content) == 0 || m.Usage.OutputTokens == 0 {
		t.Fatalf("unexpected message: %+v", m)
	}
	if raw.Header.Get("x-ratelimit-limit-requests") != "100" || raw.Header.Get("x-ratelimit-remaining-requests") != "99" {
		t.Fatalf("rate-limit headers: %v", raw.Header)
	}
	stream := client.Messages.NewStreaming(ctx, params)
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil || len(acc.Content) == 0 {
		t.Fatalf("stream: %v %+v", err, acc)
	}

	wrong := anthropic.NewClient(anthropicopt.WithBaseURL(r.url), anthropicopt.WithAPIKey("sk-ant-wrong"), anthropicopt.WithMaxRetries(0))
	_, err = wrong.Messages.New(ctx, params)
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || !strings.Contains(apiErr.RawJSON(), "authentication_error") {
		t.Fatalf("a wrong key through the SDK: %v", err)
	}

	oc := openai.NewClient(option.WithBaseURL(r.url+"/v1/"), option.WithAPIKey("sk-ant-router-key"), option.WithMaxRetries(0))
	if _, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "m", MaxTokens: param.NewOpt[int64](4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}); err != nil {
		t.Fatalf("the key as a bearer token: %v", err)
	}
}
