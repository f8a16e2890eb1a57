package fastproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/admission"
	"github.com/warmroute/warmroute/connwatch"
	"github.com/warmroute/warmroute/learn"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/resume"
	"github.com/warmroute/warmroute/upstream"
)

// relay is the sixth stage: it streams an upstream body to the client
// (fasthttp flushes each Read's bytes), passing it through the learning
// room, and releases the worker's load exactly once when fasthttp closes
// it: at the end of the stream, on a client disconnect (write error, or the
// client watcher's cancel), or when the response is reset. Not pooled:
// fasthttp may call Close more than once, and a recycled relay would then
// close another request's stream.
//
// A chat, completions or messages stream is relayed in whole SSE events
// and followed (resume.Answer): when its worker cuts it — a reset, a close
// or an end before its terminator, a stall past --upstream-stall-timeout-secs
// — and the answer can be continued, the relay sends the history and the
// text delivered so far to another worker and splices that continuation
// into the same answer (resume.go; docs/design.md §8.2). Any other cut
// ends, for the client, with an OpenAI-style error event, counted under
// its own status label ("stream_cut") and logged. A client that accepts
// no byte for the client stall timeout is cut (each Read extends its write
// deadline).
type relay struct {
	up     *fasthttp.Response // the worker's response headers
	body   io.Reader          // its body: an *upstream.Body, or endless in a test
	w      *loadview.Worker
	obs    *learn.Observer // learns from the events as they pass; nil when nobody does
	f      *forwarder
	ctx    *fasthttp.RequestCtx // the request, which a continuation is built from
	conn   net.Conn             // the client's connection, for the stall deadline
	rm     *routeMetrics        // set by the handler: counted and timed when the stream ends
	start  time.Time
	status int
	rid    string
	cut    bool  // the worker cut the stream and the client gets the error event
	held   bool  // the relay holds a load on w
	err    error // the client left: what ends its stream
	tail   []byte
	closed atomic.Bool
	first  atomic.Bool // the first byte is counted (Worker.FirstByte)
	trace  *reqTrace   // the request's spans: the relay ends its attempt's and the stream's; nil: not traced
	root   *reqTrace   // set by the handler: the relay ends the server span too

	// The client's watch: a client that leaves cancels the upstream
	// exchange at once, even while the worker sends nothing.
	cancel upstream.Canceler
	watch  *connwatch.Conn
	own    connwatch.Conn // the registration when the connection keeps none

	// Following the answer (nil ans: relayed as it comes).
	ans      *resume.Answer
	kind     reqview.Kind
	pinned   bool               // the model step pins the turn to its worker
	tried    []*loadview.Worker // workers that served the answer so far
	resumes  int                // continuations made after cuts
	preempts int                // continuations made after a preemption (preempt.go)
	in       *[]byte            // upstream bytes: events not yet given, then a partial one
	ready    int                // (*in)[:ready] are whole events, given through out
	have     int                // (*in)[:have] were read
	out      []byte             // bytes for the client's next Read
	rw       []byte             // a continuation's events, rewritten
	ended    bool               // the upstream body ended; out and the tail are what is left

	meter *tenantMeter // counts what the client reads, for its tenant's token limit; nil: none

	// Preemption (preempt.go), when the queue preempts: the request's
	// admission as the queue saw it, and whether a more urgent request
	// asked for its slot.
	model, tenant string
	prio          int
	candidate     uint32 // the worker whose candidates it is among (preemption.add); 0: none
	preempt       atomic.Bool

	// The request's admission, ended with the stream (admitStage.done);
	// nil admit: the handler ended it.
	admit  *admission.Controller
	ticket admission.Ticket
}

// relayBufs pools the relays' event buffers, answers the followed ones.
var (
	relayBufs = sync.Pool{New: func() any { b := make([]byte, 4<<10); return &b }} // grown while an event does not fit
	answers   = sync.Pool{New: func() any { return new(resume.Answer) }}
)

