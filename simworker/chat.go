package simworker

import (
	"bufio"
	"hash/maphash"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// toolArguments are the arguments of every simulated tool call.
const toolArguments = "{}"

// reply is what a generation answers: text, or one tool call.
type reply struct {
	toolName, toolID string
	first            int // the first output token (job.first)
	units            int // decode steps (stream chunks)
	completion       int // completion tokens
	reason           string
}

// plan decides the reply of j: a call of tool when tool != "", else text.
func (w *Worker) plan(j *job, tool string) reply {
	if tool != "" {
		return reply{
			toolName:   tool,
			toolID:     w.toolCallID(j.model),
			units:      2, // header (id, name), then arguments
			completion: w.tokens(len(tool)+len(toolArguments)) + 1,
			reason:     "tool_calls",
		}
	}
	r := reply{first: j.first, units: j.maxTokens, completion: j.maxTokens, reason: "stop"}
	if j.explicitMax {
		r.reason = "length"
	}
	return r
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   usage        `json:"usage"`

	KVTransferParams *kvTransferAnswer `json:"kv_transfer_params,omitempty"` // a prefill leg's (pd.go)
}

type chatChoice struct {
	Index        int        `json:"index"`
	Message      outMessage `json:"message"`
	Logprobs     any        `json:"logprobs"`
	FinishReason string     `json:"finish_reason"`
}

type outMessage struct {
	Role      string        `json:"role"`
	Content   *string       `json:"content"`
	ToolCalls []outToolCall `json:"tool_calls,omitempty"`
}

type outToolCall struct {
	ID       string      `json:"id"`
	Type     string      `json:"type"`
	Function outFunction `json:"function"`
}

type outFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

func (w *Worker) chat(ctx *fasthttp.RequestCtx, f faults) {
	var req chatRequest
	t, ok := w.request(ctx, &req, &req.Model)
	if !ok {
		return
	}
	model := t.name
	if len(req.Messages) == 0 {
		w.badRequest(ctx, "messages must not be empty")
		return
	}
	for i := range req.Messages {
		if m := &req.Messages[i]; m.Role == "tool" && w.foreignToolID(ctx, model, m.ToolCallID) {
			return
		}
	}
	if msg := continueError(&req); msg != "" {
		w.fail(ctx, fasthttp.StatusBadRequest, "BadRequestError", "", msg)
		return
	}
	sortTools(req.Tools)
	maxTokens := req.MaxCompletionTokens
	if maxTokens == nil {
		maxTokens = req.MaxTokens
	}
	var j *job
	switch {
	case req.ContinueFinalMessage:
		prompt, body := renderContinue(req.Tools, req.Messages)
		j = w.newJob(t, prompt, maxTokens, f)
		w.resume(j, fillerPrefix(prompt[body:]))
	case req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt:
		j = w.newJob(t, appendMessages(nil, req.Tools, req.Messages), maxTokens, f)
	default:
		j = w.newJob(t, renderChat(nil, req.Tools, req.Messages), maxTokens, f)
	}
	if w.tooLong(ctx, j) {
		return
	}
	j.priority = req.Priority
	prefill := w.pdLeg(j, req.KVTransferParams, req.Stream)
	tool := ""
	if req.Messages[len(req.Messages)-1].Role == "user" && !prefill {
		tool = toolChoice(req.ToolChoice, req.Tools)
	}
	r := w.plan(j, tool)
	id := w.nextID("chatcmpl-")
	created := time.Now().Unix()
	if prefill {
		j.holdID = id
	}

	if !req.Stream {
		if !w.runBuffered(ctx, j, r, f) {
			return
		}
		msg := outMessage{Role: "assistant"}
		if r.toolName != "" {
			msg.ToolCalls = []outToolCall{{ID: r.toolID, Type: "function", Function: outFunction{Name: r.toolName, Arguments: toolArguments}}}
		} else {
			text := fillerRun(r.first, r.completion)
			msg.Content = &text
		}
		w.writeJSON(ctx, fasthttp.StatusOK, &chatCompletion{
			ID: id, Object: "chat.completion", Created: created, Model: model,
			Choices: []chatChoice{{Message: msg, FinishReason: r.reason}},
			Usage:   w.usage(j, r.completion),

			KVTransferParams: w.kvAnswer(ctx, j),
		})
		return
	}

	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	head := []byte(`data: {"id":"` + id + `","object":"chat.completion.chunk","created":` + strconv.FormatInt(created, 10) + `,"model":`)
	head = appendJSONString(head, model)
	head = append(head, `,"choices":[{"index":0,"delta":`...)
	const open = `,"logprobs":null,"finish_reason":`
	spec := streamSpec{
		units:      r.units,
		completion: r.completion,
		reason:     r.reason,
		chunk: func(dst []byte, i int) []byte {
			dst = append(dst, head...)
			switch {
			case r.toolName != "" && i == 0:
				dst = append(dst, `{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":`...)
				dst = appendJSONString(dst, r.toolID)
				dst = append(dst, `,"type":"function","function":{"name":`...)
				dst = appendJSONString(dst, r.toolName)
				dst = append(dst, `,"arguments":""}}]}`...)
			case r.toolName != "":
				dst = append(dst, `{"tool_calls":[{"index":0,"function":{"arguments":`...)
				dst = appendJSONString(dst, toolArguments)
				dst = append(dst, `}}]}`...)
			case i == 0:
				dst = append(dst, `{"role":"assistant","content":`...)
				dst = appendJSONString(dst, fillerToken(r.first+i))
				dst = append(dst, '}')
			default:
				dst = append(dst, `{"content":`...)
				dst = appendJSONString(dst, fillerToken(r.first+i))
				dst = append(dst, '}')
			}
			return append(dst, open+"null}]}\n\n"...)
		},
		tail: func(dst []byte) []byte {
			dst = append(dst, head...)
			dst = append(dst, `{}`+open+`"`...)
			dst = append(dst, r.reason...)
			dst = append(dst, "\"}]}\n\n"...)
			if includeUsage {
				dst = append(dst, `data: {"id":"`+id+`","object":"chat.completion.chunk","created":`+strconv.FormatInt(created, 10)+`,"model":`...)
				dst = appendJSONString(dst, model)
				dst = append(dst, `,"choices":[],"usage":`...)
				dst = appendUsage(dst, j.promptTokens, r.completion, j.cachedTokens, !w.cfg.OmitPromptTokensDetails)
				dst = append(dst, "}\n\n"...)
			}
			return append(dst, "data: [DONE]\n\n"...)
		},
	}
	w.stream(ctx, j, spec, f)
}

// continueError is vLLM's 400 message for a continue_final_message request
// it refuses, "" when none: together with add_generation_prompt, whose
// default true counts (vLLM's request check refuses an explicit true, the
// chat template renderer the default); or without a final assistant
// message, which is what there is to continue.
func continueError(req *chatRequest) string {
	switch {
	case !req.ContinueFinalMessage:
		return ""
	case req.AddGenerationPrompt != nil && *req.AddGenerationPrompt:
		return "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
	case req.AddGenerationPrompt == nil:
		return "continue_final_message needs add_generation_prompt false, and add_generation_prompt defaults to true."
	case req.Messages[len(req.Messages)-1].Role != "assistant":
		return "continue_final_message requires the final message to be an assistant message."
	}
	return ""
}

// appendUsage appends a usage object; details adds prompt_tokens_details.
func appendUsage(dst []byte, prompt, completion, cached int, details bool) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(completion), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
	if !details {
		return append(dst, '}')
	}
	dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
	dst = strconv.AppendInt(dst, int64(cached), 10)
	return append(dst, "}}"...)
}

