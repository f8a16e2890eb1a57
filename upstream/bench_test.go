package upstream

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// Small buffered POST over loopback to a fasthttp server, one at a time and
// in parallel. DefaultTransport is fasthttp's own; the others go through
// Transport: plain hc.DoTimeout (through HostClient), Do with a nil channel
// (not cancellable), DoCanceler (a Canceler, no goroutine), and Do with a
// cancel channel (one goroutine per request).

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

// Agent-sized request bodies (the load test's 1, 16 and 64 KB) to a server
// that does not read them beyond fasthttp's own parsing, 64 clients in
// parallel: one writev per request (vecwrite.go) against fasthttp's buffered
// Request.Write through a 16 KB writer (two writes once the request outgrows
// the buffer), as warmroute configures it.
func BenchmarkTransportBody(b *testing.B) {
	for _, size := range []int{1122, 17760, 66124} {
		for _, vec := range []bool{true, false} {
			name := fmt.Sprintf("%dB/buffered", size)
			if vec {
				name = fmt.Sprintf("%dB/writev", size)
			}
			b.Run(name, func(b *testing.B) {
				tr := NewTransport(Config{ReadBufferSize: 16 << 10, WriteBufferSize: 16 << 10})
				tr.noVec = !vec
				hc, addr := benchSetup(b, tr)
				body := strings.Repeat("x", size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				b.SetParallelism(32) // 64 clients on 2 cores
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					req := newReq(addr, "POST", body)
					resp := fasthttp.AcquireResponse()
					for pb.Next() {
						if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil {
							b.Fatal(err)
						}
					}
				})
			})
		}
	}
}
