package simworker

import (
	"bufio"
	"strconv"
	"time"

	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"
)

// The Responses API keeps state on the worker that created a response:
// previous_response_id only resolves on that worker, which models the
// non-portable provider state that pins a session to a worker.

type responsesRequest struct {
	Model              string    `json:"model"`
	Input              any       `json:"input"`
	Instructions       string    `json:"instructions"`
	PreviousResponseID string    `json:"previous_response_id"`
	Tools              []toolDef `json:"tools"`
	ToolChoice         any       `json:"tool_choice"`
	Stream             bool      `json:"stream"`
	MaxOutputTokens    *int      `json:"max_output_tokens"`
	Store              *bool     `json:"store"`
}

// storedResponse is a completed response kept for GET and continuation.
type storedResponse struct {
	body []byte // the response object as JSON
	conv []byte // the rendered conversation through this response's output
}

type responseObject struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	CreatedAt          int64           `json:"created_at"`
	Status             string          `json:"status"`
	Model              string          `json:"model"`
	Output             []any           `json:"output"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Instructions       *string         `json:"instructions"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	ToolChoice         any             `json:"tool_choice"`
	Tools              []any           `json:"tools"`
	Store              bool            `json:"store"`
	Error              any             `json:"error"`
	IncompleteDetails  any             `json:"incomplete_details"`
	Usage              *responsesUsage `json:"usage"`
}

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

func (w *Worker) createResponse(ctx *fasthttp.RequestCtx, f faults) {
	var req responsesRequest
	if !w.decode(ctx, &req) {
		return
	}
	t, ok := w.model(ctx, req.Model)
	if !ok {
		return
	}
	model := t.name
	if req.Input == nil {
		w.badRequest(ctx, "input is required")
		return
	}
	if items, ok := req.Input.([]any); ok {
		for _, it := range items {
			item, _ := it.(map[string]any)
			if typ, _ := item["type"].(string); typ == "function_call_output" {
				id, _ := item["call_id"].(string)
				if w.foreignToolID(ctx, model, id) {
					return
				}
			}
		}
	}
	sortTools(req.Tools)

	var prompt []byte
	if req.PreviousResponseID != "" {
		prev := w.lookupResponse(req.PreviousResponseID)
		if prev == nil {
			w.failParam(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "previous_response_not_found", "previous_response_id",
				"Previous response with id '"+req.PreviousResponseID+"' not found.")
			return
		}
		prompt = append(prompt, prev.conv...)
	} else {
		prompt = appendTools(prompt, req.Tools)
	}
	if req.Instructions != "" {
		prompt = appendRole(prompt, "system")
		prompt = append(prompt, req.Instructions...)
		prompt = append(prompt, msgTerminator)
	}
	prompt, last := renderResponsesInput(prompt, req.Input)
	prompt = append(prompt, genPrompt...)

	j := w.newJob(t, prompt, req.MaxOutputTokens, f)
	if w.tooLong(ctx, j) {
		return
	}
	tool := ""
	if last == "user" {
		tool = toolChoice(req.ToolChoice, req.Tools)
	}
	r := w.plan(j, tool)
	id := w.nextID("resp_")
	itemID := "msg_"
	if tool != "" {
		itemID = "fc_"
	}
	itemID = w.nextID(itemID)
	store := req.Store == nil || *req.Store

	obj := &responseObject{
		ID: id, Object: "response", CreatedAt: time.Now().Unix(), Status: "in_progress", Model: model,
		Output: []any{}, ParallelToolCalls: true, ToolChoice: req.ToolChoice, Tools: []any{}, Store: store,
	}
	if obj.ToolChoice == nil {
		obj.ToolChoice = "auto"
	}
	if req.PreviousResponseID != "" {
		obj.PreviousResponseID = &req.PreviousResponseID
	}
	if req.Instructions != "" {
		obj.Instructions = &req.Instructions
	}
	for i := range req.Tools {
		t := &req.Tools[i]
		obj.Tools = append(obj.Tools, map[string]any{"type": "function", "name": t.Name, "description": t.Description, "parameters": rawJSON(t.Parameters)})
	}
	text := ""
	if tool == "" {
		text = fillerText(r.completion)
	}
	item := func(done bool) map[string]any {
		status := "in_progress"
		if done {
			status = "completed"
		}
		if tool != "" {
			args := ""
			if done {
				args = toolArguments
			}
			return map[string]any{"type": "function_call", "id": itemID, "call_id": r.toolID, "name": tool, "arguments": args, "status": status}
		}
		content := []any{}
		if done {
			content = append(content, outputText(text))
		}
		return map[string]any{"type": "message", "id": itemID, "status": status, "role": "assistant", "content": content}
	}
	// complete marks obj completed and stores it (when asked to).
	complete := func() {
		w.finish(j.ms, r.completion, r.reason)
		obj.Status = "completed"
		obj.Output = []any{item(true)}
		u := &responsesUsage{InputTokens: j.promptTokens, OutputTokens: r.completion, TotalTokens: j.promptTokens + r.completion}
		u.InputTokensDetails.CachedTokens = j.cachedTokens
		obj.Usage = u
		if !store {
			return
		}
		conv := append([]byte(nil), prompt...)
		if tool != "" {
			conv = appendToolCall(conv, tool, toolArguments)
		} else {
			conv = append(conv, text...)
		}
		conv = append(conv, msgTerminator)
		body, err := sonic.Marshal(obj)
		if err == nil {
			w.storeResponse(id, &storedResponse{body: body, conv: conv})
		}
	}

	if !req.Stream {
		if !w.runBuffered(ctx, j, r.units, f) {
			return
		}
		complete()
		w.writeJSON(ctx, fasthttp.StatusOK, obj)
		return
	}

	seq := 0
	ev := func(dst []byte, typ string, fields map[string]any) []byte {
		fields["type"] = typ
		fields["sequence_number"] = seq
		seq++
		return appendEvent(dst, typ, fields)
	}
	spec := streamSpec{
		units: r.units, completion: r.completion, reason: r.reason, done: complete,
		chunk: func(dst []byte, i int) []byte {
			if i == 0 {
				dst = ev(dst, "response.created", map[string]any{"response": obj})
				dst = ev(dst, "response.in_progress", map[string]any{"response": obj})
				dst = ev(dst, "response.output_item.added", map[string]any{"output_index": 0, "item": item(false)})
			}
			if tool != "" {
				if i == 1 {
					dst = ev(dst, "response.function_call_arguments.delta", map[string]any{"item_id": itemID, "output_index": 0, "delta": toolArguments})
				}
				return dst
			}
			if i == 0 {
				dst = ev(dst, "response.content_part.added", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "part": outputText("")})
			}
			return ev(dst, "response.output_text.delta", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "delta": fillerToken(i)})
		},
		tail: func(dst []byte) []byte {
			if tool != "" {
				dst = ev(dst, "response.function_call_arguments.done", map[string]any{"item_id": itemID, "output_index": 0, "arguments": toolArguments})
			} else {
				dst = ev(dst, "response.output_text.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "text": text})
				dst = ev(dst, "response.content_part.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "part": outputText(text)})
			}
			dst = ev(dst, "response.output_item.done", map[string]any{"output_index": 0, "item": item(true)})
			return ev(dst, "response.completed", map[string]any{"response": obj})
		},
	}
	drop := f.drop || w.chance(w.cfg.DropRate)
	w.startStream(ctx, drop, func(bw *bufio.Writer, flush func() error) { w.runStream(bw, flush, j, spec) })
}

