package route

import (
	"math"
	"sync"
)

// reference is the model state's yardstick for speeds (learnSpeed): a
// pooled fit of time to first byte over every worker's answers, with an
// intercept and a long memory,
//
//	y = Base + Queue × load + Prefill × uncached + Decode × decoded
//
// The published pool fit has no intercept, so a fixed per-request
// overhead lands in Prefill and a prefill-heavy answer is over-predicted;
// a worker that had just taken new conversations (their whole prompts to
// prefill) then measured fast against it and drew more of them, which
// piled sessions up on equal workers. The reference only compares
// workers; it sets no rate.
type reference struct {
	mu    sync.Mutex
	theta [4]float64
	cov   [4][4]float64
}

// referenceForget: a sample k answers old weighs referenceForget^k (memory
// about 200 answers of the whole fleet).
const referenceForget = 0.995

func newReference() *reference {
	r := &reference{theta: [4]float64{0, PriorQueueSeconds, PriorPrefillSeconds * 1e3, PriorDecodeSeconds * 1e2}}
	for i := range r.cov {
		r.cov[i][i] = 1
	}
	return r
}

func referenceX(load int64, uncached, decoded int) [4]float64 {
	return [4]float64{1, float64(load), float64(uncached) / 1e3, float64(decoded) / 1e2}
}

// predictLearn returns the fit's prediction for one answer, then learns it.
func (r *reference) predictLearn(y float64, load int64, uncached, decoded int) float64 {
	x := referenceX(load, uncached, decoded)
	r.mu.Lock()
	defer r.mu.Unlock()
	pred := 0.0
	var px [4]float64 // cov·x
	for i := range x {
		pred += r.theta[i] * x[i]
		for j := range x {
			px[i] += r.cov[i][j] * x[j]
		}
	}
	den := referenceForget
	for i := range x {
		den += x[i] * px[i]
	}
	e := y - pred
	for i := range x {
		r.theta[i] += px[i] / den * e
	}
	rlsForget(&r.cov, &px, 4, den, referenceForget, &referenceLimit)
	return pred
}

// referenceLimit: the most each direction's variance grows to (its prior).
var referenceLimit = [4]float64{1, 1, 1, 1}

// rlsForget folds one sample into the covariance of a recursive least
// squares fit over its first n coordinates: cov ← (cov − px·pxᵀ / den) /
// lambda, where px = cov·x and den = lambda + x·px. No wind-up: a direction
// without samples (decode, for streams) keeps at most its limit variance
// (D·cov·D with D diagonal keeps cov symmetric and positive).
func rlsForget(cov *[4][4]float64, px *[4]float64, n int, den, lambda float64, limit *[4]float64) {
	inv, il := 1/den, 1/lambda // multiply by the inverses: a division per element is far dearer
	var d [4]float64
	clipped := false
	for i := range n {
		for j := range n {
			cov[i][j] = (cov[i][j] - px[i]*px[j]*inv) * il
		}
		d[i] = 1
		if v := cov[i][i]; v > limit[i] {
			d[i], clipped = math.Sqrt(limit[i]/v), true
		}
	}
	if !clipped {
		return
	}
	for i := range n {
		for j := range n {
			cov[i][j] *= d[i] * d[j]
		}
	}
}
