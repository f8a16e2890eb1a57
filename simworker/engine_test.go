package simworker

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
)

// firstToken streams a completion of prompt and returns the time to its
// first chunk and the whole stream's events.
func firstToken(t *testing.T, url, prompt string, maxTokens int) time.Duration {
	t.Helper()
	start := time.Now()
	resp, err := send(url+"/v1/completions", msg{"prompt": prompt, "max_tokens": maxTokens, "stream": true})
	if err != nil {
		t.Error(err)
		return 0
	}
	evs, err := readSSE(resp, start)
	if err != nil || len(evs) < 2 || evs[len(evs)-1].data != "[DONE]" {
		t.Errorf("stream: %v, %d events", err, len(evs))
		return 0
	}
	return evs[0].at
}

func TestEngineColdWarmTTFT(t *testing.T) {
	// 4000 uncached tokens: one 806 ms step (6 ms + 4000 × 200 µs); warm,
	// one ~6 ms step. At TimeScale 0.5: ~400 ms against ~3 ms.
	w, url := startWorker(t, Config{TimeScale: 0.5, PerToken: 200 * time.Microsecond})
	prompt := strings.Repeat("abcd", 4000)
	cold := firstToken(t, url, prompt, 2)
	warm := firstToken(t, url, prompt, 2)
	if cold < 300*time.Millisecond || warm*3 > cold {
		t.Fatalf("cold TTFT %v, warm %v: want cold >= 300ms and > 3× warm", cold, warm)
	}
	if st := w.Stats(); st.PrefixHits != 4000 || st.PrefixQueries != 8000 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEngineContention(t *testing.T) {
	// A 2000-token prompt alone: one 106 ms step. Behind three 8000-token
	// prefills sharing a 2048-token step budget, it waits for theirs (first
	// come, first served within the budget): about a second of simulated time.
	cfg := Config{TimeScale: 0.5, MaxNumBatchedTokens: 2048}
	_, url := startWorker(t, cfg)
	alone := firstToken(t, url, strings.Repeat("a", 8000), 1)

	w, url := startWorker(t, cfg)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { firstToken(t, url, strings.Repeat(string(rune('b'+i)), 32000), 4) })
	}
	testwait.Until(t, "three prefills in the engine", func() bool { st := w.Stats(); return st.Running >= 1 && st.Running+st.Waiting == 3 })
	contended := firstToken(t, url, strings.Repeat("a", 8000), 1)
	wg.Wait()
	if contended < 3*alone {
		t.Fatalf("TTFT alone %v, behind three prefills %v: want >= 3×", alone, contended)
	}

	// Decode contention: with 32 sequences decoding, each step costs
	// 6 ms + 32 × 1 ms instead of 6 ms + 1 ms.
	cfg = Config{TimeScale: 0.25, DecodePerSeq: time.Millisecond, MaxTokens: 40}
	_, url = startWorker(t, cfg)
	start := time.Now()
	firstToken(t, url, "x", 40)
	single := time.Since(start)
	w, url = startWorker(t, cfg)
	var mu sync.Mutex
	var batched time.Duration
	for range 32 {
		wg.Go(func() {
			start := time.Now()
			firstToken(t, url, "x", 40)
			mu.Lock()
			batched = max(batched, time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	if batched < 2*single {
		t.Fatalf("40 tokens alone %v, in a batch of 32 %v: want >= 2×", single, batched)
	}
}

func TestEngineMaxNumSeqs(t *testing.T) {
	w, url := startWorker(t, Config{MaxNumSeqs: 2, TimeScale: 0.2, MaxTokens: 20})
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if code, b := post(t, url+"/v1/completions", msg{"prompt": "x"}); code != 200 {
				t.Errorf("%d %s", code, b)
			}
		})
	}
	sawWaiting, metricsWaiting := false, false
	testwait.Until(t, "waiting requests", func() bool {
		st := w.Stats()
		if st.Running > 2 {
			t.Fatalf("running %d > MaxNumSeqs 2", st.Running)
		}
		if st.Waiting > 0 {
			sawWaiting = true
			_, b := get(t, http.MethodGet, url+"/metrics")
			if r := metricValue(t, b, "vllm:num_requests_running"); r > 2 {
				t.Fatalf("vllm:num_requests_running %v > 2", r)
			}
			metricsWaiting = metricValue(t, b, "vllm:num_requests_waiting") > 0
		}
		return sawWaiting && metricsWaiting
	})
	wg.Wait()
	if st := w.Stats(); st.Running != 0 || st.Waiting != 0 || st.Successful != 6 || st.CacheBlocksHeld != 0 {
		t.Fatalf("after: %+v", st)
	}
}

