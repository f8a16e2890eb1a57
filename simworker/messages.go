package simworker

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
)

// The Anthropic Messages API as vLLM serves it (POST /v1/messages;
// docs/design.md §6): the chat engine, prefix cache, faults and metrics,
// with Anthropic's request, response, SSE and error shapes.

// messagesPath is the route of the Messages API; errors on it take the
// Anthropic shape (fail).
const messagesPath = "/v1/messages"

type messagesRequest struct {
	Model      string             `json:"model"`
	MaxTokens  *int               `json:"max_tokens"`
	Messages   []anthropicMessage `json:"messages"`
	System     any                `json:"system"`
	Tools      []anthropicTool    `json:"tools"`
	ToolChoice any                `json:"tool_choice"`
	Stream     bool               `json:"stream"`
	Metadata   map[string]any     `json:"metadata"`
}

type anthropicMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// anthropicUsage counts input_tokens without the cached ones: the prompt is
// input_tokens + cache_read_input_tokens + cache_creation_input_tokens.
type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
	OutputTokens             int `json:"output_tokens"`
}

type anthropicMessageOut struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []any          `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

type anthropicErrorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// anthropicError is the Anthropic error body for an HTTP status.
func anthropicError(status int, msg string) *anthropicErrorBody {
	e := &anthropicErrorBody{Type: "error"}
	e.Error.Message = msg
	switch status {
	case fasthttp.StatusBadRequest, fasthttp.StatusMethodNotAllowed:
		e.Error.Type = "invalid_request_error"
	case fasthttp.StatusUnauthorized:
		e.Error.Type = "authentication_error"
	case fasthttp.StatusForbidden:
		e.Error.Type = "permission_error"
	case fasthttp.StatusNotFound:
		e.Error.Type = "not_found_error"
	case fasthttp.StatusRequestEntityTooLarge:
		e.Error.Type = "request_too_large"
	case fasthttp.StatusTooManyRequests:
		e.Error.Type = "rate_limit_error"
	case fasthttp.StatusServiceUnavailable, 529:
		e.Error.Type = "overloaded_error"
	case fasthttp.StatusGatewayTimeout:
		e.Error.Type = "timeout_error"
	default:
		e.Error.Type = "api_error"
	}
	return e
}

// anthropicToolID returns a new tool_use id for model:
// toolu_<model>_<tag>_<n>; StrictToolIDs accepts exactly the ids with the
// prefix toolu_<model>_ in tool_result blocks.
func (w *Worker) anthropicToolID(model string) string { return w.nextID("toolu_" + model + "_") }

// stopReason maps a finish reason to Anthropic's stop_reason.
func stopReason(reason string) string {
	switch reason {
	case "tool_calls":
		return "tool_use"
	case "length":
		return "max_tokens"
	}
	return "end_turn"
}

// renderMessages renders a Messages request as a prompt in the chat
// template (prompt.go), so a conversation extended by more turns renders to
// a prompt that extends the previous one. A tool_use block renders as a
// chat tool call, a tool_result block as "<|tool_result|>" and its content;
// thinking blocks carry no prompt text. A final assistant message is
// continued, as the Messages API does: it is left open, without terminator
// and generation prompt, and body is where its content begins (else -1).
// It reports whether the last message is a user turn without tool results,
// and an error text for a malformed message.
func renderMessages(tools []toolDef, system any, msgs []anthropicMessage) (prompt []byte, userTurn bool, body int, bad string) {
	prompt = appendTools(prompt, tools)
	switch s := system.(type) {
	case nil:
	case string, []any: // an empty system prompt renders as none
		n := len(prompt)
		prompt = appendRole(prompt, "system")
		if m := len(prompt); len(appendContent(prompt, s)) == m {
			prompt = prompt[:n]
		} else {
			prompt = append(appendContent(prompt[:m], s), msgTerminator)
		}
	default:
		return nil, false, -1, "system: must be a string or a list of text blocks"
	}
	for i := range msgs {
		m := &msgs[i]
		if m.Role != "user" && m.Role != "assistant" {
			return nil, false, -1, "messages." + strconv.Itoa(i) + ".role: must be user or assistant"
		}
		prompt = appendRole(prompt, m.Role)
		body = len(prompt)
		results := false
		switch c := m.Content.(type) {
		case string:
			prompt = append(prompt, c...)
		case []any:
			for _, b := range c {
				block, ok := b.(map[string]any)
				if !ok {
					return nil, false, -1, "messages." + strconv.Itoa(i) + ".content: blocks must be objects"
				}
				switch typ, _ := block["type"].(string); typ {
				case "tool_use":
					name, _ := block["name"].(string)
					prompt = appendToolCall(prompt, name, compactJSON(block["input"]))
				case "tool_result":
					results = true
					prompt = append(prompt, "<|tool_result|>"...)
					if s, ok := block["content"].(string); ok {
						prompt = append(prompt, s...)
					} else {
						prompt = appendContent(prompt, block["content"])
					}
				case "thinking", "redacted_thinking":
				default:
					prompt = appendContent(prompt, []any{block})
				}
			}
		default:
			return nil, false, -1, "messages." + strconv.Itoa(i) + ".content: must be a string or a list of blocks"
		}
		if i == len(msgs)-1 && m.Role == "assistant" {
			return prompt, false, body, ""
		}
		prompt = append(prompt, msgTerminator)
		userTurn = m.Role == "user" && !results
	}
	return append(prompt, genPrompt...), userTurn, -1, ""
}

// compactJSON renders a decoded JSON value compactly ("{}" for none).
func compactJSON(v any) string {
	if v == nil {
		return "{}"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// anthropicToolChoice returns the tool to call, or "" for none: the named
// tool of {"type":"tool"}, nothing for {"type":"none"}, else the first tool
// by name (auto, any, or no choice).
func anthropicToolChoice(choice any, tools []toolDef) string {
	if len(tools) == 0 {
		return ""
	}
	if c, ok := choice.(map[string]any); ok {
		switch c["type"] {
		case "none":
			return ""
		case "tool":
			if name, ok := c["name"].(string); ok && name != "" {
				return name
			}
		}
	}
	return tools[0].Name
}

// messages serves POST /v1/messages. max_tokens is required, as in the
// Anthropic API; a limit at or above Config.MaxTokens lets the reply end
// naturally after Config.MaxTokens tokens (stop_reason end_turn), a lower
// one cuts it (max_tokens). A final assistant message made of the first k
// output tokens is continued from token k on (resume), both limits counted
// from there.
func (w *Worker) messages(ctx *fasthttp.RequestCtx, f faults) {
	var req messagesRequest
	t, ok := w.request(ctx, &req, &req.Model)
	if !ok {
		return
	}
	model := t.name
	if msg := w.messagesRequestError(&req, model); msg != "" {
		w.badRequest(ctx, msg)
		return
	}
	tools := make([]toolDef, len(req.Tools))
	for i, tl := range req.Tools {
		tools[i] = toolDef{Type: "function", Name: tl.Name, Description: tl.Description, Parameters: tl.InputSchema}
	}
	sortTools(tools)
	prompt, userTurn, body, bad := renderMessages(tools, req.System, req.Messages)
	if bad != "" {
		w.badRequest(ctx, bad)
		return
	}
	j := w.newJob(t, prompt, req.MaxTokens, f)
	if body >= 0 {
		w.resume(j, fillerPrefix(prompt[body:]))
	}
	if w.tooLong(ctx, j) {
		return
	}
	if rest := max(w.cfg.MaxTokens-j.first, 0); j.maxTokens >= rest { // the reply ends by itself first
		j.maxTokens, j.explicitMax = rest, false
	}
	tool := ""
	if userTurn {
		tool = anthropicToolChoice(req.ToolChoice, tools)
	}
	g := &messageGen{j: j, r: w.plan(j, tool), model: model}
	if tool != "" {
		g.r.toolID = w.anthropicToolID(model)
	}
	g.id, g.stop = w.nextID("msg_"), stopReason(g.r.reason)
	if !req.Stream {
		if !w.runBuffered(ctx, j, g.r, f) {
			return
		}
		w.writeJSON(ctx, fasthttp.StatusOK, g.message())
		return
	}
	w.stream(ctx, j, g.streamSpec(), f)
}

// messagesRequestError is the 400 message for what req lacks (max_tokens,
// messages) or for a tool result whose tool_use_id was not issued for model
// when StrictToolIDs is set; "" when there is none.
func (w *Worker) messagesRequestError(req *messagesRequest, model string) string {
	switch {
	case req.MaxTokens == nil:
		return "max_tokens: Field required"
	case *req.MaxTokens < 1:
		return "max_tokens: must be at least 1"
	case len(req.Messages) == 0:
		return "messages: must not be empty"
	case !w.cfg.StrictToolIDs:
		return ""
	}
	for i := range req.Messages {
		blocks, _ := req.Messages[i].Content.([]any)
		for _, b := range blocks {
			block, _ := b.(map[string]any)
			if typ, _ := block["type"].(string); typ == "tool_result" {
				id, _ := block["tool_use_id"].(string)
				if !strings.HasPrefix(id, "toolu_"+model+"_") {
					return "tool_use_id " + strconv.Quote(id) + " was not issued by model " + model
				}
			}
		}
	}
	return ""
}

// messageGen is one generation of the Messages API.
type messageGen struct {
	j         *job
	r         reply
	id, model string
	stop      string // stop_reason
}

// usage is the generation's usage; the cache hit is known after prefill.
func (g *messageGen) usage() anthropicUsage {
	return anthropicUsage{InputTokens: g.j.promptTokens - g.j.cachedTokens, CacheReadInputTokens: g.j.cachedTokens, OutputTokens: g.r.completion}
}

// message is the whole answer of a buffered generation.
func (g *messageGen) message() *anthropicMessageOut {
	var block map[string]any
	if g.r.toolName != "" {
		block = map[string]any{"type": "tool_use", "id": g.r.toolID, "name": g.r.toolName, "input": rawJSON(toolArguments)}
	} else {
		block = map[string]any{"type": "text", "text": fillerRun(g.r.first, g.r.completion)}
	}
	return &anthropicMessageOut{
		ID: g.id, Type: "message", Role: "assistant", Model: g.model,
		Content: []any{block}, StopReason: &g.stop, Usage: g.usage(),
	}
}

// streamSpec is the generation as Messages API events.
func (g *messageGen) streamSpec() streamSpec {
	const deltaHead = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":"
	r := g.r
	return streamSpec{
		units: r.units, completion: r.completion, reason: r.reason,
		chunk: func(dst []byte, i int) []byte {
			if i == 0 { // after prefill: the cache hit is known
				dst = g.appendStart(dst)
				if r.toolName != "" {
					return dst // the arguments follow in the next step
				}
			}
			dst = append(dst, deltaHead...)
			if r.toolName != "" {
				dst = append(dst, `{"type":"input_json_delta","partial_json":`...)
				dst = appendJSONString(dst, toolArguments)
			} else {
				dst = append(dst, `{"type":"text_delta","text":`...)
				dst = appendJSONString(dst, fillerToken(r.first+i))
			}
			return append(dst, "}}\n\n"...)
		},
		tail: func(dst []byte) []byte {
			dst = append(dst, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"...)
			dst = appendEvent(dst, "message_delta", map[string]any{
				"type":  "message_delta",
				"delta": map[string]any{"stop_reason": g.stop, "stop_sequence": nil},
				"usage": g.usage(),
			})
			return append(dst, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"...)
		},
	}
}

// appendStart appends the events that open the stream: message_start,
// content_block_start and a ping.
func (g *messageGen) appendStart(dst []byte) []byte {
	u := g.usage()
	u.OutputTokens = 1
	dst = appendEvent(dst, "message_start", map[string]any{"type": "message_start", "message": &anthropicMessageOut{
		ID: g.id, Type: "message", Role: "assistant", Model: g.model, Content: []any{}, Usage: u,
	}})
	cb := map[string]any{"type": "text", "text": ""}
	if g.r.toolName != "" {
		cb = map[string]any{"type": "tool_use", "id": g.r.toolID, "name": g.r.toolName, "input": map[string]any{}}
	}
	dst = appendEvent(dst, "content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": cb})
	return append(dst, "event: ping\ndata: {\"type\":\"ping\"}\n\n"...)
}

// isMessagesPath reports whether path is the Messages API route.
func isMessagesPath(path []byte) bool { return bytes.Equal(path, []byte(messagesPath)) }
