package upstream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// countingListener counts accepted connections and signals their Close.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
	closed   chan struct{} // one send per server-side Close
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	return &closeSignalConn{Conn: c, ch: l.closed}, nil
}

type closeSignalConn struct {
	net.Conn
	once sync.Once
	ch   chan struct{}
}

func (c *closeSignalConn) Close() error {
	c.once.Do(func() {
		select {
		case c.ch <- struct{}{}:
		default:
		}
	})
	return c.Conn.Close()
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// startServer runs a fasthttp server with handler and returns its listener.
func startServer(t testing.TB, handler fasthttp.RequestHandler) *countingListener {
	t.Helper()
	ln := &countingListener{Listener: listen(t), closed: make(chan struct{}, 1024)}
	srv := &fasthttp.Server{Handler: handler}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { srv.Shutdown() })
	return ln
}

func echoHandler(ctx *fasthttp.RequestCtx) {
	ctx.SetBodyString("echo:" + string(ctx.Request.Body()))
}

func newHC(addr string, tr fasthttp.RoundTripper) *fasthttp.HostClient {
	return &fasthttp.HostClient{Addr: addr, Transport: tr}
}

func newReq(addr, method, body string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://" + addr + "/v1/chat/completions")
	req.Header.SetMethod(method)
	req.SetBodyString(body)
	return req
}

func TestKeepAliveReuse(t *testing.T) {
	ln := startServer(t, echoHandler)
	addr := ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	for i := range 5 {
		req, resp := newReq(addr, "POST", strconv.Itoa(i)), fasthttp.AcquireResponse()
		if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil {
			t.Fatal(err)
		}
		if got, want := string(resp.Body()), "echo:"+strconv.Itoa(i); got != want {
			t.Fatalf("body %q, want %q", got, want)
		}
	}
	if n := ln.accepted.Load(); n != 1 {
		t.Fatalf("server accepted %d conns, want 1", n)
	}
	if n := tr.IdleConns(addr, false); n != 1 {
		t.Fatalf("idle %d, want 1", n)
	}
	if n := hc.ConnsCount(); n != 0 {
		t.Fatalf("HostClient pool used: %d conns", n)
	}
}

func TestConnectionCloseNotReused(t *testing.T) {
	ln := startServer(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetConnectionClose()
		echoHandler(ctx)
	})
	addr := ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	for i := range 3 {
		req, resp := newReq(addr, "POST", strconv.Itoa(i)), fasthttp.AcquireResponse()
		if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil {
			t.Fatal(err)
		}
		if n := tr.IdleConns(addr, false); n != 0 {
			t.Fatalf("idle %d after Connection: close", n)
		}
	}
	if n := ln.accepted.Load(); n != 3 {
		t.Fatalf("server accepted %d conns, want 3", n)
	}
}

// hangServer reads one request per connection, reports it, then waits for
// the next read on that connection and reports its result (io.EOF when the
// client closed the connection — what makes vLLM abort the request).
type hangServer struct {
	ln     net.Listener
	gotReq chan struct{}
	after  chan error
}

func startHang(t testing.TB, respond func(net.Conn)) *hangServer {
	return startHangWrap(t, respond, nil)
}

func startHangWrap(t testing.TB, respond func(net.Conn), wrap func(net.Conn) net.Conn) *hangServer {
	t.Helper()
	s := &hangServer{ln: listen(t), gotReq: make(chan struct{}, 16), after: make(chan error, 16)}
	go func() {
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			if wrap != nil {
				c = wrap(c)
			}
			go func() {
				defer c.Close()
				var req fasthttp.Request
				if err := req.Read(bufio.NewReader(c)); err != nil {
					s.after <- fmt.Errorf("reading request: %w", err)
					return
				}
				s.gotReq <- struct{}{}
				if respond != nil {
					respond(c)
					return
				}
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, err := c.Read(make([]byte, 1))
				s.after <- err
			}()
		}
	}()
	return s
}

// countingDial counts dials so a test knows exactly how many connections
// (hence sends) an exchange made.
func countingDial(n *atomic.Int32) fasthttp.DialFunc {
	return func(addr string) (net.Conn, error) {
		n.Add(1)
		return net.Dial("tcp", addr)
	}
}

