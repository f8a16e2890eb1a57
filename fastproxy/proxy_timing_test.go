package fastproxy_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// BenchmarkProxy compares the whole warmroute handler (body scan, session
// and history routing, load accounting, headers, metrics) with a bare
// fasthttp pass-through handler, both over in-memory listeners in front of
// the same zero-latency upstream, so that the ratio is the price of routing:
//
//	go test -run '^$' -bench Proxy -benchmem -count 6 ./fastproxy | tee new.txt
func BenchmarkProxy(b *testing.B) {
	dialUp := chatUpstream(b)

	bare := &fasthttp.HostClient{Addr: "upstream:80", Dial: dialUp, MaxConns: 1024}
	bareHandler := func(ctx *fasthttp.RequestCtx) {
		if err := bare.Do(&ctx.Request, &ctx.Response); err != nil {
			ctx.Error(err.Error(), fasthttp.StatusBadGateway)
		}
	}

	srv := benchRouter(b, dialUp)

	for _, size := range []int{1 << 10, 16 << 10, 64 << 10} {
		body := benchBody(size)
		for _, c := range []struct {
			name    string
			handler fasthttp.RequestHandler
		}{{"bare", bareHandler}, {"warmroute", srv.Handler}} {
			b.Run(c.name+"/"+strconv.Itoa(size>>10)+"KB", func(b *testing.B) {
				benchChats(b, c.handler, body, -1)
			})
		}
	}
}

// serveInMemory serves handler on an in-memory listener, closed with b,
// and returns a client of it.
func serveInMemory(b *testing.B, handler fasthttp.RequestHandler) *fasthttp.HostClient {
	ln := fasthttputil.NewInmemoryListener()
	go fasthttp.Serve(ln, handler) //nolint:errcheck
	b.Cleanup(func() { ln.Close() })
	return &fasthttp.HostClient{Addr: "router:80", Dial: func(string) (net.Conn, error) { return ln.Dial() }, MaxConns: 1024}
}

// benchRouter is a cache_aware router, its queue on as the binary runs it,
// in front of the one worker "upstream:80" that dial reaches.
func benchRouter(b *testing.B, dial fasthttp.DialFunc) *fastproxy.Server {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{Dial: dial, Logger: quiet})
	ws, _ := reg.Add(context.Background(), "http://upstream:80", []string{"m"})
	reg.SetHealthy(ws[0], true)
	policy, _ := route.New("cache_aware", reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()})
	srv, err := fastproxy.New(fastproxy.Config{Registry: reg, Policy: policy, Logger: quiet, QueueSize: 100})
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// benchBody is a chat request of about n bytes: a long system prompt and a
// few turns.
func benchBody(n int) []byte {
	var s strings.Builder
	s.WriteString(`{"model":"m","messages":[{"role":"system","content":"`)
	s.WriteString(strings.Repeat("You are a careful agent. ", max(1, (n-300)/25)))
	s.WriteString(`"},{"role":"user","content":"find the booking"},{"role":"assistant","content":"which one?"},{"role":"user","content":"the last one"}]}`)
	return []byte(s.String())
}

// BenchmarkStream is BenchmarkProxy for a streamed answer: 100 chat chunks
// and [DONE], each flushed on its own, through the router's relay:
//
//	go test -run '^$' -bench Stream -benchmem -count 6 ./fastproxy | tee new.txt
func BenchmarkStream(b *testing.B) {
	upstream := fasthttputil.NewInmemoryListener()
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	go fasthttp.Serve(upstream, func(ctx *fasthttp.RequestCtx) { //nolint:errcheck
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			for range 100 {
				w.Write(chunk) //nolint:errcheck
				w.Flush()      //nolint:errcheck
			}
			w.WriteString("data: [DONE]\n\n") //nolint:errcheck
		})
	})
	defer upstream.Close()
	dialUp := func(string) (net.Conn, error) { return upstream.Dial() }

	srv := benchRouter(b, dialUp)
	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"count to a hundred"}]}`)
	benchChats(b, srv.Handler, body, 100*len(chunk)+len("data: [DONE]\n\n"))
}

// benchChats sends body to h as chat completions of 64 sessions from
// parallel clients in memory, b.N in all, each answered 200 (with want
// bytes, unless want < 0).
func benchChats(b *testing.B, h fasthttp.RequestHandler, body []byte, want int) {
	client := serveInMemory(b, h)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		i := 0
		for pb.Next() {
			req.SetRequestURI("http://router/v1/chat/completions")
			req.Header.SetMethod("POST")
			req.Header.Set("X-Session-ID", "s"+strconv.Itoa(i%64))
			req.SetBody(body)
			if err := client.Do(req, resp); err != nil || resp.StatusCode() != 200 || want >= 0 && len(resp.Body()) != want {
				b.Fatalf("status %d, %d bytes, err %v", resp.StatusCode(), len(resp.Body()), err)
			}
			i++
		}
	})
}

// chatUpstream serves a short chat completion to every request over an
// in-memory listener, closed when b ends, and returns its dialer.
func chatUpstream(b *testing.B) func(string) (net.Conn, error) {
	upstream := fasthttputil.NewInmemoryListener()
	reply := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`)
	go fasthttp.Serve(upstream, func(ctx *fasthttp.RequestCtx) { //nolint:errcheck
		ctx.SetContentType("application/json")
		ctx.SetBody(reply)
	})
	b.Cleanup(func() { upstream.Close() })
	return func(string) (net.Conn, error) { return upstream.Dial() }
}
