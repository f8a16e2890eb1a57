package loadview

// BreakerState is a worker's circuit-breaker state, numbered as in the
// vllm_router_circuit_breaker_state gauge.
type BreakerState int

// The circuit-breaker states.
const (
	BreakerClosed   BreakerState = 0 // requests flow; consecutive failures are counted
	BreakerOpen     BreakerState = 1 // no requests until CBTimeoutDuration has passed
	BreakerHalfOpen BreakerState = 2 // requests flow; CBSuccessThreshold successes close it, one failure reopens it
)

func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	}
	return "unknown"
}

// halfOpenMark is the cbUntil value of a breaker moved to HalfOpen by a
// health probe: any time in the past.
const halfOpenMark = 1

// BreakerState returns the circuit-breaker state. Open turns HalfOpen lazily,
// when read at or after the end of the open period. Lock-free.
func (w *Worker) BreakerState() BreakerState {
	u := w.cbUntil.Load()
	switch {
	case u == 0:
		return BreakerClosed
	case w.nowNano() < u:
		return BreakerOpen
	}
	return BreakerHalfOpen
}

// BreakerOpenings is how many times the worker's breaker has opened.
func (w *Worker) BreakerOpenings() uint64 { return w.cbOpens.Load() }

// RecordResult feeds the circuit breaker with the outcome of one proxied
// request: RecordSuccess when ok, RecordFailure otherwise.
func (r *Registry) RecordResult(w *Worker, ok bool) {
	if ok {
		r.RecordSuccess(w)
		return
	}
	r.RecordFailure(w)
}

// RecordSuccess records a request the worker answered. While the breaker is
// Closed it resets the failure streak with at most one atomic load (and a
// store only when a streak was running): cheap enough for every request.
// While HalfOpen, CBSuccessThreshold consecutive successes close the breaker;
// while Open (a request sent before the breaker opened), it is ignored.
// Safe for concurrent use.
func (r *Registry) RecordSuccess(w *Worker) {
	if w.cbUntil.Load() == 0 {
		if w.errs.Load() != 0 { // read first: no cache-line write per request
			w.errs.Store(0)
		}
		return
	}
	now := r.nowNano()
	w.cbMu.Lock()
	u := w.cbUntil.Load()
	if u == 0 || now < u { // closed meanwhile, or still open
		w.cbMu.Unlock()
		return
	}
	w.cbOks++
	closed := w.cbOks >= r.cfg.CBSuccessThreshold
	if closed {
		w.cbOks = 0
		w.errs.Store(0)
		w.cbUntil.Store(0)
	}
	w.cbMu.Unlock()
	if closed {
		r.cfg.Logger.Info("circuit closed", "worker", w.url)
	}
}

// RecordFailure records a request the worker failed without an answer
// (connect error, timeout, reset, a reply that is not HTTP). While Closed,
// CBFailureThreshold consecutive failures that all lie within
// CBWindowDuration open the breaker (a success resets the streak; failures
// older than the window no longer count). While HalfOpen any failure
// reopens it. Each opening starts an immediate health probe (ProbeSoon).
// With CBFailureThreshold 0 the breaker is disabled. Safe for concurrent
// use; the failure path takes a per-worker lock.
func (r *Registry) RecordFailure(w *Worker) {
	if r.cfg.CBFailureThreshold > 0 {
		r.recordFailure(w)
	}
}

// RecordAnswerFailure records a failure the worker answered (a retryable
// HTTP status) and counts it as RecordFailure does, except on the last
// healthy worker of a model it serves: there it is not counted at all, so
// answers alone never eject a model's last worker — with no second worker
// there is no second opinion, and ejecting it would turn every request's
// answer into 503 (docs/design.md §8.2). Connect failures and timeouts
// still open that worker's breaker. The check reads the snapshot, without
// lock or allocation, on this failure path only.
func (r *Registry) RecordAnswerFailure(w *Worker) {
	if r.cfg.CBFailureThreshold > 0 && !r.lastHealthy(w) {
		r.recordFailure(w)
	}
}