func outputText(s string) map[string]any {
	return map[string]any{"type": "output_text", "text": s, "annotations": []any{}}
}

// rawJSON keeps raw JSON bytes as they are when marshalled (null when empty).
type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("null"), nil
	}
	return r, nil
}

// appendEvent appends one SSE event: an optional "event:" line, then
// "data: <JSON of v>".
func appendEvent(dst []byte, event string, v any) []byte {
	if event != "" {
		dst = append(dst, "event: "...)
		dst = append(dst, event...)
		dst = append(dst, '\n')
	}
	b, err := sonic.Marshal(v)
	if err != nil {
		b = []byte(`{"error":` + strconv.Quote(err.Error()) + `}`)
	}
	dst = append(dst, "data: "...)
	dst = append(dst, b...)
	return append(dst, "\n\n"...)
}

func (w *Worker) failParam(ctx *fasthttp.RequestCtx, status int, typ, code, param, msg string) {
	w.errs.Add(1)
	e := apiError{Error: apiErrorBody{Message: msg, Type: typ, Code: &code, Param: &param}}
	w.writeJSON(ctx, status, &e)
}

func (w *Worker) lookupResponse(id string) *storedResponse {
	w.respMu.Lock()
	defer w.respMu.Unlock()
	return w.responses[id]
}

// storeResponse keeps r under id, evicting the oldest stored responses
// beyond MaxStoredResponses.
func (w *Worker) storeResponse(id string, r *storedResponse) {
	w.respMu.Lock()
	defer w.respMu.Unlock()
	for len(w.responses) >= w.cfg.MaxStoredResponses && len(w.respOrder) > 0 {
		delete(w.responses, w.respOrder[0])
		w.respOrder = w.respOrder[1:]
	}
	w.responses[id] = r
	w.respOrder = append(w.respOrder, id)
	if len(w.respOrder) > 2*w.cfg.MaxStoredResponses {
		// Drop the ids of deleted responses.
		kept := make([]string, 0, len(w.responses))
		for _, k := range w.respOrder {
			if _, ok := w.responses[k]; ok {
				kept = append(kept, k)
			}
		}
		w.respOrder = kept
	}
}

func (w *Worker) deleteResponse(id string) bool {
	w.respMu.Lock()
	defer w.respMu.Unlock()
	_, ok := w.responses[id]
	delete(w.responses, id)
	return ok
}

// responseByID serves GET and DELETE /v1/responses/{id}.
func (w *Worker) responseByID(ctx *fasthttp.RequestCtx, id string) {
	notFound := func() {
		w.fail(ctx, fasthttp.StatusNotFound, "invalid_request_error", "not_found", "No response found with id '"+id+"'.")
	}
	switch {
	case ctx.IsGet():
		r := w.lookupResponse(id)
		if r == nil {
			notFound()
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(r.body)
	case ctx.IsDelete():
		if !w.deleteResponse(id) {
			notFound()
			return
		}
		w.writeJSON(ctx, fasthttp.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
	default:
		ctx.Response.Header.Set("Allow", "GET, DELETE")
		w.fail(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use GET or DELETE")
	}
}
