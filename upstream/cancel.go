package upstream

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// ErrCanceled is returned by an exchange whose cancellation fired before its
// response was complete. The upstream connection has been closed (which makes
// vLLM abort the request) and is never reused. Transport never asks
// HostClient to retry a cancelled request.
var ErrCanceled = errors.New("upstream: exchange canceled")

// ErrWrongTransport is returned by Do and DoCanceler when hc.Transport is not
// the Transport they were called on: cancellation could not work.
var ErrWrongTransport = errors.New("upstream: HostClient.Transport is not this Transport")

// Canceler cancels one exchange from any goroutine.
//
// The zero value is ready to use. A Canceler is bound to the connection of the
// exchange it was passed to (DoCanceler) only while that exchange dials,
// writes and reads; Cancel closes that connection at once. Cancel before the
// exchange starts makes it return ErrCanceled without sending anything; Cancel
// after it finished does nothing but mark the Canceler cancelled.
//
// Cancel is idempotent, safe for concurrent use, never blocks on I/O and may
// be called from a connwatch gone callback. A Canceler stays cancelled: use a
// new one per request, or call Reset once nothing can call Cancel any more
// (for example after connwatch's stop has returned) and no exchange uses it.
type Canceler struct {
	mu         sync.Mutex
	canceled   bool
	conn       net.Conn           // the raw connection of the exchange in flight
	dialCancel context.CancelFunc // aborts a dial in flight
}

// Cancel cancels the exchange using c, now or when it starts.
func (c *Canceler) Cancel() {
	c.mu.Lock()
	if c.canceled {
		c.mu.Unlock()
		return
	}
	c.canceled = true
	conn, dc := c.conn, c.dialCancel
	c.conn, c.dialCancel = nil, nil
	c.mu.Unlock()
	// The exchange sees canceled under mu before it could pool conn, so
	// closing outside the lock cannot close a reused connection.
	if dc != nil {
		dc()
	}
	if conn != nil {
		_ = conn.Close()
	}
}

// Canceled reports whether Cancel has been called (since the last Reset).
func (c *Canceler) Canceled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.canceled
}

// Reset makes c usable for another exchange. It must not run concurrently
// with Cancel or with an exchange using c.
func (c *Canceler) Reset() {
	c.mu.Lock()
	c.canceled, c.conn, c.dialCancel = false, nil, nil
	c.mu.Unlock()
}

// bind attaches conn; false (and conn untouched) when already cancelled.
func (c *Canceler) bind(conn net.Conn) bool {
	c.mu.Lock()
	ok := !c.canceled
	if ok {
		c.conn = conn
	}
	c.mu.Unlock()
	return ok
}

// unbind detaches the connection and reports whether Cancel ran meanwhile,
// in which case the connection is closed (or about to be) and must not be
// reused.
func (c *Canceler) unbind() bool {
	c.mu.Lock()
	c.conn = nil
	canceled := c.canceled
	c.mu.Unlock()
	return canceled
}

func (c *Canceler) setDialCancel(f context.CancelFunc) bool {
	c.mu.Lock()
	ok := !c.canceled
	if ok {
		c.dialCancel = f
	}
	c.mu.Unlock()
	return ok
}

// Do performs req on hc (which must use t as its Transport) via
// hc.DoTimeout, so HostClient's own bookkeeping (PendingRequests, retries,
// RetryIfErr) still happens, and makes the exchange cancellable: when cancel
// is closed before the response is complete, the upstream connection is
// closed at once and Do returns ErrCanceled. timeout <= 0 means no deadline
// other than hc.ReadTimeout/WriteTimeout.
//
// A nil cancel costs nothing extra. A non-nil cancel costs one goroutine that
// lives for the duration of the call (it waits on cancel and on the call's
// end); use DoCanceler to avoid it when the cancel signal is a callback.
// If cancel is already closed, Do returns ErrCanceled without sending.
//
// Only buffered exchanges are cancellable: with resp.StreamBody (or
// hc.StreamResponseBody) the exchange is delegated to fasthttp's transport and
// cancel is only checked before it starts; close the body stream instead.
// hc.Transport must be t itself (not a wrapper), else ErrWrongTransport.
//
// req and resp follow HostClient.Do's rules; req must not be used by another
// Do on t at the same time.
func (t *Transport) Do(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration, cancel <-chan struct{}) error {
	if cancel == nil {
		return t.DoCanceler(hc, req, resp, timeout, nil)
	}
	select {
	case <-cancel:
		return ErrCanceled
	default:
	}
	c := new(Canceler) // not pooled: the goroutine may still call Cancel after return
	done := make(chan struct{})
	go func() {
		select {
		case <-cancel:
			c.Cancel()
		case <-done:
		}
	}()
	err := t.DoCanceler(hc, req, resp, timeout, c)
	close(done)
	return err
}

// DoCanceler is Do with a Canceler instead of a channel: no goroutine is
// started; c.Cancel (from any goroutine, e.g. a connwatch gone callback)
// cancels the exchange. c may be nil (not cancellable).
func (t *Transport) DoCanceler(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration, c *Canceler) error {
	if hc.Transport != fasthttp.RoundTripper(t) {
		return ErrWrongTransport
	}
	if c != nil && c.Canceled() {
		return ErrCanceled
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	t.register(req, registration{c: c, deadline: deadline})
	var err error
	if timeout > 0 {
		err = hc.DoTimeout(req, resp, timeout)
	} else {
		err = hc.Do(req, resp)
	}
	t.unregister(req)
	if err != nil && c != nil && c.Canceled() {
		err = ErrCanceled
	}
	return err
}

// registration is what Do tells RoundTrip about a request.
type registration struct {
	c        *Canceler
	deadline time.Time // zero: none
}

const regShards = 64 // power of two

type regShard struct {
	mu sync.Mutex
	m  map[*fasthttp.Request]registration
	_  [40]byte // keep shards on separate cache lines
}

func regShardIndex(req *fasthttp.Request) uintptr {
	h := uint64(uintptr(unsafe.Pointer(req))) * 0x9E3779B97F4A7C15
	return uintptr(h >> 58) // top 6 bits: 0..63
}

func (t *Transport) register(req *fasthttp.Request, r registration) {
	s := &t.regs[regShardIndex(req)]
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[*fasthttp.Request]registration)
	}
	s.m[req] = r
	s.mu.Unlock()
}

func (t *Transport) unregister(req *fasthttp.Request) {
	s := &t.regs[regShardIndex(req)]
	s.mu.Lock()
	delete(s.m, req)
	s.mu.Unlock()
}

func (t *Transport) lookup(req *fasthttp.Request) (registration, bool) {
	s := &t.regs[regShardIndex(req)]
	s.mu.Lock()
	r, ok := s.m[req]
	s.mu.Unlock()
	return r, ok
}