// maxEvent bounds one SSE event held whole; a longer one passes in pieces,
// and the answer can no longer be continued.
const maxEvent = 1 << 20

// newRelay returns the relay of a stream from w, watching the client's
// connection from now on.
func (f *forwarder) newRelay(ctx *fasthttp.RequestCtx, st *reqState, w *loadview.Worker) *relay {
	r := &relay{f: f, ctx: ctx, w: w, held: true, conn: ctx.Conn(), rid: string(ctx.Request.Header.Peek(hdrRequestID)),
		kind: st.kind, pinned: st.pin != nil || st.noRetry}
	for _, t := range st.tried { // the workers that failed this request before w
		if t != nil && t != w && t != st.prefilled {
			r.tried = append(r.tried, t)
		}
	}
	r.tried = append(r.tried, w)
	if st.limited != nil {
		r.meter = newTenantMeter(st.srv.limits, st.limited, len(ctx.Request.Body()))
	}
	if f.preempt != nil {
		if r.prio = st.priority(ctx); r.prio > 0 { // only background streams may be preempted: only they need their admission again
			r.model, r.tenant = strings.Clone(st.req.Model), st.tenantName(ctx) // the model may alias a buffer the handler reuses
		}
	}
	if r.watch = connRegistration(ctx.Conn()); r.watch == nil {
		r.watch = &r.own
	}
	clientWatcher.Start(r.watch, ctx.Conn(), r.cancel.Cancel)
	return r
}

// errNotStreamable: a worker whose client is not an upstream.Transport
// (loadview gives every worker one).
var errNotStreamable = errors.New("the worker's client cannot stream")

// open sends req to r.w and reads the response headers into a new r.up.
func (r *relay) open(req *fasthttp.Request, timeout time.Duration) error {
	r.up = fasthttp.AcquireResponse()
	hc := r.w.Client()
	t, ok := hc.Transport.(*upstream.Transport)
	if !ok {
		return errNotStreamable
	}
	lim := upstream.StreamLimits{Timeout: timeout, FirstByte: r.f.firstByte, Stall: r.f.upstreamStall}
	ub, err := t.Stream(hc, req, r.up, lim, &r.cancel)
	if err == nil {
		r.body = ub
	}
	return err
}

// begin starts relaying the opened response: followed in events when its
// answer may be continued.
func (r *relay) begin(obs *learn.Observer) {
	r.obs, r.status = obs, r.up.StatusCode()
	api, ok := resumeAPI(r.kind)
	sse := bytes.HasPrefix(r.up.Header.ContentType(), []byte("text/event-stream"))
	if ok && sse && r.status == fasthttp.StatusOK && r.f.resumeAttempts > 0 {
		r.ans = answers.Get().(*resume.Answer)
		r.ans.Reset(api, r.f.resumeMaxBytes)
		r.in = relayBufs.Get().(*[]byte)
		if r.f.preempt != nil && r.prio > 0 && !r.pinned {
			r.f.preempt.add(r)
		}
	}
}

// resumeAPI is the continuation format of an endpoint kind.
func resumeAPI(k reqview.Kind) (resume.API, bool) {
	switch k {
	case reqview.Chat:
		return resume.Chat, true
	case reqview.Completions:
		return resume.Completions, true
	case reqview.Messages:
		return resume.Messages, true
	}
	return 0, false
}

// closeUpstream closes the current upstream body and response.
func (r *relay) closeUpstream() error {
	if r.up == nil {
		return nil
	}
	var err error
	if c, ok := r.body.(io.Closer); ok {
		err = c.Close()
	}
	fasthttp.ReleaseResponse(r.up)
	r.up, r.body = nil, nil
	return err
}

// streamCutEvent ends a stream the worker cut, for the client.
const streamCutEvent = "\n\ndata: {\"error\":{\"message\":\"the worker ended the stream early\",\"type\":\"upstream_error\",\"param\":null,\"code\":\"stream_cut\"}}\n\n"

