package upstream

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// sseAnswer is a streamed answer of n SSE events of about a token each, as
// one chunk per event.
func sseAnswer(n int) string {
	var b strings.Builder
	b.WriteString(sseHead)
	for i := range n {
		b.WriteString(chunk(`data: {"choices":[{"delta":{"content":"tok"},"index":0}],"n":` + strings.Repeat("7", i%4+1) + "}\n\n"))
	}
	b.WriteString(chunk("data: [DONE]\n\n") + "0\r\n\r\n")
	return b.String()
}

// startSSE answers every request on every connection with answer, written
// at once; it allocates nothing per request once a connection is warm.
func startSSE(t testing.TB, answer string) string {
	ln := listen(t)
	out := []byte(answer)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				var req fasthttp.Request
				for {
					if err := req.Read(br); err != nil {
						return
					}
					if _, err := c.Write(out); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func readAll(b *testing.B, r io.Reader, buf []byte) {
	for {
		_, err := r.Read(buf)
		if err == io.EOF {
			return
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStream: one streamed answer of 100 events at a time, read whole:
// Stream, Body.Read and Close against hc.DoTimeout with resp.StreamBody
// (delegated to fasthttp's transport and the HostClient's pool).
func BenchmarkStream(b *testing.B) {
	addr := startSSE(b, sseAnswer(100))
	lim := StreamLimits{Timeout: 30 * time.Second, FirstByte: 10 * time.Second, Stall: 5 * time.Second}
	b.Run("Stream", func(b *testing.B) {
		tr := NewTransport(Config{})
		hc := newHC(addr, tr)
		req, resp := streamReq(addr), fasthttp.AcquireResponse()
		c := new(Canceler)
		buf := make([]byte, 4096)
		b.ReportAllocs()
		for b.Loop() {
			c.Reset()
			body, err := tr.Stream(hc, req, resp, lim, c)
			if err != nil {
				b.Fatal(err)
			}
			readAll(b, body, buf)
			body.Close()
		}
	})
	b.Run("delegated", func(b *testing.B) {
		tr := NewTransport(Config{})
		hc := newHC(addr, tr)
		req, resp := streamReq(addr), fasthttp.AcquireResponse()
		buf := make([]byte, 4096)
		b.ReportAllocs()
		for b.Loop() {
			resp.StreamBody = true
			if err := hc.DoTimeout(req, resp, lim.Timeout); err != nil {
				b.Fatal(err)
			}
			readAll(b, resp.BodyStream(), buf)
			resp.CloseBodyStream()
		}
	})
}
