//go:build !race

package fastproxy

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/resume"
)

// endless is an upstream body that never ends: the same chunk on every Read.
type endless []byte

func (e endless) Read(p []byte) (int, error) { return copy(p, e), nil }

// TestRelayAllocatesNothingPerChunk: relaying a followed stream (SSE
// framing, and the answer kept for a continuation, issue 31) allocates
// nothing per chunk.
func TestRelayAllocatesNothingPerChunk(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{Logger: quiet})
	ws, err := reg.Add(context.Background(), "http://up:80", []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{metrics: newServerMetrics(nil), log: quiet, reg: reg, stall: time.Minute, resumeAttempts: 1, resumeMaxBytes: 1 << 20}
	r := &relay{f: f, w: ws[0], held: true, ans: new(resume.Answer), in: relayBufs.Get().(*[]byte),
		body: endless(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}` + "\n\n")}
	r.ans.Reset(resume.Chat, 1<<20)
	p := make([]byte, 4096)
	read := func() {
		if n, err := r.Read(p); n == 0 || err != nil {
			t.Fatalf("read %d, %v", n, err)
		}
	}
	for range 100 {
		read()
	}
	if n := testing.AllocsPerRun(2000, read); n > 0.02 {
		t.Fatalf("%.3f allocations per chunk", n)
	}
	if text, tokens := r.ans.Delivered(); tokens < 2000 || len(text) != 6*tokens {
		t.Fatalf("followed %d tokens, %d bytes of text", tokens, len(text))
	}
}
