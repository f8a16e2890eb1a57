package main

import (
	"fmt"
	"strings"

	"github.com/warmroute/warmroute/bench"
)

// goodputFactor: a request is good when its TTFT is at most this many
// times its priority class's TTFT p50 through pass-through at the lowest
// load (the yardstick, common to every configuration).
const goodputFactor = 4

// classStats are one priority class's served requests in a run's window.
type classStats struct {
	served   int
	p50, p99 float64 // TTFT, simulated seconds
	good     int     // TTFT within goodputFactor × the yardstick
	atFull   int     // reached an engine running every slot (simworker.FirstToken)
	tail     tailStats
}

// tailStats decompose the TTFT of a class's slowest served requests, those
// at or above its p99: where they waited.
type tailStats struct {
	n           int
	atFull      int     // reached an engine running every slot
	routerQueue float64 // p50 of their wait in the router's queue, simulated seconds
	engineQueue float64 // p50 of their wait for a slot in the engine, simulated seconds
}

// runStats summarize a run. Outcomes count every request; the rest only
// the requests sent in the measured window, the run's span after warm-up.
type runStats struct {
	window    float64 // simulated seconds measured
	sent      int
	waited    int // requests answered with x-vllm-router-queue-ms (they waited in the router's queue)
	continued int // requests whose answer a worker continued (the router preempted or lost its stream)
	outcomes  [numOutcomes]int
	class     [2]classStats
	servedAll int
	p50All    float64
	goodput   float64    // good requests per simulated second
	hit       float64    // Σ cached / Σ prompt tokens of the served requests
	tenant    [2]float64 // served requests per simulated second
	offered   [2]float64 // requests sent per simulated second: what the tenant's sessions asked for at that load (closed loop: a turn waits for the last answer)
	queueP99  float64    // the served requests' wait in the router queue (x-vllm-router-queue-ms, absent: 0), p99, simulated seconds
	queueSeen bool       // some answer carried x-vllm-router-queue-ms
}

// yardstick is the TTFT p50 of each class that goodput is measured against.
type yardstick [2]float64

// stats computes a run's summary; yard may be nil (no goodput).
func (r *runResult) stats(o *options, yard *yardstick) runStats {
	var st runStats
	from := o.warm * r.spec.span
	st.window = r.spec.span - from
	var ttft [2][]float64
	var served [2][]*record
	var all, queue []float64
	var prompt, cached int
	var tenantServed, tenantSent [2]int
	for i := range r.records {
		rec := &r.records[i]
		st.sent++
		st.outcomes[rec.out]++
		if rec.queueMS >= 0 {
			st.waited++
		}
		if rec.continued > 0 {
			st.continued++
		}
		if rec.sent >= from {
			tenantSent[rec.tenant]++
		}
		if rec.sent < from || rec.out != outServed {
			continue
		}
		ttft[rec.class] = append(ttft[rec.class], rec.ttft)
		served[rec.class] = append(served[rec.class], rec)
		all = append(all, rec.ttft)
		prompt += rec.prompt
		cached += rec.cached
		tenantServed[rec.tenant]++
		st.queueSeen = st.queueSeen || rec.queueMS >= 0
		queue = append(queue, max(rec.queueMS, 0)/1000/o.timeScale) // no header: it did not wait
		if yard != nil && rec.ttft <= goodputFactor*yard[rec.class] {
			st.class[rec.class].good++
		}
	}
	for c := range ttft {
		cs := &st.class[c]
		cs.served = len(ttft[c])
		cs.p50, cs.p99 = bench.Percentile(ttft[c], 50), bench.Percentile(ttft[c], 99)
		cs.atFull, cs.tail = engineStats(served[c], cs.p99, o)
	}
	st.servedAll = len(all)
	st.p50All = bench.Percentile(all, 50)
	st.queueP99 = bench.Percentile(queue, 99)
	if prompt > 0 {
		st.hit = float64(cached) / float64(prompt)
	}
	if st.window > 0 {
		st.goodput = float64(st.class[0].good+st.class[1].good) / st.window
		for t := range tenantServed {
			st.tenant[t] = float64(tenantServed[t]) / st.window
			st.offered[t] = float64(tenantSent[t]) / st.window
		}
	}
	return st
}