// --- /v1/completions ---

type completionRequest struct {
	Model         string         `json:"model"`
	Prompt        any            `json:"prompt"`
	MaxTokens     *int           `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options"`
	IgnoreEOS     bool           `json:"ignore_eos"`

	KVTransferParams *kvTransferParams `json:"kv_transfer_params"` // disaggregated prefill/decode (pd.go)
}

type textCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []textChoice `json:"choices"`
	Usage   usage        `json:"usage"`

	KVTransferParams *kvTransferAnswer `json:"kv_transfer_params,omitempty"` // a prefill leg's (pd.go)
}

type textChoice struct {
	Index        int    `json:"index"`
	Text         string `json:"text"`
	Logprobs     any    `json:"logprobs"`
	FinishReason string `json:"finish_reason"`
}

// renderPrompt renders a completions prompt: a string, a list of strings
// (concatenated), or token ids (one space-separated number each).
func renderPrompt(p any) ([]byte, bool) {
	switch v := p.(type) {
	case string:
		return []byte(v), true
	case []any:
		var b []byte
		for _, e := range v {
			switch e := e.(type) {
			case string:
				b = append(b, e...)
			case float64:
				b = strconv.AppendInt(b, int64(e), 10)
				b = append(b, ' ')
			default:
				return nil, false
			}
		}
		return b, true
	}
	return nil, false
}

