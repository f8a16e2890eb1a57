package fastproxy

import (
	"bytes"
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/VictoriaMetrics/metrics"
	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/sharedstate"
)

// Response headers of the model step (logical models only).
const (
	hdrSelectedModel    = "x-vsr-selected-model"
	hdrSelectedDecision = "x-vsr-selected-decision"
	hdrSessionPhase     = "x-vsr-session-phase"
	hdrSessionAction    = "x-vsr-session-action"
	hdrReplayID         = "x-vsr-replay-id"
)

// logicalModels lists the logical model names served by the model step.
func (s *Server) logicalModels() []string {
	if s.cfg.Models == nil {
		return nil
	}
	return s.cfg.Models.LogicalModels()
}

// newHealth tells the model step which models and workers can serve; built
// once, so a request does not allocate its closures.
func (s *Server) newHealth() saar.Health {
	return saar.Health{
		ModelUp: func(model string) bool {
			ws, _ := s.cfg.Registry.ForModel(s2b(model))
			for _, w := range ws {
				if w.Healthy() {
					return true
				}
			}
			return false
		},
		WorkerUp: func(url string) bool {
			w := s.cfg.Registry.ByURL(url)
			return w != nil && w.Healthy()
		},
	}
}

// selectModel runs the model step for a logical model: it chooses the
// physical model of this turn and splices its name into the body (the
// original body is kept in st until the request ends, since the view
// aliases it). It returns false when it answered the request itself.
func (s *Server) selectModel(ctx *fasthttp.RequestCtx, st *reqState, h saar.Health) bool {
	v := st.view
	hdr := &ctx.Request.Header
	st.sel = s.cfg.Models.Select(&saar.Turn{
		Logical:            s2b(st.req.Model),
		Session:            st.req.Session,
		LatestUserText:     v.LastUserText,
		HistoryChars:       len(v.History),
		HasTools:           v.HasTools,
		ToolResultIDs:      v.ToolResultIDs,
		ToolResults:        v.ToolResults,
		PreviousResponseID: v.PreviousResponseID,
		OpaqueReasoning:    v.OpaqueReasoning,
		ReasoningID:        v.ReasoningID,
		ReasoningEffort:    v.ReasoningEffort,
		Header:             func(name string) []byte { return hdr.Peek(name) },
	}, h)
	if st.sel.Model == "" {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "no_model_available",
			"no physical model of "+clip(string(v.Model), 256)+" has a healthy worker")
		return false
	}
	if v.ModelStart >= 0 {
		spliceModel(ctx, st)
	}
	st.req.Model = st.sel.Model
	if st.sel.PinnedWorker != "" {
		// Provider state lives on that worker only: no silent failover to
		// another one (the model step breaks the lock explicitly when the
		// worker is down).
		if st.pin = s.cfg.Registry.ByURL(st.sel.PinnedWorker); st.pin == nil {
			writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "owner_unavailable",
				"the worker that holds this request's provider state is no longer registered")
			return false
		}
		st.noRetry = true
	}
	return true
}

// spliceModel writes st.sel.Model over the model name of the body, whose
// other bytes are forwarded unchanged. The first splice swaps the original
// body out of the request into st.body, where the view's aliases stay valid
// until releaseState; a second one (a failover) splices from it again.
func spliceModel(ctx *fasthttp.RequestCtx, st *reqState) {
	v := st.view
	orig, buf := ctx.Request.Body(), st.body[:0]
	if st.spliced {
		orig, buf = st.body, nil
	}
	nb := append(buf, orig[:v.ModelStart]...)
	nb = appendJSONString(nb, st.sel.Model)
	nb = append(nb, orig[v.ModelEnd:]...)
	if st.spliced {
		ctx.Request.SetBody(nb)
		return
	}
	st.body, st.spliced = ctx.Request.SwapBody(nb), true
}

// failoverModel runs the model step again when every worker of the turn's
// model failed it before any byte reached the client, with that model
// counted as down: an unlocked turn moves to another model, a hard-locked
// one breaks its lock explicitly (lock_broken). It prepares st for one more
// forward and reports whether there is one. Provider-state turns pinned to
// a worker never fail over (their state lives there).
func (s *Server) failoverModel(ctx *fasthttp.RequestCtx, st *reqState) bool {
	if st.pin != nil || st.noRetry {
		return false
	}
	switch ctx.Response.StatusCode() { // our own 502 (retries exhausted) or 503 (no healthy worker)
	case fasthttp.StatusBadGateway, fasthttp.StatusServiceUnavailable:
	default:
		return false
	}
	failed := st.sel.Model
	h := s.health
	up := h.ModelUp
	h.ModelUp = func(m string) bool { return m != failed && up(m) }
	st.req.Model = st.modelName() // the logical name again
	save := ctx.Response.StatusCode()
	if !s.selectModel(ctx, st, h) || st.sel.Model == failed {
		ctx.Response.SetStatusCode(save)
		return false
	}
	workers, ok := s.cfg.Registry.ForModel(s2b(st.req.Model))
	if !ok {
		return false
	}
	s.metrics.modelFailovers.Inc()
	s.cfg.Logger.Warn("model failed over", "from", failed, "to", st.sel.Model, "action", st.sel.Action)
	ctx.Response.Reset()
	st.req.Workers, st.req.Subset = workers, false
	s.fitContext(st, ctx.PostBody())
	s.releaseObserver(st.obs)
	st.obs = s.newObserver(st, true)
	return true
}

