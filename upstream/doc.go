// Package upstream provides a fasthttp.RoundTripper whose exchanges, buffered
// and streamed, can be cancelled from another goroutine.
//
// fasthttp's HostClient.Do has no context and keeps its connections private,
// so an in-flight request cannot be stopped: when the router's client goes
// away, the upstream worker keeps generating for it. vLLM aborts a request as
// soon as its HTTP connection closes, so closing the upstream connection is the
// cancellation. Transport does its exchanges on connections it owns
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
// Streamed answers (an LLM's SSE stream) go through Stream, on the same pool:
//
//	c := new(upstream.Canceler) // or one per request, Reset between uses
//	stop := watcher.Watch(ctx.Conn(), c.Cancel)
//	body, err := t.Stream(hc, req, resp, upstream.StreamLimits{
//		Timeout:   30 * time.Minute, // the whole exchange
//		FirstByte: 5 * time.Minute,  // until the response headers
//		Stall:     2 * time.Minute,  // between body bytes
//	}, c)
//	if err == nil {
//		// resp holds the headers; read the body from body, then
//		body.Close()
//	}
//	stop()
//
// The Canceler stays bound to the connection until Body.Close, so a client
// that leaves mid-stream closes the upstream connection at once and the
// blocked Body.Read returns ErrCanceled. Headers that do not come within
// FirstByte give ErrFirstByte; a body that sends nothing for Stall gives
// ErrStalled; Timeout gives fasthttp.ErrTimeout. The stall bound moves with
// every byte, so its read deadline is armed lazily (docs/design.md §7): the
// armed timer stays until it fires, and a read it interrupts early arms the
// deadline wanted and goes on. A Body read to its end gives its connection
// back to the pool; Body objects are pooled, so a stream allocates nothing
// beyond what fasthttp's response parsing does.
//
// Responses with resp.StreamBody set (or a HostClient with
// StreamResponseBody) that go through hc.Do, Do or DoCanceler rather than
// Stream are delegated unchanged to fasthttp.DefaultTransport, which uses the
// HostClient's own pool: one deadline for headers and body, not cancellable
// once started; closing their body stream interrupts them.
package upstream
