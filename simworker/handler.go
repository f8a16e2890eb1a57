package simworker

import (
	"bufio"
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"
)

// FaultHeader is the request header that injects faults into one request: a
// comma-separated list of
//
//	error        answer 500
//	unavailable  answer 503
//	drop         close the connection: after the first streamed chunk, or
//	             without any response when not streaming (cut=1 when streaming)
//	slow=<ms>    add <ms> real milliseconds to the time to first token
//	timeout      hang until the worker closes or HangLimit passes, then 504
//
// and at most one stream fault, which acts after N chunks of a streamed
// answer (N ≥ 0; a chunk is one decode step, each whole SSE events; an
// answer of N chunks or fewer meets it after its last chunk, before the
// finish chunk, usage and terminator):
//
//	cut=N        close the connection, the chunked body unterminated
//	reset=N      reset the connection (TCP RST)
//	truncate=N   end the body properly (the last chunk of the chunked
//	             encoding) without the rest: no finish chunk, no
//	             "data: [DONE]" or message_stop
//	stall=N      send nothing more and hold the connection until the
//	             client leaves, the worker closes or HangLimit passes
//
// A buffered (non-streamed) answer meets cut, reset and stall before any
// response, as drop; truncate does not touch it. Config.DefaultFaults
// applies to requests without the header.
const FaultHeader = "x-sim-fault"

// faults are the injected faults of one request, and its x-request-id
// when Config.OnFirstToken wants it.
type faults struct {
	err, unavailable, drop, timeout bool
	slow                            time.Duration
	stream                          streamFault
	id                              string
}

// streamFault is a fault that ends a stream after a number of chunks.
type streamFault struct {
	kind  faultKind
	after int // chunks written first
}

type faultKind uint8

const (
	faultNone faultKind = iota
	faultCut
	faultReset
	faultTruncate
	faultStall
)

var faultKinds = map[string]faultKind{"cut": faultCut, "reset": faultReset, "truncate": faultTruncate, "stall": faultStall}

func parseFaults(v []byte) (faults, error) {
	var f faults
	for part := range strings.SplitSeq(string(v), ",") {
		name, arg, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch name = strings.ToLower(name); name {
		case "":
		case "error":
			f.err = true
		case "unavailable":
			f.unavailable = true
		case "drop":
			f.drop = true
		case "timeout":
			f.timeout = true
		case "slow":
			ms, err := strconv.ParseFloat(arg, 64)
			if err != nil || ms < 0 {
				return f, fmt.Errorf("%s: slow=%q: want milliseconds", FaultHeader, arg)
			}
			f.slow += time.Duration(ms * float64(time.Millisecond))
		case "cut", "reset", "truncate", "stall":
			n, err := strconv.Atoi(arg)
			if err != nil || n < 0 {
				return f, fmt.Errorf("%s: %s=%q: want a number of chunks", FaultHeader, name, arg)
			}
			if f.stream.kind != faultNone {
				return f, fmt.Errorf("%s: at most one of cut, reset, truncate, stall", FaultHeader)
			}
			f.stream = streamFault{kind: faultKinds[name], after: n}
		default:
			return f, fmt.Errorf("%s: unknown fault %q (want error, unavailable, drop, slow=<ms>, timeout, cut=<n>, reset=<n>, truncate=<n>, stall=<n>)", FaultHeader, name)
		}
	}
	return f, nil
}

// unavailableNow reports whether the worker was made unavailable
// (SetUnavailable) or uptime lies in a configured 503 window.
func (w *Worker) unavailableNow() bool {
	if w.down.Load() {
		return true
	}
	if len(w.cfg.Unavailable) == 0 {
		return false
	}
	up := w.Uptime()
	for _, win := range w.cfg.Unavailable {
		if win.Contains(up) {
			return true
		}
	}
	return false
}