// setModelHeaders echoes the model step's choice on the response.
func setModelHeaders(ctx *fasthttp.RequestCtx, sel *saar.Selection) {
	h := &ctx.Response.Header
	h.Set(hdrSelectedModel, sel.Model)
	h.Set(hdrSelectedDecision, sel.Decision)
	h.Set(hdrSessionPhase, sel.Phase)
	h.Set(hdrSessionAction, sel.Action)
	h.Set(hdrReplayID, sel.ReplayID)
}

// observer carries what must be learned from one response: by the model
// step (models set: logical models, Responses API state) and by the
// cache-aware policy (ca set: docs/design.md §4, "Learning"). It owns
// copies of everything, since it may outlive the request (streams), and is
// pooled (Server.observers): the request that creates it or, for a relayed
// stream, the relay's Close returns it.
type observer struct {
	models  *saar.Router // nil: the model step learns nothing from this response
	session []byte
	model   string
	lock    string
	sse     reqview.SSEScanner
	learned reqview.Learned
	noted   int // tool-call ids of a stream already indexed
	notedR  int // reasoning artifact ids of a stream already indexed

	// Hard locks shared with other replicas (docs/design.md §8.3), when
	// models.SharesLocks: written as soon as the response shows them and
	// acknowledged before its last byte is forwarded (see waitLocks).
	share     bool       // write this response's locks
	shareResp bool       // its response id is a lock (Responses API: previous_response_id)
	sharedIDs int        // tool-call ids already written (or being written)
	sharedRs  int        // reasoning artifact ids already written (or being written)
	sharedID  bool       // the response id is written (or being written)
	lw        *lockWrite // the latest write in flight; nil: none
	lockWait  *metrics.Histogram

	// The binding the selection queued for the shared store
	// (route.Choice.Published) and the session memory the model step queued
	// (memQueued), when Server.cfg.Shared is set: flushed from the send on,
	// in the background, and acknowledged before the last byte like a lock
	// (waitFlush).
	shared    *sharedstate.Store
	memQueued bool       // the model step published this session's memory record (a logical model with a session key)
	fw        *lockWrite // the flush in flight; nil: none

	ca     *route.CacheAware // nil: the policy learns nothing
	choice route.Choice      // the selection of the attempt that was sent
	stream bool
	load   int64     // the worker's requests in flight at send, this one excluded
	sent   time.Time // when the request went upstream
	first  time.Time // first response byte: headers of a buffered answer, first body bytes of a stream
}

// stream learns from streamed bytes, indexing new tool-call ids at once.
func (o *observer) streamed(p []byte, w *loadview.Worker) {
	if o.first.IsZero() {
		o.first = time.Now()
	}
	o.sse.Write(p, &o.learned)
	if o.models == nil {
		return
	}
	if ids := o.learned.ToolCallIDs; len(ids) > o.noted {
		o.models.NoteToolCalls(o.model, w.URL(), ids[o.noted:])
		o.noted = len(ids)
	}
	if ids := o.learned.ReasoningIDs; len(ids) > o.notedR {
		o.models.NoteReasoning(o.model, w.URL(), ids[o.notedR:])
		o.notedR = len(ids)
	}
	if o.share {
		o.shareLocks(w)
	}
}

// scan learns from a whole (not streamed) response body. Only the model
// step reads its ids (docs/design.md §5: locks, shared ones included); the
// policy alone needs the token counts, which ScanUsage reads without
// walking the choices' tool calls.
func (o *observer) scan(body []byte) {
	if o.models == nil {
		_ = reqview.ScanUsage(&o.learned, body)
		return
	}
	_ = reqview.ScanResponse(&o.learned, body)
}

// lockWrite is one ShareLocks call in flight; done closes when it and every
// write started before it have returned. Not pooled: it outlives the
// observer when the client leaves.
type lockWrite struct {
	done chan struct{}
	err  error
}

