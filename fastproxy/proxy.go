package fastproxy

import (
	"bytes"
	"errors"
	"io"
	"iter"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

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
	hdrRankUp     = "X-Data-Parallel-Rank" // to the worker: its data-parallel rank (attempt)
)

// outcome of one upstream attempt.
type outcome uint8

const (
	sent     outcome = iota // the response is committed to the client
	failed                  // failed before any byte reached the client; another worker may serve
	timedOut                // --request-timeout-secs passed: 504, no failover (the worker may still be generating)
	gone                    // the client left: nothing to answer
)

// failure says why an attempt failed, in words a client may see (kind) and
// with what the worker said (status, Retry-After); the worker's address and
// the raw error stay in the log.
type failure struct {
	kind       string
	status     int    // the worker's status, for kindStatus and kindBackpressure
	retryAfter string // the worker's Retry-After, for kindBackpressure
	detail     string // for the log only
}

// forward selects a worker and proxies ctx.Request to it, failing over to
// another worker before any byte reached the client (docs/design.md §8,
// "faults are classified"):
//   - connect errors, first-byte timeouts, resets and unparseable answers
//     are the worker's fault: counted toward its breaker, failed over;
//   - 429 and 503 are back pressure: never counted, failed over, and passed
//     through with the worker's Retry-After when every worker tried pushed
//     back (a busy worker between two others' faults does not hide them);
//   - 408, 500, 502, 504 fail over; the same status from two workers is the
//     request's fault, answered with that status and counted against
//     neither; otherwise each is counted against its worker.
func (s *Server) forward(ctx *fasthttp.RequestCtx, st *reqState, stream bool) {
	req := &st.req
	tried := st.tried[:0]
	dropHopByHopRequest(&ctx.Request.Header)
	st.ranked = false
	var last route.Choice
	var lastFail, backpressure failure
	lastStatus := 0                  // the status of the last kindStatus failure, whatever came between
	onlyBackpressure := true         // every failed attempt so far was back pressure
	var suspects [2]*loadview.Worker // workers whose status failure is not yet charged
	attempts := s.cfg.RetryMaxRetries
	if st.noRetry {
		attempts = 1
	}
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			s.metrics.retries.Inc()
			time.Sleep(s.backoff(attempt))
			if st.view == nil {
				s.restoreView(ctx, st)
			}
			req.Workers = excluding(req.Workers, tried)
			req.Subset = true
		}
		var ch route.Choice
		if st.pin != nil {
			if !st.pin.Healthy() { // went down since the model step chose it: say so
				writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "owner_unavailable",
					"the worker that holds this request's provider state is not available")
				return
			}
			ch = route.Choice{Worker: st.pin, Decision: route.PinnedWorker}
		} else {
			ch = s.cfg.Policy.Select(req)
		}
		if ch.Worker == nil {
			if attempt == 0 {
				noWorker(ctx, st.view.Model)
				return
			}
			break
		}
		if st.early {
			s.dropView(st) // the choice is made and taught
		}
		last = ch
		tried = append(tried, ch.Worker)
		out, f := s.attempt(ctx, st, ch, stream)
		switch out {
		case sent:
			s.chargeSuspects(suspects[:])
			s.label(ctx, ch)
			return
		case gone:
			s.label(ctx, ch)
			ctx.Response.Reset()
			ctx.SetConnectionClose()
			writeError(ctx, 499, "client_closed_request", "client_closed_request", "the client closed the connection")
			return
		case timedOut:
			s.chargeSuspects(suspects[:])
			ctx.Response.Reset() // the failed upstream's status and headers are not ours
			s.label(ctx, ch)
			writeError(ctx, fasthttp.StatusGatewayTimeout, "upstream_timeout", "upstream_timeout",
				"the worker did not answer within --request-timeout-secs")
			return
		}
		s.logAttempt(ctx, ch.Worker, attempt, f)
		if f.kind != kindBackpressure {
			onlyBackpressure = false
		}
		switch f.kind {
		case kindBackpressure:
			backpressure = f
			continue // says nothing about the request or the other workers
		case kindStatus:
			if lastStatus == f.status && suspects[0] != nil {
				// The same answer from two workers: the request is the cause.
				ctx.Response.Reset()
				s.label(ctx, ch)
				writeError(ctx, f.status, "upstream_error", "request_failed_upstream",
					"two workers failed this request the same way (status "+strconv.Itoa(f.status)+")")
				return
			}
			s.chargeSuspects(suspects[:])
			suspects[0], lastStatus = ch.Worker, f.status
		default:
			s.chargeSuspects(suspects[:])
		}
		lastFail = f
	}
	s.chargeSuspects(suspects[:])
	s.metrics.retriesExhausted.Inc()
	ctx.Response.Reset()
	if last.Worker != nil {
		s.label(ctx, last)
	}
	if onlyBackpressure && backpressure.kind != "" {
		if backpressure.retryAfter != "" {
			ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, backpressure.retryAfter)
		}
		typ, code := "rate_limit_error", "upstream_rate_limited"
		if backpressure.status == fasthttp.StatusServiceUnavailable {
			typ, code = "service_unavailable_error", "upstream_unavailable"
		}
		writeError(ctx, backpressure.status, typ, code, "every worker tried is busy; retry later")
		return
	}
	writeError(ctx, fasthttp.StatusBadGateway, "upstream_error", "upstream_failed",
		"upstream failed after "+strconv.Itoa(len(tried))+" attempt(s); last: "+lastFail.kind)
}

