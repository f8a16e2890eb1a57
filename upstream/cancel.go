package upstream

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"

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
// exchange it was passed to only while that exchange dials, writes and reads
// (for Stream, until Body.Close); Cancel closes that connection at once. Cancel before the
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

// Do performs req on hc (which must use t as its Transport) with hc's
// retry policy (MaxIdemponentCallAttempts, RetryIfErr, RetryIfErrUpstream;
// see DoCanceler), and makes the exchange cancellable: when cancel
// is closed before the response is complete, the upstream connection is
// closed at once and Do returns ErrCanceled. timeout <= 0 means no deadline
// other than hc.ReadTimeout/WriteTimeout.
//
// A nil cancel costs nothing extra. A non-nil cancel costs one goroutine that
// lives for the duration of the call (it waits on cancel and on the call's
// end); use DoCanceler to avoid it when the cancel signal is a callback.
// If cancel is already closed, Do returns ErrCanceled without sending.
//
// Only buffered exchanges are cancellable here: with resp.StreamBody (or
// hc.StreamResponseBody) the exchange is delegated to fasthttp's transport and
// cancel is only checked before it starts; use Stream for a cancellable
// stream.
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
//
// A buffered exchange does not go through hc.Do: DoCanceler makes its
// attempts itself (see attempts), so that the deadline and c reach the
// exchange as arguments rather than through a registry that RoundTrip would
// look up (docs/design.md §7). Everything else goes to hc.DoTimeout (or
// hc.Do).
func (t *Transport) DoCanceler(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration, c *Canceler) error {
	if hc.Transport != fasthttp.RoundTripper(t) {
		return ErrWrongTransport
	}
	if c != nil && c.Canceled() {
		return ErrCanceled
	}
	var err error
	switch {
	case delegated(hc, resp):
		if timeout > 0 {
			err = hc.DoTimeout(req, resp, timeout)
		} else {
			err = hc.Do(req, resp)
		}
	default:
		err = t.attempts(hc, req, resp, timeout, c)
	}
	if err != nil && c != nil && c.Canceled() {
		err = ErrCanceled
	}
	return err
}

// delegated reports whether an exchange goes to fasthttp's own transport:
// a streamed response, or a HostClient with several addresses.
func delegated(hc *fasthttp.HostClient, resp *fasthttp.Response) bool {
	return resp.StreamBody || hc.StreamResponseBody || strings.IndexByte(hc.Addr, ',') >= 0
}

// defaultUserAgent is fasthttp's User-Agent for a HostClient without a Name
// (fasthttp does not export it).
const defaultUserAgent = "fasthttp"

// attempts is what hc.Do does for a buffered exchange, with the deadline and
// c passed to each exchange: the scheme check; the User-Agent when the
// request has none (hc.Name, else fasthttp's unless
// hc.NoDefaultUserAgentHeader); then an exchange, and another while one
// fails in a way the transport calls retryable (a kept-alive connection the
// worker had closed), up to hc.MaxIdemponentCallAttempts, if
// hc.RetryIfErrUpstream, else hc.RetryIfErr, else an idempotent method
// allows it, and the deadline has not passed. Not done: HostClient's
// PendingRequests count, and hc.SecureErrorLogMessage, which fasthttp gives
// no way to set on a request or response from outside: they keep their own
// (a fasthttp.Server's, for the request and response of its handler).
//
// resp is not reset before the exchange: reading the answer resets its
// headers and body (keeping the flags that a Reset would clear, such as the
// server's no-default Content-Type).
func (t *Transport) attempts(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, timeout time.Duration, c *Canceler) error {
	if err := prepare(hc, req); err != nil {
		return err
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	most := hc.MaxIdemponentCallAttempts
	if most <= 0 {
		most = fasthttp.DefaultMaxIdemponentCallAttempts
	}
	stream := req.IsBodyStream() // before the first send spends (and drops) the stream
	for n := 1; ; n++ {
		retry, err := t.exchange(hc, req, resp, deadline, c)
		if err == nil || !retry || stream || n >= most {
			return err
		}
		reset, retry := retryPolicy(hc, req, resp, n, err)
		if !retry {
			return err
		}
		if now := time.Now(); timeout > 0 && reset {
			deadline = now.Add(timeout)
		} else if timeout > 0 && !now.Before(deadline) {
			return fasthttp.ErrTimeout
		}
	}
}

// prepare is what hc.Do does to a request before its attempts: the scheme
// check, path normalizing as hc says, and the User-Agent when the request
// has none (hc.Name, else fasthttp's unless hc.NoDefaultUserAgentHeader).
func prepare(hc *fasthttp.HostClient, req *fasthttp.Request) error {
	if hc.IsTLS != (string(req.URI().Scheme()) == "https") {
		return fasthttp.ErrHostClientRedirectToDifferentScheme
	}
	req.URI().DisablePathNormalizing = hc.DisablePathNormalizing
	if len(req.Header.UserAgent()) == 0 {
		if ua := hc.Name; ua != "" {
			req.Header.SetUserAgent(ua)
		} else if !hc.NoDefaultUserAgentHeader {
			req.Header.SetUserAgent(defaultUserAgent)
		}
	}
	return nil
}

// retryPolicy is hc's answer to whether attempt n, which failed with err in
// a way the transport calls retryable, is made again: hc.RetryIfErrUpstream,
// else hc.RetryIfErr, else whether the method is idempotent. reset asks for
// a fresh deadline.
func retryPolicy(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, n int, err error) (reset, retry bool) {
	switch {
	case hc.RetryIfErrUpstream != nil:
		upstream := ""
		if a := resp.RemoteAddr(); a != nil {
			upstream = a.String()
		}
		return hc.RetryIfErrUpstream(req, n, err, upstream)
	case hc.RetryIfErr != nil:
		return hc.RetryIfErr(req, n, err)
	}
	h := &req.Header
	return false, h.IsGet() || h.IsHead() || h.IsPut() || h.IsQuery()
}