// shareLocks starts writing the locks the response has shown since the
// last call (tool-call ids; the response id of a Responses API answer;
// opaque reasoning artifacts, docs/design.md §5) to
// the shared store, in the background, chained after the write in flight.
// A response that shows no lock starts nothing.
func (o *observer) shareLocks(w *loadview.Worker) {
	l := &o.learned
	var ids [][]byte
	if len(l.ToolCallIDs) > o.sharedIDs {
		ids = make([][]byte, 0, len(l.ToolCallIDs)-o.sharedIDs)
		for _, id := range l.ToolCallIDs[o.sharedIDs:] {
			ids = append(ids, bytes.Clone(id))
		}
		o.sharedIDs = len(l.ToolCallIDs)
	}
	var rid []byte
	if o.shareResp && !o.sharedID && len(l.ResponseID) > 0 {
		rid, o.sharedID = bytes.Clone(l.ResponseID), true
	}
	var rs []reqview.ReasoningID
	if len(l.ReasoningIDs) > o.sharedRs {
		rs = slices.Clone(l.ReasoningIDs[o.sharedRs:])
		o.sharedRs = len(l.ReasoningIDs)
	}
	if ids == nil && rid == nil && rs == nil {
		return
	}
	prev, lw := o.lw, &lockWrite{done: make(chan struct{})}
	o.lw = lw
	models, model, url := o.models, o.model, w.URL()
	go func() {
		lw.err = models.ShareLocks(context.Background(), model, url, ids, rid, rs)
		if prev != nil {
			<-prev.done
			lw.err = cmp.Or(lw.err, prev.err)
		}
		close(lw.done)
	}()
}

// waitLocks returns once lw (and the writes before it) returned: the
// response's bytes that follow may now reach the client. The time waited
// is what the lock write added to the response.
func (o *observer) waitLocks(lw *lockWrite) {
	if lw == nil {
		return
	}
	t0 := time.Now()
	<-lw.done
	if o.lockWait != nil {
		o.lockWait.UpdateDuration(t0)
	}
	if o.lw == lw {
		o.lw = nil
	}
}

// syncLocks writes what the whole response taught and waits for every lock
// write and the binding's flush: a buffered body is forwarded only
// afterwards.
func (o *observer) syncLocks(w *loadview.Worker) {
	if o.share {
		o.shareLocks(w)
		o.waitLocks(o.lw)
	}
	o.waitFlush()
}

// startFlush starts waiting, in the background, for the shared store to
// acknowledge every binding queued so far, this selection's included
// (docs/design.md §8.3): it overlaps with the worker's answer.
func (o *observer) startFlush() {
	fw, st := &lockWrite{done: make(chan struct{})}, o.shared
	o.fw = fw
	go func() {
		fw.err = st.Flush(context.Background()) // bounded by the store (AsyncTimeout; at once while Redis is down)
		close(fw.done)
	}()
}

// waitFlush returns once the binding's flush, if any, returned: the
// response's last byte may now reach the client. A failed flush (Redis
// down) kept the binding for replay; the response completes anyway.
func (o *observer) waitFlush() {
	if o.fw != nil {
		<-o.fw.done
		o.fw = nil
	}
}

// streamEnds reports whether chunk holds the end of an SSE stream: chat
// and completions "[DONE]", the Responses API's final events.
func streamEnds(chunk []byte) bool {
	return bytes.Contains(chunk, []byte("[DONE]")) || bytes.Contains(chunk, []byte(`"response.completed"`)) ||
		bytes.Contains(chunk, []byte(`"response.incomplete"`)) || bytes.Contains(chunk, []byte(`"response.failed"`))
}

// newObserver returns a pooled observer for st's request; forSAAR: the
// model step learns from it too.
func (s *Server) newObserver(st *reqState, forSAAR bool) *observer {
	o := s.observers.Get().(*observer)
	o.ca = s.ca
	if forSAAR {
		o.models = s.cfg.Models
		o.session = append(o.session[:0], st.req.Session...)
		o.model = strings.Clone(st.req.Model) // may alias the request body
		o.lock = st.sel.LockModel
		if o.share = s.lockWait != nil; o.share {
			o.shareResp, o.lockWait = st.kind == reqview.Responses, s.lockWait
		}
	}
	if o.shared = s.cfg.Shared; o.shared != nil {
		o.memQueued = forSAAR && st.sel.Model != "" && len(st.req.Session) > 0
	}
	return o
}

// releaseObserver returns o (may be nil) to the pool.
func (s *Server) releaseObserver(o *observer) {
	if o == nil {
		return
	}
	o.learned.Reset()
	o.sse.Reset()
	session := o.session[:0]
	if cap(session) > 4096 {
		session = nil
	}
	*o = observer{session: session, sse: o.sse, learned: o.learned}
	s.observers.Put(o)
}