func (r *relay) Read(p []byte) (int, error) {
	n, err := r.read(p)
	if r.meter != nil && n > 0 {
		r.meter.write(p[:n])
	}
	return n, err
}

func (r *relay) read(p []byte) (int, error) {
	if r.ans == nil {
		return r.readRaw(p)
	}
	for {
		if len(r.out) > 0 {
			n := copy(p, r.out)
			r.out = r.out[n:]
			return n, nil
		}
		if r.ended {
			if r.err != nil {
				return 0, r.err
			}
			return r.readTail(p)
		}
		r.fill()
	}
}

// readTail gives the error event of a cut, then the end.
func (r *relay) readTail(p []byte) (int, error) {
	if len(r.tail) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.tail)
	r.tail = r.tail[n:]
	return n, nil
}

// readRaw relays a stream that is not followed, as it comes.
func (r *relay) readRaw(p []byte) (int, error) {
	if r.tail != nil {
		n, _ := r.readTail(p)
		if len(r.tail) == 0 {
			return n, io.EOF
		}
		return n, nil
	}
	r.deadline()
	n, err := r.body.Read(p)
	r.firstByte(n, err)
	if r.obs != nil {
		r.obs.Chunk(p[:n], err != nil, r.w)
	}
	if err != nil && err != io.EOF {
		if clientGone(err) {
			return n, err
		}
		r.fail(err)
		r.cut, r.tail = true, []byte(streamCutEvent)
		if n > 0 {
			return n, nil
		}
		return r.readRaw(p)
	}
	return n, err
}

// deadline extends the client's write deadline before a read.
func (r *relay) deadline() {
	if r.conn != nil {
		_ = r.conn.SetWriteDeadline(time.Now().Add(r.f.stall))
	}
}

func (r *relay) firstByte(n int, err error) {
	if (n > 0 || err != nil) && !r.first.Load() && r.first.CompareAndSwap(false, true) {
		r.w.FirstByte()
		r.trace.firstByte()
	}
}

// fill reads the upstream once and sets out to the whole events that came;
// first, a stream a more urgent request preempted gives its slot up.
func (r *relay) fill() {
	if r.preempt.Load() && r.preempted() {
		return
	}
	in := *r.in
	if r.ready > 0 { // the events before it were given
		r.have = copy(in, in[r.ready:r.have])
		r.ready = 0
	}
	if r.have == len(in) {
		if len(in) >= maxEvent { // an event too long to hold: it passes in pieces
			r.ans.NotContinuable("an event is over 1 MiB")
			r.pass(in, false, true)
			r.ready = len(in)
			return
		}
		in = append(in, make([]byte, len(in))...)
		*r.in = in
	}
	r.deadline()
	n, err := r.body.Read(in[r.have:])
	r.firstByte(n, err)
	r.have += n
	if end := eventsEnd(in[:r.have]); end > 0 {
		r.pass(in[:end], err != nil, false)
		r.ready = end
	}
	switch {
	case err == nil:
	case err == io.EOF && r.ans.Ended():
		r.out = append(r.out, in[r.ready:r.have]...) // whatever follows the terminator
		r.ready, r.ended = r.have, true
	case clientGone(err):
		r.ended, r.err = true, err
	default:
		r.cutOff(err)
	}
}

// pass hands whole events to the client, rewritten when they come from a
// continuation, and to the learning room as the worker sent them; a piece
// of an event too long to hold (piece) passes as it is.
func (r *relay) pass(events []byte, last, piece bool) {
	if r.obs != nil {
		r.obs.Chunk(events, last, r.w)
	}
	if piece {
		r.out = events
		return
	}
	if r.resumes+r.preempts == 0 {
		for rest := events; len(rest) > 0; {
			ev, tail := nextEvent(rest)
			r.ans.Observe(ev)
			rest = tail
		}
		r.out = events
		return
	}
	r.rw = r.rw[:0]
	for rest := events; len(rest) > 0; {
		ev, tail := nextEvent(rest)
		r.rw = r.ans.Rewrite(r.rw, ev)
		rest = tail
	}
	r.out = r.rw
}

