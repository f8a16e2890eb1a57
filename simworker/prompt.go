package simworker

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"

	"github.com/bytedance/sonic"
)

// api decodes request bodies. CopyString makes every decoded string its own
// copy, so nothing decoded aliases the fasthttp request buffer: stream writers
// run after the handler returns.
var api = sonic.Config{CopyString: true}.Froze()

// Chat template tags. A conversation renders as
//
//	<|tools|>{"name":..,"description":..,"parameters":..}\n   (one per tool, sorted by name)
//	<|system|>text\n
//	<|user|>text\n
//	<|assistant|>text<|tool_call|>name arguments\n
//	<|tool|>result\n
//	<|assistant|>                                         (generation prompt)
//
// so a conversation extended by more turns renders to a prompt that extends
// the previous one: the generation prompt "<|assistant|>" is where the next
// turn's assistant message begins.
const (
	tagTools      = "<|tools|>"
	tagToolCall   = "<|tool_call|>"
	genPrompt     = "<|assistant|>"
	msgTerminator = '\n'
)

type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	Tools               []toolDef      `json:"tools"`
	ToolChoice          any            `json:"tool_choice"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	IgnoreEOS           bool           `json:"ignore_eos"`
	Priority            int            `json:"priority"` // lower first, with Config.SchedulingPolicy "priority"
	// AddGenerationPrompt (vLLM's default: true) and ContinueFinalMessage
	// choose how the prompt ends: with a new assistant turn, with the last
	// message closed, or with the last message open for the model to
	// continue.
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`

	KVTransferParams *kvTransferParams `json:"kv_transfer_params"` // disaggregated prefill/decode (pd.go)
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content"`
	Name       string         `json:"name"`
	ToolCalls  []chatToolCall `json:"tool_calls"`
	ToolCallID string         `json:"tool_call_id"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// toolDef accepts both the Chat Completions shape
// {"type":"function","function":{"name":..}} and the Responses API shape
// {"type":"function","name":..}.
type toolDef struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Function    *struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

func (t *toolDef) normalize() {
	if f := t.Function; f != nil {
		if t.Name == "" {
			t.Name = f.Name
		}
		if t.Description == "" {
			t.Description = f.Description
		}
		if len(t.Parameters) == 0 {
			t.Parameters = f.Parameters
		}
	}
}

// sortTools normalizes the tools and sorts them by name.
func sortTools(tools []toolDef) {
	for i := range tools {
		tools[i].normalize()
	}
	slices.SortStableFunc(tools, func(a, b toolDef) int { return strings.Compare(a.Name, b.Name) })
}

// appendTools renders tools (already sorted) as the template's tool block.
func appendTools(dst []byte, tools []toolDef) []byte {
	for i := range tools {
		t := &tools[i]
		dst = append(dst, tagTools...)
		dst = append(dst, `{"name":`...)
		dst = appendJSONString(dst, t.Name)
		dst = append(dst, `,"description":`...)
		dst = appendJSONString(dst, t.Description)
		dst = append(dst, `,"parameters":`...)
		if len(t.Parameters) == 0 {
			dst = append(dst, "null"...)
		} else {
			var b bytes.Buffer
			if json.Compact(&b, t.Parameters) == nil {
				dst = append(dst, b.Bytes()...)
			} else {
				dst = append(dst, t.Parameters...)
			}
		}
		dst = append(dst, '}', msgTerminator)
	}
	return dst
}

// renderChat renders a chat request as a prompt (tools already sorted).
func renderChat(dst []byte, tools []toolDef, msgs []chatMessage) []byte {
	return append(appendMessages(dst, tools, msgs), genPrompt...)
}

// appendMessages renders tools and messages, each message closed, without
// the generation prompt (add_generation_prompt false).
func appendMessages(dst []byte, tools []toolDef, msgs []chatMessage) []byte {
	dst = appendTools(dst, tools)
	for i := range msgs {
		dst = appendRole(dst, msgs[i].Role)
		dst = append(appendBody(dst, &msgs[i]), msgTerminator)
	}
	return dst
}

// appendBody renders m's content and tool calls.
func appendBody(dst []byte, m *chatMessage) []byte {
	dst = appendContent(dst, m.Content)
	for j := range m.ToolCalls {
		dst = appendToolCall(dst, m.ToolCalls[j].Function.Name, m.ToolCalls[j].Function.Arguments)
	}
	return dst
}

// renderContinue renders a chat request whose last message the model
// continues (continue_final_message): that message is left open, with no
// terminator and no generation prompt, so a final assistant message
// renders as the prompt without it plus its text. body is where the last
// message's content begins.
func renderContinue(tools []toolDef, msgs []chatMessage) (prompt []byte, body int) {
	last := &msgs[len(msgs)-1]
	prompt = appendRole(appendMessages(nil, tools, msgs[:len(msgs)-1]), last.Role)
	return appendBody(prompt, last), len(prompt)
}

func appendRole(dst []byte, role string) []byte {
	dst = append(dst, "<|"...)
	dst = append(dst, role...)
	return append(dst, "|>"...)
}

func appendToolCall(dst []byte, name, args string) []byte {
	dst = append(dst, tagToolCall...)
	dst = append(dst, name...)
	dst = append(dst, ' ')
	return append(dst, args...)
}

// appendContent renders message content: a string, or an array of parts whose
// text (text, input_text, output_text, refusal) is concatenated; other parts
// render as a placeholder of their type.
func appendContent(dst []byte, c any) []byte {
	switch v := c.(type) {
	case string:
		return append(dst, v...)
	case []any:
		for _, p := range v {
			part, ok := p.(map[string]any)
			if !ok {
				continue
			}
			if s, ok := part["text"].(string); ok {
				dst = append(dst, s...)
			} else if s, ok := part["refusal"].(string); ok {
				dst = append(dst, s...)
			} else if typ, ok := part["type"].(string); ok {
				dst = append(dst, "<|"...)
				dst = append(dst, typ...)
				dst = append(dst, "|>"...)
			}
		}
	}
	return dst
}

// renderResponsesInput renders Responses API input (a string or a list of
// items) after dst. It reports the kind of the last item: "user", "tool"
// (function_call_output) or another role.
func renderResponsesInput(dst []byte, input any) ([]byte, string) {
	switch v := input.(type) {
	case string:
		dst = appendRole(dst, "user")
		dst = append(dst, v...)
		return append(dst, msgTerminator), "user"
	case []any:
		last := ""
		for _, it := range v {
			item, ok := it.(map[string]any)
			if !ok {
				continue
			}
			typ, _ := item["type"].(string)
			switch typ {
			case "", "message":
				role, _ := item["role"].(string)
				dst = appendRole(dst, role)
				dst = appendContent(dst, item["content"])
				dst = append(dst, msgTerminator)
				last = role
			case "function_call":
				name, _ := item["name"].(string)
				args, _ := item["arguments"].(string)
				dst = append(dst, genPrompt...)
				dst = appendToolCall(dst, name, args)
				dst = append(dst, msgTerminator)
				last = "assistant"
			case "function_call_output":
				dst = appendRole(dst, "tool")
				switch out := item["output"].(type) {
				case string:
					dst = append(dst, out...)
				default:
					dst = appendContent(dst, out)
				}
				dst = append(dst, msgTerminator)
				last = "tool"
			default:
				// reasoning and other items carry no prompt text here.
			}
		}
		return dst, last
	}
	return dst, ""
}

// toolChoice returns the tool to call, or "" for none: the named tool of a
// forced choice, nothing for "none", else the first tool by name.
func toolChoice(choice any, tools []toolDef) string {
	if len(tools) == 0 {
		return ""
	}
	switch v := choice.(type) {
	case string:
		if v == "none" {
			return ""
		}
	case map[string]any:
		if name, ok := v["name"].(string); ok && name != "" {
			return name
		}
		if f, ok := v["function"].(map[string]any); ok {
			if name, ok := f["name"].(string); ok && name != "" {
				return name
			}
		}
	}
	return tools[0].Name
}

// appendJSONString appends s as a JSON string literal.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// fillerWords are the deterministic output text, one word per token: a
// cycle in which no word ends with the next, so a run of them parses one
// way only.
var fillerWords = [...]string{
	" The", " simulated", " worker", " answers", " with", " filler", " text", " so",
	" that", " routing", " can", " be", " tested", " without", " a", " GPU", ".",
}

// fillerToken returns the text of output token i.
func fillerToken(i int) string { return fillerWords[i%len(fillerWords)] }

// fillerText returns the text of n output tokens.
func fillerText(n int) string { return fillerRun(0, n) }

// fillerRun returns the text of output tokens first … first+n-1.
func fillerRun(first, n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(fillerToken(first + i))
	}
	return b.String()
}

// fillerLen returns the length in bytes of the first k output tokens.
func fillerLen(k int) int {
	n, cycle := 0, 0
	for i, w := range fillerWords {
		if i < k%len(fillerWords) {
			n += len(w)
		}
		cycle += len(w)
	}
	return k/len(fillerWords)*cycle + n
}

// fillerPrefix returns k when s is exactly the first k output tokens (0 for
// an empty s), else -1.
func fillerPrefix(s []byte) int {
	k := 0
	for ; len(s) > 0; k++ {
		w := fillerToken(k)
		if !bytes.HasPrefix(s, []byte(w)) {
			return -1
		}
		s = s[len(w):]
	}
	return k
}

// fillerSuffix returns the largest k such that p ends with the first k
// output tokens (0 when it ends with none). Walking back from each word
// that could end the run, it notes every point where the run reaches
// token 0.
func fillerSuffix(p []byte) int {
	best := 0
	for last := range fillerWords {
		end, c := len(p), 0
		for i := last; bytes.HasSuffix(p[:end], []byte(fillerWords[i])); {
			end -= len(fillerWords[i])
			c++
			if i == 0 {
				best = max(best, c)
				i = len(fillerWords)
			}
			i--
		}
	}
	return best
}
