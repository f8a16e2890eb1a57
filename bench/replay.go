package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

// How the session id travels (Options.SessionVia).
const (
	ViaHeader = "header" // X-Session-ID (the vLLM multi-turn benchmark's convention)
	ViaBody   = "body"   // session_params.session_id
	ViaNone   = "none"   // not sent: history-only routing
)

// Options configures one replay run (and every run of RunAll).
type Options struct {
	Workers     int                    // simulated workers behind the router (the oracle gets one); with Decode, the prefill workers
	Decode      int                    // decode workers: > 0 disaggregates the fleet (docs/design.md §9), the policy a PDPolicy pair
	Sim         simworker.Config       // template of every worker (Models and Seed are set per worker)
	CacheAware  route.CacheAwareConfig // cache_aware's settings; pre_rfc uses Threshold and the gates
	Concurrency int                    // sessions in flight (closed loop)
	MaxTokens   int                    // max_tokens of every request (ignore_eos: exactly this many); 0: each turn's own (answerTokens)
	ThinkTime   time.Duration          // simulated mean pause between a session's turns, ±50 % jitter (scaled by Sim.TimeScale)
	SessionVia  string                 // ViaHeader, ViaBody or ViaNone
	SampleEvery time.Duration          // load sampling period (default 5 ms)
	// RequestTimeout bounds one request (client and router); default 120 s.
	RequestTimeout time.Duration
	KeepTurns      bool // keep per-turn results in RunResult.Turns (tests)
	// WorkerSim, when set, adjusts worker i's copy of Sim (after Models and
	// Seed are set), e.g. a slower prefill on one worker. Not applied to the
	// oracle's single worker.
	WorkerSim func(i int, c *simworker.Config)
}

func (o *Options) setDefaults() {
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 1
	}
	if o.SessionVia == "" {
		o.SessionVia = ViaHeader
	}
	if o.SampleEvery <= 0 {
		o.SampleEvery = 5 * time.Millisecond
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 120 * time.Second
	}
}

// DefaultAnswerTokens is max_tokens of a turn whose answer length is
// unknown, when Options.MaxTokens is 0.
const DefaultAnswerTokens = 64

// answerTokens is max_tokens of turn t: Options.MaxTokens when set, else
// the answer the workload recorded for the call (Turn.Answer). Replaying
// the recorded lengths matters under load: with one fixed length and no
// pause between turns, the sessions that one worker admits together decode
// in step, finish together and come back together, so every placement
// that keeps a conversation on its worker queues its prefill behind its
// cohort's (bench/results/README.md, the replay matrix: answer lengths).
func (o *Options) answerTokens(t *Turn) int {
	switch {
	case o.MaxTokens > 0:
		return o.MaxTokens
	case t.Answer > 0:
		return t.Answer
	}
	return DefaultAnswerTokens
}

// maxTokensText describes max_tokens for a report.
func (o *Options) maxTokensText() string {
	if o.MaxTokens > 0 {
		return fmt.Sprintf("max_tokens %d", o.MaxTokens)
	}
	return fmt.Sprintf("max_tokens = each call's recorded answer length (%d where unknown)", DefaultAnswerTokens)
}

// scale converts a measured duration to simulated seconds.
func (o *Options) scale(d time.Duration) float64 {
	if o.Sim.TimeScale <= 0 {
		return d.Seconds()
	}
	return d.Seconds() / o.Sim.TimeScale
}

// TurnResult is what the client saw of one request.
type TurnResult struct {
	Session, Turn int
	Prompt        int     // usage.prompt_tokens
	Cached        int     // usage.prompt_tokens_details.cached_tokens
	Completion    int     // usage.completion_tokens
	TTFT          float64 // simulated seconds to the first content chunk
	E2E           float64 // simulated seconds to the end of the stream
	Decision      string  // x-vllm-router-decision
	Worker        string  // x-vllm-router-worker
	Err           string
	Sent          float64 // simulated seconds from the run's start to the send
}

