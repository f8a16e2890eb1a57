package route

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/loadview"
)

// The time-to-first-token estimate (docs/design.md §4, "Worker choice by
// estimated time to first token"). For a candidate worker w and a request
// whose key has n characters, of which w holds h:
//
//	T(w) = Queue(w) × load(w) + Prefill(w) × (n − h) / CharsPerToken(w)
//
// load is w's requests in flight (a count, not their age). Each worker
// learns its three rates, per model state, from the responses it serves
// (CacheAware.Observe), and the model state learns the same fit from every
// worker's answers (the pool); a worker that has served nothing yet uses
// the priors. Queue and Prefill never go below their priors (the priors are
// floors): a fleet whose latency does not show prefill, such as a
// zero-latency test worker, must not teach the router that cache is
// worthless, and with Prefill > 0 the worker that holds more of the key
// wins at equal load (ties on T also go to the longer hold). What a miss
// is placed by is the placement cost of estimate (pooled rates × the
// worker's speed, the load term × R, the prefill × (1 + load + pending)); the
// per-worker fits are published (metrics, Summaries).
const (
	// PriorQueueSeconds is the prior and floor of Queue: seconds of wait
	// per request already in flight on the worker (about one decode step's
	// share of a continuous batch).
	PriorQueueSeconds = 0.005
	// PriorPrefillSeconds is the prior and floor of Prefill: seconds per
	// uncached prompt token (40k tokens/s, faster than one GPU prefills any
	// model worth routing for, so a real fleet learns a larger value).
	PriorPrefillSeconds = 25e-6
	// PriorDecodeSeconds is the prior of the decode rate, seconds per
	// completion token; it is learned only to keep the decode inside a
	// non-streamed response's time to first byte out of Prefill and Queue.
	PriorDecodeSeconds = 0.015
	// PriorCharsPerToken is the prior of key characters per prompt token.
	PriorCharsPerToken = 4.0

	// Bounds of the learned rates.
	maxQueueSeconds   = 60.0 // per request in flight
	maxPrefillSeconds = 0.01 // per token
	maxDecodeSeconds  = 0.1  // per token
	minCharsPerToken  = 1.0
	maxCharsPerToken  = 16.0

	// forget is the recursive least squares forgetting factor: a sample
	// k responses old weighs forget^k, so the fit remembers about 5
	// responses and the weight left on a regime that ended k samples ago
	// is 0.8^k (under 0.05 after 14).
	forget = 0.8
	// speedMemory and speedPrior: see learnSpeed.
	speedMemory = 64
	speedPrior  = 2
	speedClip   = 4 // an answer counts at most 4× its prediction (the step TestEstimatorRecovers covers)
	// speedWarmup: answers the pooled fit learns from before speeds are
	// measured against it. A speed measured against the priors is the
	// priors' error, and a worker it judges slow may not be sent another
	// request to correct it (TestSlowPrefillWorkerGetsFewerNewSessions saw
	// the first two workers served starved this way).
	speedWarmup = 8
	// minSpeedReference: an answer that took, or that the reference
	// predicts, under 1 ms says nothing about a worker's speed (a
	// zero-latency fleet's answers all do, and their speeds stay 1).
	minSpeedReference = 1e-3

	// RecoverySamples bounds how many samples the estimate takes to come
	// within 10 % of a step change of up to 4× in a worker's rates
	// (TestEstimatorRecovers holds it to that): forgetting, plus one or two
	// samples clipped before the band opens.
	RecoverySamples = 20
)

// warmup is how many first samples are fitted unclipped.
const warmup = 3

// priorVar is the initial covariance of the fit (its diagonal), and the
// most it may grow to when a direction sees no samples (streams never
// excite the decode rate): (1 s per request)², (1 s per 1k tokens)²,
// (10 s per 100 tokens)². Loose: the first few samples decide.
var priorVar = [4]float64{1, 1, 100}