// chargeSuspects counts the pending status failures against their workers.
func (s *Server) chargeSuspects(ws []*loadview.Worker) {
	for i, w := range ws {
		if w != nil {
			s.cfg.Registry.RecordFailure(w)
			ws[i] = nil
		}
	}
}

func (s *Server) logAttempt(ctx *fasthttp.RequestCtx, w *loadview.Worker, attempt int, f failure) {
	s.cfg.Logger.Warn("upstream attempt failed", "request_id", string(ctx.Request.Header.Peek(hdrRequestID)),
		"worker", w.URL(), "attempt", attempt+1, "kind", f.kind, "status", f.status, "detail", f.detail)
}

// label sets the router headers of choice. The handler counts the decision
// the response finally carries, once per request.
func (s *Server) label(ctx *fasthttp.RequestCtx, ch route.Choice) {
	h := &ctx.Response.Header
	h.SetCanonical(s2b(hdrWorker), s2b(ch.Worker.URL()))
	h.SetCanonical(s2b(hdrBaseWorker), s2b(ch.Worker.BaseURL()))
	if r := ch.Worker.RankString(); r != "" {
		h.SetCanonical(s2b(hdrDPRank), s2b(r))
	}
	h.SetCanonical(s2b(hdrDecision), s2b(ch.Decision))
}