// RunResult is one (policy, seed) run.
type RunResult struct {
	Policy   string
	Seed     uint64
	Requests int
	Errors   int
	FirstErr string

	PromptTokens, CachedTokens int64   // client side, from the usage chunks
	WorkerQueries, WorkerHits  float64 // worker side (the prefill workers in a disaggregated fleet), deltas of the /metrics counters
	OutputTokens               int64   // client side: Σ usage.completion_tokens
	// Router side: Σ vllm_router_prefix_tokens_predicted_total and
	// _served_total after the run; RouterCounters is false when the router
	// did not export them.
	PredictedTokens, ServedTokens float64
	RouterCounters                bool

	WorkerConfig simworker.Config // the last worker's effective config (defaults applied)

	SessionHit []float64 // per session: Σ cached / Σ prompt
	TTFT, E2E  []float64 // per successful request, simulated seconds
	Wall       time.Duration
	SimSeconds float64 // Wall in simulated seconds

	InflightMean []float64 // per worker (prefill workers when PD): time-averaged in-flight requests (router registry)
	Served       []int     // per worker (prefill workers when PD): requests served (worker counters)
	Labels       map[string]int

	// A disaggregated fleet's (Options.Decode; docs/design.md §9): the
	// decode workers' time-averaged in-flight requests, and Σ over them of
	// the prompt tokens they pulled from prefill workers and of the pulls
	// that failed (simworker.Stats' KVTransferredTokens, KVFailedTransfers).
	PD                 bool
	DecodeInflightMean []float64
	KVTransferred      uint64
	KVFailed           uint64

	Turns []TurnResult // with Options.KeepTurns
}

// HitClient is Σ cached / Σ prompt tokens from the client's usage chunks.
func (r *RunResult) HitClient() float64 {
	return ratio(float64(r.CachedTokens), float64(r.PromptTokens))
}

// HitWorkers is Σ hits / Σ queries from the workers' /metrics (the
// prefill workers' in a disaggregated fleet).
func (r *RunResult) HitWorkers() float64 { return ratio(r.WorkerHits, r.WorkerQueries) }

// Hit is the hit rate routing decides: the client's (HitClient), or in a
// disaggregated fleet the prefill workers' (HitWorkers) — there the
// client's cached_tokens also count what the decode worker pulled.
func (r *RunResult) Hit() float64 {
	if r.PD {
		return r.HitWorkers()
	}
	return r.HitClient()
}

// HitPredicted is the router's predicted prefix tokens / Σ prompt tokens
// (client side); ok is false when the router did not export the counter.
func (r *RunResult) HitPredicted() (float64, bool) {
	return ratio(r.PredictedTokens, float64(r.PromptTokens)), r.RouterCounters
}

// HitServed is the router's served prefix tokens / Σ prompt tokens.
func (r *RunResult) HitServed() (float64, bool) {
	return ratio(r.ServedTokens, float64(r.PromptTokens)), r.RouterCounters
}

// LoadMaxMean is max / mean over workers of the time-averaged in-flight count.
func (r *RunResult) LoadMaxMean() float64 { return maxOverMean(r.InflightMean) }

// DecodeLoadMaxMean is LoadMaxMean over a disaggregated fleet's decode workers.
func (r *RunResult) DecodeLoadMaxMean() float64 { return maxOverMean(r.DecodeInflightMean) }

// ServedMaxMean is max / mean over workers of the requests served.
func (r *RunResult) ServedMaxMean() float64 {
	f := make([]float64, len(r.Served))
	for i, v := range r.Served {
		f[i] = float64(v)
	}
	return maxOverMean(f)
}

// Throughput is requests per simulated second.
func (r *RunResult) Throughput() float64 { return ratio(float64(r.Requests-r.Errors), r.SimSeconds) }

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func maxOverMean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	mx, sum := v[0], 0.0
	for _, x := range v {
		mx = max(mx, x)
		sum += x
	}
	return ratio(mx, sum/float64(len(v)))
}

