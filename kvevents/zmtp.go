package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// ZMTP over plain connections: zmq4 does the handshake and the framing on a
// connection this package opened, tracks and closes itself (its sockets'
// own dialing, accepting and reconnecting are not used), so that Close
// ends everything and every frame a peer announces is bounded first.

// endSeq is the sequence that ends a replay: -1 as 8 big-endian bytes.
const endSeq = ^uint64(0)

// splitEndpoint turns a ZMQ endpoint into a Go network and address:
// tcp://host:port (host "*" for every interface) or ipc:///path.
func splitEndpoint(ep string) (network, addr string, err error) {
	switch {
	case strings.HasPrefix(ep, "tcp://"):
		addr = strings.TrimPrefix(ep, "tcp://")
		if strings.HasPrefix(addr, "*:") {
			addr = addr[1:]
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return "", "", fmt.Errorf("kvevents: endpoint %q: %w", ep, err)
		}
		return "tcp", addr, nil
	case strings.HasPrefix(ep, "ipc://"):
		if addr = strings.TrimPrefix(ep, "ipc://"); addr == "" {
			return "", "", fmt.Errorf("kvevents: endpoint %q without a path", ep)
		}
		return "unix", addr, nil
	}
	return "", "", fmt.Errorf("kvevents: endpoint %q: want tcp://host:port or ipc://path", ep)
}

// endpointOf names a bound listener as an endpoint peers can dial.
func endpointOf(a net.Addr) string {
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// errFrame is a peer's frame or message over the bounds; its connection is
// dropped.
var errFrame = errors.New("kvevents: ZMTP frame over the limits")

const (
	greetingLen  = 64 // ZMTP 3 greeting, before any frame
	maxMsgFrames = 8  // vLLM's messages have three
)

// guardConn reads the ZMTP frame headers as they pass to zmq4 and fails
// the read that completes one announcing more than maxFrame bytes, or a
// message of more than maxMsgFrames frames or maxMsg bytes, before zmq4
// sizes a buffer from it.
type guardConn struct {
	net.Conn
	maxFrame, maxMsg uint64

	greeting int // greeting bytes still to pass
	hdr      [9]byte
	hdrLen   int
	body     uint64 // body bytes of the current frame still to pass
	frames   int    // frames of the current message so far
	msgBytes uint64
}

func newGuard(c net.Conn, maxFrame, maxMsg uint64) *guardConn {
	return &guardConn{Conn: c, maxFrame: maxFrame, maxMsg: maxMsg, greeting: greetingLen}
}

func (g *guardConn) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if verr := g.scan(p[:n]); verr != nil {
		return 0, verr
	}
	return n, err
}

func (g *guardConn) scan(b []byte) error {
	for len(b) > 0 {
		switch {
		case g.greeting > 0:
			k := min(g.greeting, len(b))
			g.greeting -= k
			b = b[k:]
			continue
		case g.body > 0:
			k := min(g.body, uint64(len(b)))
			g.body -= k
			b = b[k:]
			continue
		}
		g.hdr[g.hdrLen] = b[0]
		g.hdrLen++
		b = b[1:]
		flags := g.hdr[0]
		need := 2
		if flags&0x02 != 0 {
			need = 9
		}
		if g.hdrLen < need {
			continue
		}
		g.hdrLen = 0
		size := uint64(g.hdr[1])
		if need == 9 {
			size = binary.BigEndian.Uint64(g.hdr[1:9])
		}
		if flags&0xf8 != 0 || size > g.maxFrame {
			return fmt.Errorf("%w: flags 0x%02x, %d bytes", errFrame, flags, size)
		}
		if flags&0x04 == 0 { // a message frame, not a command
			g.frames++
			g.msgBytes += size
			if g.frames > maxMsgFrames || g.msgBytes > g.maxMsg {
				return fmt.Errorf("%w: message of %d frames, %d bytes", errFrame, g.frames, g.msgBytes)
			}
			if flags&0x01 == 0 {
				g.frames, g.msgBytes = 0, 0
			}
		}
		g.body = size
	}
	return nil
}

// frameBounds derives the guard's bounds from a payload bound: a message
// is a payload and a few small frames.
func frameBounds(lim Limits) (maxFrame, maxMsg uint64) {
	p := uint64(lim.withDefaults().MaxPayloadBytes)
	return p, p + 64<<10
}

// handshake runs the ZMTP greeting and the NULL mechanism on c as typ,
// within the deadline, every frame bounded.
func handshake(c net.Conn, typ zmq4.SocketType, server bool, maxFrame, maxMsg uint64, deadline time.Time) (*zmq4.Conn, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return nil, err
	}
	zc, err := zmq4.Open(newGuard(c, maxFrame, maxMsg), null.Security(), typ, nil, server, nil)
	if err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return zc, nil
}

func seqBytes(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq)
}
