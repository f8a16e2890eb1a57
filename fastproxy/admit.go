package fastproxy

import (
	"strconv"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/admission"
	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
)

// Headers of the router's queue.
const (
	hdrPriority = "X-Request-Priority" // a client's priority; wins over the body's "priority"
	hdrTenant   = "X-Tenant-Id"        // the tenant, read only with --trust-tenant-header
	hdrQueueMS  = "X-Vllm-Router-Queue-Ms"
)

// admitStage is the request's admission (docs/design.md §9): whether it may
// go to a worker now, or after waiting in the router's queue
// (package admission) until its model's pool has room, or not at all. It
// runs after the model step, since the queue is per physical model, and
// before the worker step, so that the worker is chosen when the request
// leaves the queue.
type admitStage struct {
	ctl         *admission.Controller
	sat         *saturation  // the pools' room, wait and prefill speed
	holder      route.Holder // tells a warm turn and where it is held; nil: none is
	trustTenant bool         // read the tenant from X-Tenant-Id
	rejected    *metrics.Counter
}

// admit admits the request of st or answers it itself: 429 when the router
// is at its bounds, 503 when it waited too long or the router is shutting
// down, 499 when the client left while it waited. It returns false when it
// answered. A request admitted is counted in flight until done.
func (a *admitStage) admit(ctx *fasthttp.RequestCtx, st *reqState) bool {
	st.ticket = admission.Ticket{Model: st.req.Model, Prepare: st.prepare}
	st.ctx = ctx
	err := a.ctl.Admit(&st.ticket)
	st.stopWatching()
	st.ctx = nil
	st.trace.admitted(st, err)
	switch err {
	case nil:
		if w := st.ticket.Waited; w > 0 {
			st.waitedMS = (w + time.Millisecond - 1).Milliseconds() // a request that waited says so, however briefly
		}
		return true
	case admission.ErrBusy:
		a.rejected.Inc()
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		writeError(ctx, fasthttp.StatusTooManyRequests, "rate_limit_error", "router_busy",
			"the router is at --max-concurrent-requests; retry shortly")
	case admission.ErrFull:
		a.rejected.Inc()
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		writeError(ctx, fasthttp.StatusTooManyRequests, "rate_limit_error", "queue_full",
			"the router's queue is full (--queue-size, --queue-max-bytes); retry shortly")
	case admission.ErrTimeout:
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "5")
		writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "queue_timeout",
			"the request waited --queue-timeout-secs for a worker; retry later")
	case admission.ErrClosed:
		ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "1")
		writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "shutting_down",
			"the router is shutting down; retry on another replica")
	case admission.ErrGone:
		ctx.SetConnectionClose()
		writeError(ctx, 499, "client_closed_request", "client_closed_request", "the client closed the connection")
	}
	return false
}

// done ends an admitted request when its handler returns, unless its
// answer streams: then the relay ends it with the stream (relay.Close), so
// that a stream counts in flight, against --max-concurrent-requests and in
// its tenant's share, until its last byte, not only until its headers.
func (a *admitStage) done(ctx *fasthttp.RequestCtx, st *reqState) {
	if r, ok := ctx.Response.BodyStream().(*relay); ok && !r.closed.Load() {
		r.admit, r.ticket = a.ctl, st.ticket.Handoff()
		return
	}
	a.ctl.Done(&st.ticket)
}

// pool is model's pool as the model step's overflow rule reads it
// (docs/design.md §9): saturated when a request sent now would wait — its
// room, read exactly, is no more than the requests of that model the
// queue holds (a pool of unknown room never is) — with the expected wait
// (saturation.wait); and the pool's prefill speed. Lock-free and
// allocation-free while nothing waits.
func (a *admitStage) pool(model string) saar.PoolState {
	p := saar.PoolState{PrefillSeconds: a.sat.prefill(model)}
	room := a.sat.room(model)
	if room < 0 {
		return p
	}
	if backlog := a.ctl.Backlog(model); room <= backlog {
		p.Saturated, p.WaitSeconds = true, a.sat.wait(model, backlog)
	}
	return p
}

