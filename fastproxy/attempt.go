package fastproxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/connwatch"
	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/learn"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/upstream"
)

// hdrRankUp tells a worker the data-parallel rank an attempt is for.
const hdrRankUp = "X-Data-Parallel-Rank"

// outcome of one upstream attempt.
type outcome uint8

const (
	sent      outcome = iota // the response is committed to the client
	failed                   // failed before any byte reached the client; another worker may serve
	timedOut                 // --request-timeout-secs passed: 504, no failover (the worker may still be generating)
	gone                     // the client left: nothing to answer
	madeError                // the router answered with an error of its own (the response is set)
)

// attempt sends ctx.Request to ch.Worker. Load on the worker is acquired
// here and released exactly once: at return for buffered responses and
// failures, or when the relayed stream ends (completion, client
// disconnect, upstream error). Its wait for a first byte
// (loadview.Worker.FirstByte) ends with the first body byte a stream
// relays, else at that release.
//
// The learning room hears the attempt (st.obs, when set): its sending, and
// a successful answer — the buffered body before it is written, or the
// stream as it passes, the relay then owning the observer.
func (f *forwarder) attempt(ctx *fasthttp.RequestCtx, st *reqState, ch route.Choice, stream bool) (outcome, failure) {
	w := ch.Worker
	f.address(&ctx.Request, st, w)
	if st.obs != nil {
		st.obs.Sending(ch, stream)
	}
	if f.preempt != nil {
		f.preemptFor(ctx, st, w)
	}
	w.Acquire()
	f.admit.ctl.Bound(&st.ticket) // a request from the queue: the pool's room now counts it on its worker
	if stream {
		return f.streaming(ctx, st, w)
	}
	return f.buffered(ctx, st, w)
}

// address points req at w: its host, its data-parallel rank, the router's
// credential to the workers.
func (f *forwarder) address(req *fasthttp.Request, st *reqState, w *loadview.Worker) {
	req.URI().SetHost(w.Client().Addr)
	if r := w.RankString(); r != "" {
		req.Header.SetCanonical(bytesconv.S2B(hdrRankUp), bytesconv.S2B(r))
		st.ranked = true
	} else if st.ranked { // set by an earlier attempt (a client's went with the hop-by-hop headers)
		req.Header.Del(hdrRankUp)
		st.ranked = false
	}
	if b := *f.bearer.Load(); b != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, b)
	}
}

// buffered reads w's whole answer into ctx.Response.
func (f *forwarder) buffered(ctx *fasthttp.RequestCtx, st *reqState, w *loadview.Worker) (outcome, failure) {
	timeout, firstByte := f.timeout-st.ticket.Waited, false // the wait in the queue counts against the deadline
	if fb := f.firstByte; fb > 0 && fb < timeout {
		timeout, firstByte = fb, true
	}
	err := f.do(ctx, st, w, &ctx.Response, timeout)
	w.FirstByte()
	w.Release()
	out, fail := f.classify(w, err, &ctx.Response, firstByte)
	if out == sent {
		dropHopByHopResponse(&ctx.Response.Header)
		if st.obs != nil && ctx.Response.StatusCode() == fasthttp.StatusOK {
			st.obs.Answer(ctx.Response.Body(), false, w) // before the body is written (docs/design.md §8.3)
		}
	}
	return out, fail
}

// streaming waits for w's response headers and sets the body to stream to
// the client through a relay (relay.go). The wait for the headers is
// bounded by --first-byte-timeout-secs, each wait for a body byte by
// --upstream-stall-timeout-secs, the whole by --request-timeout-secs less
// the time queued; a client that leaves cancels the exchange at once.
func (f *forwarder) streaming(ctx *fasthttp.RequestCtx, st *reqState, w *loadview.Worker) (outcome, failure) {
	r := f.newRelay(ctx, st, w)
	err := r.open(&ctx.Request, f.timeout-st.ticket.Waited)
	out, fail := f.classify(w, err, r.up, false)
	if out != sent {
		r.Close() //nolint:errcheck // discarding a failed attempt
		return out, fail
	}
	up := r.up
	up.Header.CopyTo(&ctx.Response.Header)
	dropHopByHopResponse(&ctx.Response.Header)
	var obs *learn.Observer
	if up.StatusCode() == fasthttp.StatusOK {
		obs, st.obs = st.obs, nil // the relay owns it now
	}
	r.begin(obs)
	r.trace = st.trace
	r.trace.relay()
	ctx.Response.SetBodyStream(r, -1)
	return sent, failure{}
}

