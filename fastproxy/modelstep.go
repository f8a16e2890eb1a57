package fastproxy

import (
	"log/slog"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/saar"
)

// Response headers of the model step (logical models only).
const (
	hdrSelectedModel    = "x-vsr-selected-model"
	hdrSelectedDecision = "x-vsr-selected-decision"
	hdrSessionPhase     = "x-vsr-session-phase"
	hdrSessionAction    = "x-vsr-session-action"
	hdrReplayID         = "x-vsr-replay-id"
)

// modelStep is the third stage: for a logical model (such as auto) the
// model step (saar) chooses the physical model of this turn, and the body
// goes on with that model's name spliced in (docs/design.md §5). It also
// knows which worker holds a Responses API response. A zero modelStep (no
// models configured) serves physical models only.
type modelStep struct {
	models          *saar.Router // nil: physical models only
	forwardPriority bool         // the workers get the request's priority in the body (--forward-priority)
	reg             *loadview.Registry
	health          saar.Health // the model step's view of the fleet, built once so a request does not allocate its closures
	failovers       *metrics.Counter
	log             *slog.Logger
}

func newModelStep(models *saar.Router, reg *loadview.Registry, failovers *metrics.Counter, log *slog.Logger) modelStep {
	m := modelStep{models: models, reg: reg, failovers: failovers, log: log}
	m.health = saar.Health{
		ModelUp: func(model string) bool {
			ws, _ := reg.ForModel(bytesconv.S2B(model))
			for _, w := range ws {
				if w.Healthy() {
					return true
				}
			}
			return false
		},
		WorkerUp: func(url string) bool {
			w := reg.ByURL(url)
			return w != nil && w.Healthy()
		},
	}
	return m
}

// on reports whether models are configured.
func (m *modelStep) on() bool { return m.models != nil }

// logical reports whether st's request names a logical model.
func (m *modelStep) logical(st *reqState) bool {
	return m.models != nil && m.models.IsLogical(st.req.Model)
}

// logicalModels lists the logical model names served by the model step.
func (m *modelStep) logicalModels() []string {
	if m.models == nil {
		return nil
	}
	return m.models.LogicalModels()
}

// choose chooses the physical model of this turn of a logical model and
// splices its name into the body (the original body is kept in st until
// the request ends, since the view aliases it). It returns false when it
// answered the request itself.
func (m *modelStep) choose(ctx *fasthttp.RequestCtx, st *reqState, h saar.Health) bool {
	v := st.view
	hdr := &ctx.Request.Header
	t0 := st.trace.clock()
	st.sel = m.models.Select(&saar.Turn{
		Logical:            bytesconv.S2B(st.req.Model),
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
	st.trace.modelStep(t0, st.req.Model, &st.sel)
	if st.sel.Model == "" {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "no_model_available",
			"no physical model of "+clip(string(v.Model), 256)+" has a healthy worker")
		return false
	}
	st.rewriteBody(ctx, st.sel.Model, m.forwardPriority)
	st.req.Model = st.sel.Model
	if st.sel.PinnedWorker != "" {
		// Provider state lives on that worker only: no silent failover to
		// another one (the model step breaks the lock explicitly when the
		// worker is down).
		if st.pin = m.reg.ByURL(st.sel.PinnedWorker); st.pin == nil {
			writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "owner_unavailable",
				"the worker that holds this request's provider state is no longer registered")
			return false
		}
		st.noRetry = true
	}
	return true
}

// failover chooses again when every worker of the turn's model failed it
// before any byte reached the client, with that model counted as down: an
// unlocked turn moves to another model, a hard-locked one breaks its lock
// explicitly (lock_broken). It reports whether the request goes round the
// worker step once more, with the failed answer reset. Provider-state
// turns pinned to a worker never fail over (their state lives there).
func (m *modelStep) failover(ctx *fasthttp.RequestCtx, st *reqState) bool {
	if st.pin != nil || st.noRetry {
		return false
	}
	switch ctx.Response.StatusCode() { // our own 502 (retries exhausted) or 503 (no healthy worker)
	case fasthttp.StatusBadGateway, fasthttp.StatusServiceUnavailable:
	default:
		return false
	}
	failed := st.sel.Model
	h := m.health
	h.Pool = nil // a turn moves off a saturated pool once, before it waits (docs/design.md §9)
	up := h.ModelUp
	h.ModelUp = func(m string) bool { return m != failed && up(m) }
	st.req.Model = st.modelName() // the logical name again
	save := ctx.Response.StatusCode()
	if !m.choose(ctx, st, h) || st.sel.Model == failed {
		ctx.Response.SetStatusCode(save)
		return false
	}
	if _, ok := m.reg.ForModel(bytesconv.S2B(st.req.Model)); !ok {
		return false
	}
	m.failovers.Inc()
	st.trace.log(m.log).Warn("model failed over", "from", failed, "to", st.sel.Model, "action", st.sel.Action)
	ctx.Response.Reset()
	return true
}

// label echoes the model step's choice on the response.
func (m *modelStep) label(ctx *fasthttp.RequestCtx, sel *saar.Selection) {
	h := &ctx.Response.Header
	h.Set(hdrSelectedModel, sel.Model)
	h.Set(hdrSelectedDecision, sel.Decision)
	h.Set(hdrSessionPhase, sel.Phase)
	h.Set(hdrSessionAction, sel.Action)
	h.Set(hdrReplayID, sel.ReplayID)
}

// responseOwner returns the healthy worker that created the Responses API
// response id (provider-managed state is not portable), or answers 404 or
// 503 itself and returns false.
func (m *modelStep) responseOwner(ctx *fasthttp.RequestCtx, id string) (*loadview.Worker, bool) {
	if m.models == nil {
		notFound(ctx, "response_not_found", "response "+clip(id, 128)+" was not created through this router")
		return nil, false
	}
	_, url, ok, unreachable := m.models.LookupResponse(bytesconv.S2B(id))
	if unreachable { // another replica may hold it (docs/design.md §8.3): not a 404
		writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "shared_state_unavailable",
			"the router cannot reach its shared state to find the worker that holds this response; retry later")
		return nil, false
	}
	if !ok {
		notFound(ctx, "response_not_found", "response "+clip(id, 128)+" was not created through this router")
		return nil, false
	}
	w := m.reg.ByURL(url)
	if w == nil || !w.Healthy() {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "owner_unavailable",
			"the worker that holds this response is not available")
		return nil, false
	}
	return w, true
}

// forgetResponse drops a deleted response's owner.
func (m *modelStep) forgetResponse(id string) { m.models.ForgetResponse(bytesconv.S2B(id)) }
