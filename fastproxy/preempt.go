package fastproxy

import (
	"errors"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/admission"
	"github.com/warmroute/warmroute/loadview"
)

// preemption lets a request of priority 0 or more urgent that would wait
// for a sequence slot on its worker take one from a background stream
// there (docs/design.md §9, "Preemption"): vLLM's own priority scheduling
// orders its waiting queue but frees no slot for a waiting request, and a
// FCFS engine not even that. The stream is cut between two events by its
// relay and its answer continued, as a cut stream is, once the queue
// releases it again: its client sees a pause, never a lost answer.
type preemption struct {
	mu      sync.Mutex
	streams map[uint32][]*relay // by worker id: followed streams of positive priority, oldest first
}

func newPreemption() *preemption { return &preemption{streams: map[uint32][]*relay{}} }

// add makes r, a followed stream of positive priority on its worker, a
// candidate.
func (p *preemption) add(r *relay) {
	id := r.w.ID()
	p.mu.Lock()
	p.streams[id] = append(p.streams[id], r)
	r.candidate = id
	p.mu.Unlock()
}

// remove takes r out of the candidates, if it is one.
func (p *preemption) remove(r *relay) {
	p.mu.Lock()
	p.drop(r)
	p.mu.Unlock()
}

// drop is remove under p.mu.
func (p *preemption) drop(r *relay) {
	if r.candidate == 0 {
		return
	}
	rs := p.streams[r.candidate]
	for i, x := range rs {
		if x == r {
			rs = append(rs[:i], rs[i+1:]...)
			break
		}
	}
	if len(rs) == 0 {
		delete(p.streams, r.candidate)
	} else {
		p.streams[r.candidate] = rs
	}
	r.candidate = 0
}

// take marks for preemption the least urgent stream on worker id less
// urgent than prio, if any, the latest started among equals (as vLLM picks
// its victim: the least work lost). A stream is preempted at most once.
func (p *preemption) take(id uint32, prio int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var victim *relay
	for _, r := range p.streams[id] {
		if r.prio > prio && (victim == nil || r.prio >= victim.prio) {
			victim = r
		}
	}
	if victim == nil {
		return
	}
	p.drop(victim)
	victim.preempt.Store(true)
}

// preemptFor makes room on w for st's request when it would wait there for
// a sequence slot (loadview.Worker.Full: what w runs and queues reaches what
// it ran when it last showed a queue) and the request is of priority 0 or
// more urgent. Nothing happens on a worker of unknown capacity.
// Allocation-free.
func (f *forwarder) preemptFor(ctx *fasthttp.RequestCtx, st *reqState, w *loadview.Worker) {
	if !w.Full() {
		return
	}
	if p := st.priority(ctx); p <= 0 {
		f.preempt.take(w.ID(), p)
	}
}

// preempted continues the answer of a stream preempted for a more urgent
// request, between two events: it gives its worker's slot up at once,
// ends its admission, waits in the queue as the warmest request of its
// tenant (admission.Controller.Readmit), not held for the worker it left
// (which is full: that is why it was preempted), and is continued where
// the policy then places it, its own worker included. False when it cannot be
// continued after all (the answer became a tool call meanwhile, say):
// then it just goes on.
func (r *relay) preempted() bool {
	r.preempt.Store(false)
	body, err := []byte(nil), errNotContinuable
	if r.ans.Why() == "" && !r.pinned {
		body, err = r.ans.Body(r.ctx.Request.Body())
	}
	if err != nil {
		r.f.metrics.preempts[resumeNot].Inc()
		return false
	}
	from := r.w
	r.have = r.ready // a partial event is never given
	r.closeUpstream()
	r.releaseWorker()
	ctl := r.f.admit.ctl
	if r.admit != nil {
		r.admit.Done(&r.ticket)
		r.admit = nil
	}
	r.trace.log(r.f.log).Info("stream preempted for a more urgent request", "request_id", r.rid, "worker", from.URL())
	t := admission.Ticket{Model: r.model, Priority: r.prio, Tenant: r.tenant, Bytes: len(body)}
	left := r.f.timeout - time.Since(r.ctx.Time())
	if err := r.readmit(ctl, &t, left); err != nil {
		if err == admission.ErrGone {
			r.f.metrics.preempts[preemptGone].Inc()
			r.ended, r.err = true, err
			return true
		}
		r.f.metrics.preempts[resumeFailed].Inc()
		r.trace.log(r.f.log).Warn("preempted stream not continued", "request_id", r.rid, "why", err.Error())
		r.ended, r.cut, r.tail = true, true, []byte(streamCutEvent)
		return true
	}
	r.admit, r.ticket = ctl, t.Handoff()
	for i, w := range r.tried { // it served the answer but did not fail it: it may continue it
		if w == from {
			r.tried = append(r.tried[:i], r.tried[i+1:]...)
			break
		}
	}
	r.preempts++
	ok := r.reopen(body)
	ctl.Bound(&r.ticket) // its pool's room counts it where it went (or it ended)
	if ok {
		r.ans.Continue()
		r.f.metrics.preempts[resumeDone].Inc()
		return true
	}
	r.f.metrics.preempts[resumeFailed].Inc()
	r.trace.log(r.f.log).Warn("preempted stream not continued", "request_id", r.rid, "why", "no worker took the continuation")
	r.ended, r.cut, r.tail = true, true, []byte(streamCutEvent)
	return true
}

// Outcomes of a preempted stream (label outcome of
// vllm_router_stream_preemptions_total): resumeDone (continued after its
// wait), resumeNot (it could no longer be continued, and went on instead),
// resumeFailed (its wait ended without a release, or no worker took it:
// it ended with the error event), preemptGone (its client left while it
// waited).
const preemptGone = "client_gone"

var preemptOutcomes = [...]string{resumeDone, resumeNot, resumeFailed, preemptGone}

// errNotContinuable: a preempted answer that can no longer be continued.
var errNotContinuable = errors.New("the answer can no longer be continued")

// readmit waits for t's release, its client's leaving ending the wait
// (admission.ErrGone): the client watch, which cancels the upstream
// exchange while one runs, closes the wait's channel meanwhile.
func (r *relay) readmit(ctl *admission.Controller, t *admission.Ticket, left time.Duration) error {
	if left <= 0 {
		return admission.ErrTimeout
	}
	gone := make(chan struct{})
	t.Gone = gone
	clientWatcher.Stop(r.watch)
	clientWatcher.Start(r.watch, r.conn, func() { close(gone) })
	err := ctl.Readmit(t, left)
	clientWatcher.Stop(r.watch)
	clientWatcher.Start(r.watch, r.conn, r.cancel.Cancel)
	return err
}
