package learn

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// recorder is a policy that learns: it keeps every report Observe gets.
type recorder struct {
	mu    sync.Mutex
	heard []route.Served
}

func (*recorder) Name() string                       { return "recorder" }
func (*recorder) Reads() route.Depth                 { return route.ReadsModel }
func (*recorder) Select(*route.Request) route.Choice { return route.Choice{} }
func (r *recorder) Observe(_ route.Choice, s *route.Served) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heard = append(r.heard, *s)
}

// plain is a policy that learns nothing.
type plain struct{}

func (plain) Name() string                       { return "plain" }
func (plain) Reads() route.Depth                 { return route.ReadsModel }
func (plain) Select(*route.Request) route.Choice { return route.Choice{} }

// workers registers n workers at addresses where nothing listens (the
// observer only reads their identity and load).
func workers(t *testing.T, n int) []*loadview.Worker {
	t.Helper()
	reg := loadview.NewRegistry(loadview.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var ws []*loadview.Worker
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + ln.Addr().String()
		ln.Close()
		added, err := reg.Add(context.Background(), url, []string{"m"})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, added...)
	}
	return ws
}

const (
	usageBody  = `{"id":"c1","choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":60}}}`
	noCacheKey = `{"id":"c1","choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":100,"completion_tokens":5}}`
	sseUsage   = "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n" +
		"data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":80,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n"
)

func TestNobodyLearnsNoObserver(t *testing.T) {
	r := New(Config{Policy: plain{}})
	o := r.Observer(Turn{Model: "m"})
	if o != nil {
		t.Fatal("an observer for an answer nobody learns from")
	}
	o.Release() // nil-safe: the request releases what it holds, whatever it is
}

func TestPolicyLearnsFromAWholeAnswer(t *testing.T) {
	p := &recorder{}
	w := workers(t, 1)[0]
	f := func(body string, wantCached int) {
		t.Helper()
		p.heard = nil
		o := New(Config{Policy: p}).Observer(Turn{Model: "m"})
		o.Sending(route.Choice{Worker: w}, false)
		o.Answer([]byte(body), false, w)
		o.Release()
		if len(p.heard) != 1 {
			t.Fatalf("policy heard %d reports, want 1", len(p.heard))
		}
		s := p.heard[0]
		if s.PromptTokens != 100 || s.CompletionTokens != 5 || s.CachedTokens != wantCached || s.Stream {
			t.Fatalf("report %+v, want 100 prompt, 5 completion, %d cached, not streamed", s, wantCached)
		}
		if s.TTFB < 0 || s.Elapsed < s.TTFB {
			t.Fatalf("TTFB %v, elapsed %v", s.TTFB, s.Elapsed)
		}
	}
	f(usageBody, 60)
	f(noCacheKey, -1) // no prompt_tokens_details: unknown, never "nothing cached"
}

func TestStreamTeachesOnlyWhenItEndsComplete(t *testing.T) {
	p := &recorder{}
	w := workers(t, 1)[0]
	r := New(Config{Policy: p})

	o := r.Observer(Turn{Model: "m"})
	o.Sending(route.Choice{Worker: w}, true)
	o.Chunk([]byte(sseUsage), false, w)
	o.Chunk([]byte("data: [DONE]\n\n"), false, w)
	o.Done(w)
	o.Release()
	if len(p.heard) != 1 {
		t.Fatalf("policy heard %d reports, want 1", len(p.heard))
	}
	if s := p.heard[0]; s.PromptTokens != 80 || s.CachedTokens != 16 || s.CompletionTokens != 3 || !s.Stream {
		t.Fatalf("report %+v, want the stream's usage", s)
	}

	cut := r.Observer(Turn{Model: "m"}) // a stream the worker cut: the relay never calls Done
	cut.Sending(route.Choice{Worker: w}, true)
	cut.Chunk([]byte(sseUsage), true, w)
	cut.Release()
	if len(p.heard) != 1 {
		t.Fatal("a cut stream taught the policy")
	}
}

// A report on another worker than the one chosen (a pinned or failed-over
// answer) says nothing about the choice.
func TestAnotherWorkersAnswerTeachesNothing(t *testing.T) {
	p := &recorder{}
	ws := workers(t, 2)
	o := New(Config{Policy: p}).Observer(Turn{Model: "m"})
	o.Sending(route.Choice{Worker: ws[0]}, false)
	o.Answer([]byte(usageBody), false, ws[1])
	o.Release()
	if len(p.heard) != 0 {
		t.Fatalf("policy heard %+v", p.heard)
	}
}

// A pooled observer comes back empty: nothing of the last answer leaks
// into the next.
func TestReleasedObserverForgetsItsAnswer(t *testing.T) {
	p := &recorder{}
	w := workers(t, 1)[0]
	r := New(Config{Policy: p})
	o := r.Observer(Turn{Model: "m", Session: []byte("s1")})
	o.Sending(route.Choice{Worker: w}, false)
	o.Chunk([]byte(sseUsage), false, w)
	o.Release()
	o = r.Observer(Turn{Model: "m"})
	if o.learned.HasUsage || len(o.session) != 0 || o.choice.Worker != nil {
		t.Fatalf("a reused observer remembers: usage %v session %q", o.learned.HasUsage, o.session)
	}
	o.Release()
}