func TestEngineKVCapacityWaits(t *testing.T) {
	// 16 blocks of 16 tokens. A 64-token prompt generating 100 tokens holds
	// ceil(164/16) = 11 blocks while it runs; a second one cannot get 11 of
	// the 5 left and waits though MaxNumSeqs allows 64.
	w, url := startWorker(t, Config{CacheBlocks: 16, TimeScale: 0.5, StepBase: 20 * time.Millisecond})
	long := func(ch string) msg {
		return msg{"prompt": strings.Repeat(ch, 256), "max_tokens": 100, "stream": true}
	}
	respA, err := send(url+"/v1/completions", long("a"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := respA.Body.Read(buf); err != nil { // A is running
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		resp, err := send(url+"/v1/completions", long("b"))
		if err == nil {
			_, err = readSSE(resp, time.Now())
		}
		done <- err
	}()
	testwait.Until(t, "B waiting for blocks", func() bool { return w.Stats().Waiting == 1 })
	st := w.Stats()
	if st.Running != 1 || st.CacheBlocksHeld != 11 {
		t.Fatalf("while A runs: %+v", st)
	}
	_, b := get(t, http.MethodGet, url+"/metrics")
	if v := metricValue(t, b, "vllm:kv_cache_usage_perc"); v != 11.0/16 {
		t.Fatalf("kv_cache_usage_perc %v, want %v", v, 11.0/16)
	}
	// A's client leaves: the engine frees A's blocks and B runs.
	respA.Body.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	testwait.Until(t, "all blocks released", func() bool { st := w.Stats(); return st.CacheBlocksHeld == 0 && st.Running == 0 })
}

func TestKVCacheLRUOverUnreferenced(t *testing.T) {
	c := newKVCache(8)
	run := func(chain []uint64, need int) *seq {
		t.Helper()
		s := &seq{chain: chain, need: need}
		if !c.reserve(s) {
			t.Fatalf("chain %v did not fit (used %d, evictable %d)", chain, c.used(), c.evictable)
		}
		for s.refd < len(s.chain) {
			c.insert(s)
		}
		return s
	}
	has := func(k uint64) bool { _, ok := c.index[k]; return ok }

	c.release(run([]uint64{1, 2, 3}, 4))
	c.release(run([]uint64{4, 5, 6}, 4))
	if c.used() != 6 || c.evictable != 6 {
		t.Fatalf("used %d, evictable %d, want 6, 6", c.used(), c.evictable)
	}
	s := run([]uint64{1, 2, 3}, 4) // a hit: 1, 2, 3 become most recent
	if s.anon != 1 || c.evictable != 3 {
		t.Fatalf("hit: anon %d, evictable %d", s.anon, c.evictable)
	}
	c.release(s)
	held := run([]uint64{7, 8, 9}, 5) // needs 3 more than the 2 free: evicts 6, 5, 4
	if has(4) || has(5) || has(6) || !has(1) || !has(2) || !has(3) || c.used() != 8 {
		t.Fatalf("LRU evicted the wrong blocks: %v", c.index)
	}
	// Full of referenced blocks (7, 8, 9 and 2 anonymous) plus 3 idle ones:
	// a sequence needing 4 waits, even one whose 3 prefix blocks hit.
	for _, chain := range [][]uint64{{1, 2, 3}, {10}} {
		if c.reserve(&seq{chain: chain, need: 4}) {
			t.Fatalf("chain %v admitted into a full cache", chain)
		}
	}
	if c.used() != 8 || c.evictable != 3 || !has(1) {
		t.Fatalf("a refused reservation changed the cache: used %d, evictable %d", c.used(), c.evictable)
	}
	c.release(held)
	run([]uint64{1, 2, 3}, 4)
}

func TestOmitPromptTokensDetails(t *testing.T) {
	_, url := startWorker(t, Config{OmitPromptTokensDetails: true})
	code, b := post(t, url+"/v1/chat/completions", msg{"messages": []any{user("hi")}, "max_tokens": 2})
	m := decodeJSON(t, b)
	if _, ok := path(m, "usage").(map[string]any)["prompt_tokens_details"]; code != 200 || ok || num(path(m, "usage", "prompt_tokens")) == 0 {
		t.Fatalf("%d %s", code, b)
	}
	resp, err := send(url+"/v1/chat/completions", msg{"messages": []any{user("hi")}, "max_tokens": 2, "stream": true,
		"stream_options": msg{"include_usage": true}})
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readSSE(resp, time.Now())
	if err != nil || len(evs) < 3 {
		t.Fatal(err, evs)
	}
	u := decodeJSON(t, []byte(evs[len(evs)-2].data))["usage"].(map[string]any)
	if _, ok := u["prompt_tokens_details"]; ok || num(u["total_tokens"]) == 0 {
		t.Fatalf("usage chunk %v", u)
	}
}

func TestLatencyModelValidate(t *testing.T) {
	if err := (Config{LatencyModel: "vllm"}).Validate(); err == nil {
		t.Fatal("unknown latency model accepted")
	}
	for _, m := range []string{"", LatencyEngine, LatencyLegacy} {
		if err := (Config{LatencyModel: m}).Validate(); err != nil {
			t.Fatalf("%q: %v", m, err)
		}
	}
	if w := New(Config{LatencyModel: LatencyLegacy}); w.eng != nil {
		t.Fatal("legacy worker runs an engine")
	}
}

func TestEngineOnFirstToken(t *testing.T) {
	// One slot. "a" holds it for 40 steps of at least 6 ms simulated; "b",
	// sent once "a" runs, waits for it in the engine's queue, and says so.
	var mu sync.Mutex
	got := map[string]FirstToken{}
	cfg := Config{MaxNumSeqs: 1, TimeScale: 0.5, OnFirstToken: func(id string, ft FirstToken) {
		mu.Lock()
		got[id] = ft
		mu.Unlock()
	}}
	w, url := startWorker(t, cfg)
	var wg sync.WaitGroup
	wg.Go(func() {
		if code, b := post(t, url+"/v1/completions", msg{"prompt": "a", "max_tokens": 40}, "X-Request-Id", "a"); code != 200 {
			t.Errorf("a: %d %s", code, b)
		}
	})
	testwait.Until(t, "a running", func() bool { return w.Stats().Running == 1 })
	if code, b := post(t, url+"/v1/completions", msg{"prompt": "b", "max_tokens": 1}, "X-Request-Id", "b"); code != 200 {
		t.Fatalf("b: %d %s", code, b)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	a, b := got["a"], got["b"]
	if len(got) != 2 || a.Running != 0 || a.Waiting != 0 || b.Running != 1 || b.Waiting != 0 || a.Slots != 1 || b.Slots != 1 {
		t.Fatalf("reports %+v: want a alone and b behind one running sequence, 1 slot", got)
	}
	// b waited for most of a's 40 steps; a for at most the step it joined.
	if b.Queued < 20*6*time.Millisecond || a.Queued > b.Queued/4 || b.TTFT < b.Queued {
		t.Fatalf("a queued %v, b queued %v (TTFT %v): want b >= 120ms simulated, a a step at most, TTFT >= queued", a.Queued, b.Queued, b.TTFT)
	}
}

func TestEngineSchedulingPolicy(t *testing.T) {
	// One slot, held by "a"; "late" (priority 10) waits first, then
	// "urgent" (priority 0). First come, first served takes late first;
	// the priority policy takes urgent first.
	for policy, want := range map[string]string{ScheduleFCFS: "a late urgent", SchedulePriority: "a urgent late"} {
		var mu sync.Mutex
		var order []string
		w, url := startWorker(t, Config{MaxNumSeqs: 1, TimeScale: 0.2, SchedulingPolicy: policy, OnFirstToken: func(id string, _ FirstToken) {
			mu.Lock()
			order = append(order, id)
			mu.Unlock()
		}})
		var wg sync.WaitGroup
		chat := func(id string, prio, tokens int) {
			body := msg{"model": "sim-model", "max_tokens": tokens, "priority": prio, "messages": []msg{{"role": "user", "content": id}}}
			if code, b := post(t, url+"/v1/chat/completions", body, "X-Request-Id", id); code != 200 {
				t.Errorf("%s: %d %s", id, code, b)
			}
		}
		wg.Go(func() { chat("a", 0, 100) })
		testwait.Until(t, "a running", func() bool { return w.Stats().Running == 1 })
		wg.Go(func() { chat("late", 10, 1) })
		testwait.Until(t, "late waiting", func() bool { return w.Stats().Waiting == 1 })
		wg.Go(func() { chat("urgent", 0, 1) })
		testwait.Until(t, "urgent waiting", func() bool { return w.Stats().Waiting == 2 })
		wg.Wait()
		mu.Lock()
		if got := strings.Join(order, " "); got != want {
			t.Errorf("%s: first tokens in the order %q, want %q", policy, got, want)
		}
		mu.Unlock()
	}
}
