package loadview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestIsConnectErrorTable(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"dial timeout", fasthttp.ErrDialTimeout, true},
		{"wrapped dial timeout", fmt.Errorf("upstream: %w", fasthttp.ErrDialTimeout), true},
		{"tls handshake timeout", fasthttp.ErrTLSHandshakeTimeout, true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"no route", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.EHOSTUNREACH}, true},
		{"bare refused errno", syscall.ECONNREFUSED, true},
		{"dns", &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}, true},
		{"read reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false},
		{"write reset", &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, false},
		{"read refused?", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{"request deadline", fasthttp.ErrTimeout, false},
		{"closed", fasthttp.ErrConnectionClosed, false},
		{"eof", io.EOF, false},
		{"other", errors.New("boom"), false},
	}
	for _, c := range cases {
		if got := IsConnectError(c.err); got != c.want {
			t.Errorf("%s: IsConnectError(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

// do sends one GET through w's upstream client.
func do(w *Worker, timeout time.Duration) (time.Duration, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(w.BaseURL() + "/v1/models")
	start := time.Now()
	var err error
	if timeout > 0 {
		err = w.Client().DoTimeout(req, resp, timeout)
	} else {
		err = w.Client().Do(req, resp)
	}
	return time.Since(start), err
}

func TestConnectRefusedIsConnectError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r := NewRegistry(Config{ConnectTimeout: time.Second, HealthTimeout: time.Second, Logger: quiet()})
	ws, err := r.Add(context.Background(), "http://"+addr, []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := do(ws[0], 0); !IsConnectError(err) {
		t.Fatalf("refused port: IsConnectError(%v) = false", err)
	}
}

func TestConnectTimeoutIsConnectError(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	blackhole := func(string) (net.Conn, error) { <-stop; return nil, errors.New("stopped") } // an unroutable address
	r := NewRegistry(Config{
		Dial: blackhole, ConnectTimeout: 50 * time.Millisecond,
		RequestTimeout: time.Minute, HealthTimeout: time.Minute, Logger: quiet(),
	})
	ws, err := r.Add(context.Background(), "http://unroutable:80", []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	took, err := do(ws[0], 0)
	if !errors.Is(err, fasthttp.ErrDialTimeout) || !IsConnectError(err) {
		t.Fatalf("blocked dial: %v (IsConnectError %v)", err, IsConnectError(err))
	}
	if took > 20*time.Second {
		t.Fatalf("dial bounded by the request timeout (%v), not the connect timeout", took)
	}
}

func TestCustomDialErrorIsConnectError(t *testing.T) {
	r := NewRegistry(Config{Dial: func(string) (net.Conn, error) { return nil, errors.New("listener closed") }, Logger: quiet()})
	ws, _ := r.Add(context.Background(), "http://mem:80", []string{"m"})
	if _, err := do(ws[0], 0); !IsConnectError(err) {
		t.Fatalf("custom dial failure: IsConnectError(%v) = false", err)
	}
}

func TestSilentServerIsNotConnectError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, 16)
	go func() { // accept and never answer
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	defer func() {
		for len(held) > 0 {
			(<-held).Close()
		}
	}()
	r := NewRegistry(Config{RequestTimeout: 100 * time.Millisecond, HealthTimeout: 100 * time.Millisecond, Logger: quiet()})
	ws, err := r.Add(context.Background(), "http://"+ln.Addr().String(), []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := do(ws[0], 0); err == nil || IsConnectError(err) {
		t.Fatalf("read timeout: IsConnectError(%v) = true", err)
	}
	if _, err := do(ws[0], 100*time.Millisecond); err == nil || IsConnectError(err) {
		t.Fatalf("request deadline: IsConnectError(%v) = true", err)
	}
}

func TestDiscoveryBodyIsBounded(t *testing.T) {
	huge := `{"data":[{"id":"` + strings.Repeat("a", 2<<20) + `"}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/models" {
			io.WriteString(w, huge) //nolint:errcheck
		}
	}))
	defer srv.Close()
	r := NewRegistry(Config{Logger: quiet()})
	if _, err := r.discover(context.Background(), srv.URL); !errors.Is(err, fasthttp.ErrBodyTooLarge) {
		t.Fatalf("2 MiB /v1/models: %v, want ErrBodyTooLarge", err)
	}
	ws, err := r.Add(context.Background(), srv.URL, nil)
	if err != nil || ws[0].Models() != nil || !ws[0].Healthy() {
		t.Fatalf("Add: err %v models %d healthy %v", err, len(ws[0].Models()), ws[0].Healthy())
	}
}
