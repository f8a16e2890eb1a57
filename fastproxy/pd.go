package fastproxy

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
)

// Response headers of a disaggregated request: the worker of each leg and
// the decode policy's decision (the request's decision header is the
// prefill choice's).
const (
	hdrPrefillWorker  = "X-Vllm-Router-Prefill-Worker"
	hdrDecodeWorker   = "X-Vllm-Router-Decode-Worker"
	hdrDecodeDecision = "X-Vllm-Router-Decode-Decision"
)

// Outcomes of a request whose worker step chose a prefill worker (label
// outcome of vllm_router_pd_requests_total).
const (
	pdDecoded      = "decoded"       // prefilled, then a decode leg answered
	pdPrefillError = "prefill_error" // the prefill worker answered with the request's error, passed to the client
	pdWhole        = "whole"         // no decode worker was healthy, or every one failed the decode leg: the prefill worker served the request whole
	pdFailed       = "failed"        // no decode leg answered; the request went on to another prefill worker
)

var pdOutcomes = [...]string{pdDecoded, pdPrefillError, pdWhole, pdFailed}

// kindDecode: every decode leg of a prefilled request failed (a failure
// kind that charges nobody: each decode worker was charged as it failed).
const kindDecode = "decode_failed"

// disagg is the forward stage's part for a disaggregated fleet
// (docs/design.md §9, "Disaggregated fleets"): when the worker step chose
// a Prefill worker, the request goes there first as a prefill-only request
// (prefillBody), then, with the kv_transfer_params of that answer, to a
// Decode worker of the model that the decode policy chooses; the decode
// answer is the client's, streamed or not, like any answer.
type disagg struct {
	policy route.Policy  // chooses the decode worker
	hold   time.Duration // a prefill worker keeps the blocks this long (PDConfig.KVHold)
}

// legs reports whether requests of ep are disaggregated: those that
// generate, on the routes vLLM's disaggregated proxy splits. Other
// endpoints go whole to the chosen entry worker.
func legs(ep endpoint) bool { return ep == epChat || ep == epCompletions || ep == epResponses }

// decodeChoice is the decode policy's choice for st among the healthy
// decode workers of its model not in tried; Worker nil when none is left.
func (p *disagg) decodeChoice(reg *loadview.Registry, st *reqState, tried []*loadview.Worker) route.Choice {
	ws, ok := reg.DecodeWorkers(bytesconv.S2B(st.req.Model))
	if !ok {
		return route.Choice{}
	}
	req := st.req // the session and history keys of the prefill choice; the decode side's candidates
	req.Workers, req.Subset = ws, false
	if len(tried) > 0 {
		req.Workers, req.Subset = excluding(ws, tried), true
	}
	return p.policy.Select(&req)
}

// disaggregated serves ctx's request in two legs: prefill on pre.Worker,
// decode on dec.Worker (docs/design.md §9). The outcome is the request's,
// as attempt's:
//   - the prefill leg failing is pre.Worker's failure: forward tries
//     another entry worker;
//   - a decode leg failing before its first byte is sent again, with the
//     same kv_transfer_params, to another decode worker while the prefill
//     worker still holds the blocks (hold), at most --retry-max-retries
//     legs; past that it fails with kindDecode and forward prefills again
//     elsewhere; when no decode worker is left to try, the prefill worker,
//     whose cache holds the prompt now, serves the request whole; two
//     decode workers failing it with the same status is the request's
//     fault, answered with it;
//   - once the decode answer began it is the client's, as any answer: a
//     cut stream is continued (relay.go).
func (f *forwarder) disaggregated(ctx *fasthttp.RequestCtx, st *reqState, pre, dec route.Choice, stream bool) (outcome, failure) {
	params, out, fail := f.prefillLeg(ctx, st, pre)
	if out != sent {
		return out, fail
	}
	h := &ctx.Response.Header
	if params == nil { // the prefill worker's own error, for the client
		f.metrics.pd[pdPrefillError].Inc()
		f.setWorkerHeader(h, hdrPrefillWorker, pre.Worker)
		return sent, failure{}
	}
	prefilled := time.Now()
	st.pdBody = append(st.pdBody[:0], ctx.Request.Body()...)
	buf := legBufs.Get().(*[]byte)
	body, err := decodeBody((*buf)[:0], st.pdBody, params)
	if err != nil { // the prefill leg parsed the same body: not reached
		putLegBuf(buf)
		return failed, failure{kind: kindInvalid, detail: err.Error()}
	}
	ctx.Request.SetBody(body) // a copy: the request outlives the handler when it streams
	*buf = body
	putLegBuf(buf)
	st.prefilled = pre.Worker
	defer func() { st.prefilled = nil }()
	d := retryDecision{tried: st.pdTried[:0], onlyBackpressure: true}
	for n := 0; ; n++ {
		d.last = dec
		d.tried = append(d.tried, dec.Worker)
		out, fail = f.attempt(ctx, st, dec, stream)
		if out != failed {
			d.charge(f.reg)
			f.metrics.pd[pdDecoded].Inc()
			f.metrics.countDecodeDecision(dec.Decision)
			f.setWorkerHeader(h, hdrPrefillWorker, pre.Worker)
			f.setWorkerHeader(h, hdrDecodeWorker, dec.Worker)
			h.SetCanonical(bytesconv.S2B(hdrDecodeDecision), bytesconv.S2B(dec.Decision))
			return out, fail
		}
		f.logAttempt(ctx, st, dec.Worker, n, fail)
		if !d.tryAgain(f.reg, dec.Worker, fail) {
			ctx.Request.SetBody(st.pdBody)
			ctx.Response.Reset()
			writeError(ctx, fail.status, "upstream_error", "request_failed_upstream",
				"two workers failed this request the same way (status "+strconv.Itoa(fail.status)+")")
			return madeError, failure{}
		}
		if n+1 >= f.attempts || time.Since(prefilled) >= f.pd.hold {
			break
		}
		if st.view == nil {
			f.views.restore(ctx, st)
		}
		if dec = f.pd.decodeChoice(f.reg, st, d.tried); dec.Worker == nil {
			return f.whole(ctx, st, pre, &d, stream)
		}
		f.metrics.pdDecodeRetries.Inc()
	}
	d.charge(f.reg)
	ctx.Request.SetBody(st.pdBody) // the next prefill starts from the client's request
	ctx.Response.Reset()
	f.metrics.pd[pdFailed].Inc()
	if d.onlyBackpressure {
		return failed, d.backpressure // nobody's fault: passed on if every worker pushes back
	}
	return failed, failure{kind: kindDecode, detail: "decode legs failed; last: " + d.lastFail.kind}
}