// Run replays wl once through a fresh router with policy in front of a fresh
// fleet: Concurrency client goroutines each take the next session and send
// its turns strictly in order, each after the previous one's stream ended
// (plus ThinkTime). It returns when every session is done or ctx ends.
func Run(ctx context.Context, opt Options, wl *Workload, policy string, seed uint64) (*RunResult, error) {
	opt.setDefaults()
	if !ValidPolicy(policy) {
		return nil, fmt.Errorf("unknown policy %q (want one of %v)", policy, Policies)
	}
	base := policy
	if b, ok := controlOf(policy); ok {
		base = b
	}
	if p, _, pd := SplitPD(base); pd && opt.Decode == 0 {
		return nil, fmt.Errorf("policy %q names a decode leg, but the fleet has no decode workers", policy)
	} else if opt.Decode > 0 && oneSided(p) {
		return nil, fmt.Errorf("policy %q cannot route a disaggregated fleet", policy)
	}
	f, err := startFleet(&opt, policy, seed)
	if err != nil {
		return nil, err
	}
	defer f.close()
	client := &http.Client{
		Timeout: opt.RequestTimeout,
		Transport: &http.Transport{
			MaxIdleConns: 2 * opt.Concurrency, MaxIdleConnsPerHost: 2 * opt.Concurrency,
			DisableCompression: true,
		},
	}
	defer client.CloseIdleConnections()
	before, err := f.scrape(client)
	if err != nil {
		return nil, err
	}
	statsBefore := make([]simworker.Stats, len(f.sims))
	for i, w := range f.sims {
		statsBefore[i] = w.Stats()
	}

	res := &RunResult{Policy: policy, Seed: seed, Labels: map[string]int{}, PD: opt.Decode > 0}
	results := make([][]TurnResult, len(wl.Sessions))

	// Load sampler: per-worker in-flight counts from the router's registry,
	// the entry side's first.
	all := f.reg.Workers()
	workers := make([]*loadview.Worker, 0, len(all))
	for _, w := range all {
		if w.Role() != loadview.Decode {
			workers = append(workers, w)
		}
	}
	entry := len(workers)
	for _, w := range all {
		if w.Role() == loadview.Decode {
			workers = append(workers, w)
		}
	}
	sums := make([]int64, len(workers))
	samples := 0
	stop := make(chan struct{})
	var sampled sync.WaitGroup
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		t := time.NewTicker(opt.SampleEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				for i, w := range workers {
					sums[i] += w.Load()
				}
				samples++
			}
		}
	}()

	start := time.Now()
	next := make(chan int)
	var wg sync.WaitGroup
	for c := 0; c < opt.Concurrency; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var body bytes.Buffer
			for si := range next {
				s := &wl.Sessions[si]
				out := make([]TurnResult, 0, len(s.Turns))
				for ti := range s.Turns {
					if ti > 0 && opt.ThinkTime > 0 {
						if !SleepCtx(ctx, ThinkTime(&opt, seed, si, ti)) {
							break
						}
					}
					if ctx.Err() != nil {
						break
					}
					sent := opt.scale(time.Since(start))
					tr := sendTurn(ctx, client, f.url, &opt, s, ti, &body, f.announce)
					tr.Session, tr.Turn, tr.Sent = si, ti, sent
					out = append(out, tr)
				}
				results[si] = out
			}
		}()
	}
feed:
	for si := range wl.Sessions {
		select {
		case next <- si:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	res.Wall = time.Since(start)
	res.SimSeconds = opt.scale(res.Wall)
	close(stop)
	sampled.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}

	after, err := f.scrape(client)
	if err != nil {
		return nil, err
	}
	for i := range after[:f.entry] {
		res.WorkerHits += after[i].hits - before[i].hits
		res.WorkerQueries += after[i].queries - before[i].queries
	}
	res.PredictedTokens, res.ServedTokens, res.RouterCounters = f.routerCounters()
	res.WorkerConfig = f.sims[len(f.sims)-1].Config()
	for i, w := range f.sims {
		st := w.Stats()
		if i < f.entry {
			res.Served = append(res.Served, int(st.Requests-statsBefore[i].Requests))
			continue
		}
		res.KVTransferred += st.KVTransferredTokens - statsBefore[i].KVTransferredTokens
		res.KVFailed += st.KVFailedTransfers - statsBefore[i].KVFailedTransfers
	}
	for i := range sums {
		mean := ratio(float64(sums[i]), float64(samples))
		if i < entry {
			res.InflightMean = append(res.InflightMean, mean)
		} else {
			res.DecodeInflightMean = append(res.DecodeInflightMean, mean)
		}
	}
	for _, out := range results {
		var p, c int64
		for _, tr := range out {
			res.Requests++
			if tr.Err != "" {
				res.Errors++
				if res.FirstErr == "" {
					res.FirstErr = tr.Err
				}
				continue
			}
			res.Labels[tr.Decision]++
			p += int64(tr.Prompt)
			c += int64(tr.Cached)
			res.OutputTokens += int64(tr.Completion)
			res.TTFT = append(res.TTFT, tr.TTFT)
			res.E2E = append(res.E2E, tr.E2E)
		}
		res.PromptTokens += p
		res.CachedTokens += c
		if p > 0 {
			res.SessionHit = append(res.SessionHit, float64(c)/float64(p))
		}
		if opt.KeepTurns {
			res.Turns = append(res.Turns, out...)
		}
	}
	return res, nil
}

