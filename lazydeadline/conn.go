// Package lazydeadline wraps a net.Conn so that its deadlines are armed
// lazily (docs/design.md §7).
//
// A server moves a connection's deadlines on every request: fasthttp moves a
// client connection's read deadline twice (the idle wait, then the request)
// and its write deadline once, and a stream moves the write deadline per
// chunk. Each move resets a runtime timer. Here a deadline later than the
// armed one is only recorded: the armed timer fires early, the read or write
// it interrupts sees that the deadline asked for has not passed, arms it, and
// goes on. A deadline earlier than the armed one, or a clear, is armed at
// once. So no I/O ends before or after its deadline, and a busy keep-alive
// connection moves its timers about once per timeout instead of on every
// request.
package lazydeadline

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// Conn is a net.Conn whose deadlines are armed lazily. Set Conn before first
// use; a Conn must not be copied after.
type Conn struct {
	net.Conn
	rd, wd deadline
}

// deadline is one direction's deadline.
type deadline struct {
	mu    sync.Mutex
	want  time.Time // the deadline asked for (zero: none)
	armed time.Time // the one the connection holds (zero: none)
}

// set records t and arms it with arm when it comes before the armed
// deadline (or clears one).
func (d *deadline) set(t time.Time, arm func(time.Time) error) error {
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
func (d *deadline) retry(err error, arm func(time.Time) error) bool {
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
// before the armed deadline.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.rd.set(t, c.Conn.SetReadDeadline)
}

// SetWriteDeadline is SetReadDeadline for writes.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	return c.wd.set(t, c.Conn.SetWriteDeadline)
}

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

// Read reads until the read deadline, however early the armed timer fires.
func (c *Conn) Read(b []byte) (int, error) {
	for {
		n, err := c.Conn.Read(b)
		if err == nil || n > 0 || !c.rd.retry(err, c.Conn.SetReadDeadline) {
			return n, err
		}
	}
}

// Write writes all of b until the write deadline, however early the armed
// timer fires.
func (c *Conn) Write(b []byte) (int, error) {
	written := 0
	for {
		n, err := c.Conn.Write(b[written:])
		written += n
		if err == nil || !c.wd.retry(err, c.Conn.SetWriteDeadline) {
			return written, err
		}
	}
}
