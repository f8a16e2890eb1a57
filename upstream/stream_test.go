package upstream

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// handServer writes its answers by hand, so a test controls their bytes and
// their timing. answer is called for each request read on a connection
// (n counts them from 0 per connection) and returns whether to read another
// request on it; the connection is closed once it returns false.
type handServer struct {
	ln       net.Listener
	accepted atomic.Int32
	gotReq   chan struct{}
	after    chan error    // what awaitClose saw: io.EOF when the client closed
	connDone chan struct{} // one send per connection the server closed
}

func startRaw(t testing.TB, answer func(c net.Conn, n int) bool) *handServer {
	return startRawWrap(t, answer, nil)
}

func startRawWrap(t testing.TB, answer func(c net.Conn, n int) bool, wrap func(net.Conn) net.Conn) *handServer {
	t.Helper()
	s := &handServer{ln: listen(t), gotReq: make(chan struct{}, 64), after: make(chan error, 64), connDone: make(chan struct{}, 64)}
	go func() {
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			if wrap != nil {
				c = wrap(c)
			}
			go func() {
				defer func() {
					c.Close()
					s.connDone <- struct{}{}
				}()
				br := bufio.NewReader(c)
				var req fasthttp.Request
				for n := 0; ; n++ {
					if err := req.Read(br); err != nil {
						return
					}
					s.gotReq <- struct{}{}
					if !answer(c, n) {
						return
					}
				}
			}()
		}
	}()
	return s
}

// awaitClose reads c until the client closes it (or 10 s pass) and reports
// the read's result on s.after.
func (s *handServer) awaitClose(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	s.after <- err
}

// wantClosed waits for awaitClose to report the client's close.
func (s *handServer) wantClosed(t *testing.T) {
	t.Helper()
	select {
	case err := <-s.after:
		if err != io.EOF {
			t.Fatalf("server read: %v, want EOF (the client closed the connection)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not see the connection closed")
	}
}

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

func chunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

func event(i int) string { return fmt.Sprintf("data: %d\n\n", i) }

func write(c net.Conn, s string) bool {
	_, err := io.WriteString(c, s)
	return err == nil
}

// steady writes the SSE head, then n events (forever if n < 0) every gap,
// and ends the body when n >= 0.
func steady(c net.Conn, n int, gap time.Duration) bool {
	if !write(c, sseHead) {
		return false
	}
	for i := 0; n < 0 || i < n; i++ {
		if i > 0 {
			time.Sleep(gap) // the scenario: a worker decoding at that pace
		}
		if !write(c, chunk(event(i))) {
			return false
		}
	}
	return write(c, "0\r\n\r\n")
}

func events(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(event(i))
	}
	return b.String()
}

func streamReq(addr string) *fasthttp.Request {
	return newReq(addr, "POST", `{"stream":true}`)
}

func TestStreamChunkedReuse(t *testing.T) {
	s := startRaw(t, func(c net.Conn, _ int) bool { return steady(c, 3, 0) })
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	for i := range 3 {
		req, resp := streamReq(addr), fasthttp.AcquireResponse()
		b, err := tr.Stream(hc, req, resp, StreamLimits{Timeout: 5 * time.Second}, new(Canceler))
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != 200 || string(resp.Header.ContentType()) != "text/event-stream" {
			t.Fatalf("headers: %d %q", resp.StatusCode(), resp.Header.ContentType())
		}
		got, err := io.ReadAll(b)
		if err != nil || string(got) != events(3) {
			t.Fatalf("%d: body %q, %v", i, got, err)
		}
		if n, err := b.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("read after the end: %d %v", n, err)
		}
		b.Close()
		if n := tr.IdleConns(addr, false); n != 1 {
			t.Fatalf("idle %d after a clean stream, want 1", n)
		}
		if resp.StreamBody {
			t.Fatal("Stream left resp.StreamBody set")
		}
	}
	if n := s.accepted.Load(); n != 1 {
		t.Fatalf("accepted %d connections, want 1", n)
	}
	if n := hc.ConnsCount(); n != 0 {
		t.Fatalf("HostClient pool used: %d conns", n)
	}
	// A buffered exchange takes the connection a stream left.
	s2 := startRaw(t, func(c net.Conn, n int) bool {
		if n == 0 {
			return steady(c, 2, 0)
		}
		return write(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	})
	addr2 := s2.ln.Addr().String()
	hc2 := newHC(addr2, tr)
	resp := fasthttp.AcquireResponse()
	b, err := tr.Stream(hc2, streamReq(addr2), resp, StreamLimits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, b); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := tr.Do(hc2, newReq(addr2, "POST", "x"), resp, 5*time.Second, nil); err != nil || string(resp.Body()) != "ok" {
		t.Fatalf("buffered after a stream: %v %q", err, resp.Body())
	}
	if n := s2.accepted.Load(); n != 1 {
		t.Fatalf("accepted %d connections, want 1", n)
	}
}

