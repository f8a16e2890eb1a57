package simworker

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// TestMessagesAnthropicSDK drives /v1/messages with the official Anthropic
// Go SDK: plain and streamed messages, a cache hit on the second turn, a
// tool_use round trip and an error.
func TestMessagesAnthropicSDK(t *testing.T) {
	_, url := startWorker(t, Config{StrictToolIDs: true})
	c := anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey("sim"), option.WithMaxRetries(0))
	ctx := context.Background()

	system := []anthropic.TextBlockParam{{Text: strings.Repeat("You are a patient tutor. ", 20)}}
	turn1 := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Explain recursion."))}
	m, err := c.Messages.New(ctx, anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 6, System: system, Messages: turn1})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text != fillerText(6) ||
		m.StopReason != anthropic.StopReasonMaxTokens || m.Usage.OutputTokens != 6 || m.Usage.InputTokens == 0 || m.Usage.CacheReadInputTokens != 0 {
		t.Fatalf("first message: %s", m.RawJSON())
	}
	prompt1 := m.Usage.InputTokens

	// Turn 2, streamed: the SDK accumulates the events into a message.
	turn2 := append(turn1, m.ToParam(), anthropic.NewUserMessage(anthropic.NewTextBlock("Give an example.")))
	s := c.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 1024, System: system, Messages: turn2})
	var acc anthropic.Message
	var types []string
	for s.Next() {
		ev := s.Current()
		types = append(types, ev.Type)
		if err := acc.Accumulate(ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if types[0] != "message_start" || types[len(types)-1] != "message_stop" {
		t.Fatalf("event types %v", types)
	}
	if len(acc.Content) != 1 || acc.Content[0].Text != fillerText(64) || acc.StopReason != anthropic.StopReasonEndTurn || acc.Usage.OutputTokens != 64 {
		t.Fatalf("streamed message: %s", acc.RawJSON())
	}
	if u := acc.Usage; u.CacheReadInputTokens == 0 || u.CacheReadInputTokens > prompt1 || u.CacheReadInputTokens%16 != 0 {
		t.Fatalf("turn 2 should hit turn 1's full blocks (prompt %d): %+v", prompt1, u)
	}

	// Tool use round trip.
	tools := []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "get_weather", Description: anthropic.String("weather"),
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}}}}}
	q := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Weather in Oslo?"))}
	m, err = c.Messages.New(ctx, anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 256, Tools: tools, Messages: q})
	if err != nil {
		t.Fatal(err)
	}
	use := m.Content[0].AsToolUse()
	if m.StopReason != anthropic.StopReasonToolUse || use.Name != "get_weather" || !strings.HasPrefix(use.ID, "toolu_sim-model_") || string(use.Input) != "{}" {
		t.Fatalf("tool use: %s", m.RawJSON())
	}
	q = append(q, m.ToParam(), anthropic.NewUserMessage(anthropic.NewToolResultBlock(use.ID, "cloudy", false)))
	m, err = c.Messages.New(ctx, anthropic.MessageNewParams{Model: "sim-model", MaxTokens: 256, Tools: tools, Messages: q})
	if err != nil {
		t.Fatal(err)
	}
	if m.StopReason != anthropic.StopReasonEndTurn || m.Content[0].Type != "text" {
		t.Fatalf("after the tool result: %s", m.RawJSON())
	}

	// Errors reach the SDK as *anthropic.Error with the status.
	_, err = c.Messages.New(ctx, anthropic.MessageNewParams{Model: "no-such-model", MaxTokens: 4, Messages: turn1})
	var apiErr *anthropic.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || !strings.Contains(apiErr.Error(), "not_found_error") {
		t.Fatalf("unknown model: %v", err)
	}
}