// sending records, before an attempt, what the policy learns besides the
// answer: the choice, the worker's load across replicas (what the estimate
// reads, docs/design.md §4 and §8.3) and the clock; and starts flushing
// the binding the choice published and the memory record the model step
// published, so that the session's next turn, on any replica, reads both.
func (o *observer) sending(ch route.Choice, stream bool) {
	o.choice, o.stream = ch, stream
	o.load = ch.Worker.FleetLoad()
	o.sent, o.first = time.Now(), time.Time{}
	if o.shared != nil && (ch.Published() || o.memQueued) {
		o.startFlush()
	}
}

// done records what the response taught, with the worker that served it.
func (o *observer) done(w *loadview.Worker) {
	l := &o.learned
	if o.models != nil {
		o.models.Observe(o.session, o.model, w.URL(), saar.Observed{
			ResponseID:       l.ResponseID,
			ToolCallIDs:      l.ToolCallIDs,
			ReasoningIDs:     l.ReasoningIDs,
			PromptTokens:     l.PromptTokens,
			CachedTokens:     l.CachedTokens,
			CompletionTokens: l.CompletionTokens,
			Lock:             o.lock,
		})
	}
	if o.ca == nil || o.choice.Worker != w {
		return
	}
	now := time.Now()
	first := o.first
	if first.IsZero() {
		first = now
	}
	// An absent cached_tokens (vLLM omits prompt_tokens_details without
	// --enable-prompt-tokens-details) is unknown, never "nothing cached".
	sv := route.Served{TTFB: first.Sub(o.sent), Elapsed: now.Sub(o.sent), Stream: o.stream, Load: o.load,
		PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1}
	if l.HasUsage {
		if l.PromptTokens > 0 {
			sv.PromptTokens = l.PromptTokens
		}
		if l.CachedKnown {
			sv.CachedTokens = l.CachedTokens
		}
		sv.CompletionTokens = l.CompletionTokens
	}
	o.ca.Observe(o.choice, &sv)
}

// responseByID routes GET|DELETE /v1/responses/{id} (and its sub-resources,
// GET …/input_items, POST …/cancel) to the worker that created the
// response: provider-managed state is not portable.
func (s *Server) responseByID(ctx *fasthttp.RequestCtx, tail string) {
	id, sub, _ := strings.Cut(tail, "/")
	allow, ok := "GET, DELETE", ctx.IsGet() || ctx.IsDelete()
	if sub != "" {
		allow, ok = "GET, POST", ctx.IsGet() || ctx.IsPost()
	}
	if !ok {
		methodNotAllowed(ctx, allow)
		return
	}
	if s.cfg.Models == nil {
		notFound(ctx, "response_not_found", "response "+clip(id, 128)+" was not created through this router")
		return
	}
	_, url, ok, unreachable := s.cfg.Models.LookupResponse(s2b(id))
	if unreachable { // another replica may hold it (docs/design.md §8.3): not a 404
		writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "shared_state_unavailable",
			"the router cannot reach its shared state to find the worker that holds this response; retry later")
		return
	}
	if !ok {
		notFound(ctx, "response_not_found", "response "+clip(id, 128)+" was not created through this router")
		return
	}
	w := s.cfg.Registry.ByURL(url)
	if w == nil || !w.Healthy() {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "owner_unavailable",
			"the worker that holds this response is not available")
		return
	}
	st := s.getState()
	defer s.releaseState(st)
	st.pin = w
	st.req = route.Request{Workers: []*loadview.Worker{w}, Subset: true}
	st.noRetry = true
	s.forward(ctx, st, false)
	if sub == "" && ctx.IsDelete() && ctx.Response.StatusCode() == fasthttp.StatusOK {
		s.cfg.Models.ForgetResponse(s2b(id))
	}
}

// routerReplay serves GET /v1/router_replay?session=&limit=: the model
// step's replay records, oldest first.
func (s *Server) routerReplay(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		methodNotAllowed(ctx, "GET")
		return
	}
	if s.cfg.Models == nil {
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"records": []saar.Record{}})
		return
	}
	limit := 100
	if l := ctx.QueryArgs().Peek("limit"); len(l) > 0 {
		n, err := strconv.Atoi(string(l))
		if err != nil || n < 0 {
			badRequest(ctx, "limit must be a non-negative integer")
			return
		}
		limit = n
	}
	recs := s.cfg.Models.Records(string(ctx.QueryArgs().Peek("session")), limit)
	if recs == nil {
		recs = []saar.Record{}
	}
	b, err := sonic.Marshal(map[string]any{"records": recs})
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, "internal_error", "encode_failed", "cannot encode the response")
		return
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// s2b views s as bytes without copying; the result must not be modified.
func s2b(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