// whole sends ctx's request whole to the prefill worker pre.Worker after
// every decode worker failed its decode leg: the prompt is in its cache.
func (f *forwarder) whole(ctx *fasthttp.RequestCtx, st *reqState, pre route.Choice, d *retryDecision, stream bool) (outcome, failure) {
	d.charge(f.reg)
	ctx.Request.SetBody(st.pdBody)
	ctx.Response.Reset()
	f.metrics.pd[pdWhole].Inc()
	if st.obs != nil {
		st.obs.Whole() // the prefill policy learns from the answer of its choice
	}
	st.prefilled = nil // it serves the answer
	out, fail := f.attempt(ctx, st, pre, stream)
	if out == sent {
		f.setWorkerHeader(&ctx.Response.Header, hdrPrefillWorker, pre.Worker)
	}
	return out, fail
}

// prefillLeg sends the prefill-only form of ctx's request to ch.Worker and
// returns the kv_transfer_params of its answer, with the outcome of the
// leg. An answer with another status than 200 that is not worth another
// worker (the request's own error) is set as ctx's response and returned
// as sent with nil params; a 200 without params returns an empty object,
// so that the decode worker prefills on its own (counted in the log).
func (f *forwarder) prefillLeg(ctx *fasthttp.RequestCtx, st *reqState, ch route.Choice) ([]byte, outcome, failure) {
	w := ch.Worker
	buf := legBufs.Get().(*[]byte)
	body, err := prefillBody((*buf)[:0], ctx.Request.Body(), st.kind)
	if err != nil {
		putLegBuf(buf)
		return nil, failed, failure{kind: kindInvalid, detail: err.Error()}
	}
	*buf = body
	req := fasthttp.AcquireRequest()
	defer putLegBuf(buf)
	defer fasthttp.ReleaseRequest(req)
	ctx.Request.Header.CopyTo(&req.Header) // x-request-id included: both legs carry the client's
	req.SetBodyRaw(body)
	f.addressTo(req, w)
	if st.obs != nil {
		st.obs.Sending(ch, false)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	timeout, firstByte := f.timeout-st.ticket.Waited, false
	if fb := f.firstByte; fb > 0 && fb < timeout {
		timeout, firstByte = fb, true
	}
	w.Acquire()
	f.admit.ctl.Bound(&st.ticket)
	err = f.doRequest(ctx, st, req, w, resp, timeout)
	w.FirstByte()
	w.Release()
	out, fail := f.classify(w, err, resp, firstByte)
	if out != sent {
		return nil, out, fail
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		resp.CopyTo(&ctx.Response)
		dropHopByHopResponse(&ctx.Response.Header)
		return nil, sent, failure{}
	}
	params := transferParams(resp.Body())
	if params == nil {
		st.trace.log(f.log).Warn("prefill answer without kv_transfer_params; the decode worker prefills on its own",
			"request_id", string(ctx.Request.Header.Peek(hdrRequestID)), "worker", w.URL())
		params = []byte("{}")
	}
	if st.obs != nil {
		st.obs.Prefilled(resp.Body(), w)
	}
	return append(st.pdParams[:0], params...), sent, failure{}
}

// withoutTransferParams removes a client's own kv_transfer_params from
// ctx's request, which the view found there, and reads the view again: in
// PD mode only the router says which blocks a worker pulls, and from where
// (docs/design.md §9). It answers 400 itself, and returns false, when the
// body cannot be rewritten.
func (s *Server) withoutTransferParams(ctx *fasthttp.RequestCtx, st *reqState, kind reqview.Kind) bool {
	out, err := withoutTransferParams(ctx.Request.Body())
	if err != nil {
		badRequest(ctx, "request body is not a valid JSON object")
		return false
	}
	ctx.Request.SetBody(out)
	st.view.Reset()
	if kind != reqview.Other {
		return s.view.read(ctx, st, kind)
	}
	if reqview.Parse(st.view, ctx.Request.Body(), kind) != nil { // a worker path's body; not reached
		badRequest(ctx, "request body is not a valid JSON object")
		return false
	}
	return true
}
