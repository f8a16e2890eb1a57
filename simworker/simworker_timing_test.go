package simworker

import (
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// go test -run ^$ -bench . -benchmem -count 5 ./simworker/

func BenchmarkBlockHashes(b *testing.B) {
	prompt := []byte(strings.Repeat("0123456789abcdef", 4096)) // 64 KB
	dst := make([]uint64, 0, len(prompt)/64)
	b.SetBytes(int64(len(prompt)))
	b.ReportAllocs()
	for b.Loop() {
		dst = blockHashes(dst[:0], 1, prompt, 64)
	}
}

func BenchmarkCacheLookupInsert(b *testing.B) {
	c := newPrefixCache(8192)
	chain := blockHashes(nil, 1, []byte(strings.Repeat("x", 64<<10)), 64)
	b.ReportAllocs()
	for b.Loop() {
		c.lookupInsert(chain, nil)
	}
}

// BenchmarkHandlerChat is the worker's CPU cost per non-streamed chat
// request in zero-latency mode (TimeScale 0), without the network.
func BenchmarkHandlerChat(b *testing.B) {
	for _, size := range []int{1 << 10, 16 << 10, 64 << 10} {
		b.Run(strconv.Itoa(size>>10)+"KB", func(b *testing.B) {
			w := New(Config{TimeScale: 0, MaxTokens: 16})
			defer w.Close()
			body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("a", size) + `"}]}`)
			var ctx fasthttp.RequestCtx
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				ctx.Request.Reset()
				ctx.Response.Reset()
				ctx.Request.Header.SetMethod(fasthttp.MethodPost)
				ctx.Request.SetRequestURI("/v1/chat/completions")
				ctx.Request.SetBody(body)
				w.Handler(&ctx)
				if ctx.Response.StatusCode() != 200 {
					b.Fatalf("status %d: %s", ctx.Response.StatusCode(), ctx.Response.Body())
				}
			}
		})
	}
}

// BenchmarkHandlerZeroWork is the worker's CPU cost per request in
// zero-work mode, without the network: the body is never decoded.
func BenchmarkHandlerZeroWork(b *testing.B) {
	w := New(Config{ZeroWork: true})
	defer w.Close()
	body := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("a", 64<<10) + `"}]}`)
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	for b.Loop() {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.Header.SetMethod(fasthttp.MethodPost)
		ctx.Request.SetRequestURI("/v1/chat/completions")
		ctx.Request.SetBody(body)
		w.Handler(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("status %d", ctx.Response.StatusCode())
		}
	}
}