func testCancel(t *testing.T, method string, useCanceler bool) {
	s := startHang(t, nil)
	addr := s.ln.Addr().String()
	var dials atomic.Int32
	tr := NewTransport(Config{Dial: countingDial(&dials)})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, method, "{}"), fasthttp.AcquireResponse()

	ch := make(chan struct{})
	c := new(Canceler)
	errc := make(chan error, 1)
	go func() {
		if useCanceler {
			errc <- tr.DoCanceler(hc, req, resp, 30*time.Second, c)
		} else {
			errc <- tr.Do(hc, req, resp, 30*time.Second, ch)
		}
	}()
	<-s.gotReq
	start := time.Now()
	if useCanceler {
		c.Cancel()
	} else {
		close(ch)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrCanceled) {
			t.Fatalf("Do: %v, want ErrCanceled", err)
		}
		t.Logf("Do returned %v after cancel", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("Do did not return after cancel")
	}
	select {
	case err := <-s.after:
		if err != io.EOF {
			t.Fatalf("server read after cancel: %v, want EOF", err)
		}
		t.Logf("server saw EOF %v after cancel", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Fatal("server did not see the connection close")
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d dials: cancelled request was resent", n)
	}
	if n := tr.IdleConns(addr, false); n != 0 {
		t.Fatalf("cancelled conn pooled (%d idle)", n)
	}
	select {
	case <-s.gotReq:
		t.Fatal("request resent")
	default:
	}
}

func TestCancelChanPOST(t *testing.T)     { testCancel(t, "POST", false) }
func TestCancelChanGET(t *testing.T)      { testCancel(t, "GET", false) } // idempotent: HostClient would retry
func TestCancelCancelerPOST(t *testing.T) { testCancel(t, "POST", true) }
func TestCancelCancelerGET(t *testing.T)  { testCancel(t, "GET", true) }

func TestCancelBeforeStart(t *testing.T) {
	var dials atomic.Int32
	tr := NewTransport(Config{Dial: countingDial(&dials)})
	hc := newHC("127.0.0.1:1", tr)
	ch := make(chan struct{})
	close(ch)
	req, resp := newReq(hc.Addr, "POST", "{}"), fasthttp.AcquireResponse()
	if err := tr.Do(hc, req, resp, time.Second, ch); !errors.Is(err, ErrCanceled) {
		t.Fatalf("got %v", err)
	}
	c := new(Canceler)
	c.Cancel()
	if err := tr.DoCanceler(hc, req, resp, time.Second, c); !errors.Is(err, ErrCanceled) {
		t.Fatalf("got %v", err)
	}
	if dials.Load() != 0 {
		t.Fatal("dialed")
	}
}

// A cancel after the exchange completed changes nothing; the conn is reused.
func TestCancelAfterDone(t *testing.T) {
	ln := startServer(t, echoHandler)
	addr := ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	c := new(Canceler)
	req, resp := newReq(addr, "POST", "x"), fasthttp.AcquireResponse()
	if err := tr.DoCanceler(hc, req, resp, 5*time.Second, c); err != nil {
		t.Fatal(err)
	}
	c.Cancel()
	if string(resp.Body()) != "echo:x" || tr.IdleConns(addr, false) != 1 {
		t.Fatalf("body %q idle %d", resp.Body(), tr.IdleConns(addr, false))
	}
	c.Reset()
	if err := tr.DoCanceler(hc, req, resp, 5*time.Second, c); err != nil {
		t.Fatal(err)
	}
	if ln.accepted.Load() != 1 {
		t.Fatal("conn not reused")
	}
}

func TestTimeout(t *testing.T) {
	s := startHang(t, nil)
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "POST", "{}"), fasthttp.AcquireResponse()
	start := time.Now()
	err := tr.Do(hc, req, resp, 100*time.Millisecond, make(chan struct{}))
	if !errors.Is(err, fasthttp.ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	if errors.Is(err, fasthttp.ErrDialTimeout) {
		t.Fatal("read timeout looks like a dial timeout")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v", d)
	}
	if err := <-s.after; err != io.EOF {
		t.Fatalf("server: %v, want EOF (timed-out conn closed)", err)
	}
}

// A connection read timeout shorter than the request's deadline still
// bounds the wait for the answer (the deadline then does not cover both
// directions alone).
func TestReadTimeoutShorterThanDeadline(t *testing.T) {
	s := startHang(t, nil)
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	hc.ReadTimeout = 100 * time.Millisecond
	req, resp := newReq(addr, "POST", "{}"), fasthttp.AcquireResponse()
	start := time.Now()
	if err := tr.Do(hc, req, resp, time.Minute, make(chan struct{})); !errors.Is(err, fasthttp.ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v: the read timeout did not apply", d)
	}
}