// backoff is the delay before retry attempt n ≥ 1: exponential from
// RetryBackoff, capped, with full jitter in [d/2, d).
func (s *Server) backoff(n int) time.Duration {
	d := s.cfg.RetryBackoff << min(n-1, 20)
	if d <= 0 || d > s.cfg.RetryMaxBackoff {
		d = s.cfg.RetryMaxBackoff
	}
	half := d / 2
	return half + time.Duration(s.cfg.Rand()%uint64(half+1))
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

// statusFailure classifies a worker status that is worth another worker.
func statusFailure(code int, retryAfter []byte) (failure, bool) {
	switch code {
	case 429, 503:
		return failure{kind: kindBackpressure, status: code, retryAfter: validRetryAfter(retryAfter)}, true
	case 408, 500, 502, 504:
		return failure{kind: kindStatus, status: code}, true
	}
	return failure{}, false
}

// validRetryAfter passes on a worker's Retry-After only in one of its two
// valid forms (delay seconds, HTTP date); anything else is dropped.
func validRetryAfter(v []byte) string {
	if len(v) == 0 || len(v) > 64 {
		return ""
	}
	if n, err := strconv.Atoi(string(v)); err == nil && n >= 0 {
		return string(v)
	}
	if _, err := time.Parse(time.RFC1123, string(v)); err == nil {
		return string(v)
	}
	return ""
}

// attempt sends ctx.Request to w. Load on w is acquired here and released
// exactly once: at return for buffered responses and failures, or when the
// relayed stream ends (completion, client disconnect, upstream error). Its
// wait for a first byte (loadview.Worker.FirstByte) ends with the first
// body byte a stream relays, else at that release.
//
// st.obs, when set, learns from a successful response: from the buffered body,
// or from the stream as it passes (a relayed stream takes st.obs over and
// returns it to the pool when it closes).
func (s *Server) attempt(ctx *fasthttp.RequestCtx, st *reqState, ch route.Choice, stream bool) (outcome, failure) {
	req, obs, w := &ctx.Request, st.obs, ch.Worker
	req.URI().SetHost(w.Client().Addr)
	if r := w.RankString(); r != "" {
		req.Header.SetCanonical(s2b(hdrRankUp), s2b(r))
		st.ranked = true
	} else if st.ranked { // set by an earlier attempt (a client's went with the hop-by-hop headers)
		req.Header.Del(hdrRankUp)
		st.ranked = false
	}
	if s.bearer != "" {
		req.Header.Set(fasthttp.HeaderAuthorization, s.bearer)
	}
	timeout, firstByte := s.cfg.RequestTimeout, false
	if fb := s.cfg.FirstByteTimeout; fb > 0 && fb < timeout {
		timeout, firstByte = fb, true
	}
	if obs != nil {
		obs.sending(ch, stream)
	}
	w.Acquire()
	if !stream {
		err := s.do(ctx, st, w, &ctx.Response, timeout)
		w.FirstByte()
		w.Release()
		out, f := s.classify(w, err, &ctx.Response, firstByte)
		if out == sent {
			dropHopByHopResponse(&ctx.Response.Header)
			if obs != nil && ctx.Response.StatusCode() == fasthttp.StatusOK {
				obs.scan(ctx.Response.Body())
				obs.done(w)
				obs.syncLocks(w) // before the body is written (docs/design.md §8.3)
			}
		}
		return out, f
	}
	up := fasthttp.AcquireResponse()
	up.StreamBody = true
	err := s.doStream(ctx, w, up)
	out, f := s.classify(w, err, up, false)
	if out != sent {
		up.CloseBodyStream() //nolint:errcheck // discarding a failed attempt
		fasthttp.ReleaseResponse(up)
		w.FirstByte()
		w.Release()
		return out, f
	}
	up.Header.CopyTo(&ctx.Response.Header)
	dropHopByHopResponse(&ctx.Response.Header)
	body := up.BodyStream()
	if body == nil { // the whole body was already buffered: hand the buffer over
		w.FirstByte()
		w.Release()
		if obs != nil && up.StatusCode() == fasthttp.StatusOK {
			obs.streamed(up.Body(), w)
			obs.done(w)
			obs.syncLocks(w)
		}
		ctx.Response.SwapBody(up.SwapBody(nil))
		fasthttp.ReleaseResponse(up)
		return sent, failure{}
	}
	if up.StatusCode() != fasthttp.StatusOK {
		obs = nil
	} else {
		st.obs = nil // the relay owns it now
	}
	r := &relay{up: up, body: body, w: w, obs: obs, s: s, conn: ctx.Conn(), status: up.StatusCode(),
		rid: string(ctx.Request.Header.Peek(hdrRequestID))}
	ctx.Response.SetBodyStream(r, -1)
	return sent, failure{}
}

// classify turns an upstream result into an outcome, feeding the circuit
// breaker for what is the worker's fault.
func (s *Server) classify(w *loadview.Worker, err error, resp *fasthttp.Response, firstByte bool) (outcome, failure) {
	reg := s.cfg.Registry
	if err != nil {
		f := failure{detail: err.Error()}
		var ne net.Error
		switch {
		case errors.Is(err, errClientGone):
			f.kind = kindCanceled
			s.metrics.upstreamErrors[f.kind].Inc()
			return gone, f
		case errors.Is(err, fasthttp.ErrNoFreeConns): // our pool is full: not the worker's fault
			f.kind = kindPool
		case loadview.IsConnectError(err):
			f.kind = kindConnect
			reg.RecordFailure(w)
		case errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout()):
			reg.RecordFailure(w)
			if !firstByte {
				s.metrics.upstreamErrors[kindTimeout].Inc()
				return timedOut, failure{kind: kindTimeout, detail: f.detail}
			}
			f.kind = kindFirstByte
			reg.ProbeSoon(w)
		case errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			f.kind = kindReset
			reg.RecordFailure(w)
		default: // an answer that is not HTTP: the worker is broken
			f.kind = kindInvalid
			reg.RecordFailure(w)
		}
		s.metrics.upstreamErrors[f.kind].Inc()
		return failed, f
	}
	if f, retry := statusFailure(resp.StatusCode(), resp.Header.Peek(fasthttp.HeaderRetryAfter)); retry {
		s.metrics.upstreamErrors[f.kind].Inc()
		return failed, f // a status failure is charged by forward once it knows whose fault it is
	}
	reg.RecordSuccess(w)
	return sent, failure{}
}

