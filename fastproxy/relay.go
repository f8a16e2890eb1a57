package fastproxy

import (
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/learn"
	"github.com/warmroute/warmroute/loadview"
)

// relay is the sixth stage: it streams an upstream body to the client chunk
// by chunk (fasthttp flushes each chunk it reads), passing each through the
// learning room, and releases the worker's load exactly once when fasthttp
// closes it: at the end of the stream, on a client disconnect (write
// error), or when the response is reset. Not pooled: fasthttp may call
// Close more than once, and a recycled relay would then close another
// request's stream.
//
// A stream the worker cuts mid-way ends, for the client, with an
// OpenAI-style error event; it is counted under its own status label
// ("stream_cut") and logged. A client that accepts no byte for the stall
// timeout is cut (each chunk extends its write deadline).
type relay struct {
	up     *fasthttp.Response
	body   io.Reader
	w      *loadview.Worker
	obs    *learn.Observer // learns from the events as they pass; nil when nobody does
	f      *forwarder
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

// newRelay returns the relay of up's body from w, which owns obs from now on.
func (f *forwarder) newRelay(ctx *fasthttp.RequestCtx, up *fasthttp.Response, body io.Reader, w *loadview.Worker, obs *learn.Observer) *relay {
	return &relay{up: up, body: body, w: w, obs: obs, f: f, conn: ctx.Conn(), status: up.StatusCode(),
		rid: string(ctx.Request.Header.Peek(hdrRequestID))}
}

// streamCutEvent ends a stream the worker cut, for the client.
const streamCutEvent = "\n\ndata: {\"error\":{\"message\":\"the worker ended the stream early\",\"type\":\"upstream_error\",\"param\":null,\"code\":\"stream_cut\"}}\n\n"

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
		_ = r.conn.SetWriteDeadline(time.Now().Add(r.f.stall))
	}
	n, err := r.body.Read(p)
	if (n > 0 || err != nil) && !r.first.Load() && r.first.CompareAndSwap(false, true) {
		r.w.FirstByte()
	}
	if r.obs != nil {
		r.obs.Chunk(p[:n], err != nil, r.w)
	}
	if err != nil && err != io.EOF {
		r.cut = true
		r.f.metrics.upstreamErrors[kindStream].Inc()
		r.f.metrics.streamsCut.Inc()
		r.f.log.Warn("stream cut by the worker", "request_id", r.rid, "worker", r.w.URL(), "err", err)
		r.tail = []byte(streamCutEvent)
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
			r.obs.Done(r.w)
		}
		r.obs.Release()
		r.obs = nil
	}
	return err
}
