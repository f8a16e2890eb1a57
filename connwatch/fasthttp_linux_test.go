//go:build linux

package connwatch

import (
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// A fasthttp handler waiting on a long call learns that its client left.
func TestFasthttpHandler(t *testing.T) {
	w := New(testInterval)
	ln := listen(t)
	result := make(chan string, 1)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ch := make(chan struct{})
		stop := w.Watch(ctx.Conn(), func() { close(ch) })
		defer stop()
		if w.Len() == 0 {
			result <- "not watched"
			return
		}
		result <- "waiting"
		select {
		case <-ch:
			result <- "gone"
		case <-time.After(5 * time.Second):
			result <- "timeout"
		}
	}}
	go srv.Serve(ln) //nolint:errcheck
	defer srv.Shutdown()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")); err != nil {
		t.Fatal(err)
	}
	if r := <-result; r != "waiting" {
		t.Fatal(r)
	}
	c.Close()
	if r := <-result; r != "gone" {
		t.Fatal(r)
	}
}
