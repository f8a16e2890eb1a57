package fastproxy_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
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
