package route

import (
	"sync/atomic"

	"github.com/warmroute/warmroute/loadview"
)

var (
	_ Policy = (*roundRobin)(nil)
	_ Policy = (*random)(nil)
	_ Policy = (*powerOfTwo)(nil)
	_ Policy = (*consistentHash)(nil)
)

// roundRobin cycles through the healthy workers.
type roundRobin struct{ next atomic.Uint64 }

func (*roundRobin) Name() string { return RoundRobin }
func (*roundRobin) Reads() Depth { return ReadsModel }
func (p *roundRobin) Select(req *Request) Choice {
	n := uint64(len(req.Workers))
	start := p.next.Add(1) - 1
	for i := uint64(0); i < n; i++ {
		if w := req.Workers[(start+i)%n]; w.Healthy() {
			return Choice{Worker: w, Decision: RoundRobin}
		}
	}
	return Choice{Worker: nil, Decision: RoundRobin}
}

// random picks a healthy worker uniformly.
type random struct{ rnd func() uint64 }

func (*random) Name() string { return Random }
func (*random) Reads() Depth { return ReadsModel }
func (p *random) Select(req *Request) Choice {
	return Choice{Worker: RandomHealthy(req.Workers, p.rnd), Decision: Random}
}

// powerOfTwo samples two healthy workers and keeps the less loaded one.
type powerOfTwo struct{ rnd func() uint64 }

func (*powerOfTwo) Name() string { return PowerOfTwo }
func (*powerOfTwo) Reads() Depth { return ReadsModel }
func (p *powerOfTwo) Select(req *Request) Choice {
	a := RandomHealthy(req.Workers, p.rnd)
	b := RandomHealthy(req.Workers, p.rnd)
	if a == nil || (b != nil && b.FleetLoad() < a.FleetLoad()) {
		a = b
	}
	return Choice{Worker: a, Decision: PowerOfTwo}
}

// leastLoaded sends each request to the healthy worker with the fewest
// requests in flight (every replica's, with the load scrape), then the
// lowest KV cache usage the worker reports, ties broken at random: the
// decode leg's baseline in a disaggregated fleet (docs/design.md §9),
// where a decode worker's cost is its batch and its free KV blocks.
// Allocation-free.
type leastLoaded struct{ rnd func() uint64 }

func (*leastLoaded) Name() string { return LeastLoaded }
func (*leastLoaded) Reads() Depth { return ReadsModel }
func (p *leastLoaded) Select(req *Request) Choice {
	var best *loadview.Worker
	var bestLoad int64
	var bestKV float64
	ties := uint64(0)
	for _, w := range req.Workers {
		if !w.Healthy() {
			continue
		}
		l, kv := w.FleetLoad(), 0.0
		if r, ok := w.LoadReport(); ok && r.KVCacheUsage > 0 {
			kv = r.KVCacheUsage
		}
		switch {
		case best == nil || l < bestLoad || l == bestLoad && kv < bestKV:
			best, bestLoad, bestKV, ties = w, l, kv, 1
		case l == bestLoad && kv == bestKV:
			ties++
			if p.rnd()%ties == 0 {
				best = w
			}
		}
	}
	return Choice{Worker: best, Decision: LeastLoaded}
}

// consistentHash maps the session key to a worker by rendezvous hashing
// (highest hash of key ⊕ worker wins): stable across router replicas, and
// removing a worker moves only its own sessions. Allocation-free. Requests
// without a session key go to a random healthy worker.
type consistentHash struct{ rnd func() uint64 }

func (*consistentHash) Name() string { return ConsistentHash }
func (*consistentHash) Reads() Depth { return ReadsSession }
func (p *consistentHash) Select(req *Request) Choice {
	if len(req.Session) == 0 {
		return Choice{Worker: RandomHealthy(req.Workers, p.rnd), Decision: ConsistentHash}
	}
	k := loadview.Hash64(req.Session)
	var best *loadview.Worker
	var bestScore uint64
	for _, w := range req.Workers {
		if !w.Healthy() {
			continue
		}
		if s := loadview.Mix64(k ^ w.Hash()); best == nil || s > bestScore {
			best, bestScore = w, s
		}
	}
	return Choice{Worker: best, Decision: ConsistentHash}
}
