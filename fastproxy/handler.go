package fastproxy

import (
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/learn"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
)

// Handler is the fasthttp handler for the router's inference listener: it
// sends each path to what serves it (paths.go) and counts every answer
// once, by route, status and decision.
func (s *Server) Handler(ctx *fasthttp.RequestCtx) {
	path, ep, ok := s.endpointOf(ctx)
	rm := s.rm[path]
	if rm == nil {
		rm = s.rmAll
	}
	var ridBuf [128]byte
	rid := s.requestID(ctx, &ridBuf)
	clientClose := ctx.Request.Header.ConnectionClose() // forward drops the client's Connection header
	var tr *reqTrace
	if s.tracer != nil {
		tr = s.startTrace(ctx, path, ep, rid)
	}
	defer func() {
		if clientClose {
			ctx.SetConnectionClose()
		}
		if p := recover(); p != nil {
			s.metrics.panics.Inc()
			tr.log(s.cfg.Logger).Error("handler panic", "request_id", string(rid), "path", path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			ctx.Response.Reset()
			writeError(ctx, fasthttp.StatusInternalServerError, "internal_error", "internal_error", "internal router error")
		}
		ctx.Response.Header.SetCanonical(bytesconv.S2B(hdrRequestID), rid)
		s.metrics.countDecision(ctx.Response.Header.Peek(hdrDecision))
		// ctx.Time: when fasthttp began serving the request. A stream ends
		// after the handler returns: its relay counts and times it.
		if r, ok := ctx.Response.BodyStream().(*relay); ok {
			r.rm, r.start, r.root = rm, ctx.Time(), tr
		} else {
			rm.count(ctx.Response.StatusCode())
			rm.duration.observe(time.Since(ctx.Time()))
			tr.end(ctx.Response.StatusCode(), false)
		}
	}()
	if !ok {
		badRequest(ctx, "the request path must be sent in normalized form (no dot segments or encoded separators)")
		return
	}
	switch ep {
	case epLiveness:
		s.liveness(ctx)
	case epReadiness:
		s.readiness(ctx)
	case epUnknown:
		noRoute(ctx)
	case epAdmin, epFleetAdmin:
		s.serveAdmin(ctx, adminKeyOnly, path, rid, func() { s.adminEndpoint(ctx, path, ep) })
	case epMetrics: // a scrape: not audited
		if _, ok := s.admitAdmin(ctx, adminKeyOnly); ok {
			ctx.SetContentType("text/plain; version=0.0.4")
			s.WriteMetrics(ctx)
		}
	default:
		if t, ok := s.admitClient(ctx); ok {
			if t != nil && t.limits.On() {
				s.limitedClient(ctx, path, ep, t, tr)
			} else {
				s.client(ctx, path, ep, t, tr)
			}
		}
	}
}

// client serves an authenticated client's request (t: its key's tenant,
// nil without client keys) to an inference or worker endpoint, or
// /v1/models.
func (s *Server) client(ctx *fasthttp.RequestCtx, path string, ep endpoint, t *tenant, tr *reqTrace) {
	if ep == epModels {
		s.listModels(ctx)
		return
	}
	st := s.getState()
	defer s.releaseState(st)
	if t != nil {
		st.tenant = t.name
		if t.limits.TPM > 0 && generates(ep) {
			st.limited = t // its stream's relay charges the tokens it delivers
		}
	}
	st.trace = tr
	switch ep {
	case epChat, epCompletions, epResponses, epMessages, epGenerateTokens, epEmbeddings:
		st.legs = s.fwd.pd != nil && legs(ep)
		s.inference(ctx, st, inferenceKinds[ep])
	case epResponseByID:
		s.responseByID(ctx, st, path[len(pathResponses)+1:])
	case epWorkerPath:
		s.passThrough(ctx, st)
	}
}

// inferenceKinds is the body family of each inference endpoint.
var inferenceKinds = [...]reqview.Kind{
	epChat:           reqview.Chat,
	epCompletions:    reqview.Completions,
	epResponses:      reqview.Responses,
	epMessages:       reqview.Messages,
	epGenerateTokens: reqview.Generate,
	epEmbeddings:     reqview.Other,
}

// inference runs an inference request through the stages, in order
// (docs/design.md §2): the view of its body, the model step (logical models
// only), admission (the queue, per physical model), the worker step's
// candidates, then forward, whose attempts ask the worker step for a worker
// each and hand the answer to the learning room, through the relay when it
// streams. When every worker of a logical model's choice failed the request
// before any byte reached the client, the model step chooses again and the
// request goes round once more.
func (s *Server) inference(ctx *fasthttp.RequestCtx, st *reqState, kind reqview.Kind) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	if !s.view.read(ctx, st, kind) {
		return
	}
	if s.fwd.pd != nil && st.view.TransferParams && !s.withoutTransferParams(ctx, st, kind) {
		return
	}
	stream := st.view.Stream
	logical := s.models.logical(st)
	if logical && !s.models.choose(ctx, st, s.models.health) {
		return
	}
	if !logical {
		st.rewriteBody(ctx, "", s.cfg.ForwardPriority)
	}
	if !s.admit.admit(ctx, st) {
		return
	}
	defer s.admit.done(ctx, st)
	defer labelQueue(ctx, st)
	forModelStep := logical || (kind == reqview.Responses && s.models.on())
	for {
		if !s.workers.candidates(ctx, st) {
			return
		}
		st.obs.Release()
		st.obs = s.learn.Observer(learn.Turn{Session: st.req.Session, Model: st.req.Model, ModelStep: forModelStep,
			Lock: st.sel.LockModel, Responses: kind == reqview.Responses, Chosen: st.sel.Model != ""})
		st.early = !forModelStep
		s.fwd.forward(ctx, st, stream)
		if !logical || !s.models.failover(ctx, st) {
			break
		}
	}
	if logical {
		s.models.label(ctx, &st.sel)
	}
}

