package upstream

import (
	"bufio"
	"errors"
	"io"
	"os"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// StreamLimits bounds a streamed exchange (Stream); a zero field bounds
// nothing.
type StreamLimits struct {
	// Timeout bounds the whole exchange: dial, request, headers and every
	// body byte. Passing it returns fasthttp.ErrTimeout.
	Timeout time.Duration
	// FirstByte bounds the time from the start of the exchange to the end of
	// the response headers (dial and request included). Passing it returns
	// ErrFirstByte.
	FirstByte time.Duration
	// Stall bounds the wait for the next body byte, counted from the last
	// byte received (the headers' end for the first). Passing it returns
	// ErrStalled.
	Stall time.Duration
}

// ErrFirstByte is returned by Stream when the response headers did not come
// within StreamLimits.FirstByte (and before its Timeout).
var ErrFirstByte = errors.New("upstream: no response headers within the first-byte timeout")

// ErrStalled is returned by Body.Read when no body byte came for
// StreamLimits.Stall.
var ErrStalled = errors.New("upstream: response body stalled")

var errMultiAddr = errors.New("upstream: Stream needs a HostClient with a single Addr")

// Stream sends req on hc (whose Transport must be t, else ErrWrongTransport)
// and reads the response headers into resp; the body is read from the
// returned Body, which the caller must Close exactly once, and resp must not
// be reset or reused until then.
//
// c (may be nil) cancels the exchange from any goroutine at any point until
// Body.Close: during the dial, the request, the header wait and every body
// Read; Cancel closes the connection and the blocked call returns
// ErrCanceled. lim bounds the waits (StreamLimits); hc.WriteTimeout bounds the
// request's write, and hc.ReadTimeout, counted from the start, the headers
// and the body like Timeout. A new connection's dial is bounded by the
// connect timeout, FirstByte and Timeout, and fails with a *DialError.
//
// The connection comes from t's pool, shared with buffered exchanges, and
// goes back to it when the body was read to its end cleanly. The request and
// hc's retry policy are as for DoCanceler (scheme check, User-Agent default,
// RetryIfErrUpstream, RetryIfErr, else idempotent methods), except that only
// a kept-alive connection that failed before any response byte is retried,
// once, on a new connection: a stream is never resent after a byte of its
// answer, nor after a timeout or a cancel. An Addr listing several addresses
// is refused.
func (t *Transport) Stream(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, lim StreamLimits, c *Canceler) (*Body, error) {
	if hc.Transport != fasthttp.RoundTripper(t) {
		return nil, ErrWrongTransport
	}
	if c != nil && c.Canceled() {
		return nil, ErrCanceled
	}
	if strings.IndexByte(hc.Addr, ',') >= 0 {
		return nil, errMultiAddr
	}
	if err := prepare(hc, req); err != nil {
		return nil, err
	}
	b := t.acquireBody()
	b.t, b.p, b.c, b.resp = t, t.pool(hc), c, resp
	b.maxAge = hc.MaxConnDuration
	b.setLimits(lim, hc, time.Now())
	most := hc.MaxIdemponentCallAttempts
	if most <= 0 {
		most = fasthttp.DefaultMaxIdemponentCallAttempts
	}
	bodyStream := req.IsBodyStream() // before the first send spends the stream
	reuse := true
	for n := 1; ; n++ {
		retry, err := b.exchange(hc, req, reuse)
		if err == nil {
			return b, nil
		}
		if !retry || bodyStream || n >= most || n >= 2 {
			t.releaseBody(b)
			return nil, err
		}
		reset, retry := retryPolicy(hc, req, resp, n, err)
		if !retry {
			t.releaseBody(b)
			return nil, err
		}
		now := time.Now()
		if reset {
			b.setLimits(lim, hc, now)
		} else if !b.cr.end.IsZero() && !now.Before(b.cr.end) {
			t.releaseBody(b)
			return nil, fasthttp.ErrTimeout
		}
		reuse = false
	}
}

// Body is a streamed response body on a connection the Transport owns (see
// Stream). Read and Close must not be called concurrently with each other;
// use the Canceler to interrupt a Read from another goroutine.
type Body struct {
	t    *Transport
	p    *hostPool
	pc   *pconn
	c    *Canceler
	resp *fasthttp.Response
	br   *bufio.Reader
	body io.Reader // resp's body stream; nil without a body

	err  error // sticky: io.EOF once the body ended, else what ended it
	keep bool  // the connection may be pooled once the body ended

	maxAge time.Duration // hc.MaxConnDuration

	cr connReader
}

// connReader is what the Body's bufio.Reader reads: the connection, with
// its read deadline armed lazily (docs/design.md §7, as lazydeadline does
// for client connections). The deadline wanted moves with every byte
// received when a stall is bounded; the armed one stays until it fires, and
// a read it interrupts before the wanted deadline arms that and goes on. So
// a stream reading a chunk every few milliseconds reads the clock once per
// read from the connection and moves its timer about once per Stall.
type connReader struct {
	b *Body

	end    time.Time     // Timeout or hc.ReadTimeout: the last byte's deadline (zero: none)
	header time.Time     // the headers' deadline: end or FirstByte, whichever first
	writeD time.Duration // hc.WriteTimeout
	stall  time.Duration

	inBody bool
	got    int       // bytes read in this attempt
	last   time.Time // when the last bytes came (kept only with a stall bound)
	armed  time.Time // the read deadline the connection holds
	tErr   error     // the timeout that ended a read: ErrFirstByte, ErrStalled or fasthttp.ErrTimeout
}

func (b *Body) setLimits(lim StreamLimits, hc *fasthttp.HostClient, now time.Time) {
	cr := &b.cr
	cr.end, cr.header = time.Time{}, time.Time{}
	if lim.Timeout > 0 {
		cr.end = now.Add(lim.Timeout)
	}
	if hc.ReadTimeout > 0 {
		if d := now.Add(hc.ReadTimeout); cr.end.IsZero() || d.Before(cr.end) {
			cr.end = d
		}
	}
	cr.header = cr.end
	if lim.FirstByte > 0 {
		if d := now.Add(lim.FirstByte); cr.header.IsZero() || d.Before(cr.header) {
			cr.header = d
		}
	}
	cr.writeD = hc.WriteTimeout
	cr.stall = lim.Stall
}

// want is the read deadline wanted now.
func (cr *connReader) want() time.Time {
	if !cr.inBody {
		return cr.header
	}
	if cr.stall <= 0 {
		return cr.end
	}
	w := cr.last.Add(cr.stall)
	if !cr.end.IsZero() && cr.end.Before(w) {
		return cr.end
	}
	return w
}

func (cr *connReader) Read(p []byte) (int, error) {
	conn := cr.b.pc.c
	for {
		n, err := conn.Read(p)
		if n > 0 {
			cr.got += n
			if cr.stall > 0 {
				cr.last = time.Now()
			}
			return n, err
		}
		if err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		// The armed timer fired: go on if the deadline wanted is later.
		now := time.Now()
		w := cr.want()
		if w.IsZero() || now.Before(w) {
			if conn.SetReadDeadline(w) != nil {
				return n, err
			}
			cr.armed = w
			continue
		}
		cr.tErr = cr.timeoutErr(now)
		return n, err
	}
}

// timeoutErr names the bound that passed at now.
func (cr *connReader) timeoutErr(now time.Time) error {
	switch {
	case !cr.end.IsZero() && !now.Before(cr.end):
		return fasthttp.ErrTimeout
	case !cr.inBody && !cr.header.IsZero() && !now.Before(cr.header):
		return ErrFirstByte
	case cr.inBody && cr.stall > 0:
		return ErrStalled
	}
	return fasthttp.ErrTimeout // hc.WriteTimeout
}

// exchange makes one attempt: a connection (pooled if reuse), the request,
// the response headers. retry reports a failure that may be retried on a
// new connection: a kept-alive one that failed before any response byte.
func (b *Body) exchange(hc *fasthttp.HostClient, req *fasthttp.Request, reuse bool) (bool, error) {
	t, cr, c, resp := b.t, &b.cr, b.c, b.resp
	var pc *pconn
	if reuse {
		pc = b.p.get()
	}
	reused := pc != nil
	if pc == nil {
		var err error
		if pc, err = t.dial(hc, b.p, cr.header, c); err != nil {
			return false, err
		}
	}
	if c != nil && !c.bind(pc.raw) {
		_ = pc.c.Close()
		return false, ErrCanceled
	}
	b.pc = pc
	cr.inBody, cr.got, cr.tErr, cr.last = false, 0, nil, time.Time{}
	conn := pc.c
	resp.ParseNetConn(conn)

	// The usual case, a write bounded by the headers' deadline, takes one
	// deadline call for both directions.
	wd := minDeadline(cr.header, cr.writeD)
	if wd.Equal(cr.header) {
		if !wd.IsZero() || pc.rdSet || pc.wdSet {
			if err := conn.SetDeadline(wd); err != nil {
				return b.fail(reused, err)
			}
		}
		pc.wdSet, pc.rdSet = !wd.IsZero(), !wd.IsZero()
	} else {
		if err := conn.SetWriteDeadline(wd); err != nil {
			return b.fail(reused, err)
		}
		if err := conn.SetReadDeadline(cr.header); err != nil {
			return b.fail(reused, err)
		}
		pc.wdSet, pc.rdSet = !wd.IsZero(), !cr.header.IsZero()
	}
	cr.armed = cr.header
	if err := t.writeRequest(conn, req); err != nil {
		return b.fail(reused, err)
	}

	if req.Header.IsHead() {
		resp.SkipBody = true
	}
	if hc.DisableHeaderNamesNormalizing {
		resp.Header.DisableNormalizing()
	}
	b.br = t.acquireReader(cr)
	streamBody := resp.StreamBody
	resp.StreamBody = true
	err := resp.ReadLimitBody(b.br, 0)
	resp.StreamBody = streamBody // the body stream is made: the flag has done its work
	if err != nil {
		return b.fail(reused, err)
	}
	cl := resp.Header.ContentLength()
	b.body = resp.BodyStream()
	// A body without a length or chunks (-2) ends where the upstream closes.
	b.keep = !req.ConnectionClose() && !resp.ConnectionClose() && (b.body == nil || cl != -2)
	if b.body == nil || cl == 0 {
		b.err = io.EOF // nothing to read
		return false, nil
	}
	cr.inBody = true // cr.last: when the headers' end came
	// The armed deadline (the headers') must not come after the body's.
	if w := cr.want(); !w.IsZero() && (cr.armed.IsZero() || w.Before(cr.armed)) {
		if err := conn.SetReadDeadline(w); err != nil {
			b.err = err
			return false, nil
		}
		cr.armed = w
		pc.rdSet = true
	}
	return false, nil
}

// fail ends a failed attempt: the connection is closed and err classified.
func (b *Body) fail(reused bool, err error) (bool, error) {
	canceled := b.c != nil && b.c.unbind()
	_ = b.pc.c.Close()
	b.pc = nil
	if b.br != nil {
		b.t.releaseReader(b.br)
		b.br = nil
	}
	switch {
	case canceled:
		return false, ErrCanceled
	case b.cr.tErr != nil:
		return false, b.cr.tErr
	case isTimeout(err):
		return false, b.cr.timeoutErr(time.Now())
	case err == io.EOF:
		err = fasthttp.ErrConnectionClosed
	}
	return reused && b.cr.got == 0, err
}

// Read reads the response body. It returns io.EOF at the body's end;
// ErrCanceled once the Canceler fired, ErrStalled, fasthttp.ErrTimeout
// (StreamLimits), io.ErrUnexpectedEOF when the upstream closed the
// connection before the body's end, or another error of the connection or
// of the body's framing. An error other than io.EOF leaves the connection
// unusable; every later Read returns the same error.
func (b *Body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.body.Read(p)
	if err != nil {
		if err != io.EOF {
			switch {
			case b.c != nil && b.c.Canceled():
				err = ErrCanceled
			case b.cr.tErr != nil:
				err = b.cr.tErr
			}
		}
		b.err = err
	}
	return n, err
}

// Close releases the body: the connection goes back to the pool when the
// body was read to its end cleanly (no bytes after it, no Connection: close
// from either side, not cancelled, not older than hc.MaxConnDuration), else
// it is closed, which makes the upstream abort the request. The Canceler is
// unbound (a later Cancel does nothing to the connection) and resp's body
// stream released. Close must be called exactly once; b must not be used
// after.
func (b *Body) Close() error {
	t, p, pc := b.t, b.p, b.pc
	canceled := b.c != nil && b.c.unbind()
	clean := b.err == io.EOF && b.keep && !canceled && b.br.Buffered() == 0 &&
		!b.resp.ConnectionClose() && (b.maxAge <= 0 || time.Since(pc.created) <= b.maxAge)
	_ = b.resp.CloseBodyStream()
	b.pc = nil
	t.releaseBody(b)
	if clean {
		p.put(pc)
	} else {
		_ = pc.c.Close()
	}
	return nil
}

func (t *Transport) acquireBody() *Body {
	if v := t.bodies.Get(); v != nil {
		return v.(*Body) //nolint:forcetypeassert // only *Body is put
	}
	b := &Body{}
	b.cr.b = b
	return b
}

// releaseBody pools b; its connection (b.pc, if any) must be dealt with by
// the caller.
func (t *Transport) releaseBody(b *Body) {
	if b.br != nil {
		t.releaseReader(b.br)
	}
	cr := b.cr.b
	*b = Body{}
	b.cr.b = cr
	t.bodies.Put(b)
}
