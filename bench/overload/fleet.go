package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/bench"
	"github.com/warmroute/warmroute/simworker"
)

// fleet is the run's batching simulated workers. Each is served by the
// harness's own fasthttp server in front of the worker's Handler, so that
// every inference request a worker receives is written to the ledger by its
// x-request-id (which the router forwards): the upstream side of the
// one-outcome check.
type fleet struct {
	sims   []*simworker.Worker
	srvs   []*fasthttp.Server
	urls   []string
	closed sync.Once
}

// startFleet starts n workers of cfg on loopback, serving bench.Model;
// their engines report each request's first token to led.
func startFleet(n int, cfg simworker.Config, led *ledger) (*fleet, error) {
	f := &fleet{}
	for i := range n {
		c := cfg
		c.Models = []string{bench.Model}
		c.Name = fmt.Sprintf("w%d", i)
		c.Seed = int64(i) + 1
		c.OnFirstToken = led.firstToken
		w := simworker.New(c)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			w.Close() //nolint:errcheck // nothing served yet
			f.close()
			return nil, err
		}
		srv := &fasthttp.Server{
			Handler:            recordDispatch(w.Handler, led),
			Name:               "simworker",
			MaxRequestBodySize: w.Config().MaxBodySize,
			IdleTimeout:        30 * time.Second,
			CloseOnShutdown:    true,
		}
		go srv.Serve(ln) //nolint:errcheck // ends at Shutdown
		f.sims = append(f.sims, w)
		f.srvs = append(f.srvs, srv)
		f.urls = append(f.urls, "http://"+ln.Addr().String())
	}
	return f, nil
}

// recordDispatch writes every POST's x-request-id to led before h serves
// it, telling a continuation of an answer (continue_final_message, which
// the router sends after preempting or losing a stream) from a request.
func recordDispatch(h fasthttp.RequestHandler, led *ledger) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if ctx.IsPost() {
			led.dispatched(string(ctx.Request.Header.Peek("X-Request-Id")), bytes.Contains(ctx.PostBody(), continuationMark))
		}
		h(ctx)
	}
}

// continuationMark is how a continuation's body says it is one.
var continuationMark = []byte(`"continue_final_message":true`)

// close stops the workers (which unblocks their streams), then their
// servers; later calls do nothing.
func (f *fleet) close() {
	f.closed.Do(func() {
		for i, srv := range f.srvs {
			f.sims[i].Close() //nolint:errcheck // the worker's own servers: none
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			srv.ShutdownWithContext(ctx) //nolint:errcheck // best effort at the end of a run
			cancel()
		}
	})
}

// requests is the inference requests the workers received, all together.
func (f *fleet) requests() uint64 {
	var n uint64
	for _, w := range f.sims {
		n += w.Stats().Requests
	}
	return n
}
