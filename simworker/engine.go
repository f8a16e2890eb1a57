package simworker

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Scheduling policies (Config.SchedulingPolicy).
const (
	ScheduleFCFS     = "fcfs"
	SchedulePriority = "priority"
)

// Latency models (Config.LatencyModel).
const (
	// LatencyEngine simulates a continuous-batching engine step by step
	// (docs/design.md §6): chunked prefill of uncached tokens under a step
	// token budget, one token per running sequence per step, step time
	// growing with the batch, queueing past MaxNumSeqs and past the KV
	// capacity.
	LatencyEngine = "engine"
	// LatencyLegacy is the per-request model: TTFT = Overhead + PerToken ×
	// uncached tokens, then InterToken per output token, MaxNumSeqs slots.
	LatencyLegacy = "legacy"
)

// engine is the continuous-batching scheduler of one Worker: one loop for
// all its models, which share the simulated GPU (docs/design.md §6). The
// loop sleeps until each step's deadline with one timer, does O(running)
// work per step and blocks when idle. mu guards everything but the seqs'
// atomics; handlers take it once to submit.
type engine struct {
	w       *Worker
	mu      sync.Mutex
	waiting []*seq // FIFO
	running []*seq // admission order
	kv      kvCache
	sched   []*seq // scratch: the seqs scheduled in the current step
	wake    chan struct{}
	started sync.Once

	holds      map[string]*kvHold // prefill legs' blocks awaiting a decode worker, by request id (pd.go)
	heldBlocks int                // blocks the holds reference
}

// FirstToken is how one request reached its first token in the engine
// model (Config.OnFirstToken). Durations are simulated: real ones ÷
// TimeScale.
type FirstToken struct {
	Queued  time.Duration // from its submission to the engine until it got a sequence slot
	TTFT    time.Duration // from its arrival at the worker to the first token
	Running int           // sequences running when it was submitted
	Waiting int           // sequences waiting then, ahead of it
	Slots   int           // MaxNumSeqs
}

// seq is one request inside the engine. Fields without atomics belong to
// the loop (under engine.mu).
type seq struct {
	j       *job
	chain   []uint64 // block hashes of the prompt's full blocks (nil: not cached)
	units   int      // tokens to generate; 0 = prefill only (embeddings)
	need    int      // KV blocks reserved at admission: prompt + units
	stream  bool     // wake the handler on every token, not just at the end
	noCache bool     // no prefix-cache lookup or prompt counters (embeddings)
	pull    *kvPull  // decode leg: KV to pull from a prefill worker before running (pd.go)
	hold    bool     // prefill leg: on finishing, hold the prompt's blocks for a decode worker

	prefilled int // prompt tokens computed (cached ones included)
	generated int
	chunk     int  // prefill tokens scheduled in this step
	decode    bool // scheduled to emit a token in this step
	refd      int  // chain[:refd] are referenced by this seq
	anon      int  // blocks held that are not in the cache index

	submitted, admitted  time.Time // into the waiting queue, into a sequence slot
	runningAt, waitingAt int       // sequences running and waiting when it was submitted

	produced atomic.Int64 // tokens emitted so far
	finished atomic.Bool
	aborted  atomic.Bool // the handler gave up: release at the next step
	signal   chan struct{}
}

func newEngine(w *Worker) *engine {
	return &engine{w: w, kv: newKVCache(w.cfg.CacheBlocks), wake: make(chan struct{}, 1)}
}

// submit queues j for generation of units tokens, after its extra TTFT
// (faults, slow start). False when the worker closed first.
func (w *Worker) submit(j *job, units int, stream, noCache bool) (*seq, bool) {
	if j.extraTTFT > 0 && !w.sleep(j.extraTTFT) {
		return nil, false
	}
	e := w.eng
	s := &seq{j: j, units: units, stream: stream, noCache: noCache, signal: make(chan struct{}, 1)}
	if j.kv != nil {
		s.pull = &kvPull{admitted: make(chan struct{})}
	}
	s.hold = j.holdID != ""
	bt := w.cfg.BlockTokens
	if !noCache {
		s.chain = blockHashes(nil, j.salt, j.prompt, bt*w.cfg.CharsPerToken)
	}
	// Blocks for prompt + generated tokens are reserved up front, so a
	// running sequence never needs preempting; a request larger than the
	// whole cache runs alone on all of it (docs/design.md §6).
	s.need = min(max((j.promptTokens+units+bt-1)/bt, 1), e.kv.capacity)
	if len(s.chain) > s.need {
		s.chain = s.chain[:s.need]
	}
	e.mu.Lock()
	s.submitted, s.runningAt, s.waitingAt = time.Now(), len(e.running), len(e.waiting)
	e.enqueue(s)
	w.waiting.Add(1)
	j.ms.waiting.Add(1)
	e.mu.Unlock()
	e.started.Do(func() { go e.loop() })
	e.poke()
	if s.pull != nil && !w.transfer(s) {
		return nil, false
	}
	return s, true
}

