package upstream

import (
	"bufio"
	"net"

	"github.com/valyala/fasthttp"
)

// One write(2) per request.
//
// fasthttp's Request.Write sends a request that does not fit the write buffer
// as two writes (the buffer, holding the header and the body's start, then
// the rest of the body) and copies part of the body on the way. A write to a
// socket costs more than its bytes: on loopback the receiver's TCP processing
// runs in the sender's softirq and wakes the receiver once more, so a second
// write of a request's last few KB is a visible share of the router's CPU
// under load (bench/results/README.md); nginx sends the same request with one
// writev.
//
// vecWriter does the same under Request.Write: a small bufio.Writer
// (vecBufSize) writes into it, so each write reaching it is either a flush of
// that small buffer, which is copied (the buffer is reused), or a direct write
// of a slice of the caller's larger than the buffer (the serialized header or
// the body, which Request.Write leaves alone until it returns), which is kept
// by reference. Once Request.Write has returned, send writes every piece with
// one writev.
//
// It is used only where that holds and writev exists: a plain TCP or Unix
// connection, a request body in memory (no body stream) and no trailers
// (trailers are serialized into the header's own buffer, which would overwrite
// a header kept by reference); and only for bodies that would not fit the
// write buffer with their header anyway: smaller requests already go out in
// one write, a copy of a few KB is cheap, and a plain write is slightly
// cheaper than a writev.

// vecBufSize is the bufio buffer under Request.Write: writes up to this size
// are copied, larger ones kept by reference.
const vecBufSize = 512

// vecOwnMax bounds the copy buffer a pooled vecWriter keeps.
const vecOwnMax = 16 << 10

type vecWriter struct {
	bw   *bufio.Writer // writes into this vecWriter
	own  []byte        // copies of small writes
	segs net.Buffers   // the pieces in order
	bufs net.Buffers   // what WriteTo consumes (shares segs' array)
}

func newVecWriter() *vecWriter {
	v := &vecWriter{own: make([]byte, 0, 2*vecBufSize), segs: make(net.Buffers, 0, 4)}
	v.bw = bufio.NewWriterSize(v, vecBufSize)
	return v
}

// Write implements io.Writer for v.bw. It never fails.
func (v *vecWriter) Write(p []byte) (int, error) {
	if len(p) > vecBufSize { // not bufio's buffer: a caller's slice, stable until Request.Write returns
		v.segs = append(v.segs, p)
		return len(p), nil
	}
	n := len(v.own)
	v.own = append(v.own, p...)
	// A new piece per write even when it follows the previous copy: if own
	// grew, the earlier pieces still point into the old array, which keeps
	// its contents.
	v.segs = append(v.segs, v.own[n:len(v.own):len(v.own)])
	return len(p), nil
}

// send writes the collected pieces to conn, one writev, and resets v.
func (v *vecWriter) send(conn net.Conn) error {
	var err error
	switch len(v.segs) {
	case 0:
	case 1:
		_, err = conn.Write(v.segs[0])
	default:
		v.bufs = v.segs
		_, err = v.bufs.WriteTo(conn)
		v.bufs = nil
	}
	v.reset()
	return err
}

func (v *vecWriter) reset() {
	clear(v.segs) // drop the references to the request
	v.segs = v.segs[:0]
	if cap(v.own) > vecOwnMax {
		v.own = make([]byte, 0, 2*vecBufSize)
	} else {
		v.own = v.own[:0]
	}
	v.bw.Reset(v)
}

// vectorable reports whether req can be written to conn through a vecWriter.
func vectorable(conn net.Conn, req *fasthttp.Request) bool {
	switch conn.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return false
	}
	return !req.IsBodyStream() && len(req.Header.PeekTrailerKeys()) == 0
}

// writeRequest writes req to conn: with one writev where vectorable and the
// body would not fit the write buffer with its header, else (one write when
// it fits) through a pooled bufio.Writer of WriteBufferSize.
func (t *Transport) writeRequest(conn net.Conn, req *fasthttp.Request) error {
	if !t.noVec && vectorable(conn, req) && len(req.Body())+vecBufSize > t.cfg.WriteBufferSize {
		v, _ := t.vecs.Get().(*vecWriter)
		if v == nil {
			v = newVecWriter()
		}
		err := req.Write(v.bw)
		if err == nil {
			err = v.bw.Flush() // into v: never fails
		}
		if err == nil {
			err = v.send(conn)
		} else {
			v.reset()
		}
		t.vecs.Put(v)
		return err
	}
	bw := t.acquireWriter(conn)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	t.releaseWriter(bw)
	return err
}
