package loadview

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// dialer returns the DialTimeout function of the upstream clients. Each dial
// is bounded by connect (or by fasthttp's per-request budget when that is
// shorter), separately from the request's read/write timeout, so that an
// unreachable worker fails in seconds rather than after the request timeout.
//
// Without a custom dial it dials TCP (IPv4 and IPv6) through fasthttp's
// DNS-caching dialer. A custom dial (benchmarks: in-memory listeners) is kept;
// it runs on its own goroutine so that connect bounds it too, and its errors
// are reported as dial errors (*net.OpError with Op "dial") so that
// IsConnectError recognises them whatever the dialer returns.
func dialer(dial fasthttp.DialFunc, connect time.Duration) fasthttp.DialFuncWithTimeout {
	bound := func(t time.Duration) time.Duration {
		if t <= 0 || t > connect {
			return connect
		}
		return t
	}
	if dial == nil {
		return func(addr string, t time.Duration) (net.Conn, error) {
			return fasthttp.DialDualStackTimeout(addr, bound(t))
		}
	}
	return func(addr string, t time.Duration) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			c, err := dial(addr)
			ch <- result{c, err}
		}()
		timer := time.NewTimer(bound(t))
		defer timer.Stop()
		select {
		case res := <-ch:
			if res.err != nil {
				return nil, asDialError(addr, res.err)
			}
			return res.c, nil
		case <-timer.C:
			go func() { // a connection that arrives late is nobody's
				if res := <-ch; res.c != nil {
					res.c.Close()
				}
			}()
			return nil, fasthttp.ErrDialTimeout
		}
	}
}

func asDialError(addr string, err error) error {
	if IsConnectError(err) {
		return err
	}
	return &net.OpError{Op: "dial", Net: "tcp", Addr: stringAddr(addr), Err: err}
}

type stringAddr string

func (a stringAddr) Network() string { return "tcp" }
func (a stringAddr) String() string  { return string(a) }

// IsConnectError reports whether err says that no connection to the worker
// could be made, so that the request was certainly not sent and may be sent
// to another worker: a refused or unroutable dial, a dial or TLS-handshake
// timeout, a failed name lookup. It is false for everything that can happen
// after the request was (possibly) written — a read timeout, a reset, a
// closed connection, fasthttp.ErrTimeout (the whole request's deadline, which
// may have passed after the request was written) — and for nil.
func IsConnectError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, fasthttp.ErrTLSHandshakeTimeout) {
		return true
	}
	if _, ok := errors.AsType[*fasthttp.ErrDialWithUpstream](err); ok {
		return true // fasthttp wraps only dial failures in it
	}
	if op, ok := errors.AsType[*net.OpError](err); ok {
		return op.Op == "dial"
	}
	if _, ok := errors.AsType[*net.DNSError](err); ok {
		return true
	}
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return true // fasthttp completes the handshake while dialing
	}
	// A bare errno from a custom dialer: refused or unroutable can only
	// happen while connecting.
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}
