package fastproxy

import (
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
)

// Response headers the router adds to every proxied response.
const (
	hdrWorker     = "x-vllm-router-worker"
	hdrBaseWorker = "x-vllm-router-base-worker"
	hdrDPRank     = "x-vllm-router-dp-rank"
	hdrDecision   = "x-vllm-router-decision"
	hdrRankUp     = "X-data-parallel-rank"
)

// outcome of one upstream attempt.
type outcome uint8

const (
	sent      outcome = iota // the response is committed to the client
	retryable                // failed before any byte reached the client; try another worker
	timedOut                 // upstream deadline passed
)

// forward selects a worker and proxies ctx.Request to it, failing over to
// another worker on connection errors and retryable statuses, up to
// RetryMaxRetries attempts, always before any byte reached the client.
func (s *Server) forward(ctx *fasthttp.RequestCtx, st *reqState, stream bool) {
	req := &st.req
	tried := st.tried[:0]
	for _, k := range hopByHop {
		ctx.Request.Header.Del(k)
	}
	var last route.Choice
	cause := ""
	attempts := s.cfg.RetryMaxRetries
	if st.noRetry {
		attempts = 1
	}
	for attempt := 0; attempt < attempts; attempt++ {
		if attempt > 0 {
			retriesTotal.Inc()
			time.Sleep(s.backoff(attempt))
			req.Workers = excluding(req.Workers, tried)
			req.Subset = true
		}
		var ch route.Choice
		if st.pin != nil {
			if !st.pin.Healthy() { // went down since the model step chose it: say so
				writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "owner_unavailable",
					"worker "+st.pin.URL()+" holds this request's provider state and is not available")
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
		last = ch
		if len(tried) < cap(tried) {
			tried = append(tried, ch.Worker)
		}
		var out outcome
		out, cause = s.attempt(ctx, ch.Worker, stream, st.obs)
		switch out {
		case sent:
			s.label(ctx, ch)
			return
		case timedOut:
			ctx.Response.Reset() // the failed upstream's status and headers are not ours
			s.label(ctx, ch)
			writeError(ctx, fasthttp.StatusGatewayTimeout, "upstream_timeout", "upstream_timeout",
				"worker "+ch.Worker.URL()+" did not answer within --request-timeout-secs ("+cause+")")
			return
		}
		s.cfg.Logger.Warn("upstream attempt failed", "worker", ch.Worker.URL(), "attempt", attempt+1, "cause", cause)
	}
	retriesExhausted.Inc()
	ctx.Response.Reset()
	if last.Worker != nil {
		s.label(ctx, last)
	}
	writeError(ctx, fasthttp.StatusBadGateway, "upstream_error", "upstream_failed",
		"upstream failed after "+strconv.Itoa(len(tried))+" attempt(s); last: "+cause)
}

// label sets the router headers of choice. The handler counts the decision
// the response finally carries, once per request.
func (s *Server) label(ctx *fasthttp.RequestCtx, ch route.Choice) {
	h := &ctx.Response.Header
	h.Set(hdrWorker, ch.Worker.URL())
	h.Set(hdrBaseWorker, ch.Worker.BaseURL())
	if r := ch.Worker.RankString(); r != "" {
		h.Set(hdrDPRank, r)
	}
	h.Set(hdrDecision, ch.Decision)
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

// retryableStatus lists the upstream statuses worth another worker.
func retryableStatus(code int) bool {
	switch code {
	case 408, 429, 500, 502, 503, 504:
		return true
	}
	return false
}

// attempt sends ctx.Request to w. Load on w is acquired here and released
// exactly once: at return for buffered responses and failures, or when the
// relayed stream ends (completion, client disconnect, upstream error).
//
// obs, when set, learns from a successful response: from the buffered body,
// or from the stream as it passes.
func (s *Server) attempt(ctx *fasthttp.RequestCtx, w *loadview.Worker, stream bool, obs *observer) (outcome, string) {
	req := &ctx.Request
	req.URI().SetHost(w.Client().Addr)
	if r := w.RankString(); r != "" {
		req.Header.Set(hdrRankUp, r)
	} else {
		req.Header.Del(hdrRankUp)
	}
	if s.bearer != "" {
		req.Header.Set("Authorization", s.bearer)
	}
	w.Acquire()
	if !stream {
		err := w.Client().DoTimeout(req, &ctx.Response, s.cfg.RequestTimeout)
		w.Release()
		out, cause := s.classify(ctx, w, err, ctx.Response.StatusCode())
		if out == sent {
			dropHopByHop(&ctx.Response.Header)
			if obs != nil && ctx.Response.StatusCode() == fasthttp.StatusOK {
				_ = reqview.ScanResponse(&obs.learned, ctx.Response.Body())
				obs.done(w)
			}
		}
		return out, cause
	}
	up := fasthttp.AcquireResponse()
	up.StreamBody = true
	err := w.Client().DoTimeout(req, up, s.cfg.RequestTimeout)
	out, cause := s.classify(ctx, w, err, up.StatusCode())
	if out != sent {
		up.CloseBodyStream() //nolint:errcheck // discarding a failed attempt
		fasthttp.ReleaseResponse(up)
		w.Release()
		return out, cause
	}
	up.Header.CopyTo(&ctx.Response.Header)
	dropHopByHop(&ctx.Response.Header)
	body := up.BodyStream()
	if body == nil { // the whole body was already buffered: hand the buffer over
		w.Release()
		if obs != nil && up.StatusCode() == fasthttp.StatusOK {
			obs.sse.Write(up.Body(), &obs.learned)
			obs.done(w)
		}
		ctx.Response.SwapBody(up.SwapBody(nil))
		fasthttp.ReleaseResponse(up)
		return sent, ""
	}
	if up.StatusCode() != fasthttp.StatusOK {
		obs = nil
	}
	ctx.Response.SetBodyStream(&relay{up: up, body: body, w: w, obs: obs}, -1)
	return sent, ""
}

// classify turns an upstream result into an outcome, feeding the circuit
// breaker.
func (s *Server) classify(ctx *fasthttp.RequestCtx, w *loadview.Worker, err error, status int) (outcome, string) {
	if errors.Is(err, fasthttp.ErrNoFreeConns) { // our pool is full: not the worker's fault
		upstreamErrors["connect"].Inc()
		return retryable, w.URL() + ": " + err.Error()
	}
	if err != nil {
		s.cfg.Registry.RecordResult(w, false)
		var ne net.Error
		dial := errors.Is(err, fasthttp.ErrDialTimeout)
		if !dial && (errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout())) {
			upstreamErrors["timeout"].Inc()
			return timedOut, err.Error()
		}
		upstreamErrors["connect"].Inc()
		return retryable, w.URL() + ": " + err.Error()
	}
	if retryableStatus(status) {
		s.cfg.Registry.RecordResult(w, false)
		upstreamErrors["status"].Inc()
		return retryable, w.URL() + " answered " + strconv.Itoa(status)
	}
	s.cfg.Registry.RecordResult(w, true)
	return sent, ""
}

// relay streams an upstream body to the client chunk by chunk (fasthttp
// flushes each chunk it reads) and releases the worker's load exactly once
// when fasthttp closes it: at the end of the stream, on a client disconnect
// (write error), or when the response is reset. Not pooled: fasthttp may
// call Close more than once, and a recycled relay would then close another
// request's stream.
type relay struct {
	up     *fasthttp.Response
	body   io.Reader
	w      *loadview.Worker
	obs    *observer         // learns from the events as they pass; nil when not needed
	hist   *latencyHistogram // the route's duration, observed when the stream ends
	start  time.Time
	closed atomic.Bool
}

func (r *relay) Read(p []byte) (int, error) {
	n, err := r.body.Read(p)
	if r.obs != nil && n > 0 {
		r.obs.stream(p[:n], r.w)
	}
	if err != nil && err != io.EOF {
		upstreamErrors["stream"].Inc()
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
	r.w.Release() // first: nothing after it may keep the load counted
	if r.hist != nil {
		r.hist.observe(time.Since(r.start))
	}
	if r.obs != nil {
		r.obs.done(r.w)
	}
	return err
}

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 §7.6.1): never forwarded in either direction. fasthttp handles
// Connection and Transfer-Encoding itself.
var hopByHop = [...]string{"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Upgrade"}

// dropHopByHop removes the hop-by-hop headers of an upstream response,
// including a Connection: close meant for the router's own connection.
func dropHopByHop(h *fasthttp.ResponseHeader) {
	h.ResetConnectionClose()
	for _, k := range hopByHop {
		h.Del(k)
	}
}