// relay streams an upstream body to the client chunk by chunk (fasthttp
// flushes each chunk it reads) and releases the worker's load exactly once
// when fasthttp closes it: at the end of the stream, on a client disconnect
// (write error), or when the response is reset. Not pooled: fasthttp may
// call Close more than once, and a recycled relay would then close another
// request's stream.
//
// A stream the worker cuts mid-way ends, for the client, with an
// OpenAI-style error event; it is counted under its own status label
// ("stream_cut") and logged. A client that accepts no byte for
// StreamStallTimeout is cut (each chunk extends its write deadline).
type relay struct {
	up     *fasthttp.Response
	body   io.Reader
	w      *loadview.Worker
	obs    *observer // learns from the events as they pass; nil when not needed
	s      *Server
	conn   net.Conn      // the client's connection, for the stall deadline
	rm     *routeMetrics // set by the handler: counted and timed when the stream ends
	start  time.Time
	status int
	rid    string
	cut    bool // the worker cut the stream; the error event is being sent
	tail   []byte
	closed atomic.Bool
	first  atomic.Bool // the first byte is counted (Worker.FirstByte)
}

func (r *relay) Read(p []byte) (int, error) {
	if r.tail != nil {
		n := copy(p, r.tail)
		r.tail = r.tail[n:]
		if len(r.tail) == 0 {
			return n, io.EOF
		}
		return n, nil
	}
	if r.conn != nil {
		_ = r.conn.SetWriteDeadline(time.Now().Add(r.s.cfg.StreamStallTimeout))
	}
	n, err := r.body.Read(p)
	if (n > 0 || err != nil) && !r.first.Load() && r.first.CompareAndSwap(false, true) {
		r.w.FirstByte()
	}
	if o := r.obs; o != nil {
		prev := o.lw // lock writes started by earlier chunks
		if n > 0 {
			o.streamed(p[:n], r.w)
		}
		// A lock is acknowledged before any later byte of the response,
		// and before the chunk that ends it (docs/design.md §8.3).
		if (o.lw != nil || o.fw != nil) && (err != nil || streamEnds(p[:n])) {
			o.waitLocks(o.lw)
			o.waitFlush() // the binding too (route.Choice.Published)
		} else {
			o.waitLocks(prev)
		}
	}
	if err != nil && err != io.EOF {
		r.cut = true
		r.s.metrics.upstreamErrors[kindStream].Inc()
		r.s.metrics.streamsCut.Inc()
		r.s.cfg.Logger.Warn("stream cut by the worker", "request_id", r.rid, "worker", r.w.URL(), "err", err)
		r.tail = []byte("\n\ndata: {\"error\":{\"message\":\"the worker ended the stream early\",\"type\":\"upstream_error\",\"param\":null,\"code\":\"stream_cut\"}}\n\n")
		if n > 0 {
			return n, nil
		}
		return r.Read(p)
	}
	return n, err
}