// engineStats counts the served requests recs that reached a full engine
// (every slot running when it was submitted), and decomposes those whose
// TTFT is at least p99.
func engineStats(recs []*record, p99 float64, o *options) (atFull int, tail tailStats) {
	var router, engine []float64
	for _, rec := range recs {
		full := rec.engine != nil && rec.engine.Running >= rec.engine.Slots
		if full {
			atFull++
		}
		if rec.ttft < p99 {
			continue
		}
		tail.n++
		if full {
			tail.atFull++
		}
		router = append(router, max(rec.queueMS, 0)/1000/o.timeScale)
		if rec.engine != nil {
			engine = append(engine, rec.engine.Queued.Seconds())
		}
	}
	tail.routerQueue, tail.engineQueue = bench.Percentile(router, 50), bench.Percentile(engine, 50)
	return atFull, tail
}

// outcomeLine lists a run's outcomes in one line.
func (r *runResult) outcomeLine() string {
	var n [numOutcomes]int
	for i := range r.records {
		n[r.records[i].out]++
	}
	var parts []string
	for o, k := range n {
		if k > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", outcome(o), k))
		}
	}
	if len(parts) == 0 {
		return "no requests"
	}
	return strings.Join(parts, ", ")
}

// fairness is each tenant's served rate against its max-min fair share at
// one load, in requests per simulated second.
type fairness struct {
	demand, fair, served [2]float64
}

// ratio is served / min(demand, fair share) of tenant t (0 without demand).
func (f fairness) ratio(t int) float64 {
	want := min(f.demand[t], f.fair[t])
	if want <= 0 {
		return 0
	}
	return f.served[t] / want
}

// demandModel turns a run into each tenant's demand. Demand is measured,
// not modelled: a tenant's served rate through pass-through at the
// yardstick load (below capacity: everything it asks for is served, over
// the same window), scaled by the turns its sessions ask for in the run
// against in the yardstick run. Every load replays the same arrivals, a
// heavier one adding more, each with its own tenant draw, so a tenant's
// share of the arrivals differs from load to load by chance; scaling by
// the load alone would charge a tenant with sessions it never sent. The
// capacity in requests is the sum of the served rates scaled to 1×.
type demandModel struct {
	perLoad [2]float64 // requests per simulated second per unit of load
	perTurn [2]float64 // requests per simulated second per turn the tenant's sessions ask for; 0: by load
}

func newDemandModel(yardRun *runResult, yardStats runStats) demandModel {
	var m demandModel
	asked := yardRun.asked()
	for t := range m.perLoad {
		m.perLoad[t] = yardStats.tenant[t] / yardRun.spec.load
		if asked[t] > 0 {
			m.perTurn[t] = yardStats.tenant[t] / float64(asked[t])
		}
	}
	return m
}

// capacity is the fleet's capacity in requests per simulated second.
func (m demandModel) capacity() float64 { return m.perLoad[0] + m.perLoad[1] }

// at returns the tenants' fairness in run r, whose stats are st.
func (m demandModel) at(r *runResult, st runStats) fairness {
	var f fairness
	asked := r.asked()
	for t := range f.demand {
		f.demand[t] = m.perLoad[t] * r.spec.load
		if m.perTurn[t] > 0 && asked[t] > 0 {
			f.demand[t] = m.perTurn[t] * float64(asked[t])
		}
	}
	fs := fairShares(f.demand[:], m.capacity())
	copy(f.fair[:], fs)
	f.served = st.tenant
	return f
}

// asked is the turns the sessions that arrived in r ask for, per tenant.
func (r *runResult) asked() (n [2]int) {
	for _, a := range r.arrivals {
		n[a.tenant] += len(a.src.Turns)
	}
	return n
}
