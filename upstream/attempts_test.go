package upstream

import (
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestRetryPolicy: DoCanceler retries a failed exchange as hc.Do would — a
// worker that reads each request and closes the connection without an
// answer gets as many connections as the policy allows.
func TestRetryPolicy(t *testing.T) {
	s := startHang(t, func(net.Conn) {}) // read the request, close
	addr := s.ln.Addr().String()
	var sawUpstream atomic.Value
	for _, c := range []struct {
		name   string
		method string
		setup  func(hc *fasthttp.HostClient)
		dials  int32
	}{
		{"GET is idempotent", "GET", nil, fasthttp.DefaultMaxIdemponentCallAttempts},
		{"GET, two attempts at most", "GET", func(hc *fasthttp.HostClient) { hc.MaxIdemponentCallAttempts = 2 }, 2},
		{"POST is not retried", "POST", nil, 1},
		{"POST with RetryIfErr", "POST", func(hc *fasthttp.HostClient) {
			hc.RetryIfErr = func(_ *fasthttp.Request, attempts int, err error) (bool, bool) {
				return false, attempts < 2 && errors.Is(err, fasthttp.ErrConnectionClosed)
			}
		}, 2},
		{"POST with RetryIfErrUpstream", "POST", func(hc *fasthttp.HostClient) {
			hc.RetryIfErr = func(*fasthttp.Request, int, error) (bool, bool) { return false, false } // not asked
			hc.RetryIfErrUpstream = func(_ *fasthttp.Request, attempts int, _ error, upstream string) (bool, bool) {
				sawUpstream.Store(upstream)
				return false, attempts < 3
			}
		}, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			var dials atomic.Int32
			tr := NewTransport(Config{Dial: countingDial(&dials)})
			hc := newHC(addr, tr)
			if c.setup != nil {
				c.setup(hc)
			}
			req, resp := newReq(addr, c.method, "{}"), fasthttp.AcquireResponse()
			err := tr.DoCanceler(hc, req, resp, 5*time.Second, new(Canceler))
			if !errors.Is(err, fasthttp.ErrConnectionClosed) {
				t.Fatalf("got %v, want ErrConnectionClosed", err)
			}
			if got := dials.Load(); got != c.dials {
				t.Fatalf("%d connections, want %d", got, c.dials)
			}
		})
	}
	if got, _ := sawUpstream.Load().(string); got != addr {
		t.Fatalf("RetryIfErrUpstream saw upstream %q, want %q", got, addr)
	}
}

// TestRequestDefaults: the User-Agent a request without one gets, the
// scheme check, and the response's no-default Content-Type, as hc.Do.
func TestRequestDefaults(t *testing.T) {
	ln := startServer(t, func(ctx *fasthttp.RequestCtx) {
		ctx.Response.Header.SetNoDefaultContentType(true)
		ctx.SetBody(ctx.Request.Header.UserAgent())
	})
	addr := ln.Addr().String()
	for _, c := range []struct {
		name, own, want string
		setup           func(hc *fasthttp.HostClient)
	}{
		{"the client's name", "", "warmroute", func(hc *fasthttp.HostClient) { hc.Name = "warmroute" }},
		{"fasthttp's default", "", defaultUserAgent, nil},
		{"none", "", "", func(hc *fasthttp.HostClient) { hc.NoDefaultUserAgentHeader = true }},
		{"the request's own", "agent/1", "agent/1", func(hc *fasthttp.HostClient) { hc.Name = "warmroute" }},
	} {
		tr := NewTransport(Config{})
		hc := newHC(addr, tr)
		if c.setup != nil {
			c.setup(hc)
		}
		req, resp := newReq(addr, "POST", "{}"), fasthttp.AcquireResponse()
		if c.own != "" {
			req.Header.SetUserAgent(c.own)
		}
		resp.Header.SetNoDefaultContentType(true)
		if err := tr.DoCanceler(hc, req, resp, 5*time.Second, nil); err != nil {
			t.Fatal(err)
		}
		if string(resp.Body()) != c.want {
			t.Errorf("%s: the worker saw User-Agent %q, want %q", c.name, resp.Body(), c.want)
		}
		if ct := resp.Header.ContentType(); len(ct) != 0 {
			t.Errorf("%s: Content-Type %q on an answer without one", c.name, ct)
		}
	}
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	req.SetRequestURI("https://" + addr + "/")
	if err := tr.DoCanceler(hc, req, resp, time.Second, nil); !errors.Is(err, fasthttp.ErrHostClientRedirectToDifferentScheme) {
		t.Fatalf("an https request on a plain client: %v", err)
	}
}

// TestRetryAfterTheDeadline: time spent between attempts counts. When the
// deadline has passed by the time the policy allows another attempt, none
// starts (ErrTimeout, one connection); when the policy resets the timeout,
// the next attempt gets a fresh one. The retry hook stands in for the time
// that passes, so nothing here waits on a race.
func TestRetryAfterTheDeadline(t *testing.T) {
	s := startHang(t, func(net.Conn) {}) // read the request, close
	addr := s.ln.Addr().String()
	for _, c := range []struct {
		name  string
		reset bool
		want  error
		dials int32
	}{
		{"deadline passed", false, fasthttp.ErrTimeout, 1},
		{"timeout reset", true, fasthttp.ErrConnectionClosed, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			var dials atomic.Int32
			tr := NewTransport(Config{Dial: countingDial(&dials)})
			hc := newHC(addr, tr)
			hc.RetryIfErr = func(_ *fasthttp.Request, attempts int, _ error) (bool, bool) {
				time.Sleep(60 * time.Millisecond) // past the 50 ms deadline
				return c.reset, attempts < 2
			}
			req, resp := newReq(addr, "POST", "{}"), fasthttp.AcquireResponse()
			err := tr.DoCanceler(hc, req, resp, 50*time.Millisecond, nil)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if got := dials.Load(); got != c.dials {
				t.Fatalf("%d connections, want %d", got, c.dials)
			}
		})
	}
}

// TestBodyStreamNotRetried: a request whose body is a stream is never sent
// twice (the stream is spent), whatever the policy says.
func TestBodyStreamNotRetried(t *testing.T) {
	s := startHang(t, func(net.Conn) {})
	addr := s.ln.Addr().String()
	var dials atomic.Int32
	tr := NewTransport(Config{Dial: countingDial(&dials)})
	hc := newHC(addr, tr)
	req, resp := newReq(addr, "PUT", ""), fasthttp.AcquireResponse() // idempotent
	req.SetBodyStream(strings.NewReader("{}"), 2)
	if err := tr.DoCanceler(hc, req, resp, 5*time.Second, nil); !errors.Is(err, fasthttp.ErrConnectionClosed) {
		t.Fatalf("got %v, want ErrConnectionClosed", err)
	}
	if got := dials.Load(); got != 1 {
		t.Fatalf("%d connections, want 1", got)
	}
}
