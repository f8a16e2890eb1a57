package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/puzpuzpuz/xsync/v3"
	"github.com/valyala/fasthttp"
)

// Config configures a Transport. Zero fields take the defaults documented on
// each field; fields documented as falling back to the HostClient are read
// from the HostClient of the first buffered exchange to each address.
type Config struct {
	// ConnectTimeout bounds dialing (and the TLS handshake) of a new
	// upstream connection; the request deadline bounds it too.
	// Default fasthttp.DefaultDialTimeout (3 s).
	ConnectTimeout time.Duration

	// Dial, if set, dials new connections (the connect timeout cannot be
	// applied to it, nor can a dial in flight be cancelled: a cancel takes
	// effect when it returns). Otherwise hc.DialTimeout, then hc.Dial, then a
	// net.Dialer are used, in that order; only the net.Dialer dial is
	// cancellable while in flight.
	Dial fasthttp.DialFunc

	// MaxIdleConnsPerHost caps the idle keep-alive connections kept per
	// address; connections beyond it are closed after use. Default 256.
	MaxIdleConnsPerHost int

	// MaxIdleConnDuration closes idle connections unused for that long.
	// Default hc.MaxIdleConnDuration, else fasthttp.DefaultMaxIdleConnDuration.
	// Keep it below the upstream server's keep-alive timeout.
	MaxIdleConnDuration time.Duration

	// MaxResponseBodySize limits buffered response bodies
	// (fasthttp.ErrBodyTooLarge beyond). Default hc.MaxResponseBodySize
	// (0: unlimited).
	MaxResponseBodySize int

	// ReadBufferSize and WriteBufferSize size the pooled bufio readers and
	// writers. Default 4096 each. A request that would not fit the write
	// buffer goes to a plain TCP (or Unix) connection as one writev, its
	// in-memory body not copied (vecwrite.go); TLS, body streams and
	// trailers always go through the buffered writer.
	ReadBufferSize, WriteBufferSize int
}

// DialError is returned when a new upstream connection could not be made.
// It unwraps to the dial function's error (a *net.OpError with Op "dial"
// for the default dialer), and errors.Is(err, fasthttp.ErrDialTimeout)
// reports true for a dial (or TLS handshake) timeout, which is therefore
// distinguishable from a response timeout (fasthttp.ErrTimeout).
type DialError struct {
	Addr string
	Err  error

	timeout bool
}

func (e *DialError) Error() string { return "upstream: dial " + e.Addr + ": " + e.Err.Error() }

// Unwrap returns the underlying dial error.
func (e *DialError) Unwrap() error { return e.Err }

// Timeout reports whether the dial timed out.
func (e *DialError) Timeout() bool { return e.timeout }

// Is reports true for fasthttp.ErrDialTimeout when the dial timed out.
func (e *DialError) Is(target error) bool { return e.timeout && target == fasthttp.ErrDialTimeout }

// Transport is a fasthttp.RoundTripper (set it as HostClient.Transport) that
// performs buffered exchanges (Do, DoCanceler) and streamed ones (Stream) on
// its own per-address keep-alive pool so that they can be cancelled; a
// response with StreamBody that goes through hc.Do, Do or DoCanceler is
// delegated to fasthttp.DefaultTransport.
//
// Differences from fasthttp's transport for buffered exchanges: connections
// come from the Transport's pool, not the HostClient's, so hc.MaxConns,
// MaxConnWaitTimeout, ConnsCount and IdleConnsCount do not apply to them;
// a timeout or cancel returns retry=false (a request that may be running on
// the upstream is never resent); only a single hc.Addr is supported (an Addr
// listing several addresses is delegated to fasthttp.DefaultTransport, and is
// then not cancellable).
//
// A Transport is safe for concurrent use by any number of HostClients and
// goroutines. It holds idle connections until they expire or
// CloseIdleConnections is called; it starts no goroutine of its own except
// one short-lived timer callback per address while idle connections exist.
type Transport struct {
	cfg Config

	pools *xsync.MapOf[poolKey, *hostPool]

	readers sync.Pool // *bufio.Reader
	writers sync.Pool // *bufio.Writer
	vecs    sync.Pool // *vecWriter (vecwrite.go)
	bodies  sync.Pool // *Body (stream.go)

	noVec bool // benchmarks: always the buffered writer
}

