// Package connwatch tells a fasthttp handler that its client has gone while
// the handler is blocked on a long upstream call.
//
// A fasthttp handler gets no signal when its client disconnects: the server
// does not read the connection while the handler runs. A Watcher polls the
// registered server-side connections with a non-blocking, non-consuming peek
// (recv with MSG_PEEK|MSG_DONTWAIT): an orderly EOF, ECONNRESET or EPIPE means
// the client is gone; no data (EAGAIN) or data waiting (a pipelined next
// request, left unread) means it is still there.
//
// Typical use, with upstream.Transport:
//
//	c := new(upstream.Canceler)
//	stop := watcher.Watch(ctx.Conn(), c.Cancel)
//	err := t.DoCanceler(hc, req, resp, timeout, c)
//	stop()
//
// A server that keeps per-connection state can register without
// allocating: a Conn kept with the connection serves each of its requests
// in turn (Start, Stop).
//
// Limits: a client that sends its next request and then closes (or half-closes)
// its side is seen as present until that request is read; peeking works on the
// raw TCP socket, so it sees TLS records too, which is fine for EOF detection.
// Linux only; elsewhere Watch watches nothing.
package connwatch

import (
	"crypto/tls"
	"net"
	"sync"
	"syscall"
	"time"
)

// Watcher polls registered connections from one background goroutine, which
// exists only while at least one connection is registered (no ticker, no
// goroutine when idle). A Watcher is safe for concurrent use; its zero value
// is not usable, create it with New. It needs no closing: once every stop has
// been called, its goroutine exits within one interval.
type Watcher struct {
	interval time.Duration

	mu      sync.Mutex
	entries []*Conn // registered; Conn.idx is its index here
	running bool    // the poll goroutine exists
}

// Conn is one connection's registration, reusable for the connection's
// requests one at a time: Start registers it, Stop unregisters it. The
// first Start reaches the socket (one allocation); later ones, on the same
// connection, allocate nothing. The zero value is ready to use. A Conn
// must not be copied after first use.
type Conn struct {
	c  net.Conn        // the connection rc reaches; written only while unregistered
	rc syscall.RawConn // nil: c cannot be watched

	// Guarded by Watcher.mu, under which the poll goroutine reads rc and gen.
	idx int    // in Watcher.entries while reg
	gen uint64 // registrations so far: a poll's verdict applies only to the one it probed
	reg bool   // registered

	// mu is held while gone runs, so that Stop can wait for it.
	mu   sync.Mutex
	gone func()
	done bool // gone called or Stop called; guarded by mu
}

// New returns a Watcher that polls every interval (50–100 ms is a good
// choice: one cheap syscall per connection per interval). interval <= 0 means
// 100 ms.
func New(interval time.Duration) *Watcher {
	if interval <= 0 {
		interval = 100 * time.Millisecond
	}
	return &Watcher{interval: interval}
}

// Watch registers c, the server side of a client connection, until stop is
// called or the client is seen gone, at which point gone is called once, from
// the Watcher's goroutine; c is unregistered before gone is called.
//
// gone should be quick and non-blocking (close a channel, cancel a context,
// call upstream.Canceler.Cancel): it delays the polling of other connections.
// gone must not call stop (that would deadlock).
//
// stop is idempotent, may be called from any goroutine, and guarantees that
// gone is not running and will not be called once it returns. Call stop
// before the handler returns: after that, the server may read or close c.
//
// c is unwrapped through *tls.Conn, any interface{ NetConn() net.Conn } and
// syscall.Conn to reach its socket; a connection that cannot be inspected
// (an in-memory pipe, an unsupported OS) is not watched and stop is a no-op.
// Watch never reads, writes or closes c, and never consumes its bytes.
func (w *Watcher) Watch(c net.Conn, gone func()) (stop func()) {
	e := new(Conn)
	if !w.Start(e, c, gone) {
		return func() {}
	}
	return func() { w.Stop(e) }
}

// Start is Watch for a reusable registration: it registers e for c, the
// server side of a client connection, and reports whether c is watched (a
// connection that cannot be inspected is not). Call Stop(e) before the
// handler returns and before e's next Start; Stop's guarantees are stop's
// (see Watch). e remembers c's socket, so that registering the same
// connection again allocates nothing.
func (w *Watcher) Start(e *Conn, c net.Conn, gone func()) bool {
	if !supported {
		return false
	}
	if e.c != c || e.rc == nil {
		e.c, e.rc = c, rawConn(c)
	}
	if e.rc == nil {
		return false
	}
	e.mu.Lock()
	e.gone, e.done = gone, false
	e.mu.Unlock()
	w.mu.Lock()
	e.gen++
	e.idx, e.reg = len(w.entries), true
	w.entries = append(w.entries, e)
	start := !w.running
	w.running = true
	w.mu.Unlock()
	if start {
		go w.loop()
	}
	return true
}

// Stop unregisters e (idempotent): once it returns, the gone of e's last
// Start is not running and will not be called.
func (w *Watcher) Stop(e *Conn) {
	e.mu.Lock() // waits for a gone in progress
	e.done = true
	e.gone = nil
	e.mu.Unlock()
	w.remove(e, 0)
}

// Len returns the number of connections being watched.
func (w *Watcher) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.entries)
}

// remove unregisters e if it is registered (and, when gen is not 0, as
// registration gen); it reports whether it did.
func (w *Watcher) remove(e *Conn, gen uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !e.reg || gen != 0 && e.gen != gen {
		return false
	}
	i, last := e.idx, len(w.entries)-1
	moved := w.entries[last]
	w.entries[i] = moved
	moved.idx = i
	w.entries[last] = nil
	w.entries = w.entries[:last]
	e.idx, e.reg = -1, false
	return true
}

// probed is one registration as a poll saw it.
type probed struct {
	e   *Conn
	rc  syscall.RawConn
	gen uint64
}

func (w *Watcher) loop() {
	var batch []probed
	p := newProber()
	timer := time.NewTimer(w.interval)
	defer timer.Stop()
	for {
		<-timer.C
		w.mu.Lock()
		if len(w.entries) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		for _, e := range w.entries {
			batch = append(batch, probed{e, e.rc, e.gen})
		}
		w.mu.Unlock()

		for i, b := range batch {
			if p.probe(b.rc) == gone {
				w.ended(b)
			}
			batch[i] = probed{}
		}
		batch = batch[:0]
		timer.Reset(w.interval)
	}
}

// ended unregisters b's registration and calls its gone, unless it was
// stopped since the poll saw it: a registration stopped (and maybe started
// again, on another request) is not this probe's to end.
func (w *Watcher) ended(b probed) {
	e := b.e
	e.mu.Lock()
	if !e.done && w.remove(e, b.gen) {
		e.done = true
		e.gone()
	}
	e.mu.Unlock()
}

type state int

const (
	alive state = iota
	gone
)

// rawConn reaches the socket under c, or returns nil.
func rawConn(c net.Conn) syscall.RawConn {
	for range 8 {
		switch x := c.(type) {
		case nil:
			return nil
		case *tls.Conn:
			c = x.NetConn()
			continue
		case syscall.Conn:
			rc, err := x.SyscallConn()
			if err != nil {
				return nil
			}
			return rc
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
			continue
		}
		return nil
	}
	return nil
}