// prepareTicket fills what only a waiting request needs (admission calls
// it before the wait): its priority (X-Request-Priority, else the body's
// "priority"), its tenant, its warmth (a later turn of a history a worker
// holds, mid tool loop or not), the bytes it holds; and watches its
// client, whose leaving ends the wait.
func (st *reqState) prepareTicket(t *admission.Ticket) {
	ctx, s := st.ctx, st.srv
	t.Priority, t.Tenant = st.priority(ctx), st.tenantName(ctx)
	t.Warmth, t.Home = admission.Cold, 0
	if w := s.admit.holderOf(st); w != nil {
		t.Warmth, t.Home = admission.Held, w.ID()
		if st.midToolLoop() {
			t.Warmth = admission.ToolLoop
		}
	}
	t.Bytes = len(ctx.Request.Body()) + len(st.body)
	gone := make(chan struct{})
	t.Gone = gone
	st.watching = registration(ctx.Conn(), st)
	clientWatcher.Start(st.watching, ctx.Conn(), func() { close(gone) })
}

// priority is the request's priority: X-Request-Priority, else the
// body's "priority", else 0, clamped to ±reqview.MaxPriority.
func (st *reqState) priority(ctx *fasthttp.RequestCtx) int {
	prio := 0
	if st.view != nil {
		prio = st.view.Priority
	}
	if p := ctx.Request.Header.Peek(hdrPriority); len(p) > 0 {
		if n, err := strconv.Atoi(bytesconv.B2S(p)); err == nil {
			prio = min(max(n, -reqview.MaxPriority), reqview.MaxPriority)
		}
	}
	return prio
}

// tenantName is the request's tenant: its client key's name, else
// X-Tenant-Id with --trust-tenant-header, else "".
func (st *reqState) tenantName(ctx *fasthttp.RequestCtx) string {
	if st.tenant == "" && st.srv.admit.trustTenant {
		return string(ctx.Request.Header.Peek(hdrTenant))
	}
	return st.tenant
}

// holderOf is the worker holding the history of st's request, or nil.
func (a *admitStage) holderOf(st *reqState) *loadview.Worker {
	if a.holder == nil {
		return nil
	}
	return a.holder.HolderOf(&st.req)
}

// midToolLoop reports whether the request is a turn of a tool loop: its
// history ends with tool results, or the model step says so.
func (st *reqState) midToolLoop() bool {
	return st.view != nil && st.view.ToolResults > 0 || st.sel.Phase == saar.PhaseToolLoop
}

// stopWatching ends the client watch a wait started.
func (st *reqState) stopWatching() {
	if st.watching != nil {
		clientWatcher.Stop(st.watching)
		st.watching = nil
	}
}

// labelQueue tells the client how long its request waited in the queue.
func labelQueue(ctx *fasthttp.RequestCtx, st *reqState) {
	if st.waitedMS > 0 {
		var b [20]byte
		ctx.Response.Header.SetCanonical(bytesconv.S2B(hdrQueueMS), strconv.AppendInt(b[:0], st.waitedMS, 10))
	}
}

// queueConfig is the admission config of cfg; sat reads the pools.
func queueConfig(cfg *Config, sat *saturation) admission.Config {
	timeout := cfg.QueueTimeout
	if timeout <= 0 || timeout > cfg.RequestTimeout {
		timeout = cfg.RequestTimeout // the wait counts against the request's own deadline
	}
	return admission.Config{MaxInFlight: int64(cfg.MaxConcurrentRequests), Size: cfg.QueueSize,
		MaxBytes: cfg.QueueMaxBytes, Timeout: timeout, Order: cfg.QueueOrder, Room: sat.room, Headroom: sat.reserved,
		HomeRoom: sat.homeRoom, Tick: 5 * time.Millisecond}
}