// ThinkTime is the real pause before turn ti of session si: opt.ThinkTime ×
// uniform [0.5, 1.5), deterministic per (seed, session, turn), × TimeScale.
// The jitter keeps closed-loop clients from falling into lockstep (which
// would let round_robin send each session to the same worker every turn).
func ThinkTime(opt *Options, seed uint64, si, ti int) time.Duration {
	z := seqRand(seed ^ uint64(si)<<20 ^ uint64(ti))()
	u := 0.5 + float64(z>>11)/(1<<53)
	return time.Duration(float64(opt.ThinkTime) * u * max(opt.Sim.TimeScale, 0))
}

// SleepCtx sleeps d; false when ctx ended first (or had, for d ≤ 0).
func SleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// appendBody appends the request body of turn ti of s to dst.
func appendBody(dst *bytes.Buffer, opt *Options, s *Session, ti int) {
	dst.WriteString(`{"model":"` + Model + `","messages":[`)
	for i, m := range s.Turns[ti].Messages {
		if i > 0 {
			dst.WriteByte(',')
		}
		dst.Write(m)
	}
	dst.WriteString(`],"max_tokens":`)
	dst.WriteString(strconv.Itoa(opt.answerTokens(&s.Turns[ti])))
	dst.WriteString(`,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}`)
	if opt.SessionVia == ViaBody {
		dst.WriteString(`,"session_params":{"session_id":`)
		id, _ := json.Marshal(s.ID)
		dst.Write(id)
		dst.WriteByte('}')
	}
	dst.WriteByte('}')
}