// rates is one worker's learned state in one model state. Select reads the
// published rates atomically; Observe learns under mu.
type rates struct {
	queue   atomic.Uint64 // float64 bits: seconds per request in flight, ≥ PriorQueueSeconds
	prefill atomic.Uint64 // float64 bits: seconds per uncached token, ≥ PriorPrefillSeconds
	cpt     atomic.Uint64 // float64 bits: key characters per token

	prompt      atomic.Uint64 // prompt tokens of the answers whose cached_tokens is known
	predicted   atomic.Uint64 // prefix tokens the tree predicted cached (cached_tokens known)
	served      atomic.Uint64 // cached_tokens the worker reported
	corrections atomic.Uint64 // EvictOlder calls
	speed       atomic.Uint64 // float64 bits: answers' time over the reference's prediction (slowness)
	cutoff      atomic.Int64  // latest EvictOlder cutoff applied
	back        returns       // conversations this worker served that are between turns (returns.go)

	mu      sync.Mutex
	theta   [3]float64    // Queue (s/request), Prefill (s/1k tokens), Decode (s/100 tokens)
	cov     [4][4]float64 // the first 3 rows and columns (rlsForget)
	scale   float64       // EWMA of |clipped residual|, seconds
	samples atomic.Int64  // written under mu; read without it (count)
	cptEst  float64
	sumY    float64 // decayed Σ time to first byte (speed)
	sumPred float64 // decayed Σ the reference's prediction of it
}

func newRates() *rates {
	r := &rates{theta: [3]float64{PriorQueueSeconds, PriorPrefillSeconds * 1e3, PriorDecodeSeconds * 1e2},
		cptEst: PriorCharsPerToken}
	for i := range 3 {
		r.cov[i][i] = priorVar[i]
	}
	r.speed.Store(math.Float64bits(1))
	r.publish()
	return r
}

// count is the answers the fit has learned from.
func (r *rates) count() int { return int(r.samples.Load()) }

// learnSpeed folds one answer into the worker's speed: its decayed time
// to first byte over the reference's decayed prediction for the same
// answers (memory speedMemory answers, speedPrior answers of ratio 1 as
// the prior; an answer counts at most speedClip × its prediction).
// Comparing workers through one pooled fit (reference.go) keeps the noise of each
// worker's own short-memory fit out of the choice: on a fleet of equal
// workers speeds stay near 1, a 2× slower worker's near 2. mu held.
func (r *rates) learnSpeed(y, pred float64) {
	if pred <= 0 || y < 0 || math.IsNaN(y) {
		return
	}
	if r.sumPred == 0 {
		r.sumY, r.sumPred = speedPrior*pred, speedPrior*pred
	}
	r.sumY = r.sumY*(1-1.0/speedMemory) + min(y, speedClip*pred) // one outlier moves speed by a few percent
	r.sumPred = r.sumPred*(1-1.0/speedMemory) + pred
	r.speed.Store(math.Float64bits(clamp(r.sumY/r.sumPred, 1.0/16, 16)))
}

func (r *rates) publish() {
	r.queue.Store(math.Float64bits(clamp(r.theta[0], PriorQueueSeconds, maxQueueSeconds)))
	r.prefill.Store(math.Float64bits(clamp(r.theta[1]/1e3, PriorPrefillSeconds, maxPrefillSeconds)))
	r.cpt.Store(math.Float64bits(r.cptEst))
}

// Rates is a worker's published estimate (Summaries, tests).
type Rates struct {
	QueueSeconds   float64 `json:"queue_seconds_per_request"`
	PrefillSeconds float64 `json:"prefill_seconds_per_token"`
	CharsPerToken  float64 `json:"chars_per_token"`
	Samples        int     `json:"samples"`
	// Speed is the worker's time to first byte over the model's pooled
	// fit (learnSpeed); the choice uses it, not the rates above.
	Speed float64 `json:"speed"`
}

