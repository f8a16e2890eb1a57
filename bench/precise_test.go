package bench

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
)

// chatBody is a /v1/chat/completions body of messages (user and assistant
// alternating, user first) with one answer token.
func chatBody(t *testing.T, texts ...string) []byte {
	t.Helper()
	var ms []map[string]string
	for i, s := range texts {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		ms = append(ms, map[string]string{"role": role, "content": s})
	}
	b, err := json.Marshal(map[string]any{"model": Model, "messages": ms, "max_tokens": 1})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// historyKey is the prefix key the router derives from body.
func historyKey(t *testing.T, body []byte) []byte {
	t.Helper()
	var v reqview.View
	if err := reqview.Parse(&v, body, reqview.Chat); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(v.History)
}

// serve sends body to the simulated worker at url directly and waits for
// its answer.
func serve(t *testing.T, url string, body []byte) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
}

// TestPreciseFollowsTheTrueCache: a conversation's first turn D+F ran on
// worker 0, a document D alone on worker 1; then a long unrelated prompt E
// on worker 0 evicted D+F from its small cache. The history tree still
// predicts worker 0 holds the most of the next turn D+F+G, and cache_aware
// sends it there; precise reads the caches and sends it to worker 1, which
// truly holds D.
func TestPreciseFollowsTheTrueCache(t *testing.T) {
	opt := testOptions(2, 1)
	opt.Sim.CacheBlocks = 100 // 1,600 tokens: D+F, or E, not both
	opt.setDefaults()
	f, err := startFleet(&opt, PolicyPrecise, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	p := f.policy.(*Precise)
	ca, err := route.New("cache_aware", f.reg, route.Options{CacheAware: route.DefaultCacheAwareConfig(), Rand: seqRand(1)})
	if err != nil {
		t.Fatal(err)
	}
	ws := f.reg.Workers()
	byURL := map[string]*loadview.Worker{}
	for _, w := range ws {
		byURL[w.URL()] = w
	}
	w0, w1 := byURL[f.urls[0]], byURL[f.urls[1]]

	doc := strings.Repeat("D is a document of some length. ", 90) // 2,880 characters: 45 blocks
	follow := strings.Repeat("F follows up. ", 70)
	dF := chatBody(t, doc+follow)
	d := chatBody(t, doc)
	e := chatBody(t, strings.Repeat("E is unrelated. ", 390)) // 6,240 characters: 98 blocks with its answer
	next := chatBody(t, doc+follow, "an answer", "G, the next question")

	// What each worker served, taught to cache_aware's tree as the router
	// would have (a selection restricted to that worker), then served.
	for _, step := range []struct {
		body []byte
		w    *loadview.Worker
		url  string
	}{{dF, w0, f.urls[0]}, {d, w1, f.urls[1]}, {e, w0, f.urls[0]}} {
		ch := ca.Select(&route.Request{Model: Model, Workers: []*loadview.Worker{step.w}, Subset: true, Prefix: historyKey(t, step.body)})
		if ch.Worker != step.w {
			t.Fatalf("cache_aware restricted to %s chose %v", step.w.URL(), ch.Worker)
		}
		serve(t, step.url, step.body)
	}

	chain, err := f.sims[0].PromptBlocks(next)
	if err != nil {
		t.Fatal(err)
	}
	h0, h1 := f.sims[0].HeldBlocks(chain), f.sims[1].HeldBlocks(chain)
	if h1 < 40 || h0 >= h1/4 {
		t.Fatalf("setup: worker 0 holds %d blocks of the next turn, worker 1 %d (want 0 evicted, 1 holding D)", h0, h1)
	}
	key := historyKey(t, next)
	if ch := ca.Select(&route.Request{Model: Model, Workers: ws, Prefix: key}); ch.Worker != w0 {
		t.Fatalf("cache_aware chose %v (%s): the tree was meant to predict worker 0", ch.Worker.URL(), ch.Decision)
	}
	done := p.announce(next)
	ch := p.Select(&route.Request{Model: Model, Workers: ws, Prefix: key})
	done()
	if ch.Worker != w1 || ch.Decision != route.CacheAffinity {
		t.Fatalf("precise chose %s (%s), want worker 1 (%s), which holds %d blocks against worker 0's %d",
			ch.Worker.URL(), ch.Decision, route.CacheAffinity, h1, h0)
	}
	if p.Unknown() != 0 {
		t.Fatalf("%d unannounced prompts", p.Unknown())
	}
	// Done: the prompt is forgotten, and an unannounced prompt is placed by
	// load alone, labelled so.
	if ch := p.Select(&route.Request{Model: Model, Workers: ws, Prefix: key}); ch.Decision != PreciseUnknown || p.Unknown() != 1 {
		t.Fatalf("unannounced: %s, %d unknown", ch.Decision, p.Unknown())
	}
}

// The replay client announces every request to precise: a run through
// the router finds every prompt (no PreciseUnknown label) and hits the
// cache where a session continues.
func TestPreciseRun(t *testing.T) {
	wl := Synthetic(smallSynthetic(2))
	opt := testOptions(2, 2)
	opt.SessionVia = ViaNone
	r, err := Run(t.Context(), opt, wl, PolicyPrecise, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Labels[PreciseUnknown] != 0 || r.HitClient() < 0.5 {
		t.Fatalf("errors %d (%s), labels %v, hit %.3f", r.Errors, r.FirstErr, r.Labels, r.HitClient())
	}
}
