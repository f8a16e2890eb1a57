package fastproxy

import (
	"errors"
	"os"
	"sync"
	"time"
)

// lazyDeadline is one direction's deadline of a client connection, armed
// lazily (docs/design.md §7). fasthttp moves the read deadline twice per
// request (idle wait, then the request read) and the write deadline once, and
// a stream moves it once per chunk; each move resets a runtime timer. Here a
// deadline later than the armed one is only recorded: the armed timer fires
// early, the read or write it interrupts sees that the wanted deadline has not
// passed, arms it, and carries on. A deadline earlier than the armed one is
// armed at once. So an I/O never times out before its deadline, nor after it,
// and a busy keep-alive connection moves its timers about once per timeout
// instead of on every request.
type lazyDeadline struct {
	mu    sync.Mutex
	want  time.Time // the deadline asked for (zero: none)
	armed time.Time // the one the connection holds (zero: none)
}

// set records t as the deadline of one direction and arms it with arm when
// it comes before the armed one (or clears one).
func (d *lazyDeadline) set(t time.Time, arm func(time.Time) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.want = t
	if !t.IsZero() && !d.armed.IsZero() && !t.Before(d.armed) {
		return nil // the armed one comes first and will catch up
	}
	d.armed = t
	return arm(t)
}

// retry reports whether an I/O that failed with err should be tried again:
// the timer armed earlier fired, the deadline asked for has not passed, and
// it is now armed.
func (d *lazyDeadline) retry(err error, arm func(time.Time) error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.want.IsZero() && !time.Now().Before(d.want) {
		return false
	}
	d.armed = d.want
	return arm(d.want) == nil
}

// SetReadDeadline records t; the connection's timer moves only when t comes
// before the armed deadline (see lazyDeadline).
func (c *limitConn) SetReadDeadline(t time.Time) error {
	return c.rd.set(t, c.Conn.SetReadDeadline)
}

// SetWriteDeadline is SetReadDeadline for writes.
func (c *limitConn) SetWriteDeadline(t time.Time) error {
	return c.wd.set(t, c.Conn.SetWriteDeadline)
}

// SetDeadline sets both deadlines.
func (c *limitConn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

// Read reads from the client until its read deadline, however early the
// armed timer fires.
func (c *limitConn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err == nil || n > 0 || !c.rd.retry(err, c.Conn.SetReadDeadline) {
			return n, err
		}
	}
}

// Write writes all of b to the client until its write deadline, however
// early the armed timer fires.
func (c *limitConn) Write(b []byte) (int, error) {
	written := 0
	for {
		n, err := c.Conn.Write(b[written:])
		written += n
		if err == nil || !c.wd.retry(err, c.Conn.SetWriteDeadline) {
			return written, err
		}
	}
}
