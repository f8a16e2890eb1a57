package fastproxy

import (
	"bytes"
	"iter"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
)

// hopByHop are the headers that describe one connection, not the message
// (RFC 9110 §7.6.1): never forwarded in either direction. fasthttp handles
// Connection and Transfer-Encoding itself; the headers a Connection header
// names are hop-by-hop too.
var hopByHop = [...]string{"Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer", "Upgrade"}

// clientOnly is what a client request loses before any attempt: the
// hop-by-hop headers and a data-parallel rank, which only the router sets
// (attempt).
var clientOnly = append(hopByHop[:len(hopByHop):len(hopByHop)], hdrRankUp)

// dropHopByHopRequest removes the hop-by-hop headers of a client request,
// those listed in its Connection header included.
func dropHopByHopRequest(h *fasthttp.RequestHeader) {
	if c := h.Peek(fasthttp.HeaderConnection); len(c) > 0 {
		forEachToken(c, func(name []byte) { h.DelBytes(name) })
		h.Del(fasthttp.HeaderConnection) // the client's connection is not the worker's
	}
	if hasAny(h.All(), clientOnly) {
		for _, k := range clientOnly {
			h.Del(k)
		}
	}
}

// dropHopByHopResponse removes the hop-by-hop headers of an upstream
// response, including a Connection: close meant for the router's own
// connection and the headers that Connection names.
func dropHopByHopResponse(h *fasthttp.ResponseHeader) {
	if c := h.Peek(fasthttp.HeaderConnection); len(c) > 0 {
		forEachToken(c, func(name []byte) { h.DelBytes(name) })
	}
	h.ResetConnectionClose()
	if hasAny(h.All(), hopByHop[:]) {
		for _, k := range hopByHop {
			h.Del(k)
		}
	}
}

// hasAny reports whether a header of all is one of names. Most messages
// have none of the headers the router drops: one pass over their headers
// costs less than a delete per name, each of which normalizes the name and
// scans every header.
func hasAny(all iter.Seq2[[]byte, []byte], names []string) bool {
	for k := range all {
		for _, name := range names {
			if len(k) == len(name) && bytes.EqualFold(k, bytesconv.S2B(name)) {
				return true
			}
		}
	}
	return false
}

// forEachToken calls f with each comma-separated, trimmed token of v except
// the ones fasthttp manages itself (close, keep-alive).
func forEachToken(v []byte, f func([]byte)) {
	for len(v) > 0 {
		var tok []byte
		tok, v, _ = bytes.Cut(v, []byte{','})
		tok = bytes.TrimSpace(tok)
		if len(tok) > 0 && !bytes.EqualFold(tok, []byte("close")) && !bytes.EqualFold(tok, []byte("keep-alive")) {
			f(tok)
		}
	}
}
