package fastproxy

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
)

// requestID returns the request's id: the first configured request-id
// header (in the order of RequestIDHeaders) whose first value the client
// sent as 1 to 128 printable ASCII bytes, else a generated one. The
// request then carries it as its only X-Request-Id, so that it also goes
// upstream. One pass over the headers finds it, rather than a lookup per
// configured name, each of which normalizes a copy of the name and scans
// every header. The result aliases the request header or buf.
func (s *Server) requestID(ctx *fasthttp.RequestCtx, buf *[128]byte) []byte {
	h := &ctx.Request.Header
	names := s.cfg.RequestIDHeaders
	var id []byte
	var seen uint64 // names whose first value was seen (New allows at most 64)
	best, rids := len(names), 0
	for k, v := range h.All() {
		if len(k) == len(hdrRequestID) && bytes.EqualFold(k, bytesconv.S2B(hdrRequestID)) {
			rids++
		}
		for i, name := range names[:best] {
			if len(k) != len(name) || seen&(1<<i) != 0 || !bytes.EqualFold(k, bytesconv.S2B(name)) {
				continue
			}
			seen |= 1 << i
			if len(v) > 0 && len(v) <= 128 && printableASCII(v) {
				id, best = v, i
			}
			break
		}
	}
	if id != nil && rids == 1 && len(names[best]) == len(hdrRequestID) && bytes.EqualFold(bytesconv.S2B(names[best]), bytesconv.S2B(hdrRequestID)) {
		return id
	}
	if id == nil {
		id = s.newRequestID((*[32]byte)(buf[:32]))
	} else {
		id = buf[:copy(buf[:], id)]
	}
	if rids > 0 {
		h.Del(hdrRequestID) // every copy: the worker sees one id
	}
	h.SetCanonical(bytesconv.S2B(hdrRequestID), id)
	return id
}

// maxRequestIDHeaders bounds Config.RequestIDHeaders (requestID marks the
// names it saw in one 64-bit word).
const maxRequestIDHeaders = 64

// newRequestID writes a fresh request id into buf and returns it: 32 hex
// digits of a per-process random prefix and a sequence number.
func (s *Server) newRequestID(buf *[32]byte) []byte {
	binary.LittleEndian.PutUint64(buf[16:24], s.ridSeq.Add(1))
	copy(buf[24:], s.ridPrefix[:])
	hex.Encode(buf[:], buf[16:])
	return buf[:]
}

func printableASCII(b []byte) bool {
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}