// Handler serves the worker's whole HTTP surface.
func (w *Worker) Handler(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set("X-Sim-Worker", w.Name())
	path := ctx.Path()
	if w.zeroBody != nil && isInferencePath(path) {
		w.zeroWork(ctx)
		return
	}
	switch string(path) {
	case "/v1/chat/completions":
		w.inference(ctx, w.chat)
	case "/v1/completions":
		w.inference(ctx, w.completions)
	case "/generate":
		w.inference(ctx, w.generate)
	case "/v1/embeddings":
		w.inference(ctx, w.embeddings)
	case "/v1/responses":
		w.inference(ctx, w.createResponse)
	case messagesPath:
		w.inference(ctx, w.messages)
	case "/v1/models":
		if w.allow(ctx, fasthttp.MethodGet) {
			w.listModels(ctx)
		}
	case "/v1/load_lora_adapter":
		if w.allow(ctx, fasthttp.MethodPost) {
			w.loadLoRA(ctx)
		}
	case "/v1/unload_lora_adapter":
		if w.allow(ctx, fasthttp.MethodPost) {
			w.unloadLoRA(ctx)
		}
	case "/sleep":
		if w.allow(ctx, fasthttp.MethodPost) {
			w.sleepCall(ctx)
		}
	case "/wake_up":
		if w.allow(ctx, fasthttp.MethodPost) {
			w.wakeUp(ctx)
		}
	case "/is_sleeping":
		if w.allow(ctx, fasthttp.MethodGet) {
			w.isSleeping(ctx)
		}
	case kvPullPath:
		if w.allow(ctx, fasthttp.MethodPost) {
			w.kvPullCall(ctx)
		}
	case "/reset_prefix_cache":
		if w.allow(ctx, fasthttp.MethodPost) {
			w.resetPrefixCache(ctx)
		}
	case "/health":
		if w.allow(ctx, fasthttp.MethodGet) {
			if !w.healthy.Load() || w.unavailableNow() {
				w.fail(ctx, fasthttp.StatusServiceUnavailable, "server_error", "", "worker unhealthy")
				return
			}
			ctx.SetStatusCode(fasthttp.StatusOK)
		}
	case "/ping":
		if w.allow(ctx, fasthttp.MethodGet) {
			ctx.SetStatusCode(fasthttp.StatusOK)
		}
	case "/metrics":
		if w.allow(ctx, fasthttp.MethodGet) {
			ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
			w.set.WritePrometheus(ctx)
		}
	default:
		if id, ok := bytes.CutPrefix(path, []byte("/v1/responses/")); ok && len(id) > 0 {
			w.responseByID(ctx, string(id))
			return
		}
		w.fail(ctx, fasthttp.StatusNotFound, "not_found_error", "", "no route for "+string(path))
	}
}

// isInferencePath reports whether path is one of the inference endpoints.
func isInferencePath(path []byte) bool {
	switch string(path) {
	case "/v1/chat/completions", "/v1/completions", "/generate", "/v1/embeddings", "/v1/responses":
		return true
	}
	return false
}

// zeroWorkBody is the fixed answer of zero-work mode for model.
func zeroWorkBody(model string) []byte {
	b := []byte(`{"id":"chatcmpl-zero-work","object":"chat.completion","created":1700000000,"model":`)
	b = appendJSONString(b, model)
	return append(b, `,"choices":[{"index":0,"message":{"role":"assistant","content":"zero-work mode: body not parsed."},`+
		`"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":16,"completion_tokens":16,"total_tokens":32,`+
		`"prompt_tokens_details":{"cached_tokens":0}}}`...)
}

// zeroWork answers an inference request in zero-work mode: the fixed body,
// the request body never decoded; 503 while asleep (docs/design.md §6).
func (w *Worker) zeroWork(ctx *fasthttp.RequestCtx) {
	if !w.allow(ctx, fasthttp.MethodPost) {
		return
	}
	w.requests.Add(1)
	if w.asleep.Load() {
		w.sleepingError(ctx)
		return
	}
	ctx.SetContentType("application/json")
	ctx.Response.SetBodyRaw(w.zeroBody)
}

// allow answers 405 unless the method is m (HEAD passes for GET).
func (w *Worker) allow(ctx *fasthttp.RequestCtx, m string) bool {
	if string(ctx.Method()) == m || (m == fasthttp.MethodGet && ctx.IsHead()) {
		return true
	}
	ctx.Response.Header.Set("Allow", m)
	w.fail(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
		"method "+string(ctx.Method())+" not allowed; use "+m)
	return false
}

// inference runs the common prelude of the inference endpoints (method,
// counters, faults decided before the body is read) and calls h.
func (w *Worker) inference(ctx *fasthttp.RequestCtx, h func(*fasthttp.RequestCtx, faults)) {
	if !w.allow(ctx, fasthttp.MethodPost) {
		return
	}
	w.requests.Add(1)
	f := w.defaultFaults
	if h := ctx.Request.Header.Peek(FaultHeader); len(h) > 0 {
		var err error
		if f, err = parseFaults(h); err != nil {
			w.fail(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "", err.Error())
			return
		}
	}
	if w.cfg.OnFirstToken != nil {
		f.id = string(ctx.Request.Header.Peek("X-Request-Id"))
	}
	switch {
	case w.asleep.Load():
		w.sleepingError(ctx)
		return
	case f.unavailable || w.unavailableNow():
		w.fail(ctx, fasthttp.StatusServiceUnavailable, "server_error", "service_unavailable", "simulated: worker unavailable")
		return
	case f.err || w.chance(w.cfg.ErrorRate):
		w.fail(ctx, fasthttp.StatusInternalServerError, "server_error", "internal_error", "simulated: internal server error")
		return
	case f.timeout:
		t := time.NewTimer(w.cfg.HangLimit)
		defer t.Stop()
		select {
		case <-t.C:
		case <-w.done:
		case <-ctx.Done():
		}
		w.fail(ctx, fasthttp.StatusGatewayTimeout, "server_error", "timeout", "simulated: request hung")
		return
	}
	h(ctx, f)
}

