//go:build !race

package upstream

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A steady stream's Read allocates nothing, and neither does a whole
// stream (Stream, the body read, Close) once the pools are warm. The peer
// allocates nothing per answer either: AllocsPerRun counts the process's.
func TestStreamAllocs(t *testing.T) {
	lim := StreamLimits{Timeout: 30 * time.Second, FirstByte: 10 * time.Second, Stall: 5 * time.Second}
	t.Run("Read", func(t *testing.T) {
		block := []byte(strings.Repeat(chunk(event(7)), 100))
		s := startRaw(t, func(c net.Conn, _ int) bool {
			if !write(c, sseHead) {
				return false
			}
			for {
				if _, err := c.Write(block); err != nil {
					return false
				}
			}
		})
		addr := s.ln.Addr().String()
		tr := NewTransport(Config{})
		b, err := tr.Stream(newHC(addr, tr), streamReq(addr), fasthttp.AcquireResponse(), lim, new(Canceler))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		buf := make([]byte, 64)
		allocs := testing.AllocsPerRun(2000, func() {
			if _, err := b.Read(buf); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > 0 {
			t.Fatalf("allocations per Read = %.2f, want 0", allocs)
		}
	})
	t.Run("stream", func(t *testing.T) {
		addr := startSSE(t, sseAnswer(100))
		tr := NewTransport(Config{})
		hc := newHC(addr, tr)
		req, resp := streamReq(addr), fasthttp.AcquireResponse()
		c := new(Canceler)
		buf := make([]byte, 4096)
		one := func() {
			c.Reset()
			b, err := tr.Stream(hc, req, resp, lim, c)
			if err != nil {
				t.Fatal(err)
			}
			for err == nil {
				_, err = b.Read(buf)
			}
			if err != io.EOF {
				t.Fatal(err)
			}
			b.Close()
		}
		one()
		if allocs := testing.AllocsPerRun(200, one); allocs > 0 {
			t.Fatalf("allocations per stream = %.2f, want 0", allocs)
		}
	})
}