func TestStreamContentLength(t *testing.T) {
	body := strings.Repeat("x", 10000) // beyond the read buffer
	s := startRaw(t, func(c net.Conn, _ int) bool {
		return write(c, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	})
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	for range 2 {
		resp := fasthttp.AcquireResponse()
		b, err := tr.Stream(hc, streamReq(addr), resp, StreamLimits{Timeout: 5 * time.Second, Stall: time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(b)
		if err != nil || string(got) != body {
			t.Fatalf("body of %d bytes, %v", len(got), err)
		}
		b.Close()
	}
	if s.accepted.Load() != 1 || tr.IdleConns(addr, false) != 1 {
		t.Fatalf("accepted %d idle %d, want the one connection reused", s.accepted.Load(), tr.IdleConns(addr, false))
	}
}

// Responses without a body read io.EOF at once; their connection is reused.
func TestStreamNoBody(t *testing.T) {
	answers := []string{
		"HTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", // to a HEAD
	}
	s := startRaw(t, func(c net.Conn, n int) bool { return write(c, answers[n]) })
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	for i := range answers {
		req := streamReq(addr)
		if i == 3 {
			req = newReq(addr, "HEAD", "")
		}
		resp := fasthttp.AcquireResponse()
		b, err := tr.Stream(hc, req, resp, StreamLimits{Timeout: 5 * time.Second, Stall: time.Second}, nil)
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		if n, err := b.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("%d: read %d %v, want EOF", i, n, err)
		}
		b.Close()
		if tr.IdleConns(addr, false) != 1 {
			t.Fatalf("%d: not pooled", i)
		}
	}
	if s.accepted.Load() != 1 {
		t.Fatalf("accepted %d", s.accepted.Load())
	}
}

// The first-byte bound covers the wait for the headers, not the body.
func TestStreamFirstByte(t *testing.T) {
	t.Run("headers never come", func(t *testing.T) {
		var s *handServer
		s = startRaw(t, func(c net.Conn, _ int) bool { s.awaitClose(c); return false })
		addr := s.ln.Addr().String()
		tr := NewTransport(Config{})
		hc := newHC(addr, tr)
		start := time.Now()
		_, err := tr.Stream(hc, streamReq(addr), fasthttp.AcquireResponse(),
			StreamLimits{Timeout: 30 * time.Second, FirstByte: 200 * time.Millisecond, Stall: 50 * time.Millisecond}, new(Canceler))
		if !errors.Is(err, ErrFirstByte) {
			t.Fatalf("got %v, want ErrFirstByte", err)
		}
		if d := time.Since(start); d < 200*time.Millisecond || d > 5*time.Second {
			t.Fatalf("returned after %v", d)
		}
		s.wantClosed(t)
		if s.accepted.Load() != 1 || tr.IdleConns(addr, false) != 0 {
			t.Fatalf("accepted %d (want 1: not resent), idle %d", s.accepted.Load(), tr.IdleConns(addr, false))
		}
	})
	t.Run("Timeout first", func(t *testing.T) {
		var s *handServer
		s = startRaw(t, func(c net.Conn, _ int) bool { s.awaitClose(c); return false })
		addr := s.ln.Addr().String()
		tr := NewTransport(Config{})
		_, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(),
			StreamLimits{Timeout: 100 * time.Millisecond, FirstByte: 10 * time.Second}, nil)
		if !errors.Is(err, fasthttp.ErrTimeout) {
			t.Fatalf("got %v, want fasthttp.ErrTimeout", err)
		}
	})
	t.Run("slow but steady body", func(t *testing.T) {
		s := startRaw(t, func(c net.Conn, _ int) bool { return steady(c, 10, 50*time.Millisecond) })
		addr := s.ln.Addr().String()
		tr := NewTransport(Config{})
		resp := fasthttp.AcquireResponse()
		start := time.Now()
		b, err := tr.Stream(newHC(addr, tr), streamReq(addr), resp, StreamLimits{Timeout: 30 * time.Second, FirstByte: 150 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(b)
		if err != nil || string(got) != events(10) {
			t.Fatalf("body %q, %v (after %v)", got, err, time.Since(start))
		}
		b.Close()
		if tr.IdleConns(addr, false) != 1 {
			t.Fatal("not pooled")
		}
	})
}

func TestStreamStall(t *testing.T) {
	t.Run("stops mid-body", func(t *testing.T) {
		var s *handServer
		s = startRaw(t, func(c net.Conn, _ int) bool {
			if write(c, sseHead+chunk(event(0))+chunk(event(1))) {
				s.awaitClose(c)
			}
			return false
		})
		addr := s.ln.Addr().String()
		tr := NewTransport(Config{})
		// FirstByte later than the stall bound: the headers' deadline must
		// not hold the body's back.
		b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(),
			StreamLimits{Timeout: 30 * time.Second, FirstByte: 20 * time.Second, Stall: 200 * time.Millisecond}, new(Canceler))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		got, err := io.ReadAll(b)
		if !errors.Is(err, ErrStalled) || string(got) != events(2) {
			t.Fatalf("body %q, %v, want the two events and ErrStalled", got, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("stall noticed after %v", d)
		}
		if _, err := b.Read(make([]byte, 8)); !errors.Is(err, ErrStalled) {
			t.Fatalf("next read: %v, want ErrStalled again", err)
		}
		b.Close()
		s.wantClosed(t)
		if tr.IdleConns(addr, false) != 0 {
			t.Fatal("stalled connection pooled")
		}
	})
	t.Run("steady body longer than the bound", func(t *testing.T) {
		s := startRaw(t, func(c net.Conn, _ int) bool { return steady(c, 20, 40*time.Millisecond) })
		addr := s.ln.Addr().String()
		tr := NewTransport(Config{})
		b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(),
			StreamLimits{Timeout: 30 * time.Second, FirstByte: 10 * time.Second, Stall: 300 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(b)
		if err != nil || string(got) != events(20) {
			t.Fatalf("body %q, %v", got, err)
		}
		b.Close()
		if tr.IdleConns(addr, false) != 1 {
			t.Fatal("not pooled")
		}
	})
}

// The overall bound ends a body that keeps coming.
func TestStreamTimeoutMidBody(t *testing.T) {
	s := startRaw(t, func(c net.Conn, _ int) bool { steady(c, -1, 20*time.Millisecond); return false })
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	start := time.Now()
	b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(),
		StreamLimits{Timeout: 400 * time.Millisecond, FirstByte: 300 * time.Millisecond, Stall: 200 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, b)
	if !errors.Is(err, fasthttp.ErrTimeout) {
		t.Fatalf("got %v, want fasthttp.ErrTimeout", err)
	}
	if d := time.Since(start); d < 400*time.Millisecond || d > 5*time.Second {
		t.Fatalf("ended after %v", d)
	}
	b.Close()
	if tr.IdleConns(addr, false) != 0 {
		t.Fatal("timed-out connection pooled")
	}
}

func TestStreamCancel(t *testing.T) {
	t.Run("header wait", func(t *testing.T) {
		var s *handServer
		s = startRaw(t, func(c net.Conn, _ int) bool { s.awaitClose(c); return false })
		addr := s.ln.Addr().String()
		var dials atomic.Int32
		tr := NewTransport(Config{Dial: countingDial(&dials)})
		hc := newHC(addr, tr)
		hc.RetryIfErr = func(*fasthttp.Request, int, error) (bool, bool) { return false, true }
		c := new(Canceler)
		errc := make(chan error, 1)
		go func() {
			_, err := tr.Stream(hc, streamReq(addr), fasthttp.AcquireResponse(), StreamLimits{Timeout: 30 * time.Second}, c)
			errc <- err
		}()
		<-s.gotReq
		c.Cancel()
		select {
		case err := <-errc:
			if !errors.Is(err, ErrCanceled) {
				t.Fatalf("got %v, want ErrCanceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Stream did not return after the cancel")
		}
		s.wantClosed(t)
		if dials.Load() != 1 || tr.IdleConns(addr, false) != 0 {
			t.Fatalf("dials %d (want 1: not resent), idle %d", dials.Load(), tr.IdleConns(addr, false))
		}
	})
	t.Run("blocked body read", func(t *testing.T) {
		var s *handServer
		s = startRaw(t, func(c net.Conn, _ int) bool {
			if write(c, sseHead+chunk(event(0))) {
				s.awaitClose(c)
			}
			return false
		})
		addr := s.ln.Addr().String()
		tr := NewTransport(Config{})
		c := new(Canceler)
		b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(), StreamLimits{Timeout: 30 * time.Second, Stall: 20 * time.Second}, c)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		n, err := b.Read(buf)
		if err != nil || string(buf[:n]) != event(0) {
			t.Fatalf("first read %q %v", buf[:n], err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := b.Read(buf) // blocks: the server sends nothing more
			errc <- err
		}()
		c.Cancel() // before or during that Read: both must end it
		select {
		case err := <-errc:
			if !errors.Is(err, ErrCanceled) {
				t.Fatalf("got %v, want ErrCanceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Read did not return after the cancel")
		}
		s.wantClosed(t) // before Close: the cancel itself closed the connection
		b.Close()
		if tr.IdleConns(addr, false) != 0 {
			t.Fatal("cancelled connection pooled")
		}
	})
	t.Run("before start", func(t *testing.T) {
		var dials atomic.Int32
		tr := NewTransport(Config{Dial: countingDial(&dials)})
		c := new(Canceler)
		c.Cancel()
		hc := newHC("127.0.0.1:1", tr)
		if _, err := tr.Stream(hc, streamReq(hc.Addr), fasthttp.AcquireResponse(), StreamLimits{}, c); !errors.Is(err, ErrCanceled) {
			t.Fatalf("got %v", err)
		}
		if dials.Load() != 0 {
			t.Fatal("dialed")
		}
	})
	t.Run("after the end", func(t *testing.T) {
		s := startRaw(t, func(c net.Conn, _ int) bool { return steady(c, 2, 0) })
		addr := s.ln.Addr().String()
		tr := NewTransport(Config{})
		hc := newHC(addr, tr)
		c := new(Canceler)
		b, err := tr.Stream(hc, streamReq(addr), fasthttp.AcquireResponse(), StreamLimits{}, c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, b); err != nil {
			t.Fatal(err)
		}
		b.Close()
		c.Cancel() // unbound at Close: the pooled connection is not touched
		b, err = tr.Stream(hc, streamReq(addr), fasthttp.AcquireResponse(), StreamLimits{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, b); err != nil {
			t.Fatal(err)
		}
		b.Close()
		if s.accepted.Load() != 1 {
			t.Fatalf("accepted %d, want the connection reused", s.accepted.Load())
		}
	})
}

// The upstream closing before the body's end is an unexpected EOF, and the
// connection is not kept.
func TestStreamClosedMidBody(t *testing.T) {
	for name, answer := range map[string]string{
		"chunked":        sseHead + chunk(event(0)),
		"content-length": "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + event(0),
	} {
		t.Run(name, func(t *testing.T) {
			s := startRaw(t, func(c net.Conn, _ int) bool { write(c, answer); return false })
			addr := s.ln.Addr().String()
			tr := NewTransport(Config{})
			b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(), StreamLimits{Timeout: 5 * time.Second}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(b)
			if !errors.Is(err, io.ErrUnexpectedEOF) || string(got) != event(0) {
				t.Fatalf("body %q, %v, want the event and io.ErrUnexpectedEOF", got, err)
			}
			b.Close()
			if tr.IdleConns(addr, false) != 0 {
				t.Fatal("closed connection pooled")
			}
		})
	}
	t.Run("until close", func(t *testing.T) { // no length, no chunks: the body ends at the close
		s := startRaw(t, func(c net.Conn, _ int) bool { write(c, "HTTP/1.1 200 OK\r\n\r\n"+event(0)); return false })
		addr := s.ln.Addr().String()
		tr := NewTransport(Config{})
		b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(), StreamLimits{Timeout: 5 * time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := io.ReadAll(b); err != nil || string(got) != event(0) {
			t.Fatalf("body %q, %v", got, err)
		}
		b.Close()
		if tr.IdleConns(addr, false) != 0 {
			t.Fatal("connection the upstream closed pooled")
		}
	})
}

// A body closed before its end closes the connection (the upstream aborts).
func TestStreamClosedEarly(t *testing.T) {
	s := startRaw(t, func(c net.Conn, _ int) bool { steady(c, -1, 10*time.Millisecond); return false })
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(), StreamLimits{Timeout: 30 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := b.Read(buf); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if tr.IdleConns(addr, false) != 0 {
		t.Fatal("unfinished stream's connection pooled")
	}
	select {
	case <-s.connDone: // its writes failed: the client closed
	case <-time.After(5 * time.Second):
		t.Fatal("the server did not see the connection closed")
	}
}

// Connection: close from the upstream: the body is read, the connection not kept.
func TestStreamConnectionClose(t *testing.T) {
	s := startRaw(t, func(c net.Conn, _ int) bool {
		write(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"+chunk(event(0))+"0\r\n\r\n")
		return true
	})
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(), StreamLimits{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(b); err != nil || string(got) != event(0) {
		t.Fatalf("body %q, %v", got, err)
	}
	b.Close()
	if tr.IdleConns(addr, false) != 0 {
		t.Fatal("Connection: close pooled")
	}
}

// A kept-alive connection the upstream closed while idle is retried once on a
// new one when the policy allows, before any response byte; never after one.
func TestStreamStaleRetry(t *testing.T) {
	for _, c := range []struct {
		name   string
		method string
		keep   bool   // the first connection stays open after the first answer
		second string // its answer to the second request, when kept
		later  bool   // later connections answer (else they close at once)
		setup  func(hc *fasthttp.HostClient)
		ok     bool
		dials  int32 // new connections for the second request
	}{
		{name: "GET", method: "GET", later: true, ok: true, dials: 1},
		{name: "POST with RetryIfErr", method: "POST", later: true, ok: true, dials: 1, setup: func(hc *fasthttp.HostClient) {
			hc.RetryIfErr = func(_ *fasthttp.Request, n int, err error) (bool, bool) {
				return false, n < 2 && errors.Is(err, fasthttp.ErrConnectionClosed)
			}
		}},
		{name: "POST", method: "POST", later: true, dials: 0},
		{name: "after a byte", method: "GET", keep: true, second: "HTTP/1.1 2", later: true, dials: 0},
		{name: "one retry at most", method: "GET", dials: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var conns atomic.Int32
			s := startRaw(t, func(conn net.Conn, n int) bool {
				switch {
				case n == 0 && conns.Add(1) == 1:
					return steady(conn, 1, 0) && c.keep
				case n == 0 && c.later:
					return steady(conn, 2, 0)
				case n == 0:
					return false
				}
				write(conn, c.second)
				return false
			})
			addr := s.ln.Addr().String()
			var dials atomic.Int32
			tr := NewTransport(Config{Dial: countingDial(&dials)})
			hc := newHC(addr, tr)
			if c.setup != nil {
				c.setup(hc)
			}
			req := newReq(addr, c.method, "")
			b, err := tr.Stream(hc, req, fasthttp.AcquireResponse(), StreamLimits{Timeout: 5 * time.Second}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, b); err != nil {
				t.Fatal(err)
			}
			b.Close()
			if tr.IdleConns(addr, false) != 1 {
				t.Fatal("not pooled")
			}
			if !c.keep {
				<-s.connDone // the pooled connection is stale
			}
			dials.Store(0)
			b, err = tr.Stream(hc, req, fasthttp.AcquireResponse(), StreamLimits{Timeout: 5 * time.Second}, nil)
			switch {
			case c.ok && err != nil:
				t.Fatal(err)
			case c.ok:
				if got, err := io.ReadAll(b); err != nil || string(got) != events(2) {
					t.Fatalf("body %q, %v", got, err)
				}
				b.Close()
			case err == nil:
				b.Close()
				t.Fatal("no error")
			}
			if got := dials.Load(); got != c.dials {
				t.Fatalf("%d new connections, want %d (err %v)", got, c.dials, err)
			}
		})
	}
}

// https upstreams: a stream with its deadline moved lazily under TLS, the
// connection reused, and a cancel during a blocked body read.
func TestStreamTLS(t *testing.T) {
	cert, key, err := fasthttp.GenerateTestCertificate("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	tlsCert, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	var s *handServer
	s = startRawWrap(t, func(c net.Conn, n int) bool {
		if n < 2 {
			return steady(c, 8, 40*time.Millisecond)
		}
		if write(c, sseHead+chunk(event(0))) {
			s.awaitClose(c)
		}
		return false
	}, func(c net.Conn) net.Conn {
		return tls.Server(c, &tls.Config{Certificates: []tls.Certificate{tlsCert}})
	})
	addr := s.ln.Addr().String()
	tr := NewTransport(Config{})
	hc := &fasthttp.HostClient{Addr: addr, IsTLS: true, Transport: tr,
		TLSConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // test certificate
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("https://" + addr + "/v1/chat/completions")
	req.Header.SetMethod("POST")
	lim := StreamLimits{Timeout: 30 * time.Second, FirstByte: 10 * time.Second, Stall: 100 * time.Millisecond}
	for range 2 {
		b, err := tr.Stream(hc, req, fasthttp.AcquireResponse(), lim, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := io.ReadAll(b); err != nil || string(got) != events(8) {
			t.Fatalf("body %q, %v", got, err)
		}
		b.Close()
	}
	if s.accepted.Load() != 1 || tr.IdleConns(addr, true) != 1 {
		t.Fatalf("accepted %d idle %d", s.accepted.Load(), tr.IdleConns(addr, true))
	}
	c := new(Canceler)
	lim.Stall = 20 * time.Second
	b, err := tr.Stream(hc, req, fasthttp.AcquireResponse(), lim, c)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := b.Read(buf); err != nil || string(buf[:n]) != event(0) {
		t.Fatalf("first read %q %v", buf[:n], err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := b.Read(buf)
		errc <- err
	}()
	c.Cancel()
	if err := <-errc; !errors.Is(err, ErrCanceled) {
		t.Fatalf("got %v, want ErrCanceled", err)
	}
	b.Close()
	select {
	case err := <-s.after:
		var ne net.Error
		if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("server read after cancel: %v, want the connection closed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server did not see the TLS connection close")
	}
}

func TestStreamRefused(t *testing.T) {
	tr := NewTransport(Config{})
	req, resp := streamReq("127.0.0.1:1"), fasthttp.AcquireResponse()
	if _, err := tr.Stream(newHC("127.0.0.1:1", nil), req, resp, StreamLimits{}, nil); !errors.Is(err, ErrWrongTransport) {
		t.Fatalf("another transport: %v", err)
	}
	if _, err := tr.Stream(newHC("127.0.0.1:1,127.0.0.1:2", tr), req, resp, StreamLimits{}, nil); err == nil {
		t.Fatal("several addresses: no error")
	}
	if _, err := tr.Stream(&fasthttp.HostClient{Addr: "127.0.0.1:1", IsTLS: true, Transport: tr}, req, resp, StreamLimits{}, nil); !errors.Is(err, fasthttp.ErrHostClientRedirectToDifferentScheme) {
		t.Fatalf("http request to an https client: %v", err)
	}
	ln := listen(t)
	addr := ln.Addr().String()
	ln.Close()
	_, err := tr.Stream(newHC(addr, tr), streamReq(addr), resp, StreamLimits{}, nil)
	var de *DialError
	if !errors.As(err, &de) {
		t.Fatalf("refused: %v, want a *DialError", err)
	}
}

// deadlineConn counts the read deadlines set on it.
type deadlineConn struct {
	net.Conn
	moves *atomic.Int32
}

func (c deadlineConn) SetReadDeadline(t time.Time) error {
	c.moves.Add(1)
	return c.Conn.SetReadDeadline(t)
}

func (c deadlineConn) SetDeadline(t time.Time) error {
	c.moves.Add(1)
	return c.Conn.SetDeadline(t)
}

// The stall bound moves the read deadline about once per bound, not once
// per chunk (docs/design.md §7).
func TestStreamStallArmedLazily(t *testing.T) {
	const chunks = 100
	s := startRaw(t, func(c net.Conn, _ int) bool { return steady(c, chunks, 5*time.Millisecond) })
	addr := s.ln.Addr().String()
	var moves atomic.Int32
	tr := NewTransport(Config{Dial: func(a string) (net.Conn, error) {
		c, err := net.Dial("tcp", a)
		return deadlineConn{c, &moves}, err
	}})
	b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(),
		StreamLimits{Timeout: 30 * time.Second, FirstByte: 10 * time.Second, Stall: 200 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if got, err := io.ReadAll(b); err != nil || string(got) != events(chunks) {
		t.Fatalf("body %q, %v", got, err)
	}
	took := time.Since(start)
	b.Close()
	// One for the request, one when the headers came, then one per
	// firing of the stall timer.
	if most := 2 + int32(took/(200*time.Millisecond)) + 1; moves.Load() > most {
		t.Fatalf("%d deadline moves for %d chunks in %v, want at most %d", moves.Load(), chunks, took, most)
	}
	t.Logf("%d deadline moves for %d chunks in %v", moves.Load(), chunks, took)
}
