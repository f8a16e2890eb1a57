package fastproxy

import (
	"errors"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
)

// Outcomes of a stream its worker cut (label outcome of
// vllm_router_stream_resumes_total).
const (
	resumeDone   = "resumed"         // continued on another worker
	resumeNot    = "not_continuable" // ended with the error event: the answer cannot be continued
	resumeFailed = "failed"          // it could be, but no worker took the continuation
)

var resumeOutcomes = [...]string{resumeDone, resumeNot, resumeFailed}

// continueAnswer continues the answer the relay follows on another worker
// of its model after its worker cut the stream (docs/design.md §8.2), and
// reports whether it did. The continuation is admitted at once (its client
// is being served), placed by the policy among the workers that have not
// served the answer (the session's other holders first), and counts
// against --request-timeout-secs; --stream-resume-attempts bounds the
// workers tried.
func (r *relay) continueAnswer() bool {
	why := r.ans.Why()
	switch {
	case why != "":
	case r.pinned:
		why = "the model step pins the turn to its worker"
	case r.resumes >= r.f.resumeAttempts:
		why = "it was continued --stream-resume-attempts times"
	}
	var body []byte
	if why == "" {
		var err error
		if body, err = r.ans.Body(r.ctx.Request.Body()); err != nil {
			why = err.Error()
		}
	}
	if why != "" {
		r.f.metrics.resumes[resumeNot].Inc()
		r.trace.log(r.f.log).Warn("stream not continued", "request_id", r.rid, "why", why)
		return false
	}
	from := r.w.URL()
	for r.resumes < r.f.resumeAttempts {
		r.resumes++
		if r.reopen(body) {
			text, tokens := r.ans.Delivered()
			r.ans.Continue()
			r.f.metrics.resumes[resumeDone].Inc()
			r.trace.log(r.f.log).Info("stream continued on another worker", "request_id", r.rid, "from", from,
				"worker", r.w.URL(), "delivered_bytes", len(text), "delivered_tokens", tokens)
			return true
		}
	}
	r.f.metrics.resumes[resumeFailed].Inc()
	r.trace.log(r.f.log).Warn("stream not continued", "request_id", r.rid, "why", "no worker took the continuation")
	return false
}

// errNotOK: a continuation's worker answered with another status than 200.
var errNotOK = errors.New("the continuation was not answered with 200")

// reopen sends the continuation body to a worker not tried yet and, when
// it answers 200, makes its stream the relay's.
func (r *relay) reopen(body []byte) bool {
	left := r.f.timeout - time.Since(r.ctx.Time())
	ch := r.f.continuationChoice(r.ctx, r.kind, r.tried)
	if left <= 0 || ch.Worker == nil {
		return false
	}
	r.closeUpstream()
	r.releaseWorker()
	w := ch.Worker
	r.tried = append(r.tried, w)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	r.ctx.Request.Header.CopyTo(&req.Header) // the body is the continuation's: not copied
	r.ctx.Request.URI().CopyTo(req.URI())
	req.SetBodyRaw(body)
	r.f.addressTo(req, w)
	r.trace.attemptStart(&req.Header, w, true)
	r.w, r.held = w, true
	r.first.Store(false)
	w.Acquire()
	if r.obs != nil {
		r.obs.Sending(ch, true)
	}
	err := r.open(req, left)
	if err == nil && r.up.StatusCode() != fasthttp.StatusOK {
		err = errNotOK
	}
	r.trace.continuation(err, r.up.StatusCode())
	if err == nil {
		return true
	}
	if err != errNotOK {
		r.f.classify(w, err, r.up, false) // the breaker hears of it
	}
	r.trace.log(r.f.log).Warn("stream continuation failed", "request_id", r.rid, "worker", w.URL(), "err", err)
	r.closeUpstream()
	r.releaseWorker()
	return false
}

// releaseWorker releases the load the relay holds on its worker, once.
func (r *relay) releaseWorker() {
	if !r.held {
		return
	}
	r.held = false
	if !r.first.Load() {
		r.first.Store(true)
		r.w.FirstByte() // none came
	}
	r.w.Release()
}

// continuationChoice is the worker step for a continuation of ctx's
// request: the policy's choice among the healthy workers of its model that
// have not served it (tried), keyed on its history as the first attempt
// was; Worker nil when none is left.
func (f *forwarder) continuationChoice(ctx *fasthttp.RequestCtx, kind reqview.Kind, tried []*loadview.Worker) route.Choice {
	st := &reqState{view: f.views.get()}
	defer f.views.drop(st)
	if f.views.parse(st, ctx.PostBody(), kind) != nil {
		return route.Choice{}
	}
	st.kind = kind
	st.req = route.Request{Model: st.modelName(), Session: sessionKey(&ctx.Request.Header, st.view, &st.scratch),
		Prefix: routingKey(st.view, kind)}
	workers, ok := f.reg.ForModel(bytesconv.S2B(st.req.Model))
	if !ok {
		return route.Choice{}
	}
	st.req.Workers, st.req.Subset = excluding(workers, tried), true
	return f.workers.policy.Select(&st.req)
}

// addressTo points a continuation's request at w (address, for a request
// that is not the handler's).
func (f *forwarder) addressTo(req *fasthttp.Request, w *loadview.Worker) {
	req.URI().SetHost(w.Client().Addr)
	if rk := w.RankString(); rk != "" {
		req.Header.SetCanonical(bytesconv.S2B(hdrRankUp), bytesconv.S2B(rk))
	} else {
		req.Header.Del(hdrRankUp)
	}
	if b := *f.bearer.Load(); b != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, b)
	}
}
