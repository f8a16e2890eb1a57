// Package upstream provides a fasthttp.RoundTripper whose buffered
// (non-streaming) exchanges can be cancelled from another goroutine.
//
// fasthttp's HostClient.Do has no context and keeps its connections private,
// so an in-flight request cannot be stopped: when the router's client goes
// away, the upstream worker keeps generating for it. vLLM aborts a request as
// soon as its HTTP connection closes, so closing the upstream connection is the
// cancellation. Transport does buffered exchanges on connections it owns
// (a small per-host keep-alive pool) and can therefore close the one an
// exchange is using.
//
// Wiring:
//
//	t := upstream.NewTransport(upstream.Config{ConnectTimeout: 3 * time.Second})
//	hc.Transport = t // once, before hc is used
//
//	// per request, in the handler:
//	err := t.Do(hc, req, resp, timeout, cancelCh) // cancelCh may be nil
//
// or, without the helper goroutine that a channel needs:
//
//	c := new(upstream.Canceler)
//	stop := watcher.Watch(ctx.Conn(), c.Cancel)
//	err := t.DoCanceler(hc, req, resp, timeout, c)
//	stop()
//
// Do and DoCanceler make a buffered exchange's attempts themselves, with the
// HostClient's retry policy, its User-Agent default and its scheme check,
// rather than through hc.Do, whose only way to hand the transport a deadline
// and a Canceler would be a registry keyed by the request: one map insert,
// lookup and delete per request, and HostClient's own clock reads. Not kept
// from hc.Do: its PendingRequests count.
//
// A buffered request larger than the write buffer leaves in one writev, the
// body sent from where it is (vecwrite.go), as nginx sends it; fasthttp's own
// Request.Write would make two writes and copy part of the body.
//
// Responses with resp.StreamBody set (or a HostClient with
// StreamResponseBody) are delegated unchanged to fasthttp.DefaultTransport,
// which uses the HostClient's own pool; closing their body stream already
// interrupts them.
package upstream
