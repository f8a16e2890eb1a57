package fastproxy

import (
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// forwarder is the fifth stage: it sends a request to the workers the
// worker step chooses, one attempt at a time (attempt.go), until one
// answers or the retry decision (retry.go) gives up, failing over only
// before any byte reached the client (docs/design.md §8.2). As caddy's
// reverse proxy does, the loop (forward), one iteration (iteration) and
// the decision to try again (retryDecision.tryAgain) are apart.
type forwarder struct {
	workers *workerStep
	views   *viewReader // a retry's selection parses a dropped View again
	admit   *admitStage // told when a request released from the queue reaches a worker
	reg     *loadview.Registry
	metrics *serverMetrics
	log     *slog.Logger
	bearer  *atomic.Pointer[string] // Authorization sent to workers (--api-key; swapped on reload); empty: none
	// exposeWorkers (--expose-worker-headers) names the worker on the
	// answers workers gave (x-vllm-router-worker and the others); never on
	// the router's own errors.
	exposeWorkers bool

	attempts            int           // --retry-max-retries: attempts in all, ≥ 1
	backoff, maxBackoff time.Duration // before retry n: backoff·2ⁿ⁻¹ capped at maxBackoff, jittered
	rand                func() uint64
	timeout             time.Duration // --request-timeout-secs
	firstByte           time.Duration // --first-byte-timeout-secs; 0: off
	stall               time.Duration // a streaming client that accepts no byte for this long is cut (relay)
	upstreamStall       time.Duration // --upstream-stall-timeout-secs: a worker's stream that sends no byte for this long is cut; 0: off
	resumeAttempts      int           // --stream-resume-attempts: continuations of a cut stream
	resumeMaxBytes      int           // --stream-resume-max-bytes: the answer text kept to continue it
	pd                  *disagg       // a disaggregated fleet's decode legs (pd.go); nil: off
	preempt             *preemption   // --queue-preempt: background streams an urgent request may take a slot from (preempt.go); nil: off
}

// step is what one iteration of the loop leaves to do.
type step uint8

const (
	tryNext  step = iota // the attempt failed; another worker may serve
	answered             // the response is set: an answer, or an error the request ends with
	noneLeft             // no healthy candidate is left to try
)

// forward proxies ctx.Request to a worker of st.req: the loop.
func (f *forwarder) forward(ctx *fasthttp.RequestCtx, st *reqState, stream bool) {
	dropHopByHopRequest(&ctx.Request.Header)
	st.ranked = false
	d := retryDecision{tried: st.tried[:0], onlyBackpressure: true}
	attempts := f.attempts
	if st.noRetry {
		attempts = 1
	}
	for n := 0; n < attempts; n++ {
		if n > 0 && !f.prepareRetry(ctx, st, &d, n) {
			break // no candidate left untried: nothing to wait for, no retry to count
		}
		switch f.iteration(ctx, st, &d, n, stream) {
		case answered:
			return
		case noneLeft:
			f.exhausted(ctx, &d)
			return
		}
	}
	f.exhausted(ctx, &d)
}

// iteration runs attempt n: the worker step's choice, the attempt, and on
// failure the retry decision.
func (f *forwarder) iteration(ctx *fasthttp.RequestCtx, st *reqState, d *retryDecision, n int, stream bool) step {
	t0 := st.trace.clock()
	ch, ok := f.workers.choose(ctx, st)
	st.trace.workerStep(t0, st, ch)
	if !ok {
		return answered
	}
	if ch.Worker == nil {
		if n == 0 {
			noWorker(ctx, st.view.Model)
			return answered
		}
		return noneLeft
	}
	if n > 0 {
		f.metrics.retries.Inc() // a retry is an attempt sent again, not one that found no worker
	}
	var dec route.Choice // the decode leg's worker when ch prefills (pd.go)
	if f.pd != nil && st.legs && ch.Worker.Role() == loadview.Prefill {
		if dec = f.pd.decodeChoice(f.reg, st, nil); dec.Worker == nil {
			f.metrics.pd[pdWhole].Inc() // no decode worker is healthy: the prefill worker serves it whole
		}
	}
	if st.early {
		f.views.drop(st) // the choice is made and taught
	}
	d.last = ch
	d.tried = append(d.tried, ch.Worker)
	var out outcome
	var fail failure
	st.trace.attemptStart(&ctx.Request.Header, ch.Worker, false)
	if dec.Worker != nil {
		out, fail = f.disaggregated(ctx, st, ch, dec, stream)
	} else {
		out, fail = f.attempt(ctx, st, ch, stream)
	}
	st.trace.attemptEnd(out, fail, ctx.Response.StatusCode())
	switch out {
	case sent:
		d.charge(f.reg)
		f.label(ctx, ch)
		return answered
	case madeError:
		labelError(ctx, ch)
		return answered
	case gone:
		ctx.Response.Reset()
		ctx.SetConnectionClose()
		writeError(ctx, 499, "client_closed_request", "client_closed_request", "the client closed the connection")
		return answered
	case timedOut:
		d.charge(f.reg)
		ctx.Response.Reset() // the failed upstream's status and headers are not ours
		labelError(ctx, ch)
		writeError(ctx, fasthttp.StatusGatewayTimeout, "upstream_timeout", "upstream_timeout",
			"the worker did not answer within --request-timeout-secs")
		return answered
	}
	f.logAttempt(ctx, st, ch.Worker, n, fail)
	if d.tryAgain(f.reg, ch.Worker, fail) {
		return tryNext
	}
	ctx.Response.Reset()
	labelError(ctx, ch)
	writeError(ctx, fail.status, "upstream_error", "request_failed_upstream",
		"two workers failed this request the same way (status "+strconv.Itoa(fail.status)+")")
	return answered
}

// prepareRetry narrows the candidates to the workers not yet tried
// (affinity outside them then does not count) and waits out retry n's
// backoff. It reports false, without waiting, when none is left.
func (f *forwarder) prepareRetry(ctx *fasthttp.RequestCtx, st *reqState, d *retryDecision, n int) bool {
	st.req.Workers = excluding(st.req.Workers, d.tried)
	st.req.Subset = true
	if len(st.req.Workers) == 0 {
		return false
	}
	time.Sleep(f.backoffBefore(n))
	if st.view == nil {
		f.views.restore(ctx, st)
	}
	return true
}

// exhausted answers a request no attempt served: the workers' back
// pressure when every one tried pushed back, else 502.
func (f *forwarder) exhausted(ctx *fasthttp.RequestCtx, d *retryDecision) {
	d.charge(f.reg)
	f.metrics.retriesExhausted.Inc()
	ctx.Response.Reset()
	if d.last.Worker != nil {
		labelError(ctx, d.last)
	}
	if bp := d.backpressure; d.onlyBackpressure && bp.kind != "" {
		if bp.retryAfter != "" {
			ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, bp.retryAfter)
		}
		typ, code := "rate_limit_error", "upstream_rate_limited"
		if bp.status == fasthttp.StatusServiceUnavailable {
			typ, code = "service_unavailable_error", "upstream_unavailable"
		}
		writeError(ctx, bp.status, typ, code, "every worker tried is busy; retry later")
		return
	}
	writeError(ctx, fasthttp.StatusBadGateway, "upstream_error", "upstream_failed",
		"upstream failed after "+strconv.Itoa(len(d.tried))+" attempt(s); last: "+d.lastFail.kind)
}

func (f *forwarder) logAttempt(ctx *fasthttp.RequestCtx, st *reqState, w *loadview.Worker, attempt int, fail failure) {
	st.trace.log(f.log).Warn("upstream attempt failed", "request_id", string(ctx.Request.Header.Peek(hdrRequestID)),
		"worker", w.URL(), "attempt", attempt+1, "kind", fail.kind, "status", fail.status, "detail", fail.detail)
}

// backoffBefore is the delay before retry attempt n ≥ 1: exponential from
// the first backoff, capped, with full jitter in [d/2, d).
func (f *forwarder) backoffBefore(n int) time.Duration {
	d := f.backoff << min(n-1, 20)
	if d <= 0 || d > f.maxBackoff {
		d = f.maxBackoff
	}
	half := d / 2
	return half + time.Duration(f.rand()%uint64(half+1))
}

// excluding returns ws without the workers in tried (a new slice: retries only).
func excluding(ws, tried []*loadview.Worker) []*loadview.Worker {
	out := make([]*loadview.Worker, 0, len(ws))
next:
	for _, w := range ws {
		for _, t := range tried {
			if w == t {
				continue next
			}
		}
		out = append(out, w)
	}
	return out
}