func (r *rates) get() Rates {
	if r == nil {
		return Rates{PriorQueueSeconds, PriorPrefillSeconds, PriorCharsPerToken, 0, 1}
	}
	n := r.count()
	return Rates{math.Float64frombits(r.queue.Load()), math.Float64frombits(r.prefill.Load()),
		math.Float64frombits(r.cpt.Load()), n, math.Float64frombits(r.speed.Load())}
}

// learn fits one sample: y seconds to first byte with load requests in
// flight ahead, uncached prompt tokens and (non-streamed answers only) the
// completion tokens decoded before the first byte. Recursive least squares
// with forgetting (forget) and no intercept: a fixed overhead is shared by
// every worker and only shifts what each rate absorbs. The first warmup
// samples are fitted as they come (the priors are weak). The residual is clipped to max(3 × scale, a
// quarter of the prediction, 1 ms) (Huber), so one slow outlier moves the
// prediction by a few percent. The scale follows |residual| clipped to
// twice the band, so under a change of regime (residuals large sample
// after sample) the band widens by up to 1.75× per sample and the fit
// follows within RecoverySamples. mu held.
func (r *rates) learn(y float64, load int64, uncached, decoded int) {
	x := [3]float64{float64(load), float64(uncached) / 1e3, float64(decoded) / 1e2}
	nx := x[0]*x[0] + x[1]*x[1] + x[2]*x[2]
	if nx == 0 || y < 0 || math.IsNaN(y) {
		return // an idle worker serving from cache: nothing to attribute
	}
	var px [4]float64 // cov·x
	for i := range 3 {
		px[i] = r.cov[i][0]*x[0] + r.cov[i][1]*x[1] + r.cov[i][2]*x[2]
	}
	den := forget + x[0]*px[0] + x[1]*px[1] + x[2]*px[2]
	pred := r.theta[0]*x[0] + r.theta[1]*x[1] + r.theta[2]*x[2]
	e := y - pred
	ec := e
	if r.samples.Load() >= warmup { // the priors are weak: the first samples decide, unclipped
		b := max(3*r.scale, pred/4, 1e-3)
		ec = clamp(e, -b, b)
		r.scale += (min(math.Abs(e), 2*b) - r.scale) / 8
	}
	r.theta[0] = clamp(r.theta[0]+px[0]/den*ec, 0, maxQueueSeconds)
	r.theta[1] = clamp(r.theta[1]+px[1]/den*ec, 0, maxPrefillSeconds*1e3)
	r.theta[2] = clamp(r.theta[2]+px[2]/den*ec, 0, maxDecodeSeconds*1e2)
	rlsForget(&r.cov, &px, 3, den, forget, &priorVar)
	r.samples.Add(1)
	r.publish()
}

// learnCPT folds one characters-per-token sample in (EWMA, weight 1/8).
// mu held.
func (r *rates) learnCPT(cpt float64) {
	r.cptEst += (clamp(cpt, minCharsPerToken, maxCharsPerToken) - r.cptEst) / 8
	r.cpt.Store(math.Float64bits(r.cptEst))
}

// sample is what one answer teaches one rates (Observe); each part is
// learned only when present.
type sample struct {
	cpt      float64 // key characters per prompt token (learnCPT); 0: none
	y        float64 // seconds to first byte
	ref      float64 // the reference's prediction of y (learnSpeed); 0: none
	fit      bool    // fit y, load, uncached and decoded (learn)
	load     int64
	uncached int
	decoded  int
}

// observe learns s under one hold of mu (learnCPT, learnSpeed and learn
// expect mu held).
func (r *rates) observe(s *sample) {
	r.mu.Lock()
	if s.cpt > 0 {
		r.learnCPT(s.cpt)
	}
	if s.ref > 0 {
		r.learnSpeed(s.y, s.ref)
	}
	if s.fit {
		r.learn(s.y, s.load, s.uncached, s.decoded)
	}
	r.mu.Unlock()
}

