package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

// alignedWorkload is 2 sessions × 3 turns whose rendered prompts (simworker's
// template: "<|user|>" text "\n" "<|assistant|>" ...) are exactly 128, 256
// and 384 bytes: 2, 4 and 6 blocks of 16 tokens × 4 characters. Turn k's
// prompt is a prefix of turn k+1's, and the sessions share no block.
func alignedWorkload() *Workload {
	w := &Workload{Name: "aligned"}
	for i := 0; i < 2; i++ {
		rng := rand.New(rand.NewPCG(uint64(i), 99))
		// 8 + 106 + 1 + 13 = 128 bytes for turn 1; each later turn adds
		// reply 40 + 1 + 8 + user 65 + 1 + 13 = 128 bytes.
		msgs := []json.RawMessage{msg("user", text(rng, 106))}
		s := Session{ID: "s" + string(rune('a'+i))}
		for k := 0; k < 3; k++ {
			if k > 0 {
				msgs = append(msgs, msg("assistant", text(rng, 40)), msg("user", text(rng, 65)))
			}
			s.Turns = append(s.Turns, Turn{Messages: msgs[:len(msgs):len(msgs)]})
		}
		w.Sessions = append(w.Sessions, s)
	}
	return w
}

func testOptions(workers, conc int) Options {
	return Options{
		Workers:     workers,
		Sim:         simworker.Config{BlockTokens: 16, CacheBlocks: 10000, TimeScale: 0},
		Concurrency: conc, MaxTokens: 4, KeepTurns: true,
		SampleEvery: time.Millisecond, RequestTimeout: 10 * time.Second,
	}
}

// TestReplayHandComputedHits: with 2 workers and one session at a time,
// sticky keeps each session on one worker, so turn k hits turn k−1's whole
// prompt (0, 32, 64 tokens of 32, 64, 96): 192 of 384 tokens. round_robin
// alternates: a1→w0 a2→w1 a3→w0 (hits a1's 32) b1→w1 b2→w0 b3→w1 (hits
// b1's 32): 64 of 384.
func TestReplayHandComputedHits(t *testing.T) {
	wl := alignedWorkload()
	f := func(policy string, wantCached []int, wantHit float64) {
		t.Helper()
		r, err := Run(context.Background(), testOptions(2, 1), wl, policy, 1)
		if err != nil {
			t.Fatal(err)
		}
		if r.Errors != 0 {
			t.Fatalf("%s: %d errors, first: %s", policy, r.Errors, r.FirstErr)
		}
		var prompt, cached []int
		for _, tr := range r.Turns {
			prompt = append(prompt, tr.Prompt)
			cached = append(cached, tr.Cached)
		}
		if want := []int{32, 64, 96, 32, 64, 96}; !reflect.DeepEqual(prompt, want) {
			t.Fatalf("%s: prompt tokens %v, want %v", policy, prompt, want)
		}
		if !reflect.DeepEqual(cached, wantCached) {
			t.Fatalf("%s: cached tokens %v, want %v", policy, cached, wantCached)
		}
		if r.HitClient() != wantHit || r.HitWorkers() != wantHit {
			t.Fatalf("%s: hit client %v workers %v, want %v", policy, r.HitClient(), r.HitWorkers(), wantHit)
		}
		if r.WorkerQueries != 384 || r.PromptTokens != 384 {
			t.Fatalf("%s: queries %v prompt %d, want 384", policy, r.WorkerQueries, r.PromptTokens)
		}
		served := 0
		for _, n := range r.Served {
			served += n
		}
		if served != 6 {
			t.Fatalf("%s: served %v", policy, r.Served)
		}
	}
	f(PolicySticky, []int{0, 32, 64, 0, 32, 64}, 0.5)
	f("round_robin", []int{0, 0, 32, 0, 0, 32}, 64.0/384)
	f(PolicyOracle, []int{0, 32, 64, 0, 32, 64}, 0.5)
}

// TestReplayAnswerLengths: with MaxTokens 0 every call asks for the answer
// the workload recorded for it, and the worker decodes exactly that many
// tokens; MaxTokens fixes one length for every call.
func TestReplayAnswerLengths(t *testing.T) {
	wl := alignedWorkload()
	for i := range wl.Sessions {
		for k := range wl.Sessions[i].Turns {
			wl.Sessions[i].Turns[k].Answer = 3 + 2*k + i
		}
	}
	for _, fixed := range []int{0, 4} {
		opt := testOptions(2, 2)
		opt.MaxTokens = fixed
		r, err := Run(context.Background(), opt, wl, "round_robin", 1)
		if err != nil || r.Errors != 0 {
			t.Fatalf("max_tokens %d: %v, %d errors (%s)", fixed, err, r.Errors, r.FirstErr)
		}
		sum := 0
		for _, tr := range r.Turns {
			want := cmp.Or(fixed, wl.Sessions[tr.Session].Turns[tr.Turn].Answer)
			if tr.Completion != want {
				t.Fatalf("max_tokens %d: session %d turn %d decoded %d tokens, want %d", fixed, tr.Session, tr.Turn, tr.Completion, want)
			}
			sum += want
		}
		if r.OutputTokens != int64(sum) || len(r.Turns) != 6 {
			t.Fatalf("max_tokens %d: %d output tokens over %d turns, want %d over 6", fixed, r.OutputTokens, len(r.Turns), sum)
		}
	}
}

