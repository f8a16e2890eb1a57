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
	entries []*entry // registered; entry.idx is its index here
	running bool     // the poll goroutine exists
}

type entry struct {
	rc   syscall.RawConn
	gone func()
	idx  int // in Watcher.entries, -1 once removed; guarded by Watcher.mu

	// mu is held while gone runs, so that stop can wait for it.
	mu   sync.Mutex
	done bool // gone called or stop called; guarded by mu
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
	rc := rawConn(c)
	if rc == nil || !supported {
		return func() {}
	}
	e := &entry{rc: rc, gone: gone}
	w.mu.Lock()
	e.idx = len(w.entries)
	w.entries = append(w.entries, e)
	start := !w.running
	w.running = true
	w.mu.Unlock()
	if start {
		go w.loop()
	}
	return func() { w.stop(e) }
}

// Len returns the number of connections being watched.
func (w *Watcher) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.entries)
}

func (w *Watcher) stop(e *entry) {
	e.mu.Lock() // waits for a gone in progress
	e.done = true
	e.mu.Unlock()
	w.remove(e)
}

// remove unregisters e if still registered.
func (w *Watcher) remove(e *entry) {
	w.mu.Lock()
	if i := e.idx; i >= 0 {
		last := len(w.entries) - 1
		moved := w.entries[last]
		w.entries[i] = moved
		moved.idx = i
		w.entries[last] = nil
		w.entries = w.entries[:last]
		e.idx = -1
	}
	w.mu.Unlock()
}

func (w *Watcher) loop() {
	var batch []*entry
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
		batch = append(batch[:0], w.entries...)
		w.mu.Unlock()

		for i, e := range batch {
			if p.probe(e.rc) == gone {
				w.remove(e)
				e.mu.Lock()
				if !e.done {
					e.done = true
					e.gone()
				}
				e.mu.Unlock()
			}
			batch[i] = nil
		}
		timer.Reset(w.interval)
	}
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
