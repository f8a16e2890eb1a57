package route

import (
	"math"
	"sync"
	"time"

	"github.com/warmroute/warmroute/kvevents"
	"github.com/warmroute/warmroute/loadview"
)

// KVFollower is a policy that keeps its picture of each worker's cache
// true to the engine's KV-cache events (docs/design.md §9, "KV events"):
// loadview hands it every batch of a worker's stream, in order, and says
// when the stream broke, and whether because the publisher restarted.
type KVFollower interface {
	KVEvents(w *loadview.Worker, b *kvevents.Batch)
	KVResync(w *loadview.Worker, restarted bool)
}

var _ KVFollower = (*CacheAware)(nil)

// The cache-aware policy follows events without a tokenizer: it never maps
// a block to the text it holds. It maps each stored block to a lower bound
// of the access stamp the tree gave the history that stored it: the
// router's clock when the store arrived, less the worker's longest recent
// time from a request's selection to its first byte (the blocks are stored
// as its prefill ends). When the engine removes blocks, it freed them
// least recently used first (vLLM: a finished request's blocks, tail
// before head), so every history the worker last used before the newest
// of the removed blocks is gone too: the tree drops the worker's parts
// accessed at or before that bound (radix.Tree.EvictOlder, as the
// cached_tokens correction does after a miss, §4), as the engine evicts
// instead of after the miss. The bound is a lower one on purpose: an
// estimate from the mean time to first byte evicted histories the engine
// still held whenever queues made that time vary (docs/design.md §9, "KV
// events", has the runs); a bound too low only evicts less. And the
// cutoff never reaches the histories selected within the worker's longest
// recent answer time of now: they may still be running there, their blocks
// held while older, freed ones are evicted. Blocks stored before any
// answer of the worker was timed are not mapped. AllBlocksCleared drops the
// worker's part of the tree (a reset, a sleep), and so does a restarted
// publisher (a restarted engine). A broken stream forgets the map:
// removals of blocks stored before it are ignored, and the engine-stated
// capacity (§4, "The tree's budget") keeps bounding the worker's part
// meanwhile.

// kvMap bounds: blocks followed per worker, from the engine's stated
// capacity (twice its blocks) within these.
const (
	kvMapMin = 1 << 12
	kvMapMax = 1 << 20
)

// kvFollow is what the policy keeps of one worker's event stream.
type kvFollow struct {
	mu     sync.Mutex
	stamps map[kvevents.BlockHash]int64 // stored block → lower bound of its history's access stamp
	order  []kvevents.BlockHash         // insertion order (a ring once full), for the bound
	next   int
	ttfb   time.Duration // longest recent time to first byte of the worker's answers (a decaying maximum); 0: none timed
	// The longest recent time an answer of the worker took, sent to last
	// byte (a decaying maximum): a history selected within it of now may
	// still be running there, its blocks held, whatever was evicted.
	elapsed time.Duration
}

// follower returns w's follow state, made on its first event.
func (c *CacheAware) follower(w *loadview.Worker) *kvFollow {
	f, _ := c.follow.LoadOrCompute(w.ID(), func() *kvFollow { return &kvFollow{stamps: map[kvevents.BlockHash]int64{}} })
	return f
}

// noteAnswer records an answer's time to first byte and its whole time
// (Observe): each maximum decays by a 64th an answer, so it follows a
// queue that drains.
func (f *kvFollow) noteAnswer(ttfb, elapsed time.Duration) {
	f.mu.Lock()
	f.ttfb = max(ttfb, f.ttfb-f.ttfb/64)
	f.elapsed = max(elapsed, f.elapsed-f.elapsed/64)
	f.mu.Unlock()
}

// put maps h to stamp, dropping the oldest mapping past limit. Under f.mu.
func (f *kvFollow) put(h kvevents.BlockHash, stamp int64, limit int) {
	if _, ok := f.stamps[h]; !ok {
		if len(f.order) < limit {
			f.order = append(f.order, h)
		} else {
			f.next %= len(f.order)
			delete(f.stamps, f.order[f.next])
			f.order[f.next] = h
			f.next++
		}
	}
	f.stamps[h] = stamp
}

// reset forgets every mapping. Under f.mu.
func (f *kvFollow) reset() {
	clear(f.stamps)
	f.order, f.next = f.order[:0], 0
}

// gpu reports whether an event's medium is the GPU cache the prefix match
// reads: other tiers (CPU offload) do not count.
func gpu(medium string) bool { return medium == "" || medium == "GPU" || medium == "gpu" }

// KVEvents applies one batch of w's KV events (see above). Off the request
// path: the tree write it may make is handed over like any eviction.
func (c *CacheAware) KVEvents(w *loadview.Worker, b *kvevents.Batch) {
	f := c.follower(w)
	now := c.now()
	limit := kvMapMax
	cleared, cutoff := false, int64(math.MinInt64)
	f.mu.Lock()
	stamp, timed := now-int64(f.ttfb), f.ttfb > 0
	running := now - int64(f.elapsed) // histories selected after it may still be running
	for _, e := range b.Events {
		switch e := e.(type) {
		case kvevents.BlockStored:
			if !gpu(e.Medium) || !timed {
				continue
			}
			if limit == kvMapMax {
				limit = mapLimit(w, e.BlockSize)
			}
			for _, h := range e.BlockHashes {
				f.put(h, stamp, limit)
			}
		case kvevents.BlockRemoved:
			if !gpu(e.Medium) {
				continue
			}
			for _, h := range e.BlockHashes {
				if s, ok := f.stamps[h]; ok {
					delete(f.stamps, h) // its ring slot is reused in turn
					cutoff = max(cutoff, s)
				}
			}
		case kvevents.AllBlocksCleared:
			cleared = true
			cutoff = math.MinInt64 // the clear drops more than any cutoff
			f.reset()
		}
	}
	f.mu.Unlock()
	cutoff = min(cutoff, running)
	c.kvApplied.Add(1)
	if cleared {
		c.ForgetCache(w)
		c.kvCleared.Add(1)
	}
	if cutoff != math.MinInt64 {
		c.evictBefore(w, cutoff)
	}
}

// mapLimit bounds w's block map: twice the blocks its engine states it
// holds, within kvMapMin and kvMapMax.
func mapLimit(w *loadview.Worker, blockSize int) int {
	c := w.KVCapacityTokens()
	if c <= 0 || blockSize <= 0 {
		return kvMapMax
	}
	return int(min(max(2*c/int64(blockSize), kvMapMin), kvMapMax))
}

// KVResync forgets w's block map after its stream broke; a restarted
// publisher is a restarted engine, whose cache is empty: w's part of the
// tree goes too.
func (c *CacheAware) KVResync(w *loadview.Worker, restarted bool) {
	f := c.follower(w)
	f.mu.Lock()
	f.reset()
	f.mu.Unlock()
	if restarted {
		c.ForgetCache(w)
		c.kvCleared.Add(1)
	}
}

// evictBefore drops w's parts of every model's tree last accessed before
// cutoff, once per cutoff: the engine evicted everything it used before.
func (c *CacheAware) evictBefore(w *loadview.Worker, cutoff int64) {
	id := w.ID()
	c.each(func(_ string, st *modelState) {
		if st.tree.WorkerChars(id) == 0 {
			return
		}
		r, _ := st.rates.LoadOrCompute(id, newRates)
		if !raiseTo(&r.cutoff, cutoff) {
			return
		}
		r.corrections.Add(1)
		st.tree.EvictOlder(id, cutoff)
	})
	c.kvEvictions.Add(1)
}