var _ fasthttp.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport configured by cfg.
func NewTransport(cfg Config) *Transport {
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = fasthttp.DefaultDialTimeout
	}
	if cfg.MaxIdleConnsPerHost <= 0 {
		cfg.MaxIdleConnsPerHost = 256
	}
	if cfg.ReadBufferSize <= 0 {
		cfg.ReadBufferSize = 4096
	}
	if cfg.WriteBufferSize <= 0 {
		cfg.WriteBufferSize = 4096
	}
	return &Transport{cfg: cfg, pools: xsync.NewMapOf[poolKey, *hostPool]()}
}

// CloseIdleConnections closes all idle pooled connections. Exchanges in
// flight are not affected.
func (t *Transport) CloseIdleConnections() {
	t.pools.Range(func(_ poolKey, p *hostPool) bool {
		p.closeIdle()
		return true
	})
}

// IdleConns returns the number of idle pooled connections to addr.
func (t *Transport) IdleConns(addr string, isTLS bool) int {
	p, ok := t.pools.Load(poolKey{addr, isTLS})
	if !ok {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// RoundTrip implements fasthttp.RoundTripper, for a plain hc.Do or
// hc.DoTimeout on a HostClient using t (not cancellable), and for what Do and
// DoCanceler delegate to HostClient (see delegated).
func (t *Transport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (retry bool, err error) {
	if delegated(hc, resp) {
		return fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	}
	var deadline time.Time
	if d := requestTimeout(req); d > 0 {
		deadline = time.Now().Add(d)
	}
	return t.exchange(hc, req, resp, deadline, nil)
}

func minDeadline(deadline time.Time, d time.Duration) time.Time {
	if d <= 0 {
		return deadline
	}
	if t := time.Now().Add(d); deadline.IsZero() || t.Before(deadline) {
		return t
	}
	return deadline
}

// bounds reports whether the exchange's deadline (not zero) alone bounds
// both its write and its read: it comes before the connection's own
// timeouts (counted from now) would end either.
func bounds(deadline time.Time, hc *fasthttp.HostClient, now time.Time) bool {
	return (hc.WriteTimeout <= 0 || !now.Add(hc.WriteTimeout).Before(deadline)) &&
		(hc.ReadTimeout <= 0 || !now.Add(hc.ReadTimeout).Before(deadline))
}

func (t *Transport) exchange(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time, c *Canceler) (bool, error) {
	p := t.pool(hc)
	pc := p.get()
	if pc == nil {
		var err error
		if pc, err = t.dial(hc, p, deadline, c); err != nil {
			return false, err
		}
	}
	if c != nil && !c.bind(pc.raw) {
		_ = pc.c.Close()
		return false, ErrCanceled
	}
	conn := pc.c
	resp.ParseNetConn(conn)

	// The usual case, a request deadline before the connection's timeouts
	// end, takes one deadline call for both directions (one runtime timer,
	// not two).
	both := !deadline.IsZero() && bounds(deadline, hc, time.Now())
	if both {
		if err := conn.SetDeadline(deadline); err != nil {
			return t.fail(pc, c, err, true)
		}
		pc.wdSet, pc.rdSet = true, true
	} else if wd := minDeadline(deadline, hc.WriteTimeout); !wd.IsZero() || pc.wdSet {
		if err := conn.SetWriteDeadline(wd); err != nil {
			return t.fail(pc, c, err, true)
		}
		pc.wdSet = !wd.IsZero()
	}
	if err := t.writeRequest(conn, req); err != nil {
		return t.fail(pc, c, err, true)
	}

	if !both {
		if rd := minDeadline(deadline, hc.ReadTimeout); !rd.IsZero() || pc.rdSet {
			if err := conn.SetReadDeadline(rd); err != nil {
				return t.fail(pc, c, err, true)
			}
			pc.rdSet = !rd.IsZero()
		}
	}
	if req.Header.IsHead() {
		resp.SkipBody = true
	}
	if hc.DisableHeaderNamesNormalizing {
		resp.Header.DisableNormalizing()
	}
	maxBody := t.cfg.MaxResponseBodySize
	if maxBody <= 0 {
		maxBody = hc.MaxResponseBodySize
	}
	// Yield before reading the answer: under load the other goroutines'
	// work gives the worker time to answer, and the first read finds the
	// answer instead of failing with EAGAIN and waiting (one read(2) less
	// per request, docs/design.md §7). Unloaded, nothing else runs and it
	// reads at once.
	runtime.Gosched()
	br := t.acquireReader(conn)
	err := resp.ReadLimitBody(br, maxBody)
	leftover := br.Buffered() > 0 // bytes beyond the response: unsafe to reuse
	t.releaseReader(br)
	if err != nil {
		return t.fail(pc, c, err, err != fasthttp.ErrBodyTooLarge)
	}

	canceled := c != nil && c.unbind()
	if canceled || leftover || req.ConnectionClose() || resp.ConnectionClose() ||
		(hc.MaxConnDuration > 0 && time.Since(pc.created) > hc.MaxConnDuration) {
		_ = conn.Close()
	} else {
		p.put(pc)
	}
	// A cancel that raced with the end of a complete response is ignored:
	// the response is returned.
	return false, nil
}

// fail closes pc and classifies err.
func (t *Transport) fail(pc *pconn, c *Canceler, err error, retry bool) (bool, error) {
	canceled := c != nil && c.unbind()
	_ = pc.c.Close()
	switch {
	case canceled:
		return false, ErrCanceled
	case isTimeout(err):
		return false, fasthttp.ErrTimeout
	case err == io.EOF:
		return retry, fasthttp.ErrConnectionClosed
	}
	return retry, err
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout) ||
		errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// dial makes a new connection for hc (TLS if hc.IsTLS), bounded by the
// connect timeout and the request deadline, abortable through c.
func (t *Transport) dial(hc *fasthttp.HostClient, p *hostPool, deadline time.Time, c *Canceler) (*pconn, error) {
	timeout := t.cfg.ConnectTimeout
	if !deadline.IsZero() {
		if rem := time.Until(deadline); rem < timeout {
			timeout = rem
		}
		if timeout <= 0 {
			return nil, &DialError{Addr: p.addr, Err: fasthttp.ErrDialTimeout, timeout: true}
		}
	}
	var (
		conn net.Conn
		err  error
	)
	switch {
	case t.cfg.Dial != nil:
		conn, err = t.cfg.Dial(p.addr)
	case hc.DialTimeout != nil:
		conn, err = hc.DialTimeout(p.addr, timeout)
	case hc.Dial != nil:
		conn, err = hc.Dial(p.addr)
	default:
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		if c != nil && !c.setDialCancel(cancel) {
			cancel()
			return nil, ErrCanceled
		}
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", p.addr)
		if c != nil {
			c.setDialCancel(nil)
		}
		cancel()
	}
	if c != nil && c.Canceled() {
		if conn != nil {
			_ = conn.Close()
		}
		return nil, ErrCanceled
	}
	if err != nil {
		return nil, &DialError{Addr: p.addr, Err: err, timeout: isTimeout(err)}
	}
	now := time.Now()
	pc := &pconn{c: conn, raw: conn, created: now, rdSet: true, wdSet: true}
	if _, isTLS := conn.(interface{ Handshake() error }); hc.IsTLS && !isTLS {
		if c != nil && !c.bind(conn) { // a cancel during the handshake closes the raw conn
			_ = conn.Close()
			return nil, ErrCanceled
		}
		tc := tls.Client(conn, p.tlsConfig(hc))
		err = tc.SetDeadline(now.Add(timeout))
		if err == nil {
			err = tc.Handshake()
		}
		canceled := c != nil && c.unbind()
		if err != nil || canceled {
			_ = conn.Close()
			if canceled {
				return nil, ErrCanceled
			}
			return nil, &DialError{Addr: p.addr, Err: err, timeout: isTimeout(err)}
		}
		pc.c = tc
	}
	return pc, nil
}

func (t *Transport) acquireReader(conn io.Reader) *bufio.Reader {
	if v := t.readers.Get(); v != nil {
		br := v.(*bufio.Reader) //nolint:forcetypeassert // only *bufio.Reader is put
		br.Reset(conn)
		return br
	}
	return bufio.NewReaderSize(conn, t.cfg.ReadBufferSize)
}

func (t *Transport) releaseReader(br *bufio.Reader) {
	br.Reset(nil)
	t.readers.Put(br)
}

func (t *Transport) acquireWriter(conn net.Conn) *bufio.Writer {
	if v := t.writers.Get(); v != nil {
		bw := v.(*bufio.Writer) //nolint:forcetypeassert // only *bufio.Writer is put
		bw.Reset(conn)
		return bw
	}
	return bufio.NewWriterSize(conn, t.cfg.WriteBufferSize)
}

func (t *Transport) releaseWriter(bw *bufio.Writer) {
	bw.Reset(nil)
	t.writers.Put(bw)
}