// enqueue adds s to the waiting queue: at its end, or under the priority
// policy after every waiting sequence of its priority or a more urgent
// one (vLLM's order: priority, then arrival). e.mu held.
func (e *engine) enqueue(s *seq) {
	i := len(e.waiting)
	if e.w.cfg.SchedulingPolicy == SchedulePriority {
		for i > 0 && e.waiting[i-1].j.priority > s.j.priority {
			i--
		}
	}
	e.waiting = slices.Insert(e.waiting, i, s)
}

// poke wakes the loop.
func (e *engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// await waits until s produced at least n tokens (n < 0: until it
// finished). False when the worker closed first.
func (w *Worker) await(s *seq, n int) bool {
	for {
		if (n < 0 && s.finished.Load()) || (n >= 0 && int(s.produced.Load()) >= n) {
			return true
		}
		select {
		case <-s.signal:
		case <-w.done:
			return false
		}
	}
}

func (e *engine) loop() {
	w := e.w
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var deadline time.Time
	for {
		e.mu.Lock()
		for len(e.running) == 0 && len(e.waiting) == 0 {
			e.mu.Unlock()
			select {
			case <-e.wake:
			case <-w.done:
				return
			}
			e.mu.Lock()
		}
		d := w.scaled(e.schedule())
		e.mu.Unlock()

		// Keep simulated time on the step deadlines: a late wake-up shortens
		// the next sleep rather than slowing the clock, unless a whole step
		// behind (then restart from now).
		now := time.Now()
		if deadline.IsZero() || now.Sub(deadline) > d {
			deadline = now
		}
		deadline = deadline.Add(d)
		if wait := deadline.Sub(now); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-w.done:
				return
			}
		} else {
			select {
			case <-w.done:
				return
			default:
			}
		}

		e.mu.Lock()
		e.complete()
		e.unlockPublish()
	}
}

// unlockPublish releases e.mu and publishes the KV events the cache logged
// since the last batch (this step's evictions at admission and blocks
// stored by prefill, a KV pull's blocks, a reset) as one batch; none when
// there are none or events are off.
func (e *engine) unlockPublish() {
	if e.kv.log == nil || len(e.kv.log.ops) == 0 {
		e.mu.Unlock()
		return
	}
	e.w.kv.publishUnlock(e.kv.log.take(), e.mu.Unlock)
}

// schedule picks this step's work, vLLM V1 style: running sequences first
// (one token each when decoding, a prefill chunk otherwise), then waiting
// ones in arrival order while there are seqs, tokens and KV blocks; it
// returns the step's simulated duration. e.mu held.
func (e *engine) schedule() time.Duration {
	w := e.w
	cfg := &w.cfg
	budget := cfg.MaxNumBatchedTokens
	prefill, decodes := 0, 0
	e.sched = e.sched[:0]
	plan := func(s *seq) {
		s.chunk, s.decode = 0, false
		if budget <= 0 {
			return
		}
		if rem := s.j.promptTokens - s.prefilled; rem > 0 {
			s.chunk = min(rem, budget)
			budget -= s.chunk
			prefill += s.chunk
		} else {
			s.decode = true
			budget--
			decodes++
		}
		e.sched = append(e.sched, s)
	}
	kept := e.running[:0]
	for _, s := range e.running {
		if s.aborted.Load() {
			e.release(s)
			continue
		}
		kept = append(kept, s)
		plan(s)
	}
	clear(e.running[len(kept):])
	e.running = kept

	for len(e.waiting) > 0 && len(e.running) < cfg.MaxNumSeqs && budget > 0 {
		s := e.waiting[0]
		aborted := s.aborted.Load()
		reserved := s.pull != nil && s.pull.done // KV pulled: blocks reserved before
		if !aborted && !reserved && !e.kv.reserve(s) {
			break // first come, first served: the head waits for blocks
		}
		e.waiting[0] = nil
		e.waiting = e.waiting[1:]
		if s.pull != nil && !reserved && !aborted {
			// Its blocks reserved, the decode leg leaves the queue while
			// its handler pulls the KV it lacks; it still counts as
			// waiting, as vLLM counts a request waiting for remote KV.
			s.pull.hit = s.refd
			close(s.pull.admitted)
			continue
		}
		w.waiting.Add(-1)
		s.j.ms.waiting.Add(-1)
		if aborted {
			if reserved {
				e.kv.release(s)
			}
			continue
		}
		w.running.Add(1)
		s.j.ms.running.Add(1)
		s.admitted = time.Now()
		e.running = append(e.running, s)
		j := s.j
		j.cachedTokens = min(s.refd*cfg.BlockTokens, j.promptTokens)
		s.prefilled = j.cachedTokens
		if !s.noCache {
			w.countPrompt(j)
		}
		plan(s)
	}
	if len(e.waiting) == 0 {
		e.waiting = e.waiting[:0:0] // let the drained backing array go
	}
	return cfg.StepBase + time.Duration(prefill)*cfg.PerToken + time.Duration(decodes)*cfg.DecodePerSeq
}