func clamp(v, lo, hi float64) float64 { return min(max(v, lo), hi) }

// kvBlockTokens is vLLM's default KV cache block (--block-size 16): a
// worker's hold shorter than one block's characters is no hold (fastest).
const kvBlockTokens = 16

// PriorTurns is the prior of the requests one placement decides (see
// turnsPerPlacement): it counts as PriorTurns requests over one placement.
const PriorTurns = 3.0

// sharedFanout is the ways the tree must branch at a point of the key for
// a request that matches no more than the prefix before it to count as a
// new conversation (a placement, see turnsPerPlacement and fastest).
const sharedFanout = 3

// turnsPerPlacement is R, the requests a placement decides on average in
// this model state: requests with a key over placements, with the prior
// PriorTurns as one pseudo-placement, and never below PriorTurns. A
// placement is a session miss (with session ids) or, without them, a
// request no worker holds more of than the part shared by different keys
// (a new conversation: all it matches is shared; see fastest). The floor:
// a fleet's first conversations are all placed before any has a second
// turn, when the ratio is near 1 and every placement would follow the
// prefill saving onto one worker (the replay matrix's cell a/tau/header/8
// shows it: bench/results/README.md).
func (st *modelState) turnsPerPlacement() float64 {
	return max(PriorTurns, (float64(st.requests.Load())+PriorTurns)/(float64(st.placements.Load())+1))
}

// comesBack is the odds that an answer's conversation has another turn:
// 1 − placements / requests, without turnsPerPlacement's prior or floor
// (one-turn traffic must not count returns that never come).
func (st *modelState) comesBack() float64 {
	n := st.requests.Load()
	if n == 0 {
		return 0
	}
	return clamp(1-float64(st.placements.Load())/float64(n), 0, 1)
}

// estimate is the placement cost of w for a key of which uncached
// characters are not held (docs/design.md §4):
//
//	speed(w) × (Queue × R × load(w) + Prefill × uncached / CharsPerToken × (1 + load(w) + pending(w)))
//
// Queue, Prefill and CharsPerToken are the model state's pooled fit (every
// worker's answers: one model, one tokenizer; a worker not yet heard from
// measured with the prior 4 characters per token would look 25 % dearer
// on a text of 5 and never be tried), speed(w) the worker's time to first
// byte over the reference's prediction (learnSpeed), R = turns, load(w)
// the requests in flight plus returns (returns.go). The prefill is paid
// by the requests already running on w too (each waits for the steps that
// prefill it), and once more by pending(w), those not answered yet (in
// flight without a first byte, loadview.Worker.Awaiting) or about to
// arrive (returns): their first tokens wait for it, as its first token
// waits for theirs. Speeds are read through fs (speeds.go). No allocation.
func (c *CacheAware) estimate(st *modelState, w *loadview.Worker, uncached int, turns float64, fs *fleetSpeeds, now int64, tau float64) float64 {
	q := math.Float64frombits(st.pool.queue.Load())
	p := math.Float64frombits(st.pool.prefill.Load())
	cpt := math.Float64frombits(st.pool.cpt.Load())
	sp := fs.fresh
	load := float64(w.FleetLoad())   // every replica's requests (§8.3)
	pending := float64(w.Awaiting()) // this replica's only
	if r, ok := st.rates.Load(w.ID()); ok {
		sp = fs.of(math.Float64frombits(r.speed.Load()))
		back := r.back.get(now, tau)
		load += back
		pending += back
	}
	return sp * (q*turns*load + p*float64(uncached)/cpt*(1+load+pending))
}