// apiError is the OpenAI error body.
type apiError struct {
	Error apiErrorBody `json:"error"`
}

type apiErrorBody struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// fail answers an OpenAI-style error; code "" is null. On the Messages
// route the error takes the Anthropic shape (messages.go).
func (w *Worker) fail(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	if status >= 400 {
		w.errs.Add(1)
	}
	if isMessagesPath(ctx.Path()) {
		w.writeJSON(ctx, status, anthropicError(status, msg))
		return
	}
	e := apiError{Error: apiErrorBody{Message: msg, Type: typ}}
	if code != "" {
		e.Error.Code = &code
	}
	w.writeJSON(ctx, status, &e)
}

func (w *Worker) writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := sonic.Marshal(v)
	if err != nil {
		ctx.Error("simworker: encode: "+err.Error(), fasthttp.StatusInternalServerError)
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

func (w *Worker) badRequest(ctx *fasthttp.RequestCtx, msg string) {
	w.fail(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "", msg)
}

func (w *Worker) decode(ctx *fasthttp.RequestCtx, v any) bool {
	if err := api.Unmarshal(ctx.PostBody(), v); err != nil {
		w.badRequest(ctx, "malformed JSON body: "+err.Error())
		return false
	}
	return true
}

// request decodes ctx's body into req and resolves the model it names
// (*model, req's field); false when it answered the request with an error.
func (w *Worker) request(ctx *fasthttp.RequestCtx, req any, model *string) (target, bool) {
	if !w.decode(ctx, req) {
		return target{}, false
	}
	return w.model(ctx, *model)
}

// model resolves the requested model ("" → the first served model): a base
// model or a loaded LoRA adapter; else it answers 404 model_not_found.
func (w *Worker) model(ctx *fasthttp.RequestCtx, name string) (target, bool) {
	if name == "" {
		name = w.cfg.Models[0]
	}
	if t, ok := w.resolve(name); ok {
		return t, true
	}
	w.fail(ctx, fasthttp.StatusNotFound, "NotFoundError", "model_not_found", "The model `"+name+"` does not exist.")
	return target{}, false
}

// tooLong answers 400 as vLLM does, and returns true, when j's prompt does
// not fit Config.MaxModelLen, or its prompt and an explicit completion
// limit together do not.
func (w *Worker) tooLong(ctx *fasthttp.RequestCtx, j *job) bool {
	n, p := w.cfg.MaxModelLen, j.promptTokens
	var msg string
	switch {
	case p >= n:
		msg = fmt.Sprintf("This model's maximum context length is %d tokens. However, your request has %d input tokens. "+
			"Please reduce the length of the input messages.", n, p)
	case j.explicitMax && p+j.maxTokens > n:
		msg = fmt.Sprintf("'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens "+
			"and your request has %d input tokens (%d > %d - %d).", j.maxTokens, n, p, j.maxTokens, n, p)
	default:
		return false
	}
	w.fail(ctx, fasthttp.StatusBadRequest, "BadRequestError", "", msg)
	return true
}

// foreignToolID answers 400 and returns true when StrictToolIDs is set and
// id was not issued for model.
func (w *Worker) foreignToolID(ctx *fasthttp.RequestCtx, model, id string) bool {
	if !w.cfg.StrictToolIDs || strings.HasPrefix(id, "call_"+model+"_") {
		return false
	}
	w.fail(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "invalid_tool_call_id",
		"tool_call_id "+strconv.Quote(id)+" was not issued by model "+model)
	return true
}

func (w *Worker) closing(ctx *fasthttp.RequestCtx) {
	w.fail(ctx, fasthttp.StatusServiceUnavailable, "server_error", "shutting_down", "worker shutting down")
}

type modelList struct {
	Object string       `json:"object"`
	Data   []modelEntry `json:"data"`
}

// modelEntry is a model card as vLLM lists it: base models carry
// max_model_len and parent null; a LoRA adapter carries its path as root,
// its base model as parent, and max_model_len null.
type modelEntry struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

func (w *Worker) listModels(ctx *fasthttp.RequestCtx) {
	loras := w.lora.list()
	l := modelList{Object: "list", Data: make([]modelEntry, 0, len(w.cfg.Models)+len(loras))}
	maxLen := w.cfg.MaxModelLen
	for _, m := range w.cfg.Models {
		l.Data = append(l.Data, modelEntry{ID: m, Object: "model", Created: w.start.Unix(), OwnedBy: "simworker", Root: m, MaxModelLen: &maxLen})
	}
	for _, a := range loras {
		l.Data = append(l.Data, modelEntry{ID: a.name, Object: "model", Created: a.created, OwnedBy: "simworker", Root: a.path, Parent: &a.parent})
	}
	w.writeJSON(ctx, fasthttp.StatusOK, &l)
}

type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *tokenDetails `json:"prompt_tokens_details,omitempty"`
}

type tokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (w *Worker) usage(j *job, completion int) usage {
	u := usage{PromptTokens: j.promptTokens, CompletionTokens: completion, TotalTokens: j.promptTokens + completion}
	if !w.cfg.OmitPromptTokensDetails {
		u.PromptTokensDetails = &tokenDetails{CachedTokens: j.cachedTokens}
	}
	return u
}

// runSync runs j to completion in the handler: queue, TTFT, then units-1
// inter-token steps. False when the worker closed.
func (w *Worker) runSync(j *job, units int) bool {
	if w.eng != nil {
		s, ok := w.submit(j, units, false, false)
		if !ok {
			return false
		}
		defer s.aborted.Store(true) // no-op once finished
		return w.await(s, -1)
	}
	if !w.admit(j) {
		return false
	}
	defer w.release(j.ms)
	for i := 1; i < units; i++ {
		if !w.decodeStep() {
			return false
		}
	}
	return true
}

// streamSpec describes one SSE generation for runStream.
type streamSpec struct {
	units      int                            // chunks after the TTFT, one per decode step
	chunk      func(dst []byte, i int) []byte // appends chunk i (whole "data: ...\n\n" events)
	tail       func(dst []byte) []byte        // appends the events after the last chunk
	completion int                            // completion tokens reported
	reason     string                         // finish reason
	done       func()                         // called after a completed stream, before the tail is flushed
	stop       int                            // stop after this many chunks, before the tail (a stream fault); <0: never
}

// runStream drives a streamed generation inside a stream writer: admission
// and TTFT, then one flushed chunk per decode step, then the tail. It stops
// at the first write error (client gone) and at s.stop; it reports whether
// it stopped at s.stop, everything before flushed.
func (w *Worker) runStream(bw *bufio.Writer, flush func() error, j *job, s streamSpec) bool {
	if w.eng != nil {
		return w.runStreamEngine(bw, flush, j, s)
	}
	if !w.admit(j) {
		return false
	}
	defer w.release(j.ms)
	buf := make([]byte, 0, 512)
	for i := range s.units {
		if i == s.stop {
			return true
		}
		if i > 0 && !w.decodeStep() {
			return false
		}
		buf = s.chunk(buf[:0], i)
		if _, err := bw.Write(buf); err != nil {
			return false
		}
		if flush() != nil {
			return false
		}
	}
	return w.endStream(bw, flush, j, s, buf)
}

// endStream follows the last chunk: the stream fault (s.stop, past the
// last chunk), else the counted completion and the tail.
func (w *Worker) endStream(bw *bufio.Writer, flush func() error, j *job, s streamSpec, buf []byte) bool {
	if s.stop >= 0 {
		return flush() == nil
	}
	w.finish(j.ms, s.completion, s.reason)
	if s.done != nil {
		s.done()
	}
	buf = s.tail(buf[:0])
	if _, err := bw.Write(buf); err == nil {
		_ = flush()
	}
	return false
}

// runStreamEngine is runStream in the engine model: it writes a chunk for
// every token the engine emitted since the last wake-up, one flush per
// wake-up (docs/design.md §6).
func (w *Worker) runStreamEngine(bw *bufio.Writer, flush func() error, j *job, s streamSpec) bool {
	sq, ok := w.submit(j, s.units, true, false)
	if !ok {
		return false
	}
	defer sq.aborted.Store(true) // frees the sequence when the client left; no-op once finished
	buf := make([]byte, 0, 512)
	if s.units == 0 && !w.await(sq, -1) { // prefill only: an answer already complete
		return false
	}
	for i := 0; i < s.units; {
		if i == s.stop {
			return true
		}
		if !w.await(sq, i+1) {
			return false
		}
		for n := int(sq.produced.Load()); i < n && i != s.stop; i++ {
			buf = s.chunk(buf[:0], i)
			if _, err := bw.Write(buf); err != nil {
				return false
			}
		}
		if flush() != nil {
			return false
		}
	}
	return w.endStream(bw, flush, j, s, buf)
}