// eventsEnd returns the index after the last whole SSE event of b (an
// event ends with a blank line: "\n\n" or "\n\r\n"), 0 when there is
// none. It looks from the end, where a read nearly always stops.
func eventsEnd(b []byte) int {
	for i := len(b); ; {
		j := bytes.LastIndexByte(b[:i], '\n')
		switch {
		case j <= 0:
			return 0
		case b[j-1] == '\n', b[j-1] == '\r' && j >= 2 && b[j-2] == '\n':
			return j + 1
		}
		i = j
	}
}

// nextEvent splits the first event, blank line included, off b.
func nextEvent(b []byte) (event, rest []byte) {
	for i := bytes.IndexByte(b, '\n'); i >= 0 && i+1 < len(b); {
		switch {
		case b[i+1] == '\n':
			return b[:i+2], b[i+2:]
		case b[i+1] == '\r' && i+2 < len(b) && b[i+2] == '\n':
			return b[:i+3], b[i+3:]
		}
		j := bytes.IndexByte(b[i+1:], '\n')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return b, nil
}

// cutOff handles a stream its worker cut: continued on another worker when
// the answer allows, else ended with the error event. A partial event is
// never given.
func (r *relay) cutOff(err error) {
	r.fail(err)
	r.have = r.ready
	if r.continueAnswer() {
		return
	}
	r.ended, r.cut = true, true
	r.tail = []byte(streamCutEvent)
}

// fail counts and logs a cut, and charges it to the worker.
func (r *relay) fail(err error) {
	kind := kindStream
	if err == upstream.ErrStalled {
		kind = kindStall
		r.f.reg.ProbeSoon(r.w)
	}
	r.f.reg.RecordFailure(r.w)
	r.f.metrics.upstreamErrors[kind].Inc()
	r.f.metrics.streamsCut.Inc()
	r.trace.log(r.f.log).Warn("stream cut by the worker", "request_id", r.rid, "worker", r.w.URL(), "err", err)
}

// clientGone reports a read that ended because the client left (the
// watcher cancelled the exchange): nothing is left to answer.
func clientGone(err error) bool { return err == upstream.ErrCanceled }

// Close implements io.Closer; idempotent.
func (r *relay) Close() error {
	if !r.closed.CompareAndSwap(false, true) {
		return nil
	}
	clientWatcher.Stop(r.watch)
	if r.f.preempt != nil && r.prio > 0 { // never a candidate otherwise: no lock
		r.f.preempt.remove(r)
	}
	err := r.closeUpstream()
	w := r.w
	r.releaseWorker() // first: nothing after it may keep the load counted
	if r.admit != nil {
		r.admit.Done(&r.ticket) // after the worker's load: a request it releases reads the room this one left
		r.admit = nil
	}
	if r.rm != nil {
		if r.cut {
			r.rm.counter("stream_cut").Inc()
		} else {
			r.rm.count(r.status)
		}
		r.rm.duration.observe(time.Since(r.start))
	}
	r.trace.streamEnd(r.cut, r.resumes+r.preempts, r.err != nil)
	r.root.end(r.status, r.cut)
	if r.obs != nil {
		if !r.cut && r.err == nil {
			r.obs.Done(w)
		}
		r.obs.Release()
		r.obs = nil
	}
	if r.meter != nil && r.status == fasthttp.StatusOK {
		r.meter.done()
	}
	if r.resumes+r.preempts > 0 {
		r.f.metrics.resumePrompt.Add(r.ans.ContinuationPromptTokens())
	}
	if r.ans != nil {
		answers.Put(r.ans) // Read is not called after Close
		r.ans = nil
	}
	if r.in != nil {
		if cap(*r.in) <= 64<<10 {
			relayBufs.Put(r.in)
		}
		r.in = nil
	}
	return err
}