// lastHealthy reports whether w is healthy and some model it serves has no
// other healthy worker of its side of the fleet (entry or decode). A worker whose models are unknown serves any model:
// it is the last one when no other such worker is healthy (they serve every
// listed model too).
func (r *Registry) lastHealthy(w *Worker) bool {
	if !w.Healthy() {
		return false
	}
	s := r.snap.Load()
	if s.byID[w.id] != w {
		return false // removed
	}
	v := &s.entry
	if w.role == Decode {
		v = &s.decode
	}
	names := w.Models()
	if names == nil {
		return !otherHealthy(v.wildcard, w)
	}
	for _, m := range names {
		if !otherHealthy(v.byModel[m], w) {
			return true
		}
	}
	return false
}

// otherHealthy reports whether a worker of ws other than w is healthy.
func otherHealthy(ws []*Worker, w *Worker) bool {
	for _, o := range ws {
		if o != w && o.Healthy() {
			return true
		}
	}
	return false
}

// recordFailure counts one failure against w's breaker.
func (r *Registry) recordFailure(w *Worker) {
	n := r.cfg.CBFailureThreshold
	now := r.nowNano()
	w.cbMu.Lock()
	var opened bool
	switch u := w.cbUntil.Load(); {
	case u == 0: // closed
		if len(w.cbRing) != n {
			w.cbRing, w.cbPos = make([]int64, n), 0
		}
		streak := int(w.errs.Add(1))
		w.cbRing[w.cbPos] = now
		w.cbPos = (w.cbPos + 1) % n
		// cbRing[cbPos] is now the n-th most recent failure.
		opened = streak >= n && now-w.cbRing[w.cbPos] <= int64(r.cfg.CBWindowDuration)
	case now >= u: // half-open
		opened = true
	}
	if opened {
		r.openBreaker(w, now)
	}
	w.cbMu.Unlock()
	if opened {
		r.cfg.Logger.Warn("circuit opened", "worker", w.url, "open_for", r.cfg.CBTimeoutDuration)
		r.ProbeSoon(w)
	}
}

// openBreaker moves w to Open at now. Caller holds w.cbMu.
func (r *Registry) openBreaker(w *Worker, now int64) {
	w.cbOks = 0
	w.errs.Store(0)
	w.cbProbeFailed.Store(false)
	w.cbOpenedAt.Store(now)
	w.cbUntil.Store(max(now+int64(r.cfg.CBTimeoutDuration), halfOpenMark+1))
	w.cbOpens.Add(1)
}

// resetBreaker closes w's breaker and forgets its streaks.
func (r *Registry) resetBreaker(w *Worker) {
	w.cbMu.Lock()
	w.cbOks = 0
	w.errs.Store(0)
	w.cbProbeFailed.Store(false)
	w.cbUntil.Store(0)
	w.cbMu.Unlock()
}

// breakerProbe lets health probes shorten an Open period. A probe that
// started after the breaker opened and failed shows that the worker itself
// was down (not merely failing requests); once SuccessThreshold consecutive
// probes pass after that, the worker has come back (a restart) and the
// breaker moves to HalfOpen at once instead of waiting out
// CBTimeoutDuration. Probe successes alone never do it: a worker whose
// /health passes while its requests fail is what the breaker is for.
func (r *Registry) breakerProbe(w *Worker, ok bool, started int64, oks int) {
	if w.cbUntil.Load() == 0 {
		return
	}
	if !ok {
		if started >= w.cbOpenedAt.Load() {
			w.cbProbeFailed.Store(true)
		}
		return
	}
	if oks < r.cfg.SuccessThreshold || !w.cbProbeFailed.Load() {
		return
	}
	now := r.nowNano()
	w.cbMu.Lock()
	moved := false
	if u := w.cbUntil.Load(); u != 0 && now < u && w.cbProbeFailed.Load() {
		w.cbUntil.Store(halfOpenMark)
		w.cbOks = 0
		moved = true
	}
	w.cbMu.Unlock()
	if moved {
		r.cfg.Logger.Info("circuit half-open: worker recovered on health probes", "worker", w.url)
	}
}

func (r *Registry) nowNano() int64 { return r.cfg.Now().UnixNano() }
