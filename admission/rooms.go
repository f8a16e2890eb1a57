package admission

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// roomCache is the pools' room as the path of a request that does not wait
// reads it: per model, what Config.Room said at the last refresh, less the
// requests admitted since. Reading Room costs a clock read per worker (the
// staleness of its report); the cache costs a map load and one atomic add,
// and a pool takes no more than its room between refreshes. A model seen
// for the first time is read at once.
type roomCache struct {
	room  func(model string) int
	byKey sync.Map // model → *atomic.Int64; bounded by maxCachedModels
	n     atomic.Int64
}

// maxCachedModels bounds the models whose room is cached: past it (model
// names the fleet does not serve, sent by clients) Room is read directly.
const maxCachedModels = 1024

// unlimited is the cached room of a pool whose limit is unknown.
const unlimited = math.MaxInt64 / 2

// take reports whether model's pool takes one more request now, and
// counts it.
func (r *roomCache) take(model string) bool {
	v, ok := r.byKey.Load(model)
	if !ok {
		left := r.read(model)
		if r.n.Load() >= maxCachedModels {
			return left > 0
		}
		c := new(atomic.Int64)
		c.Store(left)
		if v, ok = r.byKey.LoadOrStore(strings.Clone(model), c); !ok { // model may alias a request buffer
			r.n.Add(1)
		}
	}
	return v.(*atomic.Int64).Add(-1) >= 0
}

// read is model's room now, unlimited when unknown.
func (r *roomCache) read(model string) int64 {
	if n := r.room(model); n >= 0 {
		return int64(n)
	}
	return unlimited
}

// refresh reads every cached pool's room every tick until stop closes.
func (r *roomCache) refresh(tick time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		r.byKey.Range(func(k, v any) bool {
			v.(*atomic.Int64).Store(r.read(k.(string)))
			return true
		})
	}
}