// complete applies the step that just ended: prefill progress (finished
// prompt blocks enter the cache), first and next tokens, finished
// sequences released. e.mu held.
func (e *engine) complete() {
	w := e.w
	bt := w.cfg.BlockTokens
	done := 0
	for _, s := range e.sched {
		j := s.j
		tokenOut := false
		if s.chunk > 0 {
			s.prefilled += s.chunk
			for s.refd < len(s.chain) && (s.refd+1)*bt <= s.prefilled {
				e.kv.insert(s)
			}
			if s.prefilled == j.promptTokens && s.units > 0 {
				s.generated = 1
				tokenOut = true
			}
		} else if s.decode {
			if s.units > 0 {
				s.generated++
				tokenOut = true
			}
		}
		if tokenOut && s.generated == 1 {
			j.ms.ttft.Update(time.Since(j.arrived).Seconds())
			if on := w.cfg.OnFirstToken; on != nil {
				on(j.id, FirstToken{
					Queued: w.unscaled(s.admitted.Sub(s.submitted)), TTFT: w.unscaled(time.Since(j.arrived)),
					Running: s.runningAt, Waiting: s.waitingAt, Slots: w.cfg.MaxNumSeqs,
				})
			}
		}
		fin := s.prefilled == j.promptTokens && s.generated >= s.units
		if tokenOut {
			s.produced.Store(int64(s.generated))
		}
		if fin {
			if s.hold {
				e.hold(s)
			} else {
				e.release(s)
			}
			s.finished.Store(true)
			done++
		}
		if fin || (tokenOut && s.stream) {
			select {
			case s.signal <- struct{}{}:
			default:
			}
		}
	}
	if done > 0 {
		kept := e.running[:0]
		for _, s := range e.running {
			if !s.finished.Load() {
				kept = append(kept, s)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}
	clear(e.sched)
	e.sched = e.sched[:0]
}

// release returns s's blocks and its running slot. e.mu held.
func (e *engine) release(s *seq) {
	e.kv.release(s)
	e.w.running.Add(-1)
	s.j.ms.running.Add(-1)
}

// countPrompt counts j's prompt and prefix-cache lookup.
func (w *Worker) countPrompt(j *job) {
	ms := j.ms
	hits := j.cachedTokens - j.externalTokens // the prefix cache's own hit
	ms.queries.Add(j.promptTokens)
	ms.hits.Add(hits)
	ms.prompt.Add(j.promptTokens)
	w.prefixQueries.Add(uint64(j.promptTokens))
	w.prefixHits.Add(uint64(hits))
	w.promptTokens.Add(uint64(j.promptTokens))
}

// kvStats returns the engine's blocks in use (cached or held), held by
// sequences (running, or finished prefill legs awaiting a pull), and held
// for a pull.
func (e *engine) kvStats() (used, held, xfer int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.kv.used(), e.kv.used() - e.kv.evictable, e.heldBlocks
}

// resetCache drops every cached block no running sequence holds, and
// publishes it at once: AllBlocksCleared when that is every block,
// otherwise BlockRemoved for those dropped.
func (e *engine) resetCache() {
	e.mu.Lock()
	log := e.kv.log
	all := log != nil && len(e.kv.index) == e.kv.evictable
	if all {
		e.kv.log = nil // one AllBlocksCleared says it
	}
	for e.kv.evictable > 0 {
		e.kv.evict()
	}
	if all {
		e.kv.log = log
		log.cleared()
	}
	e.unlockPublish()
}

// kvCache is the engine's KV block pool, as vLLM's block manager keeps it:
// capacity blocks; a block holding a full prompt block is named by its
// chained hash and shared by every sequence with that prefix (reference
// counted); blocks no sequence references stay cached in an LRU and are
// evicted, least recently used first, only when a new sequence needs room.
// Blocks of partial prompt blocks and of generated tokens are anonymous
// (counted in anon). Owned by the engine loop (engine.mu).
type kvCache struct {
	capacity  int
	index     map[uint64]int32 // block hash → node
	nodes     []kvNode         // nodes[0] is the LRU sentinel: next = most recent, prev = least recent
	free      []int32
	anon      int // blocks held by sequences outside the index
	evictable int // indexed blocks with ref 0 (on the LRU list)

	log *kvLog // KV events: indexed blocks stored and evicted; nil: none
}

type kvNode struct {
	key        uint64
	ref        int32
	prev, next int32
}

func newKVCache(capacity int) kvCache {
	return kvCache{
		capacity: capacity,
		index:    make(map[uint64]int32, min(capacity, 1<<16)),
		nodes:    make([]kvNode, 1, min(capacity, 1<<16)+1),
	}
}

// used is the number of blocks in use: held by sequences or cached.
func (c *kvCache) used() int { return len(c.index) + c.anon }

// reserve admits s if its blocks fit: the leading cached blocks of its
// chain are referenced (a prefix-cache hit), s.need minus those are taken
// from free blocks, evicting unreferenced cached blocks LRU-first. False,
// with nothing changed, when they do not fit.
func (c *kvCache) reserve(s *seq) bool {
	hit, hitIdle := 0, 0
	for _, k := range s.chain {
		i, ok := c.index[k]
		if !ok {
			break
		}
		hit++
		if c.nodes[i].ref == 0 {
			hitIdle++
		}
	}
	extra := s.need - hit
	if extra > c.capacity-c.used()+c.evictable-hitIdle {
		return false
	}
	for _, k := range s.chain[:hit] {
		c.ref(c.index[k])
	}
	for c.capacity-c.used() < extra {
		c.evict()
	}
	c.anon += extra
	s.refd, s.anon = hit, extra
	return true
}

// insert moves the next computed prompt block of s, chain[s.refd], into the
// index (or shares the copy another sequence computed meanwhile).
func (c *kvCache) insert(s *seq) {
	k := s.chain[s.refd]
	s.refd++
	if i, ok := c.index[k]; ok {
		c.ref(i)
		return
	}
	var i int32
	if n := len(c.free); n > 0 {
		i = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		c.nodes = append(c.nodes, kvNode{})
		i = int32(len(c.nodes) - 1)
	}
	c.nodes[i] = kvNode{key: k, ref: 1}
	c.index[k] = i
	c.anon--
	s.anon--
	if c.log != nil {
		c.log.stored(s.chain, s.refd-1, s.j)
	}
}

// release drops s's references and blocks.
func (c *kvCache) release(s *seq) {
	c.unref(s.chain[:s.refd])
	c.anon -= s.anon
	s.refd, s.anon = 0, 0
}

// unref drops one reference to each block of chain, last block first, so
// that a prompt's first block ends most recently used and eviction eats
// prompts from the tail.
func (c *kvCache) unref(chain []uint64) {
	for i := len(chain) - 1; i >= 0; i-- {
		n := c.index[chain[i]]
		if c.nodes[n].ref--; c.nodes[n].ref == 0 {
			c.pushFront(n)
			c.evictable++
		}
	}
}

func (c *kvCache) ref(i int32) {
	if c.nodes[i].ref == 0 {
		c.unlink(i)
		c.evictable--
	}
	c.nodes[i].ref++
}

// evict drops the least recently used unreferenced block.
func (c *kvCache) evict() {
	i := c.nodes[0].prev
	c.unlink(i)
	c.evictable--
	delete(c.index, c.nodes[i].key)
	c.free = append(c.free, i)
	if c.log != nil {
		c.log.removed(c.nodes[i].key)
	}
}

func (c *kvCache) unlink(i int32) {
	n := &c.nodes[i]
	c.nodes[n.prev].next = n.next
	c.nodes[n.next].prev = n.prev
}

func (c *kvCache) pushFront(i int32) {
	head := c.nodes[0].next
	c.nodes[i].prev = 0
	c.nodes[i].next = head
	c.nodes[head].prev = i
	c.nodes[0].next = i
}