// One call sets a request's deadline for the write and the read; it does
// not outlive the request: the pooled connection serves a next request
// without a deadline, and one whose own hc.ReadTimeout is shorter, after
// the first request's deadline passed.
func TestRequestDeadlineDoesNotOutliveIt(t *testing.T) {
	ln := startServer(t, echoHandler)
	addr := ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "POST", "x"), fasthttp.AcquireResponse()
	const timeout = 20 * time.Millisecond
	first := time.Now().Add(timeout)
	if err := tr.Do(hc, req, resp, timeout, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(first.Add(10 * time.Millisecond))) // a scenario: the deadline set on the conn passes
	if err := tr.Do(hc, req, resp, 0, nil); err != nil {
		t.Fatalf("no deadline, after a request with one: %v", err)
	}
	hc.ReadTimeout = time.Second
	if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil || string(resp.Body()) != "echo:x" {
		t.Fatalf("read timeout shorter than the request's: %v %q", err, resp.Body())
	}
	if ln.accepted.Load() != 1 {
		t.Fatalf("%d connections, want the one reused", ln.accepted.Load())
	}
}

// Plain hc.DoTimeout through the Transport (not through Do) honors the
// timeout too (via the request's own timeout field).
func TestPlainDoTimeout(t *testing.T) {
	if reqTimeoutOffset == 0 {
		t.Fatal("fasthttp.Request.timeout not found: plain hc.DoTimeout has no deadline")
	}
	s := startHang(t, nil)
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "POST", "{}"), fasthttp.AcquireResponse()
	if err := hc.DoTimeout(req, resp, 100*time.Millisecond); !errors.Is(err, fasthttp.ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
}

func TestDialRefused(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	ln.Close()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "POST", "{}"), fasthttp.AcquireResponse()
	err := tr.Do(hc, req, resp, time.Second, nil)
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("got %v (%T), want a dial *net.OpError", err, err)
	}
	var de *DialError
	if !errors.As(err, &de) || de.Timeout() {
		t.Fatalf("got %v, want a non-timeout *DialError", err)
	}
	if errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, fasthttp.ErrTimeout) {
		t.Fatalf("refused looks like a timeout: %v", err)
	}
}

func TestDialTimeout(t *testing.T) {
	ln := listen(t)
	addr := ln.Addr().String()
	tr := NewTransport(Config{ConnectTimeout: time.Nanosecond})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "POST", "{}"), fasthttp.AcquireResponse()
	err := tr.Do(hc, req, resp, time.Second, nil)
	if !errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, fasthttp.ErrTimeout) {
		t.Fatalf("got %v, want ErrDialTimeout and not ErrTimeout", err)
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("got %v, want a dial *net.OpError inside", err)
	}
}

func TestClosedBeforeResponse(t *testing.T) {
	s := startHang(t, func(c net.Conn) {}) // read the request, close
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "POST", "{}"), fasthttp.AcquireResponse()
	if err := tr.Do(hc, req, resp, 5*time.Second, nil); !errors.Is(err, fasthttp.ErrConnectionClosed) {
		t.Fatalf("got %v, want ErrConnectionClosed", err)
	}
}

func TestStreamedDelegated(t *testing.T) {
	ln := startServer(t, func(ctx *fasthttp.RequestCtx) {
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for i := range 3 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				w.Flush()
			}
		})
	})
	addr := ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "POST", "{}"), fasthttp.AcquireResponse()
	resp.StreamBody = true
	if err := hc.DoTimeout(req, resp, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.BodyStream())
	if err != nil {
		t.Fatal(err)
	}
	resp.CloseBodyStream()
	if want := "data: 0\n\ndata: 1\n\ndata: 2\n\n"; string(body) != want {
		t.Fatalf("body %q", body)
	}
	if tr.IdleConns(addr, false) != 0 || hc.ConnsCount() != 1 {
		t.Fatalf("not delegated: transport idle %d, hc conns %d", tr.IdleConns(addr, false), hc.ConnsCount())
	}
}

func TestBodyTooLarge(t *testing.T) {
	big := make([]byte, 1<<20)
	ln := startServer(t, func(ctx *fasthttp.RequestCtx) { ctx.SetBody(big) })
	addr := ln.Addr().String()
	tr := NewTransport(Config{MaxResponseBodySize: 64 << 10})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "GET", ""), fasthttp.AcquireResponse()
	var dials atomic.Int32
	tr.cfg.Dial = countingDial(&dials)
	if err := tr.Do(hc, req, resp, 5*time.Second, nil); !errors.Is(err, fasthttp.ErrBodyTooLarge) {
		t.Fatalf("got %v, want ErrBodyTooLarge", err)
	}
	if dials.Load() != 1 || tr.IdleConns(addr, false) != 0 {
		t.Fatalf("dials %d (want 1: no retry), idle %d", dials.Load(), tr.IdleConns(addr, false))
	}
}

