package route

import (
	"math"
	"slices"

	"github.com/warmroute/warmroute/loadview"
)

// fleetSpeeds is how one decision reads the workers' speeds
// (docs/design.md §4 (4)): relative to the median worker's, and only the
// part that stands out from the fleet's own spread. Equal workers' speeds
// drift apart with the mix of conversations each serves, and breaking ties
// in load by that drift piles new sessions onto one worker until its KV
// cache overflows, which costs hit rate. A worker whose
// log-speed lies further than 2 median absolute deviations from the
// median counts by the excess: a worker prefilling at half speed stands
// out once about 20 answers have been measured, the drift of equal ones
// does not. With fewer than 3 workers heard
// from, an outlier cannot be told from the spread: the speeds count as
// measured.
type fleetSpeeds struct {
	mid, band float64 // median log-speed and 2 × the median absolute deviation
	fresh     float64 // a worker not yet heard from: the fastest known, at most 1
}

// maxSpeedSample bounds the workers whose speeds are read per decision
// (the first ones heard from), so that the median stays allocation-free.
const maxSpeedSample = 16

func (st *modelState) fleetSpeeds(ws []*loadview.Worker) fleetSpeeds {
	var logs, dev [maxSpeedSample]float64
	n := 0
	for _, w := range ws {
		if n == maxSpeedSample {
			break
		}
		if r, ok := st.rates.Load(w.ID()); ok {
			logs[n] = math.Log(math.Float64frombits(r.speed.Load()))
			n++
		}
	}
	fs := fleetSpeeds{fresh: 1}
	if n >= 3 {
		fs.mid = median(logs[:n]) // sorts logs
		for i := range n {
			dev[i] = math.Abs(logs[i] - fs.mid)
		}
		fs.band = 2 * median(dev[:n])
	}
	for i := range n {
		fs.fresh = min(fs.fresh, fs.of(math.Exp(logs[i])))
	}
	return fs
}

// of is the speed the estimate uses for a worker whose speed is sp.
func (fs fleetSpeeds) of(sp float64) float64 {
	l := math.Log(sp) - fs.mid
	switch {
	case l > fs.band:
		return math.Exp(l - fs.band)
	case l < -fs.band:
		return math.Exp(l + fs.band)
	}
	return 1
}

// median sorts x and returns its median.
func median(x []float64) float64 {
	slices.Sort(x)
	if n := len(x); n%2 == 1 {
		return x[n/2]
	} else {
		return (x[n/2-1] + x[n/2]) / 2
	}
}