// classify turns an upstream result into an outcome, feeding the circuit
// breaker for what is the worker's fault.
func (f *forwarder) classify(w *loadview.Worker, err error, resp *fasthttp.Response, firstByte bool) (outcome, failure) {
	if err != nil {
		return f.classifyError(w, err, firstByte)
	}
	if fail, retry := statusFailure(resp.StatusCode(), resp.Header.Peek(fasthttp.HeaderRetryAfter)); retry {
		f.metrics.upstreamErrors[fail.kind].Inc()
		return failed, fail // a status failure is charged by the retry decision once it knows whose fault it is
	}
	f.reg.RecordSuccess(w)
	return sent, failure{}
}

// classifyError classifies an exchange that brought no HTTP answer.
func (f *forwarder) classifyError(w *loadview.Worker, err error, firstByte bool) (outcome, failure) {
	reg := f.reg
	fail := failure{detail: err.Error()}
	var ne net.Error
	switch {
	case errors.Is(err, errClientGone) || errors.Is(err, upstream.ErrCanceled):
		fail.kind = kindCanceled
		f.metrics.upstreamErrors[fail.kind].Inc()
		return gone, fail
	case errors.Is(err, fasthttp.ErrNoFreeConns): // our pool is full: not the worker's fault
		fail.kind = kindPool
	case loadview.IsConnectError(err):
		fail.kind = kindConnect
		reg.RecordFailure(w)
	case errors.Is(err, upstream.ErrFirstByte):
		reg.RecordFailure(w)
		fail.kind = kindFirstByte
		reg.ProbeSoon(w)
	case errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout()):
		reg.RecordFailure(w)
		if !firstByte {
			f.metrics.upstreamErrors[kindTimeout].Inc()
			return timedOut, failure{kind: kindTimeout, detail: fail.detail}
		}
		fail.kind = kindFirstByte
		reg.ProbeSoon(w)
	case errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		fail.kind = kindReset
		reg.RecordFailure(w)
	default: // an answer that is not HTTP: the worker is broken
		fail.kind = kindInvalid
		reg.RecordFailure(w)
	}
	f.metrics.upstreamErrors[fail.kind].Inc()
	return failed, fail
}

// errClientGone: the client closed its connection while the router waited
// for the worker; the upstream exchange was cancelled (its connection
// closed, which makes vLLM abort the request).
var errClientGone = errors.New("client closed the connection")

// clientWatcher polls the client connections of buffered requests in
// flight, one goroutine for all of them (connwatch).
var clientWatcher = connwatch.New(100 * time.Millisecond)

// do sends ctx.Request to w and reads the whole response into resp. When
// the worker's client runs on the cancellable transport (loadview's
// default), the exchange is cancelled as soon as the client leaves.
func (f *forwarder) do(ctx *fasthttp.RequestCtx, st *reqState, w *loadview.Worker, resp *fasthttp.Response, timeout time.Duration) error {
	return f.doRequest(ctx, st, &ctx.Request, w, resp, timeout)
}

// doRequest is do for a request of its own, req, sent on behalf of ctx's
// client (the prefill leg of a disaggregated request, pd.go).
func (f *forwarder) doRequest(ctx *fasthttp.RequestCtx, st *reqState, req *fasthttp.Request, w *loadview.Worker,
	resp *fasthttp.Response, timeout time.Duration) error {
	hc := w.Client()
	t, ok := hc.Transport.(*upstream.Transport)
	if !ok {
		return hc.DoTimeout(req, resp, timeout)
	}
	st.cancel.Reset()
	reg := registration(ctx.Conn(), st)
	clientWatcher.Start(reg, ctx.Conn(), st.onGone)
	err := t.DoCanceler(hc, req, resp, timeout, &st.cancel)
	clientWatcher.Stop(reg)
	if errors.Is(err, upstream.ErrCanceled) {
		return errClientGone
	}
	return err
}

// registration is the client connection's clientWatcher registration:
// the one its accepted connection keeps (connRegistration), else st's own.
func registration(c net.Conn, st *reqState) *connwatch.Conn {
	if e := connRegistration(c); e != nil {
		return e
	}
	return &st.watch
}

// connRegistration is the clientWatcher registration the accepted
// connection c keeps (TLS unwrapped), which each of its requests reuses
// without allocating; nil when it keeps none.
func connRegistration(c net.Conn) *connwatch.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitConn); ok {
		return &lc.watch
	}
	return nil
}
