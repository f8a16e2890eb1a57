package upstream

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// Small buffered POST over loopback to a fasthttp server, one at a time and
// in parallel. DefaultTransport is fasthttp's own; the others go through
// Transport: plain hc.DoTimeout (unregistered), Do with a nil channel
// (registered, not cancellable), DoCanceler (registered + Canceler, no
// goroutine), and Do with a cancel channel (one goroutine per request).

func benchSetup(b *testing.B, tr fasthttp.RoundTripper) (*fasthttp.HostClient, string) {
	ln := startServer(b, func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString(`{"ok":true}`) })
	addr := ln.Addr().String()
	return &fasthttp.HostClient{Addr: addr, Transport: tr, MaxConns: 1024}, addr
}

func benchRun(b *testing.B, tr *Transport, mode string) {
	var rt fasthttp.RoundTripper
	if tr != nil {
		rt = tr
	}
	hc, addr := benchSetup(b, rt)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req := newReq(addr, "POST", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		resp := fasthttp.AcquireResponse()
		cancel := make(chan struct{})
		for pb.Next() {
			var err error
			switch mode {
			case "hc":
				err = hc.DoTimeout(req, resp, 5*time.Second)
			case "nil":
				err = tr.Do(hc, req, resp, 5*time.Second, nil)
			case "canceler":
				err = tr.DoCanceler(hc, req, resp, 5*time.Second, new(Canceler))
			case "chan":
				err = tr.Do(hc, req, resp, 5*time.Second, cancel)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkDefaultTransport(b *testing.B)      { benchRun(b, nil, "hc") }
func BenchmarkTransport(b *testing.B)             { benchRun(b, NewTransport(Config{}), "hc") }
func BenchmarkTransportDoNilChan(b *testing.B)    { benchRun(b, NewTransport(Config{}), "nil") }
func BenchmarkTransportDoCanceler(b *testing.B)   { benchRun(b, NewTransport(Config{}), "canceler") }
func BenchmarkTransportDoCancelChan(b *testing.B) { benchRun(b, NewTransport(Config{}), "chan") }
