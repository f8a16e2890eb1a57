package route

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Conversations between turns (docs/design.md §4 (5)). A worker's requests
// in flight undercount what it serves next: a conversation whose turn it
// has just answered is between turns (its client reads the answer, runs a
// tool) and comes back to it. The answers of one continuous batch end
// together, so the count dips just before those conversations' next turns
// arrive, and a new conversation placed by it lands on their burst. So the
// estimate's load is the requests in flight plus returns(w): each answer w
// serves adds the odds that its conversation has another turn (comesBack),
// the next turn of a conversation w served takes one off (it is in flight
// now), a new conversation takes the latest answer's odds off (replaced),
// and the count decays with the model state's mean
// request duration as time constant, so a conversation that ended (or
// thinks for much longer than a request takes) stops counting.
type returns struct {
	mu sync.Mutex // serialises writers; readers load v and at without it
	v  atomic.Uint64
	at atomic.Int64 // unix ns at which v was exact
}

// get is the count at now, decayed with time constant tau nanoseconds.
// A reader racing a writer may pair one update's v with another's at: the
// value is then off by one step of decay, harmless for a load estimate.
func (r *returns) get(now int64, tau float64) float64 {
	v := math.Float64frombits(r.v.Load())
	if v == 0 || tau <= 0 {
		return 0
	}
	return v * math.Exp(-float64(max(now-r.at.Load(), 0))/tau)
}

// add adds d (an answer's odds, or −1 for a conversation back) at now; the count
// never goes below 0 (a return whose answer this replica did not serve,
// or one that decayed away, takes nothing off).
func (r *returns) add(now int64, tau, d float64) {
	r.mu.Lock()
	r.v.Store(math.Float64bits(max(r.get(now, tau)+d, 0)))
	r.at.Store(max(now, r.at.Load()))
	r.mu.Unlock()
}

// requestTime is the model state's mean request duration (send to end),
// an EWMA of weight 1/16 in nanoseconds; 0 before the first answer.
type requestTime struct{ ns atomic.Uint64 }

func (t *requestTime) get() float64 { return math.Float64frombits(t.ns.Load()) }

func (t *requestTime) learn(d time.Duration) {
	if d <= 0 {
		return
	}
	for {
		old := t.ns.Load()
		m := math.Float64frombits(old)
		n := float64(d)
		if m > 0 {
			n = m + (n-m)/16
		}
		if t.ns.CompareAndSwap(old, math.Float64bits(n)) {
			return
		}
	}
}

// returned takes one off the returns of worker id: a conversation it
// served is back (in flight now, or moved away).
func (st *modelState) returned(id uint32, now int64) {
	if r, ok := st.rates.Load(id); ok {
		r.back.add(now, st.elapsed.get(), -1)
	}
}

// replaced takes the latest answer's odds back off its worker: a new
// conversation most often starts because one just ended (an agent slot
// freed), and the latest answer is the likeliest last one.
func (st *modelState) replaced(now int64) {
	x := st.lastAnswer.Swap(0)
	if x == 0 {
		return
	}
	if r, ok := st.rates.Load(uint32(x >> 32)); ok {
		r.back.add(now, st.elapsed.get(), -float64(math.Float32frombits(uint32(x))))
	}
}
