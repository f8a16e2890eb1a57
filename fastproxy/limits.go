package fastproxy

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/connwatch"
	"github.com/warmroute/warmroute/lazydeadline"
)

// limitListener keeps the router alive when connections pile up: Accept
// waits while maxConns client connections are open (the kernel's backlog
// holds, then refuses, the rest), and an accept that fails for lack of file
// descriptors or memory is retried with backoff instead of ending Serve.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	log       *slog.Logger
	lastLog   time.Time // under the single Accept caller
}

// newLimitListener wraps ln; maxConns ≤ 0 derives the limit from the
// process's file-descriptor limit, keeping a quarter (at least 256) for
// upstream connections, health checks and files.
func newLimitListener(ln net.Listener, maxConns int, log *slog.Logger) *limitListener {
	if maxConns <= 0 {
		maxConns = defaultMaxConns()
	}
	return &limitListener{Listener: ln, sem: make(chan struct{}, maxConns), done: make(chan struct{}), log: log}
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

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	backoff := 5 * time.Millisecond
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			return &limitConn{Conn: lazydeadline.Conn{Conn: c}, l: l}, nil
		}
		if !resourceExhausted(err) {
			<-l.sem
			return nil, err
		}
		if now := time.Now(); now.Sub(l.lastLog) > 10*time.Second {
			l.lastLog = now
			l.log.Warn("accept failed for lack of resources; slowing down", "err", err, "retry_in", backoff)
		}
		select {
		case <-time.After(backoff):
		case <-l.done:
			<-l.sem
			return nil, net.ErrClosed
		}
		backoff = min(backoff*2, time.Second)
	}
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// resourceExhausted reports an accept error that passes once resources free up.
func resourceExhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// limitConn frees its listener slot once, on Close. It also keeps the
// connection's registration with clientWatcher, reused by each of its
// requests in turn (fasthttp serves a connection's requests one at a time),
// and arms its deadlines lazily.
type limitConn struct {
	lazydeadline.Conn
	l     *limitListener
	once  sync.Once
	watch connwatch.Conn
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-c.l.sem })
	return err
}

// NetConn returns the accepted connection (for watching it for the client
// leaving, which needs its file descriptor).
func (c *limitConn) NetConn() net.Conn { return c.Conn.Conn }
