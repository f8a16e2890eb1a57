package fastproxy

import (
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// Response headers the router adds to every proxied response, in the
// canonical form that fasthttp gives parsed names, so that label sets them
// without normalizing a copy of each name (SetCanonical) and still replaces
// a worker's header of the same name.
const (
	hdrWorker     = "X-Vllm-Router-Worker"
	hdrBaseWorker = "X-Vllm-Router-Base-Worker"
	hdrDPRank     = "X-Vllm-Router-Dp-Rank"
	hdrDecision   = "X-Vllm-Router-Decision"
)

// workerStep is the fourth stage: the candidates of a request (the workers
// of its model whose context fits it, contextfit.go) and, for each attempt
// of forward, the worker the policy chooses among those not yet tried
// (docs/design.md §4).
type workerStep struct {
	policy route.Policy
	reg    *loadview.Registry
	rates  route.TokenRates // the policy's learned characters per token; nil: fitCharsPerToken
	// rediscovery asks the fleet for its models again before a 404.
	rediscovery *modelRediscovery
}

// candidates sets st.req.Workers to the workers that may serve its model,
// narrowed to those its context fits. It answers 404 (no such model) or 503
// (no worker) itself and returns false when there is none. A model no
// worker lists is looked for once more first, in the rate-limited
// rediscovery of the fleet's models (rediscover.go).
func (ws *workerStep) candidates(ctx *fasthttp.RequestCtx, st *reqState) bool {
	workers, ok := ws.reg.ForModel(bytesconv.S2B(st.req.Model))
	if !ok && len(st.req.Model) > 0 && ws.rediscovery.await(st.req.Model) {
		workers, ok = ws.reg.ForModel(bytesconv.S2B(st.req.Model))
	}
	if !ok {
		if len(st.req.Model) > 0 {
			notFound(ctx, "model_not_found", "The model `"+clip(st.req.Model, 256)+"` does not exist.")
		} else {
			noWorker(ctx, nil)
		}
		return false
	}
	st.req.Workers, st.req.Subset = workers, false
	ws.fitContext(st, ctx.PostBody())
	return true
}

// choose returns the worker of the next attempt: the one provider state
// pins the request to, else the policy's choice (Worker nil when no
// candidate is healthy). It answers 503 itself and returns false when the
// pinned worker went down since the model step chose it.
func (ws *workerStep) choose(ctx *fasthttp.RequestCtx, st *reqState) (route.Choice, bool) {
	if st.pin == nil {
		return ws.policy.Select(&st.req), true
	}
	if !st.pin.Healthy() {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "owner_unavailable",
			"the worker that holds this request's provider state is not available")
		return route.Choice{}, false
	}
	return route.Choice{Worker: st.pin, Decision: route.PinnedWorker}, true
}

// label sets the router headers of choice on an answer a worker gave: its
// decision and, with --expose-worker-headers, its worker; without, a
// worker's own headers of those names are dropped too (a router behind
// the router). The handler counts the decision the response finally
// carries, once per request.
func (f *forwarder) label(ctx *fasthttp.RequestCtx, ch route.Choice) {
	h := &ctx.Response.Header
	h.SetCanonical(bytesconv.S2B(hdrDecision), bytesconv.S2B(ch.Decision))
	if !f.exposeWorkers {
		dropWorkerHeaders(h)
		return
	}
	h.SetCanonical(bytesconv.S2B(hdrWorker), bytesconv.S2B(ch.Worker.URL()))
	h.SetCanonical(bytesconv.S2B(hdrBaseWorker), bytesconv.S2B(ch.Worker.BaseURL()))
	if r := ch.Worker.RankString(); r != "" {
		h.SetCanonical(bytesconv.S2B(hdrDPRank), bytesconv.S2B(r))
	}
}

// labelError labels an error the router wrote itself after choosing ch:
// the decision only. A worker's address is never on the router's own
// error answers, whatever --expose-worker-headers says (docs/design.md §8).
func labelError(ctx *fasthttp.RequestCtx, ch route.Choice) {
	ctx.Response.Header.SetCanonical(bytesconv.S2B(hdrDecision), bytesconv.S2B(ch.Decision))
}

// setWorkerHeader sets the worker header name to w's URL with
// --expose-worker-headers; without it, nothing.
func (f *forwarder) setWorkerHeader(h *fasthttp.ResponseHeader, name string, w *loadview.Worker) {
	if f.exposeWorkers {
		h.SetCanonical(bytesconv.S2B(name), bytesconv.S2B(w.URL()))
	}
}

// workerHeaders are the response headers that name a worker.
var workerHeaders = []string{hdrWorker, hdrBaseWorker, hdrDPRank, hdrPrefillWorker, hdrDecodeWorker}

// dropWorkerHeaders removes the headers that name a worker from h.
func dropWorkerHeaders(h *fasthttp.ResponseHeader) {
	if hasAny(h.All(), workerHeaders) {
		for _, k := range workerHeaders {
			h.Del(k)
		}
	}
}