// completions serves /v1/completions. A prompt that ends with the first k
// output tokens (k as large as it goes) is answered from token k on
// (resume): the answer depends only on the prompt before them, so a prompt
// extended by part of its own answer gets the rest of that answer.
func (w *Worker) completions(ctx *fasthttp.RequestCtx, f faults) {
	var req completionRequest
	t, ok := w.request(ctx, &req, &req.Model)
	if !ok {
		return
	}
	model := t.name
	prompt, ok := renderPrompt(req.Prompt)
	if !ok {
		w.badRequest(ctx, "prompt must be a string or a list of strings")
		return
	}
	j := w.newJob(t, prompt, req.MaxTokens, f)
	w.resume(j, fillerSuffix(prompt))
	if w.tooLong(ctx, j) {
		return
	}
	prefill := w.pdLeg(j, req.KVTransferParams, req.Stream)
	r := w.plan(j, "")
	id := w.nextID("cmpl-")
	created := time.Now().Unix()
	if prefill {
		j.holdID = id
	}
	if !req.Stream {
		if !w.runBuffered(ctx, j, r, f) {
			return
		}
		w.writeJSON(ctx, fasthttp.StatusOK, &textCompletion{
			ID: id, Object: "text_completion", Created: created, Model: model,
			Choices: []textChoice{{Text: fillerRun(r.first, r.completion), FinishReason: r.reason}},
			Usage:   w.usage(j, r.completion),

			KVTransferParams: w.kvAnswer(ctx, j),
		})
		return
	}
	includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	head := []byte(`data: {"id":"` + id + `","object":"text_completion","created":` + strconv.FormatInt(created, 10) + `,"model":`)
	head = appendJSONString(head, model)
	spec := streamSpec{
		units: r.units, completion: r.completion, reason: r.reason,
		chunk: func(dst []byte, i int) []byte {
			dst = append(dst, head...)
			dst = append(dst, `,"choices":[{"index":0,"text":`...)
			dst = appendJSONString(dst, fillerToken(r.first+i))
			return append(dst, `,"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
		},
		tail: func(dst []byte) []byte {
			dst = append(dst, head...)
			dst = append(dst, `,"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"`...)
			dst = append(dst, r.reason...)
			dst = append(dst, "\"}]}\n\n"...)
			if includeUsage {
				dst = append(dst, head...)
				dst = append(dst, `,"choices":[],"usage":`...)
				dst = appendUsage(dst, j.promptTokens, r.completion, j.cachedTokens, !w.cfg.OmitPromptTokensDetails)
				dst = append(dst, "}\n\n"...)
			}
			return append(dst, "data: [DONE]\n\n"...)
		},
	}
	w.stream(ctx, j, spec, f)
}

// --- /generate (SGLang-style) ---

type generateRequest struct {
	Model          string `json:"model"`
	Text           any    `json:"text"`
	Prompt         any    `json:"prompt"`
	Stream         bool   `json:"stream"`
	MaxTokens      *int   `json:"max_tokens"`
	SamplingParams *struct {
		MaxNewTokens *int `json:"max_new_tokens"`
		MaxTokens    *int `json:"max_tokens"`
	} `json:"sampling_params"`
}

type generateResponse struct {
	Text     string       `json:"text"`
	MetaInfo generateMeta `json:"meta_info"`
}

type generateMeta struct {
	ID               string         `json:"id"`
	PromptTokens     int            `json:"prompt_tokens"`
	CompletionTokens int            `json:"completion_tokens"`
	CachedTokens     int            `json:"cached_tokens"`
	FinishReason     map[string]any `json:"finish_reason,omitempty"`
}

func (w *Worker) generate(ctx *fasthttp.RequestCtx, f faults) {
	var req generateRequest
	t, ok := w.request(ctx, &req, &req.Model)
	if !ok {
		return
	}
	text := req.Text
	if text == nil {
		text = req.Prompt
	}
	prompt, ok := renderPrompt(text)
	if !ok {
		w.badRequest(ctx, "text must be a string")
		return
	}
	maxTokens := req.MaxTokens
	if sp := req.SamplingParams; sp != nil {
		if sp.MaxNewTokens != nil {
			maxTokens = sp.MaxNewTokens
		} else if sp.MaxTokens != nil {
			maxTokens = sp.MaxTokens
		}
	}
	j := w.newJob(t, prompt, maxTokens, f)
	if w.tooLong(ctx, j) {
		return
	}
	r := w.plan(j, "")
	id := w.nextID("gen-")
	meta := func(completion int, final bool) generateMeta {
		m := generateMeta{ID: id, PromptTokens: j.promptTokens, CompletionTokens: completion, CachedTokens: j.cachedTokens}
		if final {
			m.FinishReason = map[string]any{"type": r.reason}
			if r.reason == "length" {
				m.FinishReason["length"] = completion
			}
		}
		return m
	}
	if !req.Stream {
		if !w.runBuffered(ctx, j, r, f) {
			return
		}
		w.writeJSON(ctx, fasthttp.StatusOK, &generateResponse{Text: fillerText(r.completion), MetaInfo: meta(r.completion, true)})
		return
	}
	var sofar strings.Builder
	spec := streamSpec{
		units: r.units, completion: r.completion, reason: r.reason,
		chunk: func(dst []byte, i int) []byte {
			sofar.WriteString(fillerToken(i))
			return appendEvent(dst, "", &generateResponse{Text: sofar.String(), MetaInfo: meta(i+1, i+1 == r.units)})
		},
		tail: func(dst []byte) []byte { return append(dst, "data: [DONE]\n\n"...) },
	}
	w.stream(ctx, j, spec, f)
}

// --- /v1/embeddings ---

type embeddingRequest struct {
	Model string `json:"model"`
	Input any    `json:"input"`
}

type embeddingList struct {
	Object string      `json:"object"`
	Data   []embedding `json:"data"`
	Model  string      `json:"model"`
	Usage  usage       `json:"usage"`
}

type embedding struct {
	Object    string    `json:"object"`
	Index     int       `json:"index"`
	Embedding []float64 `json:"embedding"`
}

// embeddingDims is the length of a simulated embedding vector.
const embeddingDims = 8

func (w *Worker) embeddings(ctx *fasthttp.RequestCtx, f faults) {
	var req embeddingRequest
	t, ok := w.request(ctx, &req, &req.Model)
	if !ok {
		return
	}
	model := t.name
	var inputs []string
	switch v := req.Input.(type) {
	case string:
		inputs = []string{v}
	case []any:
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				w.badRequest(ctx, "input must be a string or a list of strings")
				return
			}
			inputs = append(inputs, s)
		}
	default:
		w.badRequest(ctx, "input must be a string or a list of strings")
		return
	}
	if w.bufferedFault(ctx, f) {
		return
	}
	out := embeddingList{Object: "list", Model: model, Data: make([]embedding, len(inputs))}
	tokens := 0
	for i, s := range inputs {
		tokens += w.tokens(len(s))
		v := make([]float64, embeddingDims)
		h := maphash.String(hashSeed, s)
		norm := 0.0
		for k := range v {
			h = h*6364136223846793005 + 1442695040888963407
			v[k] = float64(int64(h>>11))/(1<<52) - 1
			norm += v[k] * v[k]
		}
		norm = math.Sqrt(norm)
		for k := range v {
			v[k] /= norm
		}
		out.Data[i] = embedding{Object: "embedding", Index: i, Embedding: v}
	}
	// Embeddings occupy a slot for the prefill time of their tokens, without
	// the prefix cache.
	ms := t.ms
	if w.eng != nil {
		ok = w.runEmbedding(ms, model, tokens, f)
	} else if ok = w.acquire(ms); ok {
		ok = w.sleep(w.scaled(w.cfg.Overhead+time.Duration(tokens)*w.cfg.PerToken) + f.slow)
		w.release(ms)
	}
	if !ok {
		w.closing(ctx)
		return
	}
	w.finish(ms, 0, "stop")
	out.Usage = usage{PromptTokens: tokens, TotalTokens: tokens}
	w.writeJSON(ctx, fasthttp.StatusOK, &out)
}

// runEmbedding runs a prefill-only sequence of tokens through the engine,
// without the prefix cache. False when the worker closed.
func (w *Worker) runEmbedding(ms *modelStats, model string, tokens int, f faults) bool {
	j := &job{ms: ms, model: model, promptTokens: tokens, extraTTFT: f.slow, arrived: time.Now()}
	s, ok := w.submit(j, 0, false, true)
	if !ok {
		return false
	}
	defer s.aborted.Store(true)
	return w.await(s, -1)
}

// runBuffered runs job j's reply r before a buffered (non-streamed) answer
// and counts the generation. It reports false when it answered the request
// itself: a connection fault (bufferedFault) or a closing worker.
func (w *Worker) runBuffered(ctx *fasthttp.RequestCtx, j *job, r reply, f faults) bool {
	if w.bufferedFault(ctx, f) {
		return false
	}
	if !w.runSync(j, r.units) {
		w.closing(ctx)
		return false
	}
	w.finish(j.ms, r.completion, r.reason)
	return true
}

// stream answers ctx with spec's SSE generation of j (runStream), stopped
// by f's stream fault, or cut after its first chunk on a drop fault, the
// request's or one drawn by DropRate.
func (w *Worker) stream(ctx *fasthttp.RequestCtx, j *job, spec streamSpec, f faults) {
	sf := f.stream
	if sf.kind == faultNone && (f.drop || w.chance(w.cfg.DropRate)) {
		sf = streamFault{kind: faultCut, after: 1}
	}
	spec.stop = -1
	if sf.kind != faultNone {
		spec.stop = sf.after
		w.errs.Add(1)
		if sf.kind == faultCut || sf.kind == faultReset {
			w.dropped.Add(1)
		}
	}
	w.startStream(ctx, sf, func(bw *bufio.Writer, flush func() error) bool { return w.runStream(bw, flush, j, spec) })
}
