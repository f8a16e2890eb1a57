package main

import (
	"fmt"
	"slices"
)

// row is one measured run with everything the tables show.
type row struct {
	run     *runResult
	st      runStats
	fair    fairness
	hasFair bool
	goodRel float64 // goodput / pass-through's at the same load; 0 without one, +Inf over none
}

// analysis is the report's derived numbers.
type analysis struct {
	rows       []row
	yardRun    *runResult // pass-through at the lowest load: goodput's yardstick, demand's measure
	yard       yardstick
	demand     demandModel
	capReq     float64 // capacity in requests per simulated second (0: no yardstick run)
	lowLoad    float64
	highLoad   float64
	hasYard    bool
	passByLoad map[float64]runStats // pass-through's stats per load
}

// analyze derives the tables from the runs.
func (rep *report) analyze() *analysis {
	a := &analysis{passByLoad: map[float64]runStats{}}
	if len(rep.runs) == 0 {
		return a
	}
	loads := make([]float64, 0, len(rep.runs))
	for _, r := range rep.runs {
		loads = append(loads, r.spec.load)
	}
	a.lowLoad, a.highLoad = slices.Min(loads), slices.Max(loads)
	for _, r := range rep.runs {
		if r.spec.config.name == cfgPass && r.spec.load == a.lowLoad {
			a.yardRun = r
		}
	}
	var yard *yardstick
	if a.yardRun != nil {
		st := a.yardRun.stats(rep.o, nil)
		a.yard = yardstick{st.class[0].p50, st.class[1].p50}
		a.hasYard = true
		yard = &a.yard
		a.demand = newDemandModel(a.yardRun, st)
		a.capReq = a.demand.capacity()
	}
	for _, r := range rep.runs {
		rw := row{run: r, st: r.stats(rep.o, yard)}
		if a.hasYard {
			rw.fair, rw.hasFair = a.demand.at(r, rw.st), true
		}
		if r.spec.config.name == cfgPass {
			a.passByLoad[r.spec.load] = rw.st
		}
		a.rows = append(a.rows, rw)
	}
	for i := range a.rows {
		rw := &a.rows[i]
		if p, ok := a.passByLoad[rw.run.spec.load]; ok && (p.goodput > 0 || rw.st.goodput > 0) {
			rw.goodRel = rw.st.goodput / p.goodput // +Inf: some good requests where pass-through had none
		}
	}
	return a
}

// find returns the row of config at load.
func (a *analysis) find(config string, load float64) (*row, bool) {
	for i := range a.rows {
		if r := &a.rows[i]; r.run.spec.config.name == config && r.run.spec.load == load {
			return r, true
		}
	}
	return nil, false
}

// criterion is one of issue 29's "done when" bounds, evaluated for one
// configuration; na when a baseline it needs has no data.
type criterion struct {
	config, what, value string
	pass, na            bool
}

// criteria evaluates the bounds at the highest load against the
// lowest for every queue configuration (pass-through is their baseline).
func (a *analysis) criteria() []criterion {
	var out []criterion
	if !a.hasYard || a.highLoad == a.lowLoad {
		return nil
	}
	hi, lo := a.highLoad, a.lowLoad
	for _, name := range []string{cfgFIFO, cfgNew} {
		h, okH := a.find(name, hi)
		l, okL := a.find(name, lo)
		ph, okP := a.find(cfgPass, hi)
		if !okH || !okL || !okP {
			continue
		}
		p99h, p99l := h.st.class[0].p99, l.st.class[0].p99
		out = append(out, criterion{config: name, what: fmt.Sprintf("interactive TTFT p99 at %s within 2× its value at %s", loadText(hi), loadText(lo)),
			value: fmt.Sprintf("%.3g s vs %.3g s (%.2f×)", p99h, p99l, ratioOr0(p99h, p99l)),
			pass:  p99h <= 2*p99l, na: h.st.class[0].served == 0 || l.st.class[0].served == 0})
		out = append(out, criterion{config: name, what: fmt.Sprintf("goodput at %s ≥ 1.3× pass-through's", loadText(hi)),
			value: fmt.Sprintf("%.3g vs %.3g req/s (%.2f×)", h.st.goodput, ph.st.goodput, h.goodRel),
			pass:  h.goodRel >= 1.3, na: ph.st.goodput == 0 && h.st.goodput == 0})
		for t := range tenantNames {
			want := min(h.fair.demand[t], h.fair.fair[t])
			r := h.fair.ratio(t)
			out = append(out, criterion{config: name, what: fmt.Sprintf("tenant %s served ≥ 90 %% of min(demand, fair share) at %s", tenantNames[t], loadText(hi)),
				value: fmt.Sprintf("%.3g of min(%.3g, %.3g) req/s (%.0f %%)", h.fair.served[t], h.fair.demand[t], h.fair.fair[t], 100*r),
				pass:  r >= 0.9, na: want == 0})
		}
		out = append(out, criterion{config: name, what: fmt.Sprintf("hit rate at %s at most 2 points below its %s run's", loadText(hi), loadText(lo)),
			value: fmt.Sprintf("%.1f %% vs %.1f %%", 100*h.st.hit, 100*l.st.hit),
			pass:  h.st.hit >= l.st.hit-0.02, na: l.st.servedAll == 0})
	}
	return out
}

// lowLoadCost compares each queue configuration with pass-through at the
// lowest load: TTFT p50 ratio and hit-rate difference (noise is judged by
// the reader: one run each).
func (a *analysis) lowLoadCost() []string {
	p, ok := a.find(cfgPass, a.lowLoad)
	if !ok {
		return nil
	}
	var out []string
	for _, name := range []string{cfgFIFO, cfgNew} {
		q, ok := a.find(name, a.lowLoad)
		if !ok {
			continue
		}
		out = append(out, fmt.Sprintf("%s at %s: TTFT p50 %.2f× pass-through's (interactive), %.2f× (batch); hit rate %+.1f points",
			name, loadText(a.lowLoad), ratioOr0(q.st.class[0].p50, p.st.class[0].p50), ratioOr0(q.st.class[1].p50, p.st.class[1].p50),
			100*(q.st.hit-p.st.hit)))
	}
	return out
}

func ratioOr0(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func loadText(l float64) string { return fmt.Sprintf("%g×", l) }

// violations is the number of requests, over every run, that broke the
// one-outcome rule.
func (rep *report) violations() int {
	n := 0
	for _, rs := range [][]*runResult{rep.search, rep.runs} {
		for _, r := range rs {
			n += r.violations
		}
	}
	return n
}
