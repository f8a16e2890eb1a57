package fastproxy

import (
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
)

// admission is the second stage: whether a request may go on to a worker
// now. It bounds the requests in flight (--max-concurrent-requests) and
// answers 429 with Retry-After past the bound; a request admitted is
// counted until done. The router's queue (docs/design.md §9) will hold
// such requests instead of refusing them.
type admission struct {
	limit    int64 // ≤ 0: no bound
	inflight atomic.Int64
	rejected *metrics.Counter
}

// admit counts the request in flight and returns true, or answers 429 and
// returns false. The caller calls done once for every true.
func (a *admission) admit(ctx *fasthttp.RequestCtx) bool {
	n := a.inflight.Add(1)
	if a.limit > 0 && n > a.limit {
		a.inflight.Add(-1)
		a.rejected.Inc()
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		writeError(ctx, fasthttp.StatusTooManyRequests, "rate_limit_error", "router_busy",
			"the router is at --max-concurrent-requests; retry shortly")
		return false
	}
	return true
}

// done ends an admitted request.
func (a *admission) done() { a.inflight.Add(-1) }

// inFlight is the number of admitted requests not yet done.
func (a *admission) inFlight() int64 { return a.inflight.Load() }
