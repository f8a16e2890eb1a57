package upstream

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// rawServer answers every request on every connection with a fixed 200 and
// sends the raw bytes of each request (headers and body, as read) on got.
func rawServer(t *testing.T) (string, <-chan []byte) {
	t.Helper()
	ln := listen(t)
	got := make(chan []byte, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var raw bytes.Buffer
				br := bufio.NewReader(io.TeeReader(c, &raw))
				for {
					var req fasthttp.Request
					if err := req.Read(br); err != nil {
						return
					}
					// what the request took: all read minus what is still buffered
					n := raw.Len() - br.Buffered()
					b := append([]byte(nil), raw.Bytes()[:n]...)
					raw.Next(n)
					got <- b
					if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), got
}

// serialize is what fasthttp's own Request.Write puts on the wire for req.
func serialize(t *testing.T, req *fasthttp.Request) []byte {
	t.Helper()
	var b bytes.Buffer
	bw := bufio.NewWriterSize(&b, 4096)
	if err := req.Write(bw); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// The bytes on the wire are exactly fasthttp's, for bodies and headers on
// both sides of the copy threshold and of the write buffer, on one
// keep-alive connection.
func TestVectoredWriteBytes(t *testing.T) {
	for _, wbuf := range []int{0, 16 << 10} {
		testVectoredWriteBytes(t, wbuf)
	}
}

func testVectoredWriteBytes(t *testing.T, wbuf int) {
	addr, got := rawServer(t)
	tr := NewTransport(Config{WriteBufferSize: wbuf})
	hc := newHC(addr, tr)
	for _, size := range []int{0, 1, 100, vecBufSize - 200, vecBufSize, vecBufSize + 1, 1122, 4096, 16 << 10, 17760, 66124, 1 << 20} {
		for _, bigHeader := range []bool{false, true} {
			for _, method := range []string{"POST", "GET"} {
				if method == "GET" && size > 0 {
					continue
				}
				body := strings.Repeat("x", size)
				req := newReq(addr, method, body)
				req.Header.Set("X-Session-ID", "sess-1")
				if bigHeader {
					req.Header.Set("X-Big", strings.Repeat("h", 3*vecBufSize))
				}
				resp := fasthttp.AcquireResponse()
				if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil {
					t.Fatalf("size %d: %v", size, err)
				}
				if string(resp.Body()) != "ok" {
					t.Fatalf("size %d: response %q", size, resp.Body())
				}
				var wire []byte
				select {
				case wire = <-got:
				case <-time.After(5 * time.Second):
					t.Fatalf("size %d: the server got no request", size)
				}
				if want := serialize(t, req); !bytes.Equal(wire, want) {
					t.Fatalf("%s size %d big header %v: wire differs from fasthttp's Request.Write:\n got %d B %.200q\nwant %d B %.200q",
						method, size, bigHeader, len(wire), wire, len(want), want)
				}
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
			}
		}
	}
	if n := tr.IdleConns(addr, false); n != 1 {
		t.Fatalf("idle connections = %d, want the one connection reused", n)
	}
}

// A body larger than the copy threshold is sent from where it is: at most
// vecBufSize bytes are copied, and the pooled writer keeps no reference to
// the request afterwards.
func TestVectoredWriteNoCopy(t *testing.T) {
	body := []byte(strings.Repeat("y", 17760))
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://127.0.0.1:1/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.SetBodyRaw(body)
	v := newVecWriter()
	if err := req.Write(v.bw); err != nil {
		t.Fatal(err)
	}
	if err := v.bw.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(v.segs) != 2 {
		t.Fatalf("pieces = %d, want 2 (header with the body's start, then the body in place)", len(v.segs))
	}
	last := v.segs[len(v.segs)-1]
	end := unsafe.Pointer(unsafe.SliceData(body[len(body)-1:]))
	if unsafe.Pointer(unsafe.SliceData(last[len(last)-1:])) != end {
		t.Fatal("the body's tail was copied, not sent in place")
	}
	if len(v.own) > vecBufSize {
		t.Fatalf("copied %d bytes, want at most %d", len(v.own), vecBufSize)
	}
	if want := serialize(t, req); !bytes.Equal(bytes.Join(v.segs, nil), want) {
		t.Fatal("the pieces are not the request")
	}
	v.reset()
	for _, s := range v.segs[:cap(v.segs)] {
		if s != nil {
			t.Fatal("reset kept a reference to the request")
		}
	}
}

// Requests the vectored path does not take (trailers, body streams, TLS are
// covered by tls_test.go) still go out intact through the buffered writer.
func TestVectoredWriteFallbacks(t *testing.T) {
	addr, got := rawServer(t)
	tr := NewTransport(Config{})
	hc := newHC(addr, tr)

	req := newReq(addr, "POST", strings.Repeat("z", 9000))
	if err := req.Header.SetTrailer("X-Checksum"); err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Checksum", "abc")
	if c, _ := net.Dial("tcp", addr); c != nil {
		if vectorable(c, req) {
			t.Fatal("a request with trailers must not be vectored")
		}
		c.Close()
	}
	resp := fasthttp.AcquireResponse()
	if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	wire := <-got
	if !bytes.Contains(wire, []byte("X-Checksum: abc")) || !bytes.Contains(wire, []byte(strings.Repeat("z", 9000)[:100])) {
		t.Fatalf("chunked request with trailer mangled: %.300q", wire)
	}

	req2 := newReq(addr, "POST", "")
	req2.SetBodyStream(strings.NewReader(strings.Repeat("s", 5000)), 5000)
	if err := tr.Do(hc, req2, resp, 5*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	wire = <-got
	if !bytes.HasSuffix(wire, []byte(strings.Repeat("s", 5000))) || !bytes.Contains(wire, []byte("Content-Length: 5000")) {
		t.Fatalf("body stream request mangled: %.300q", wire)
	}
}