// streamChunk is the part of a chat completion chunk the client reads.
type streamChunk struct {
	Choices []struct {
		Delta struct {
			Content   *string           `json:"content"`
			ToolCalls []json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// sendTurn sends one streamed request and reads it to the end; announce
// (nil: none) is told the body before the clock starts.
func sendTurn(ctx context.Context, c *http.Client, base string, opt *Options, s *Session, ti int, body *bytes.Buffer,
	announce func([]byte) func()) TurnResult {
	var tr TurnResult
	req, err := TurnRequest(ctx, base, opt, s, ti, body)
	if err != nil {
		tr.Err = err.Error()
		return tr
	}
	if announce != nil {
		defer announce(body.Bytes())()
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		tr.Err = err.Error()
		return tr
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		tr.Err = fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	} else {
		tr = ReadStream(resp.Body, start, opt, nil)
	}
	tr.Decision = resp.Header.Get("x-vllm-router-decision")
	tr.Worker = resp.Header.Get("x-vllm-router-worker")
	return tr
}

// TurnRequest returns the request of turn ti of s to the router at base:
// POST /v1/chat/completions, streamed with stream_options.include_usage,
// the session id as SessionVia says. Its body is written into body (reset
// first), which must outlive the request.
func TurnRequest(ctx context.Context, base string, opt *Options, s *Session, ti int, body *bytes.Buffer) (*http.Request, error) {
	body.Reset()
	appendBody(body, opt, s, ti)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body.Bytes()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if opt.SessionVia == ViaHeader {
		req.Header.Set("X-Session-ID", s.ID)
	}
	return req, nil
}

// ReadStream reads a streamed chat completion (the body of a 200 answer to
// a TurnRequest) to its end. TTFT and E2E are simulated seconds from start;
// Err says what the stream lacked ([DONE], the usage chunk, content).
// onFirst, when not nil, runs at the first content chunk.
func ReadStream(r io.Reader, start time.Time, opt *Options, onFirst func()) TurnResult {
	var tr TurnResult
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	first, usage, done := false, false, false
	for sc.Scan() {
		line, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if bytes.Equal(line, []byte("[DONE]")) {
			done = true
			break
		}
		if first && !bytes.Contains(line, []byte(`"usage":{`)) {
			continue
		}
		var ch streamChunk
		if err := json.Unmarshal(line, &ch); err != nil {
			tr.Err = "bad chunk: " + err.Error()
			return tr
		}
		if !first && hasContent(&ch) {
			first = true
			tr.TTFT = opt.scale(time.Since(start))
			if onFirst != nil {
				onFirst()
			}
		}
		if u := ch.Usage; u != nil {
			usage = true
			tr.Prompt, tr.Completion = u.PromptTokens, u.CompletionTokens
			if d := u.PromptTokensDetails; d != nil {
				tr.Cached = d.CachedTokens
			}
		}
	}
	tr.E2E = opt.scale(time.Since(start))
	switch {
	case sc.Err() != nil:
		tr.Err = "stream: " + sc.Err().Error()
	case !done:
		tr.Err = "stream ended without [DONE]"
	case !usage:
		tr.Err = "no usage chunk (stream_options.include_usage)"
	case !first:
		tr.Err = "no content chunk"
	}
	return tr
}

// hasContent reports whether a chunk carries text or a tool call.
func hasContent(ch *streamChunk) bool {
	for _, c := range ch.Choices {
		if (c.Delta.Content != nil && *c.Delta.Content != "") || len(c.Delta.ToolCalls) > 0 {
			return true
		}
	}
	return false
}

// AutoCacheBlocks sizes a worker's prefix cache for wl so that routing
// matters: the final prompts of the k largest sessions, k = sessions in
// flight per worker, plus a Workers-th of the blocks that sessions share,
// in blocks, and at least 1.25 × the longest session's final prompt. A
// policy that keeps each session on one worker and each shared prefix on
// one worker then fits whichever sessions in flight land together and the
// shared prefixes they come back to (Mooncake's documents, asked about by
// conversations far apart in time); one that spreads every session over
// every worker needs about Workers× more and thrashes the LRU. (Sized by
// the mean session, two of Mooncake's long chains on one worker overflowed
// it, and the workers served less of the prefix than the router predicted:
// bench/results/README.md, the replay matrix.)
func AutoCacheBlocks(wl *Workload, opt Options) int {
	perWorker, longest := workingSet(wl, opt)
	return max(int(perWorker+0.5), int(1.25*longest+0.5))
}

// HalfCacheBlocks sizes a worker's prefix cache to about half of what
// AutoCacheBlocks gives (half the working set of the sessions in flight),
// but never below the longest session's final prompt, so every single
// request still fits.
func HalfCacheBlocks(wl *Workload, opt Options) int {
	perWorker, longest := workingSet(wl, opt)
	return max(int(perWorker/2+0.5), int(longest+0.5))
}

// QuarterCacheBlocks sizes a worker's prefix cache to about a quarter of
// what AutoCacheBlocks gives, never below the longest session's final
// prompt (fleet d of the matrix).
func QuarterCacheBlocks(wl *Workload, opt Options) int {
	perWorker, longest := workingSet(wl, opt)
	return max(int(perWorker/4+0.5), int(longest+0.5))
}

// workingSet returns, in cache blocks, the sum of the k largest final
// prompts of a session (each plus its reply), k = sessions in flight per
// worker rounded up, + sharedBlocks / Workers; and the longest final prompt.
func workingSet(wl *Workload, opt Options) (perWorker, longest float64) {
	opt.setDefaults()
	bt := opt.Sim.BlockTokens
	if bt <= 0 {
		bt = 16
	}
	cpt := opt.Sim.CharsPerToken
	if cpt <= 0 {
		cpt = 4
	}
	var finals []int
	for i := range wl.Sessions {
		if t := wl.Sessions[i].Turns; len(t) > 0 {
			finals = append(finals, t[len(t)-1].Chars()+opt.answerTokens(&t[len(t)-1])*cpt)
		}
	}
	if len(finals) == 0 {
		return 0, 0
	}
	slices.SortFunc(finals, func(a, b int) int { return b - a })
	k := min(len(finals), max(1, (opt.Concurrency+opt.Workers-1)/max(opt.Workers, 1)))
	sum := 0
	for _, n := range finals[:k] {
		sum += n
	}
	block := float64(bt * cpt)
	shared := float64(sharedBlocks(wl, bt*cpt)) / float64(max(opt.Workers, 1))
	return float64(sum)/block + shared, float64(finals[0]) / block
}

// sharedBlocks counts the distinct prefix blocks (of blockChars characters
// of a final turn's message contents, each identified with all before it)
// that the final turns of at least two sessions have.
func sharedBlocks(wl *Workload, blockChars int) int {
	seed := maphash.MakeSeed()
	owner := map[uint64]int{} // block → the first session seen with it, or -1: shared
	for i := range wl.Sessions {
		t := wl.Sessions[i].Turns
		if len(t) == 0 {
			continue
		}
		var h maphash.Hash
		h.SetSeed(seed)
		fill := 0
		add := func() {
			k := h.Sum64()
			if o, ok := owner[k]; !ok {
				owner[k] = i
			} else if o != i {
				owner[k] = -1
			}
		}
		for _, m := range t[len(t)-1].Messages {
			for len(m) > 0 {
				n := min(len(m), blockChars-fill)
				h.Write(m[:n])
				m, fill = m[n:], fill+n
				if fill == blockChars {
					add() // the hash goes on over every block before
					fill = 0
				}
			}
		}
	}
	n := 0
	for _, o := range owner {
		if o < 0 {
			n++
		}
	}
	return n
}
