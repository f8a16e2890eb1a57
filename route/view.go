package route

import (
	"container/heap"
	"sort"
	"time"
)

// MemoryView is a bounded snapshot of the policy's routing memory for the
// operator's page (docs/design.md §8.4): totals per worker over every model
// state, and the most recently used sessions.
type MemoryView struct {
	Sessions int                   // session-map entries held, all states (expired ones not yet swept included)
	Workers  map[uint32]WorkerView // by worker id, over every model state
	Recent   []RecentSession       // most recently used first
}

// WorkerView is one worker's share of the routing memory, summed over
// model states. The token counters are Observe's (see WriteMetrics).
type WorkerView struct {
	Sessions        int    // live (not expired) sessions bound to the worker
	TreeChars       int    // characters the worker holds in the trees
	TreeBytes       int    // bytes charged against MaxTreeSize, summed over models
	TreeBudgetChars int    // the most TreeChars may hold, from the engine's stated KV capacity (the largest of its models'); 0: none
	PromptTokens    uint64 // prompt tokens of the answers whose cached_tokens is known
	PredictedTokens uint64 // prefix tokens the tree predicted cached
	ServedTokens    uint64 // cached_tokens the worker reported
}

// RecentSession is one session-map entry with its model state.
type RecentSession struct {
	Model   string // the model, or FallbackModel
	Session string // the key as stored (at most 256 bytes, §8.1)
	Worker  uint32 // worker id (the registry may no longer hold it)
	Idle    time.Duration
}

// View returns the memory view with at most recent sessions. It walks every
// session map once and holds at most recent entries meanwhile, so its
// memory is bounded by recent and the number of workers, whatever the
// sessions held.
func (c *CacheAware) View(recent int) MemoryView {
	v := MemoryView{Workers: map[uint32]WorkerView{}}
	now := c.now()
	ttl := c.cfg.SessionTTL.Nanoseconds()
	top := &recentHeap{}
	c.each(func(model string, st *modelState) {
		v.Sessions += st.sessions.Len()
		st.sessions.Range(func(key string, w uint32, last int64) bool {
			if now-last <= ttl {
				wv := v.Workers[w]
				wv.Sessions++
				v.Workers[w] = wv
			}
			if recent <= 0 {
				return true
			}
			if top.Len() < recent {
				heap.Push(top, recentEntry{model, key, w, last})
			} else if last > (*top)[0].last {
				(*top)[0] = recentEntry{model, key, w, last}
				heap.Fix(top, 0)
			}
			return true
		})
		for _, id := range st.tree.Workers() {
			wv := v.Workers[id]
			wv.TreeChars += st.tree.WorkerChars(id)
			wv.TreeBytes += st.tree.WorkerBytes(id)
			wv.TreeBudgetChars = max(wv.TreeBudgetChars, st.tree.WorkerBudget(id))
			v.Workers[id] = wv
		}
		st.rates.Range(func(id uint32, r *rates) bool {
			wv := v.Workers[id]
			wv.PromptTokens += r.prompt.Load()
			wv.PredictedTokens += r.predicted.Load()
			wv.ServedTokens += r.served.Load()
			v.Workers[id] = wv
			return true
		})
	})
	sort.Slice(*top, func(i, j int) bool { return (*top)[i].last > (*top)[j].last })
	v.Recent = make([]RecentSession, len(*top))
	for i, e := range *top {
		v.Recent[i] = RecentSession{Model: e.model, Session: e.key, Worker: e.worker, Idle: time.Duration(max(now-e.last, 0))}
	}
	return v
}

type recentEntry struct {
	model, key string
	worker     uint32
	last       int64
}

// recentHeap is a min-heap by last access: its root is the oldest of the
// sessions kept.
type recentHeap []recentEntry

func (h recentHeap) Len() int           { return len(h) }
func (h recentHeap) Less(i, j int) bool { return h[i].last < h[j].last }
func (h recentHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *recentHeap) Push(x any)        { *h = append(*h, x.(recentEntry)) }
func (h *recentHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