// passThrough proxies a worker endpoint (workerPaths) to a policy-chosen
// worker of the body's model, if it names one the fleet serves.
func (s *Server) passThrough(ctx *fasthttp.RequestCtx, st *reqState) {
	v := st.view
	body := ctx.PostBody()
	if len(body) > 0 && reqview.Parse(v, body, reqview.Other) != nil {
		v.Reset() // not JSON: forward as is, route without a body identity
	} else if s.fwd.pd != nil && v.TransferParams && !s.withoutTransferParams(ctx, st, reqview.Other) {
		return
	}
	model := st.modelName()
	workers, ok := s.cfg.Registry.ForModel(bytesconv.S2B(model))
	if !ok || !s.cfg.Registry.Serves(model) {
		model, workers = "", s.cfg.Registry.Workers() // no routing state for a name the fleet does not serve
	}
	st.req = route.Request{
		Model:   model,
		Workers: workers,
		Session: sessionKey(&ctx.Request.Header, v, &st.scratch),
	}
	if !s.admit.admit(ctx, st) {
		return
	}
	defer s.admit.done(ctx, st)
	defer labelQueue(ctx, st)
	s.fwd.forward(ctx, st, v.Stream)
}

// responseByID routes GET|DELETE /v1/responses/{id} (and its sub-resources,
// GET …/input_items, POST …/cancel) to the worker that created the
// response: provider-managed state is not portable.
func (s *Server) responseByID(ctx *fasthttp.RequestCtx, st *reqState, tail string) {
	id, sub, _ := strings.Cut(tail, "/")
	allow, ok := "GET, DELETE", ctx.IsGet() || ctx.IsDelete()
	if sub != "" {
		allow, ok = "GET, POST", ctx.IsGet() || ctx.IsPost()
	}
	if !ok {
		methodNotAllowed(ctx, allow)
		return
	}
	w, ok := s.models.responseOwner(ctx, id)
	if !ok {
		return
	}
	st.pin = w
	st.req = route.Request{Workers: []*loadview.Worker{w}, Subset: true}
	st.noRetry = true
	if !s.admit.admit(ctx, st) {
		return
	}
	defer s.admit.done(ctx, st)
	defer labelQueue(ctx, st)
	s.fwd.forward(ctx, st, false)
	if sub == "" && ctx.IsDelete() && ctx.Response.StatusCode() == fasthttp.StatusOK {
		s.models.forgetResponse(id)
	}
}

// clip returns at most n bytes of s, for echoing client input in errors.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