// fastest returns the healthy worker of req.Workers with the lowest
// placement cost (estimate) for req.Prefix, and the characters of the key
// it holds. Ties: the longer hold, then uniformly at random.
//
// A placement decides where the conversation's later turns run too, while
// moving it costs one re-prefill, after which the later turns are warm: the
// load term is weighed by R (turnsPerPlacement). And the part of the key
// that at least two eligible workers hold counts as held by every worker:
// a prefix that has spread (a system prompt) is held by any worker after
// one request, so it must not pull every new conversation to the workers
// that served it first (a conversation's own history is taught to the one
// worker serving it, so it never counts). A prefix only one worker holds is
// that worker's, however many conversations share it: counting a prefix
// the tree stores as branching 3 ways as held by all would send a document
// that three or four conversations ask about (Mooncake's) to whichever
// worker the load picked, to be prefilled again. The estimate weighs that
// prefill against the holder's load instead; once a second worker holds
// the prefix it is shared, so a system prompt pulls at most until then.
//
// A request places a new conversation (turnsPerPlacement) when no worker
// holds more of it than the longer of that part and the deepest point of
// its path where the tree branches at least sharedFanout ways, the key's
// own counting as one (radix.Tree.MatchEach's shared).
//
// One walk of the tree (MatchEach) for the branching point and the two
// longest holds, one pass over the workers as if each held only the shared
// part, then a second walk for the holders; no allocation.
func (c *CacheAware) fastest(st *modelState, req *Request) (*loadview.Worker, int) {
	n := len(req.Prefix)
	restrict := req.Subset || st.fallback
	eligible := func(id uint32) *loadview.Worker {
		w := c.reg.ByID(id)
		if w == nil || !w.Healthy() || (restrict && !contains(req.Workers, w)) {
			return nil
		}
		return w
	}
	branch, h1, h2 := 0, 0, 0 // the branching point, the longest and second-longest holds
	var holder uint32         // the worker of h1
	if n > 0 {
		branch = st.tree.MatchEach(req.Prefix, sharedFanout, func(id uint32, h int) {
			if eligible(id) == nil {
				return
			}
			if h > h1 {
				h1, h2, holder = h, h1, id
			} else if h > h2 {
				h2 = h
			}
		})
	}
	shared := h2 // held by two workers: counts as held by every worker
	now, tau := req.now, st.elapsed.get()
	own := h1 > max(branch, h2) // the conversation's previous turn ran on holder
	if own {
		st.returned(holder, now)
	}
	if len(req.Session) > 0 || !own {
		st.placements.Add(1) // a new conversation: no hold of its own anywhere
		st.replaced(now)
	}
	turns := st.turnsPerPlacement()
	fs := st.fleetSpeeds(req.Workers)
	var best *loadview.Worker
	bestT, bestHeld, ties := 0.0, 0, uint64(0)
	for _, w := range req.Workers {
		if !w.Healthy() {
			continue
		}
		t := c.estimate(st, w, n-shared, turns, &fs, now, tau)
		switch {
		case best == nil || t < bestT:
			best, bestT, ties = w, t, 1
		case t == bestT:
			ties++
			if c.rnd()%ties == 0 {
				best = w
			}
		}
	}
	if best == nil || h1 == 0 {
		return best, 0
	}
	block := kvBlockTokens * math.Float64frombits(st.pool.cpt.Load())
	st.tree.MatchEach(req.Prefix, 0, func(id uint32, h int) {
		w := eligible(id)
		if w == nil || float64(h) < block {
			return // a KV cache reuses whole blocks: less than one saves nothing
		}
		if t := c.estimate(st, w, n-max(h, shared), turns, &fs, now, tau); t < bestT || (t == bestT && h > bestHeld) {
			best, bestT, bestHeld = w, t, h
		}
	})
	return best, bestHeld
}

// Served is what the proxy saw of one response served by the worker of a
// Choice (docs/design.md §4, "Learning"). Token counts < 0 are unknown:
// vLLM omits usage.prompt_tokens_details unless started with
// --enable-prompt-tokens-details, and streams carry usage only with
// stream_options.include_usage; an unknown count is never taken as 0.
type Served struct {
	// TTFB is the time from sending the request to the first response
	// byte; for a non-streamed answer that is the whole answer, decode
	// included (Stream false).
	TTFB time.Duration
	// Elapsed is the time from sending the request to this report.
	Elapsed time.Duration
	Stream  bool
	// Load is the worker's requests in flight when this one was sent,
	// itself excluded.
	Load int64

	PromptTokens, CachedTokens, CompletionTokens int
}