// TestReplayClientAndWorkersAgree runs every policy on a small synthetic
// workload, two sessions in flight, and checks the client's token-weighted
// hit rate against the workers' /metrics: within one block per request.
func TestReplayClientAndWorkersAgree(t *testing.T) {
	wl := Synthetic(smallSynthetic(3))
	opt := testOptions(3, 2)
	opt.SessionVia = ViaBody
	opt.Sim.CacheBlocks = AutoCacheBlocks(wl, opt)
	suite, err := RunAll(context.Background(), opt, func(uint64) (*Workload, error) { return wl, nil }, Policies, []uint64{1}, testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range Policies {
		r := suite.Runs[p][0]
		if r.Errors != 0 || r.Requests != wl.Requests() {
			t.Fatalf("%s: %d/%d requests failed, first: %s", p, r.Errors, r.Requests, r.FirstErr)
		}
		if float64(r.PromptTokens) != r.WorkerQueries {
			t.Fatalf("%s: client prompt tokens %d, workers' queries %v", p, r.PromptTokens, r.WorkerQueries)
		}
		if d := math.Abs(float64(r.CachedTokens) - r.WorkerHits); d > float64(16*r.Requests) {
			t.Fatalf("%s: client cached %d, workers' hits %v: more than a block per request apart", p, r.CachedTokens, r.WorkerHits)
		}
		n := 0
		for _, v := range r.Labels {
			n += v
		}
		if n != r.Requests {
			t.Fatalf("%s: %d decision labels for %d requests", p, n, r.Requests)
		}
	}
	if o, s := suite.Runs[PolicyOracle][0].HitClient(), suite.Runs[PolicySticky][0].HitClient(); o < s {
		t.Fatalf("oracle hit %v below sticky's %v", o, s)
	}
	md := suite.Markdown()
	for _, want := range []string{"| cache_aware |", "| oracle (bound) |", "session_id_match", "## Verdict"} {
		if !strings.Contains(md, want) {
			t.Fatalf("report lacks %q:\n%s", want, md)
		}
	}
	if svg := suite.SVG(); !strings.HasPrefix(svg, "<svg") || !strings.Contains(svg, "cache_aware") {
		t.Fatal("bad SVG")
	}
	if lines := strings.Count(suite.CSV(), "\n"); lines != 1+len(Policies) {
		t.Fatalf("CSV has %d lines", lines)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestPercentile(t *testing.T) {
	f := func(v []float64, p, want float64) {
		t.Helper()
		if got := Percentile(v, p); math.Abs(got-want) > 1e-12 {
			t.Fatalf("Percentile(%v, %v) = %v, want %v", v, p, got, want)
		}
	}
	f(nil, 50, 0)
	f([]float64{3}, 99, 3)
	f([]float64{4, 1, 3, 2}, 0, 1)
	f([]float64{4, 1, 3, 2}, 50, 2.5)
	f([]float64{4, 1, 3, 2}, 100, 4)
	if s := statOf([]float64{1, 3}); s.Mean != 2 || math.Abs(s.SD-math.Sqrt2) > 1e-12 {
		t.Fatalf("statOf = %+v", s)
	}
}

// TestRunPD: a disaggregated fleet (2 prefill + 2 decode workers, the
// router in PD mode) serves every turn in two legs. The workers' hit rate
// is the prefill workers' alone: their queries are the clients' prompt
// tokens once (the decode workers' would count them twice); the decode
// workers pulled blocks, none failed, and the clients' cached tokens count
// the pulled ones, so the clients' hit rate is above the prefill side's.
func TestRunPD(t *testing.T) {
	wl := Synthetic(smallSynthetic(2))
	opt := testOptions(2, 2)
	opt.Decode = 2
	r, err := Run(context.Background(), opt, wl, PDPolicy("cache_aware", route.LeastLoaded), 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Errors != 0 || r.Requests != wl.Requests() {
		t.Fatalf("%d of %d requests failed, first: %s", r.Errors, r.Requests, r.FirstErr)
	}
	if !r.PD || r.WorkerQueries != float64(r.PromptTokens) {
		t.Fatalf("PD %v: prefill queries %v, client prompt tokens %d", r.PD, r.WorkerQueries, r.PromptTokens)
	}
	if r.KVTransferred == 0 || r.KVFailed != 0 || uint64(r.CachedTokens) < r.KVTransferred {
		t.Fatalf("transferred %d tokens, %d failed, clients' cached %d", r.KVTransferred, r.KVFailed, r.CachedTokens)
	}
	if r.Hit() != r.HitWorkers() || r.Hit() >= r.HitClient() {
		t.Fatalf("hit %.3f, prefill workers %.3f, clients %.3f", r.Hit(), r.HitWorkers(), r.HitClient())
	}
	if len(r.InflightMean) != 2 || len(r.DecodeInflightMean) != 2 || len(r.Served) != 2 {
		t.Fatalf("loads of %d prefill and %d decode workers, served %v", len(r.InflightMean), len(r.DecodeInflightMean), r.Served)
	}
}
