package simworker

import (
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

	KVTransferParams *kvTransferParams `json:"kv_transfer_params"` // disaggregated prefill/decode (pd.go)
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

	KVTransferParams *kvTransferAnswer `json:"kv_transfer_params,omitempty"` // a prefill leg's (pd.go)
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

// createResponse serves POST /v1/responses.
func (w *Worker) createResponse(ctx *fasthttp.RequestCtx, f faults) {
	var req responsesRequest
	t, ok := w.request(ctx, &req, &req.Model)
	if !ok {
		return
	}
	if req.Input == nil {
		w.badRequest(ctx, "input is required")
		return
	}
	if w.foreignCallID(ctx, t.name, req.Input) {
		return
	}
	sortTools(req.Tools)
	prompt, last, ok := w.responsesPrompt(ctx, &req)
	if !ok {
		return
	}
	j := w.newJob(t, prompt, req.MaxOutputTokens, f)
	if w.tooLong(ctx, j) {
		return
	}
	prefill := w.pdLeg(j, req.KVTransferParams, req.Stream)
	tool := ""
	if last == "user" && !prefill {
		tool = toolChoice(req.ToolChoice, req.Tools)
	}
	g := w.newResponseGen(&req, j, tool)
	if prefill {
		j.holdID = g.obj.ID
	}
	if !req.Stream {
		if !w.runBuffered(ctx, j, g.r, f) {
			return
		}
		g.complete()
		g.obj.KVTransferParams = w.kvAnswer(ctx, j)
		w.writeJSON(ctx, fasthttp.StatusOK, g.obj)
		return
	}
	w.stream(ctx, j, g.streamSpec(), f)
}

// foreignCallID answers 400 and returns true when a function_call_output
// item of input answers a call id not issued for model (foreignToolID).
func (w *Worker) foreignCallID(ctx *fasthttp.RequestCtx, model string, input any) bool {
	items, _ := input.([]any)
	for _, it := range items {
		item, _ := it.(map[string]any)
		if typ, _ := item["type"].(string); typ == "function_call_output" {
			id, _ := item["call_id"].(string)
			if w.foreignToolID(ctx, model, id) {
				return true
			}
		}
	}
	return false
}

// responsesPrompt renders req's prompt: the stored conversation of the
// previous response (or the tools), the instructions, the input and the
// generation prompt; last is the role of the input's last message. False
// when it answered 400 for an unknown previous response.
func (w *Worker) responsesPrompt(ctx *fasthttp.RequestCtx, req *responsesRequest) (prompt []byte, last string, ok bool) {
	if req.PreviousResponseID != "" {
		prev := w.lookupResponse(req.PreviousResponseID)
		if prev == nil {
			w.failParam(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "previous_response_not_found", "previous_response_id",
				"Previous response with id '"+req.PreviousResponseID+"' not found.")
			return nil, "", false
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
	prompt, last = renderResponsesInput(prompt, req.Input)
	return append(prompt, genPrompt...), last, true
}

// responseGen is one generation of the Responses API: the response object
// it builds and, when streamed, the events it numbers.
type responseGen struct {
	w      *Worker
	j      *job
	r      reply
	tool   string // the function called; "" for text
	itemID string // the output item's id
	text   string // the text answered; "" for a tool call
	store  bool   // keep the completed response for GET and continuation
	obj    *responseObject
	seq    int // the next event's sequence_number
}

// newResponseGen plans j's reply (a call of tool when tool != "") and
// builds its response object, in progress.
func (w *Worker) newResponseGen(req *responsesRequest, j *job, tool string) *responseGen {
	g := &responseGen{w: w, j: j, r: w.plan(j, tool), tool: tool, store: req.Store == nil || *req.Store}
	id := w.nextID("resp_")
	if tool != "" {
		g.itemID = w.nextID("fc_")
	} else {
		g.itemID = w.nextID("msg_")
		g.text = fillerText(g.r.completion)
	}
	g.obj = &responseObject{
		ID: id, Object: "response", CreatedAt: time.Now().Unix(), Status: "in_progress", Model: j.model,
		Output: []any{}, ParallelToolCalls: true, ToolChoice: req.ToolChoice, Tools: []any{}, Store: g.store,
	}
	if g.obj.ToolChoice == nil {
		g.obj.ToolChoice = "auto"
	}
	if req.PreviousResponseID != "" {
		g.obj.PreviousResponseID = &req.PreviousResponseID
	}
	if req.Instructions != "" {
		g.obj.Instructions = &req.Instructions
	}
	for i := range req.Tools {
		t := &req.Tools[i]
		g.obj.Tools = append(g.obj.Tools, map[string]any{"type": "function", "name": t.Name, "description": t.Description, "parameters": rawJSON(t.Parameters)})
	}
	return g
}

// item is the output item, in progress or done.
func (g *responseGen) item(done bool) map[string]any {
	status := "in_progress"
	if done {
		status = "completed"
	}
	if g.tool != "" {
		args := ""
		if done {
			args = toolArguments
		}
		return map[string]any{"type": "function_call", "id": g.itemID, "call_id": g.r.toolID, "name": g.tool, "arguments": args, "status": status}
	}
	content := []any{}
	if done {
		content = append(content, outputText(g.text))
	}
	return map[string]any{"type": "message", "id": g.itemID, "status": status, "role": "assistant", "content": content}
}

// complete marks the response completed, with its output and usage, and
// stores it (when asked to) with the conversation through its output.
func (g *responseGen) complete() {
	j, r := g.j, g.r
	g.obj.Status = "completed"
	g.obj.Output = []any{g.item(true)}
	u := &responsesUsage{InputTokens: j.promptTokens, OutputTokens: r.completion, TotalTokens: j.promptTokens + r.completion}
	u.InputTokensDetails.CachedTokens = j.cachedTokens
	g.obj.Usage = u
	if !g.store {
		return
	}
	conv := append([]byte(nil), j.prompt...)
	if g.tool != "" {
		conv = appendToolCall(conv, g.tool, toolArguments)
	} else {
		conv = append(conv, g.text...)
	}
	conv = append(conv, msgTerminator)
	body, err := sonic.Marshal(g.obj)
	if err == nil {
		g.w.storeResponse(g.obj.ID, &storedResponse{body: body, conv: conv})
	}
}

// ev appends the next event, of type typ with fields.
func (g *responseGen) ev(dst []byte, typ string, fields map[string]any) []byte {
	fields["type"] = typ
	fields["sequence_number"] = g.seq
	g.seq++
	return appendEvent(dst, typ, fields)
}

// streamSpec is the generation as Responses API events.
func (g *responseGen) streamSpec() streamSpec {
	r, id := g.r, g.itemID
	return streamSpec{
		units: r.units, completion: r.completion, reason: r.reason, done: g.complete,
		chunk: func(dst []byte, i int) []byte {
			if i == 0 {
				dst = g.ev(dst, "response.created", map[string]any{"response": g.obj})
				dst = g.ev(dst, "response.in_progress", map[string]any{"response": g.obj})
				dst = g.ev(dst, "response.output_item.added", map[string]any{"output_index": 0, "item": g.item(false)})
			}
			if g.tool != "" {
				if i == 1 {
					dst = g.ev(dst, "response.function_call_arguments.delta", map[string]any{"item_id": id, "output_index": 0, "delta": toolArguments})
				}
				return dst
			}
			if i == 0 {
				dst = g.ev(dst, "response.content_part.added", map[string]any{"item_id": id, "output_index": 0, "content_index": 0, "part": outputText("")})
			}
			return g.ev(dst, "response.output_text.delta", map[string]any{"item_id": id, "output_index": 0, "content_index": 0, "delta": fillerToken(i)})
		},
		tail: func(dst []byte) []byte {
			if g.tool != "" {
				dst = g.ev(dst, "response.function_call_arguments.done", map[string]any{"item_id": id, "output_index": 0, "arguments": toolArguments})
			} else {
				dst = g.ev(dst, "response.output_text.done", map[string]any{"item_id": id, "output_index": 0, "content_index": 0, "text": g.text})
				dst = g.ev(dst, "response.content_part.done", map[string]any{"item_id": id, "output_index": 0, "content_index": 0, "part": outputText(g.text)})
			}
			dst = g.ev(dst, "response.output_item.done", map[string]any{"output_index": 0, "item": g.item(true)})
			return g.ev(dst, "response.completed", map[string]any{"response": g.obj})
		},
	}
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