// Observe learns from one served response: the worker's rates, its
// characters per token, the predicted vs served prefix counters, and the
// tree correction. ch is the Choice that Select returned for the request
// (a Choice of another policy, or a pinned one, teaches nothing). Safe for
// concurrent use; allocates only the first time a worker is seen in a
// model, and the correction (rare) costs O(nodes the worker holds).
//
// Correction: when cached_tokens is known and falls short of the tree's
// prediction by more than an eighth plus 32 tokens (blocks, tokenization
// and templates make the two differ a little), the worker's KV cache
// evicted the part of the key last used at the hold's stamp; an LRU cache
// has then evicted everything of the worker used no later, so that goes
// from the tree (radix.Tree.EvictOlder). The key itself is not trimmed:
// the worker has just computed it and holds it now. A shortfall whose hold
// was taught less than one TTFB before this request was sent is the
// previous request still prefilling, not eviction, and corrects nothing.
func (c *CacheAware) Observe(ch Choice, s *Served) {
	st, w := ch.st, ch.Worker
	if st == nil || w == nil {
		return
	}
	id := w.ID()
	if f, ok := c.follow.Load(id); ok && s.TTFB > 0 {
		f.noteAnswer(s.TTFB, s.Elapsed)
	}
	r, ok := st.rates.Load(id)
	if !ok {
		if c.reg.ByID(id) == nil {
			return // removed meanwhile: Forget ran or will run
		}
		r, _ = st.rates.LoadOrCompute(id, newRates)
	}
	if !c.cfg.AffinityRule { // only the estimate reads returns
		st.elapsed.learn(s.Elapsed)
		odds := st.comesBack()
		r.back.add(c.now(), st.elapsed.get(), odds) // the conversation's next turn (returns.go)
		st.lastAnswer.Store(uint64(id)<<32 | uint64(math.Float32bits(float32(odds))))
	}
	prompt, cached := s.PromptTokens, s.CachedTokens
	var mine, pooled sample // what the worker's rates and the pool learn, each under one lock
	if prompt > 0 && ch.keyLen > 0 {
		mine.cpt = float64(ch.keyLen) / float64(prompt)
		pooled.cpt = mine.cpt
	}
	// The prediction in tokens: the held share of this very prompt.
	var pred float64
	if prompt > 0 && ch.keyLen > 0 {
		pred = min(float64(prompt), float64(ch.held)*float64(prompt)/float64(ch.keyLen))
	} else {
		pred = float64(ch.held) / math.Float64frombits(r.cpt.Load())
	}
	if cached >= 0 && prompt > 0 {
		r.prompt.Add(uint64(prompt))
		r.predicted.Add(uint64(pred))
		r.served.Add(uint64(cached))
		if float64(cached) < pred*7/8-32 && ch.heldAt != 0 {
			sent := c.now() - s.Elapsed.Nanoseconds()
			if ch.heldAt < sent-s.TTFB.Nanoseconds() && raiseTo(&r.cutoff, ch.heldAt) {
				r.corrections.Add(1)
				st.tree.EvictOlder(id, ch.heldAt)
			}
		}
	}
	c.applyCapacity(st, w, r) // with the characters per token learned so far
	var uncached int
	switch {
	case cached >= 0 && prompt > 0:
		uncached = max(prompt-cached, 0)
	case prompt > 0:
		uncached = max(prompt-int(pred), 0) // cached unknown: trust the tree
	default:
		uncached = int(float64(ch.keyLen-ch.held) / math.Float64frombits(r.cpt.Load()))
	}
	decoded := 0
	if !s.Stream {
		if s.CompletionTokens < 0 { // a whole answer of unknown length: its decode cannot be told apart
			r.observe(&mine)
			st.pool.observe(&pooled)
			return
		}
		decoded = s.CompletionTokens
	}
	y := s.TTFB.Seconds()
	ref := st.ref.predictLearn(y, s.Load, uncached, decoded)
	if st.pool.count() >= speedWarmup && min(y, ref) >= minSpeedReference {
		mine.ref = ref
	}
	mine.y, mine.fit, mine.load, mine.uncached, mine.decoded = y, true, s.Load, uncached, decoded
	pooled.y, pooled.fit, pooled.load, pooled.uncached, pooled.decoded = y, true, s.Load, uncached, decoded
	r.observe(&mine)
	st.pool.observe(&pooled)
}

