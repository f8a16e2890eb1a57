package fastproxy

import (
	"math"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// saturation reads how many more requests a model's pool takes before its
// workers' own queues show it full (docs/design.md §9), for the router's
// queue. A worker is full when its engine's KV cache usage reaches kv, or
// when its estimated backlog (loadview.Worker.Backlog: the requests waiting
// in its own queue, from its last report and what this router sent and
// saw answered since) reaches waiting. A worker that reports no queue is
// read from the policy's learned queue rate instead (route.QueueEstimator):
// full once the requests in flight there would each wait queueSecs. A
// worker known by neither, or a model no worker serves, sets no limit.
//
// A worker past full counts against the pool's room by as much: its
// requests wait in its engine, first come first served, where no priority
// of the router's queue reaches them, and a request the policy sends to it
// (its history is there) would wait behind them. So the queue releases
// nothing more while the pool's engines hold a queue longer than its free
// slots elsewhere.
type saturation struct {
	reg       *loadview.Registry
	queues    route.QueueEstimator // nil: the policy learns no queue rate
	waiting   int64                // --saturation-waiting
	kv        float64              // --saturation-kv-usage
	queueSecs float64              // --saturation-queue-secs
	headroom  int                  // --queue-headroom, per healthy worker; ≤ 0: none
}

// reserved is the room of model's pool kept for requests of priority 0 or
// more urgent (admission.Config.Headroom): headroom per healthy worker of
// its entry side. Lock-free, allocation-free.
func (s *saturation) reserved(model string) int {
	if s.headroom <= 0 {
		return 0
	}
	ws, _ := s.reg.ForModel(bytesconv.S2B(model))
	n := 0
	for _, w := range ws {
		if w.Healthy() {
			n++
		}
	}
	return n * s.headroom
}

// homeRoom is how many more requests of positive priority the worker
// with id takes for model before it is full, less the headroom kept
// there for urgent requests (admission.Config.HomeRoom); false: no limit
// known, or the worker is gone or unhealthy. The pool's reserve is kept
// per worker too, since an urgent turn goes where its history is: a free
// slot elsewhere does not keep it from queueing there. Lock-free,
// allocation-free.
func (s *saturation) homeRoom(model string, id uint32) (int, bool) {
	w := s.reg.ByID(id)
	if w == nil || !w.Healthy() {
		return 0, false
	}
	r, known := s.workerRoom(model, w)
	return r - max(s.headroom, 0), known
}

// room is how many more requests model's pool takes; -1: no limit known.
// In a disaggregated fleet saturation is judged per role (docs/design.md
// §9): the room is the smaller of its entry workers' and its decode
// workers'. Lock-free, allocation-free.
func (s *saturation) room(model string) int {
	m := bytesconv.S2B(model)
	ws, ok := s.reg.ForModel(m)
	if !ok {
		return -1
	}
	room := s.poolRoom(model, ws)
	if room < 0 {
		return room
	}
	if ds, ok := s.reg.DecodeWorkers(m); ok {
		if dr := s.poolRoom(model, ds); dr >= 0 && dr < room {
			room = dr
		}
	}
	return room
}

// poolRoom is room for the workers ws of model: their rooms' sum, never
// below 0; -1: no limit known.
func (s *saturation) poolRoom(model string, ws []*loadview.Worker) int {
	room, healthy := 0, false
	for _, w := range ws {
		if !w.Healthy() {
			continue
		}
		healthy = true
		r, known := s.workerRoom(model, w)
		if !known {
			return -1
		}
		room += r
	}
	if !healthy {
		return -1 // the worker step answers 503 at once: nothing to wait for
	}
	return max(room, 0)
}

// wait is the expected wait of a request that joins model's saturated pool
// behind backlog requests of the router's queue, in seconds: the queueing
// term of the time-to-first-token estimate (docs/design.md §4) for the
// pool as a whole,
//
//	W = q · (L + backlog + 1) / n
//
// n the pool's healthy workers, L their requests in flight (every
// replica's), q the mean of their learned seconds of wait per request in
// flight (route.QueueEstimator; route.PriorQueueSeconds where none was
// learned). Allocation-free.
func (s *saturation) wait(model string, backlog int) float64 {
	ws, _ := s.reg.ForModel(bytesconv.S2B(model))
	var n, load, q float64
	for _, w := range ws {
		if !w.Healthy() {
			continue
		}
		qw := route.PriorQueueSeconds
		if s.queues != nil {
			if v, ok := s.queues.QueueSeconds(model, w); ok && v > 0 {
				qw = v
			}
		}
		n, load, q = n+1, load+float64(w.FleetLoad()), q+qw
	}
	if n == 0 {
		return 0
	}
	return q / n * (load + float64(backlog) + 1) / n
}

// prefill is the seconds model's pool takes to prefill one uncached prompt
// token: learned (route.QueueEstimator), else route.PriorPrefillSeconds.
func (s *saturation) prefill(model string) float64 {
	if s.queues != nil {
		if p, ok := s.queues.PrefillSeconds(model); ok && p > 0 {
			return p
		}
	}
	return route.PriorPrefillSeconds
}

// workerRoom is how many more requests w takes before it is full, less
// than 0 by the requests past full; known is false when no limit is known.
func (s *saturation) workerRoom(model string, w *loadview.Worker) (room int, known bool) {
	kv := w.KVCacheUsage()
	kvFull := kv >= 0 && kv >= s.kv
	if n, ok := w.Backlog(); ok {
		room = int(s.waiting - n)
		if kvFull {
			room = min(room, 0)
		}
		return room, true
	}
	if kvFull || s.queues == nil {
		return 0, kvFull
	}
	q, ok := s.queues.QueueSeconds(model, w)
	if !ok || q <= 0 {
		return 0, false
	}
	return int(math.Floor(s.queueSecs/q) - float64(w.FleetLoad())), true
}