func TestIdleExpiry(t *testing.T) {
	ln := startServer(t, echoHandler)
	addr := ln.Addr().String()
	tr := NewTransport(Config{MaxIdleConnDuration: 20 * time.Millisecond})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "POST", "x"), fasthttp.AcquireResponse()
	if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ln.closed: // the server saw the idle conn closed
	case <-time.After(5 * time.Second):
		t.Fatal("idle conn not closed")
	}
	if n := tr.IdleConns(addr, false); n != 0 {
		t.Fatalf("idle %d", n)
	}
	if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if ln.accepted.Load() != 2 {
		t.Fatalf("accepted %d", ln.accepted.Load())
	}
}

func TestMaxIdleConnsPerHost(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 8)
	ln := startServer(t, func(ctx *fasthttp.RequestCtx) {
		arrived <- struct{}{}
		<-release
		echoHandler(ctx)
	})
	addr := ln.Addr().String()
	tr := NewTransport(Config{MaxIdleConnsPerHost: 2})
	hc := newHC(addr, tr)
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := newReq(addr, "POST", "x"), fasthttp.AcquireResponse()
			if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil {
				t.Error(err)
			}
		}()
	}
	for range 5 {
		<-arrived
	}
	close(release)
	wg.Wait()
	if n := tr.IdleConns(addr, false); n != 2 {
		t.Fatalf("idle %d, want 2", n)
	}
}

func TestWrongTransport(t *testing.T) {
	tr := NewTransport(Config{})
	hc := newHC("127.0.0.1:1", nil)
	req, resp := newReq(hc.Addr, "POST", "{}"), fasthttp.AcquireResponse()
	if err := tr.Do(hc, req, resp, time.Second, nil); !errors.Is(err, ErrWrongTransport) {
		t.Fatalf("got %v", err)
	}
}

// Many concurrent exchanges, a share of them cancelled mid-flight: every
// response belongs to its own request, every cancelled one returns
// ErrCanceled (or completes if the cancel came too late).
func TestConcurrent(t *testing.T) {
	var arrived sync.Map // request id -> chan struct{}, closed when the slow request reached the server
	stopSlow := make(chan struct{})
	ln := startServer(t, func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/slow" {
			if ch, ok := arrived.Load(string(ctx.Request.Body())); ok {
				close(ch.(chan struct{}))
			}
			<-stopSlow // a worker generating for minutes
			return
		}
		echoHandler(ctx)
	})
	t.Cleanup(func() { close(stopSlow) }) // runs before the server's Shutdown
	addr := ln.Addr().String()
	tr := NewTransport(Config{MaxIdleConnsPerHost: 16})
	hc := &fasthttp.HostClient{Addr: addr, Transport: tr, MaxConns: 1 << 20}
	const workers, perWorker = 64, 40
	var wg sync.WaitGroup
	var canceled, ok atomic.Int32
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				id := fmt.Sprintf("%d-%d", w, i)
				req, resp := newReq(addr, "POST", id), fasthttp.AcquireResponse()
				if i%5 == 4 { // a slow one, cancelled once the server has it
					req.SetRequestURI("http://" + addr + "/slow")
					ch := make(chan struct{})
					arrived.Store(id, ch)
					cancel := make(chan struct{})
					errc := make(chan error, 1)
					go func() { errc <- tr.Do(hc, req, resp, 10*time.Second, cancel) }()
					<-ch
					close(cancel)
					if err := <-errc; !errors.Is(err, ErrCanceled) {
						t.Errorf("%s: %v", id, err)
					}
					canceled.Add(1)
				} else {
					if err := tr.Do(hc, req, resp, 10*time.Second, make(chan struct{})); err != nil {
						t.Errorf("%s: %v", id, err)
					} else if string(resp.Body()) != "echo:"+id {
						t.Errorf("%s: got %q", id, resp.Body())
					}
					ok.Add(1)
				}
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d ok, %d canceled, %d conns accepted, %d idle", ok.Load(), canceled.Load(), ln.accepted.Load(), tr.IdleConns(addr, false))
	tr.CloseIdleConnections()
	if tr.IdleConns(addr, false) != 0 {
		t.Fatal("CloseIdleConnections left conns")
	}
}

// hc.DialTimeout (what the router's HostClients set) is used, with the
// connect timeout bounded by the request's remaining time.
func TestHostClientDialTimeoutUsed(t *testing.T) {
	ln := startServer(t, echoHandler)
	addr := ln.Addr().String()
	tr := NewTransport(Config{ConnectTimeout: 2 * time.Second})
	var got []time.Duration
	hc := newHC(addr, tr)
	hc.DialTimeout = func(a string, d time.Duration) (net.Conn, error) {
		got = append(got, d)
		return fasthttp.DialTimeout(a, d)
	}
	req, resp := newReq(addr, "POST", "x"), fasthttp.AcquireResponse()
	if err := tr.Do(hc, req, resp, time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] > time.Second || got[0] <= 0 {
		t.Fatalf("DialTimeout calls: %v", got)
	}
}