// applyCapacity budgets w's part of st's tree by the KV capacity its
// engine states (docs/design.md §4, "The tree's budget"): capacity tokens
// × the characters per token learned from w's answers (r; the model's
// pooled rate when r is nil), and trims w's part down to it when over. A
// worker whose engine states nothing has no budget of its own: the tree
// keeps MaxTreeSize and the cached_tokens correction alone, as before.
// Runs off the decision path (Observe, Sweep); O(1) unless w is over, then
// one eviction pass (radix.Tree.TrimWorker).
func (c *CacheAware) applyCapacity(st *modelState, w *loadview.Worker, r *rates) {
	id := w.ID()
	tokens := w.KVCapacityTokens()
	if tokens <= 0 {
		if st.tree.WorkerBudget(id) != 0 {
			st.tree.SetWorkerBudget(id, 0) // it no longer states one
		}
		return
	}
	if r == nil {
		r = st.pool
	}
	cpt := math.Float64frombits(r.cpt.Load())
	st.tree.SetWorkerBudget(id, int(min(float64(tokens)*cpt, math.MaxInt32*float64(1<<16))))
	st.tree.TrimWorker(id)
}

// raiseTo stores v in a if v is larger; reports whether it did.
func raiseTo(a *atomic.Int64, v int64) bool {
	for {
		old := a.Load()
		if v <= old {
			return false
		}
		if a.CompareAndSwap(old, v) {
			return true
		}
	}
}

// QueueSeconds is what a request waits on w per request in flight there,
// in model, as the estimate learned it: the model's pooled queue rate
// times w's measured speed. false until the model's rates learned from an
// answer.
func (c *CacheAware) QueueSeconds(model string, w *loadview.Worker) (float64, bool) {
	st, ok := c.models.Load(model)
	if !ok || st.pool.count() == 0 {
		return 0, false
	}
	q := math.Float64frombits(st.pool.queue.Load())
	if r, ok := st.rates.Load(w.ID()); ok && r.count() > 0 {
		q *= math.Float64frombits(r.speed.Load())
	}
	return q, true
}

// PrefillSeconds is the seconds model's pool takes to prefill one uncached
// prompt token, as the estimate learned it (the pooled fit); false until
// the model's rates learned from an answer.
func (c *CacheAware) PrefillSeconds(model string) (float64, bool) {
	st, ok := c.models.Load(model)
	if !ok || st.pool.count() == 0 {
		return 0, false
	}
	return math.Float64frombits(st.pool.prefill.Load()), true
}

// CharsPerToken returns the key characters per prompt token learned from
// worker id's answers in model, and false (with the prior) when that
// worker has not answered in that model yet. Allocation-free; for the
// proxy's context-length check (docs/design.md §8.4).
func (c *CacheAware) CharsPerToken(model string, id uint32) (float64, bool) {
	st, ok := c.models.Load(model)
	if !ok {
		return PriorCharsPerToken, false
	}
	r, ok := st.rates.Load(id)
	if !ok {
		return PriorCharsPerToken, false
	}
	return math.Float64frombits(r.cpt.Load()), true
}
