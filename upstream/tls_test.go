package upstream

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// https upstreams: keep-alive reuse and mid-flight cancel over TLS.
func TestTLS(t *testing.T) {
	cert, key, err := fasthttp.GenerateTestCertificate("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: listen(t), closed: make(chan struct{}, 16)}
	srv := &fasthttp.Server{Handler: echoHandler}
	go srv.ServeTLSEmbed(ln, cert, key) //nolint:errcheck
	t.Cleanup(func() { srv.Shutdown() })
	addr := ln.Addr().String()

	tr := NewTransport(Config{})
	hc := &fasthttp.HostClient{Addr: addr, IsTLS: true, Transport: tr,
		TLSConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // test certificate
	for range 3 {
		req := fasthttp.AcquireRequest()
		req.SetRequestURI("https://" + addr + "/")
		req.Header.SetMethod("POST")
		req.SetBodyString("x")
		resp := fasthttp.AcquireResponse()
		if err := tr.Do(hc, req, resp, 5*time.Second, nil); err != nil {
			t.Fatal(err)
		}
		if string(resp.Body()) != "echo:x" {
			t.Fatalf("body %q", resp.Body())
		}
	}
	if ln.accepted.Load() != 1 || tr.IdleConns(addr, true) != 1 {
		t.Fatalf("accepted %d idle %d", ln.accepted.Load(), tr.IdleConns(addr, true))
	}

	// Cancel mid-flight: a raw TLS server that reads the request and hangs
	// sees its read fail when the cancel closes the connection.
	tlsCert, err := tls.X509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	hs := startHangWrap(t, nil, func(c net.Conn) net.Conn {
		return tls.Server(c, &tls.Config{Certificates: []tls.Certificate{tlsCert}})
	})
	haddr := hs.ln.Addr().String()
	hc2 := &fasthttp.HostClient{Addr: haddr, IsTLS: true, Transport: tr,
		TLSConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // test certificate
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("https://" + haddr + "/slow")
	req.Header.SetMethod("POST")
	resp := fasthttp.AcquireResponse()
	c := new(Canceler)
	errc := make(chan error, 1)
	go func() { errc <- tr.DoCanceler(hc2, req, resp, 30*time.Second, c) }()
	<-hs.gotReq
	c.Cancel()
	if err := <-errc; !errors.Is(err, ErrCanceled) {
		t.Fatalf("got %v", err)
	}
	select {
	case err := <-hs.after:
		var ne net.Error
		if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("server read after cancel: %v, want the connection closed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server did not see the TLS connection close")
	}
}
