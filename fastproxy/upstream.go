package fastproxy

import (
	"crypto/tls"
	"errors"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/connwatch"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/upstream"
)

// errClientGone: the client closed its connection while the router waited
// for the worker; the upstream exchange was cancelled (its connection
// closed, which makes vLLM abort the request).
var errClientGone = errors.New("client closed the connection")

// clientWatcher polls the client connections of buffered requests in
// flight, one goroutine for all of them (connwatch).
var clientWatcher = connwatch.New(100 * time.Millisecond)

// do sends ctx.Request to w and reads the whole response into resp. When
// the worker's client runs on the cancellable transport (loadview's
// default), the exchange is cancelled as soon as the client leaves.
func (s *Server) do(ctx *fasthttp.RequestCtx, st *reqState, w *loadview.Worker, resp *fasthttp.Response, timeout time.Duration) error {
	hc := w.Client()
	t, ok := hc.Transport.(*upstream.Transport)
	if !ok {
		return hc.DoTimeout(&ctx.Request, resp, timeout)
	}
	st.cancel.Reset()
	reg := registration(ctx.Conn(), st)
	clientWatcher.Start(reg, ctx.Conn(), st.onGone)
	err := t.DoCanceler(hc, &ctx.Request, resp, timeout, &st.cancel)
	clientWatcher.Stop(reg)
	if errors.Is(err, upstream.ErrCanceled) {
		return errClientGone
	}
	return err
}

// registration is the client connection's clientWatcher registration:
// the one its accepted connection keeps (TLS unwrapped), which each of its
// requests reuses without allocating, else st's own.
func registration(c net.Conn, st *reqState) *connwatch.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitConn); ok {
		return &lc.watch
	}
	return &st.watch
}

// doStream sends ctx.Request to w and returns once the response headers
// arrived; the body is read from resp.BodyStream() by the relay. A stream
// whose client leaves is cancelled by the relay's Close.
//
// The first-byte timeout does not apply to streams yet: the wait for their
// headers shares one deadline with the whole stream in fasthttp's
// transport, so a shorter deadline would cut long generations.
func (s *Server) doStream(ctx *fasthttp.RequestCtx, w *loadview.Worker, up *fasthttp.Response) error {
	return w.Client().DoTimeout(&ctx.Request, up, s.cfg.RequestTimeout)
}
