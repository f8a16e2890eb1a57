package fastproxy

import (
	"cmp"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/connwatch"
	"github.com/warmroute/warmroute/lazydeadline"
)

// limitListener keeps the router alive when connections pile up
// (docs/design.md §8.1, "Bounds"). At most maxConns client connections are
// open. A new connection that finds them all open closes the oldest idle
// ones first — keep-alive connections between requests, and new ones that
// have not sent a byte — up to a batch of them (about a sixty-fourth of
// maxConns, 1 to 32), so that the next ones find room at once; it waits
// (the kernel's backlog holds, then refuses, the rest) only while every
// open connection has a request in flight. A connection with a request in
// flight or a response being written is never closed for this. An accept
// that fails for lack of file descriptors or memory is retried with backoff
// instead of ending Serve.
//
// The server reports its connections' states to connState (fasthttp's
// Server.ConnState): one atomic store per request and state.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	idle      chan struct{} // a connection turned idle while every slot was taken
	done      chan struct{}
	closeOnce sync.Once
	batch     int // idle connections closed at once when a new one finds no room
	log       *slog.Logger
	lastLog   time.Time // under the single Accept caller

	mu      sync.Mutex
	conns   []*limitConn // open connections, each at its pos
	scratch []idleConn   // evictIdle's candidates, reused by the single Accept caller
}

// newLimitListener wraps ln; maxConns ≤ 0 derives the limit from the
// process's file-descriptor limit, keeping a quarter (at least 256) for
// upstream connections, health checks and files.
func newLimitListener(ln net.Listener, maxConns int, log *slog.Logger) *limitListener {
	if maxConns <= 0 {
		maxConns = defaultMaxConns()
	}
	return &limitListener{Listener: ln, sem: make(chan struct{}, maxConns), idle: make(chan struct{}, 1),
		done: make(chan struct{}), batch: min(max(maxConns/64, 1), 32), log: log}
}

func defaultMaxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 || rl.Cur > 1<<20 {
		return 1 << 16
	}
	reserve := max(rl.Cur/4, 256)
	if rl.Cur <= reserve+64 {
		return 64
	}
	return int(rl.Cur - reserve)
}

// Accept accepts the next connection, then makes room for it (admit).
func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.accept()
	if err != nil {
		return nil, err
	}
	if err := l.admit(); err != nil {
		c.Close() //nolint:errcheck // the listener is closing
		return nil, err
	}
	lc := &limitConn{Conn: lazydeadline.Conn{Conn: c}, l: l}
	lc.idleSince.Store(time.Now().UnixNano()) // idle until its first byte
	l.mu.Lock()
	lc.pos = len(l.conns)
	l.conns = append(l.conns, lc)
	l.mu.Unlock()
	return lc, nil
}

// accept accepts from the wrapped listener, backing off while resources
// are exhausted.
func (l *limitListener) accept() (net.Conn, error) {
	backoff := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err == nil || !resourceExhausted(err) {
			return c, err
		}
		if now := time.Now(); now.Sub(l.lastLog) > 10*time.Second {
			l.lastLog = now
			l.log.Warn("accept failed for lack of resources; slowing down", "err", err, "retry_in", backoff)
		}
		select {
		case <-time.After(backoff):
		case <-l.done:
			return nil, net.ErrClosed
		}
		backoff = min(backoff*2, time.Second)
	}
}

// admit takes a slot for a new connection: a free one, else one that
// closing the oldest idle connections frees; while none is idle it waits
// for a connection to close or to turn idle.
func (l *limitListener) admit() error {
	for {
		select {
		case l.sem <- struct{}{}:
			return nil
		default:
		}
		l.evictIdle()
		select {
		case l.sem <- struct{}{}:
			return nil
		case <-l.idle:
		case <-l.done:
			return net.ErrClosed
		}
	}
}

// evictIdle closes up to l.batch of the connections idle the longest.
func (l *limitListener) evictIdle() {
	cands := l.scratch[:0]
	l.mu.Lock()
	for _, c := range l.conns {
		if v := c.idleSince.Load(); v > 0 {
			cands = append(cands, idleConn{c, v})
		}
	}
	l.mu.Unlock()
	slices.SortFunc(cands, func(a, b idleConn) int { return cmp.Compare(a.since, b.since) })
	n := 0
	for _, c := range cands {
		if n == l.batch {
			break
		}
		// Claimed only while still idle as seen: one whose request began
		// meanwhile is left alone.
		if c.conn.idleSince.CompareAndSwap(c.since, idleClaimed) {
			c.conn.Close() //nolint:errcheck // frees its slot; its server goroutine sees it closed and ends
			n++
		}
	}
	clear(cands)
	l.scratch = cands[:0]
}

// idleConn is an idle connection and the time since when, as evictIdle saw
// them.
type idleConn struct {
	conn  *limitConn
	since int64
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// idleClaimed marks a connection that evictIdle is closing.
const idleClaimed = -1

// connState is the servers' fasthttp ConnState hook: it keeps each
// connection's idle mark for its listener (limitListener).
func connState(c net.Conn, s fasthttp.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitConn)
	if !ok {
		return
	}
	switch s {
	case fasthttp.StateActive, fasthttp.StateHijacked:
		lc.idleSince.Store(0)
	case fasthttp.StateIdle:
		lc.idleSince.Store(time.Now().UnixNano())
		if l := lc.l; len(l.sem) == cap(l.sem) {
			select {
			case l.idle <- struct{}{}: // a new connection may be waiting for room
			default:
			}
		}
	}
}

// resourceExhausted reports an accept error that passes once resources free up.
func resourceExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// limitConn frees its listener slot once, on Close. It also keeps the
// connection's registration with clientWatcher, reused by each of its
// requests in turn (fasthttp serves a connection's requests one at a time),
// arms its deadlines lazily, and is marked idle between requests
// (connState).
type limitConn struct {
	lazydeadline.Conn
	l     *limitListener
	once  sync.Once
	watch connwatch.Conn
	// idleSince is the unix-nano time since which no request has been in
	// flight (set at accept: a new connection is idle until its first
	// byte), 0 while one is, idleClaimed once evictIdle closes it.
	idleSince atomic.Int64
	pos       int // index in l.conns, under l.mu
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// release frees the connection's slot and forgets it.
func (c *limitConn) release() {
	l := c.l
	l.mu.Lock()
	last := len(l.conns) - 1
	l.conns[c.pos] = l.conns[last]
	l.conns[c.pos].pos = c.pos
	l.conns[last] = nil
	l.conns = l.conns[:last]
	l.mu.Unlock()
	<-l.sem
}

// NetConn returns the accepted connection (for watching it for the client
// leaving, which needs its file descriptor).
func (c *limitConn) NetConn() net.Conn { return c.Conn.Conn }
