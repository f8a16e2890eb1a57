// Command bareproxy is the proxy limit of the load test (bench/loadtest): a
// bare fasthttp pass-through proxy with no logic at all. Every request is
// forwarded as is (&ctx.Request) to one upstream fasthttp.HostClient and the
// upstream response (&ctx.Response) is sent back. No body parsing, no routing,
// no headers added, no metrics: whatever warmroute spends beyond this is the
// price of its routing.
//
//	bareproxy --listen 127.0.0.1:9000 --upstream 127.0.0.1:8001
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "address to listen on")
	upstream := flag.String("upstream", "127.0.0.1:8001", "host:port of the one upstream")
	conns := flag.Int("max-conns", 1024, "upstream connections at most")
	// Buffer sizes, for the proxy-path experiments of bench/loadtest/proxyprof.sh;
	// 0 is fasthttp's default (4096).
	readBuf := flag.Int("read-buffer", 16<<10, "server read buffer (client requests)")
	writeBuf := flag.Int("write-buffer", 0, "server write buffer (responses to clients)")
	upReadBuf := flag.Int("upstream-read-buffer", 0, "upstream read buffer (worker responses)")
	upWriteBuf := flag.Int("upstream-write-buffer", 0, "upstream write buffer (requests to the worker)")
	flag.Parse()

	hc := &fasthttp.HostClient{
		Addr:                          *upstream,
		MaxConns:                      *conns,
		ReadTimeout:                   60 * time.Second,
		WriteTimeout:                  60 * time.Second,
		MaxIdleConnDuration:           time.Minute,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		NoDefaultUserAgentHeader:      true,
		ReadBufferSize:                *upReadBuf,
		WriteBufferSize:               *upWriteBuf,
	}
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Response.Reset()
				ctx.Error("upstream: "+err.Error(), fasthttp.StatusBadGateway)
			}
		},
		Name:                          "bareproxy",
		ReadBufferSize:                *readBuf,
		WriteBufferSize:               *writeBuf,
		MaxRequestBodySize:            256 << 20,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		DisableHeaderNamesNormalizing: true,
		CloseOnShutdown:               true,
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		_ = srv.Shutdown()
	}()
	fmt.Fprintf(os.Stderr, "bareproxy listening on %s -> %s\n", ln.Addr(), *upstream)
	if err := srv.Serve(ln); err != nil {
		log.Fatal(err)
	}
}
