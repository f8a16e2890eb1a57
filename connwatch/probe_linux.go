//go:build linux

package connwatch

import (
	"syscall"
	"unsafe"
)

const supported = true

// prober peeks at sockets; one per poll goroutine, reused so that a probe
// allocates nothing.
type prober struct {
	buf   [1]byte
	n     uintptr
	errno syscall.Errno
	fn    func(fd uintptr)
}

func newProber() *prober {
	p := &prober{}
	p.fn = func(fd uintptr) {
		for {
			// recvfrom(fd, buf, 1, MSG_PEEK|MSG_DONTWAIT, NULL, NULL):
			// never blocks, never consumes.
			p.n, _, p.errno = syscall.Syscall6(syscall.SYS_RECVFROM, fd,
				uintptr(unsafe.Pointer(&p.buf[0])), 1,
				syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
			if p.errno != syscall.EINTR {
				return
			}
		}
	}
	return p
}

// probe reports whether the peer of rc is gone. It uses RawConn.Control, not
// Read, so it never waits for the fd's read lock (a concurrent Read would
// otherwise stall the whole Watcher). A connection already closed locally
// counts as gone; an unexpected error counts as alive (no cancel on a guess).
func (p *prober) probe(rc syscall.RawConn) state {
	p.n, p.errno = 0, 0
	if err := rc.Control(p.fn); err != nil {
		return gone // closed locally
	}
	switch p.errno {
	case 0:
		if p.n > 0 {
			return alive // data waiting, e.g. a pipelined request
		}
		return gone // orderly EOF
	case syscall.EAGAIN:
		return alive
	case syscall.ECONNRESET, syscall.EPIPE, syscall.ETIMEDOUT, syscall.ENOTCONN:
		return gone
	}
	return alive
}