// Close implements io.Closer; idempotent.
func (r *relay) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	err := r.up.CloseBodyStream()
	fasthttp.ReleaseResponse(r.up)
	if r.first.CompareAndSwap(false, true) {
		r.w.FirstByte() // none came
	}
	r.w.Release() // first: nothing after it may keep the load counted
	if r.rm != nil {
		if r.cut {
			r.rm.counter("stream_cut").Inc()
		} else {
			r.rm.count(r.status)
		}
		r.rm.duration.observe(time.Since(r.start))
	}
	if r.obs != nil {
		if !r.cut {
			r.obs.done(r.w)
		}
		r.s.releaseObserver(r.obs)
		r.obs = nil
	}
	return err
}

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 §7.6.1): never forwarded in either direction. fasthttp handles
// Connection and Transfer-Encoding itself; the headers a Connection header
// names are hop-by-hop too.
var hopByHop = [...]string{"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Upgrade"}

// clientOnly is what a client request loses before any attempt: the
// hop-by-hop headers and a data-parallel rank, which only the router sets
// (attempt).
var clientOnly = append(hopByHop[:len(hopByHop):len(hopByHop)], hdrRankUp)

// dropHopByHopRequest removes the hop-by-hop headers of a client request,
// those listed in its Connection header included.
func dropHopByHopRequest(h *fasthttp.RequestHeader) {
	if c := h.Peek(fasthttp.HeaderConnection); len(c) > 0 {
		forEachToken(c, func(name []byte) { h.DelBytes(name) })
		h.Del(fasthttp.HeaderConnection) // the client's connection is not the worker's
	}
	if hasAny(h.All(), clientOnly) {
		for _, k := range clientOnly {
			h.Del(k)
		}
	}
}

// dropHopByHopResponse removes the hop-by-hop headers of an upstream
// response, including a Connection: close meant for the router's own
// connection and the headers that Connection names.
func dropHopByHopResponse(h *fasthttp.ResponseHeader) {
	if c := h.Peek(fasthttp.HeaderConnection); len(c) > 0 {
		forEachToken(c, func(name []byte) { h.DelBytes(name) })
	}
	h.ResetConnectionClose()
	if hasAny(h.All(), hopByHop[:]) {
		for _, k := range hopByHop {
			h.Del(k)
		}
	}
}

// hasAny reports whether a header of all is one of names. Most messages
// have none of the headers the router drops: one pass over their headers
// costs less than a delete per name, each of which normalizes the name and
// scans every header.
func hasAny(all iter.Seq2[[]byte, []byte], names []string) bool {
	for k := range all {
		for _, name := range names {
			if len(k) == len(name) && bytes.EqualFold(k, s2b(name)) {
				return true
			}
		}
	}
	return false
}

// forEachToken calls f with each comma-separated, trimmed token of v except
// the ones fasthttp manages itself (close, keep-alive).
func forEachToken(v []byte, f func([]byte)) {
	for len(v) > 0 {
		var tok []byte
		tok, v, _ = bytes.Cut(v, []byte{','})
		tok = bytes.TrimSpace(tok)
		if len(tok) > 0 && !bytes.EqualFold(tok, []byte("close")) && !bytes.EqualFold(tok, []byte("keep-alive")) {
			f(tok)
		}
	}
}
