package admission

import (
	"strings"
	"time"
)

// The queue: per model, bands of one priority each, lowest first; in a
// band, the tenants with requests waiting; per tenant, its warm requests
// and its others, each oldest first. Everything here runs under
// Controller.mu.

// waiter is one request in the queue.
type waiter struct {
	q       *modelQueue
	tenant  *tenantQueue
	prio    int
	warm    bool
	bytes   int
	seq     uint64 // arrival order, all models
	arrived time.Time
	done    chan error // the verdict, sent once: nil (released) or why not
	prev    *waiter    // in its tenant's list
	next    *waiter
	queued  bool // in the structures (not yet finished)
	bound   bool // released and reached a worker (or ended): no longer pending
}

// list is a FIFO of waiters, linked through them.
type list struct{ head, tail *waiter }

func (l *list) push(w *waiter) {
	w.prev, w.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
}

func (l *list) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next = nil, nil
}

// tenantQueue is one tenant's requests in one band.
type tenantQueue struct {
	name       string
	warm, cold list
	n          int
	finish     uint64 // the virtual time after its last release: its next start tag is max(band.vtime, finish)
}

// head is the tenant's next request: a warm one first.
func (t *tenantQueue) head() *waiter {
	if t.warm.head != nil {
		return t.warm.head
	}
	return t.cold.head
}

// band is the requests of one priority in one model's queue.
type band struct {
	prio    int
	vtime   uint64 // the start tag of the latest release
	tenants map[string]*tenantQueue
	n       int
}

// next is the tenant to serve: the lowest start tag, then the oldest head.
func (b *band) next() *tenantQueue {
	var best *tenantQueue
	var bestTag uint64
	for _, t := range b.tenants {
		tag := max(b.vtime, t.finish)
		if best == nil || tag < bestTag || tag == bestTag && t.head().seq < best.head().seq {
			best, bestTag = t, tag
		}
	}
	return best
}

// modelQueue is one model's queue.
type modelQueue struct {
	name    string
	bands   []*band // by priority, lowest first; none empty
	n       int     // requests waiting
	pending int     // released and not yet at a worker: the pool's room does not count them yet
}

// peek returns the request to release next.
func (q *modelQueue) peek() *waiter {
	if len(q.bands) == 0 {
		return nil
	}
	return q.bands[0].next().head()
}

// band returns the band of prio, creating it in order.
func (q *modelQueue) band(prio int) *band {
	i := 0
	for ; i < len(q.bands) && q.bands[i].prio < prio; i++ {
	}
	if i < len(q.bands) && q.bands[i].prio == prio {
		return q.bands[i]
	}
	b := &band{prio: prio, tenants: map[string]*tenantQueue{}}
	q.bands = append(q.bands, nil)
	copy(q.bands[i+1:], q.bands[i:])
	q.bands[i] = b
	return b
}

// each calls f for every waiter of q (f may finish it).
func (q *modelQueue) each(f func(*waiter)) {
	var all []*waiter
	for _, b := range q.bands {
		for _, t := range b.tenants {
			for _, l := range [...]*list{&t.warm, &t.cold} {
				for w := l.head; w != nil; w = w.next {
					all = append(all, w)
				}
			}
		}
	}
	for _, w := range all {
		f(w)
	}
}

// enqueue puts a new waiter for t in its model's queue. FIFO order puts
// every request in one band of one tenant, none warm.
func (c *Controller) enqueue(t *Ticket) *waiter {
	q := c.models[t.Model]
	if q == nil {
		q = &modelQueue{name: strings.Clone(t.Model)} // the ticket's strings may alias a request buffer
		c.models[q.name] = q
	}
	prio, tenant, warm := t.Priority, t.Tenant, t.Warm
	if c.cfg.Order == FIFO {
		prio, tenant, warm = 0, "", false
	}
	b := q.band(prio)
	tq := b.tenants[tenant]
	if tq == nil {
		tq = &tenantQueue{name: strings.Clone(tenant)}
		b.tenants[tq.name] = tq
	}
	c.seq++
	w := &waiter{q: q, tenant: tq, prio: prio, warm: warm, bytes: t.Bytes, seq: c.seq, arrived: c.cfg.Now(),
		done: make(chan error, 1), queued: true}
	if warm {
		tq.warm.push(w)
	} else {
		tq.cold.push(w)
	}
	tq.n++
	b.n++
	q.n++
	c.waiting.Add(1)
	c.bytes += int64(t.Bytes)
	return w
}

// finish takes w out of the queue with its verdict: nil releases it (then
// pending at its model until Bound).
func (c *Controller) finish(w *waiter, err error) {
	if !w.queued {
		return
	}
	w.queued = false
	q, tq := w.q, w.tenant
	b := q.band(w.prio)
	if w.warm {
		tq.warm.remove(w)
	} else {
		tq.cold.remove(w)
	}
	tq.n--
	b.n--
	q.n--
	if err == nil {
		start := max(b.vtime, tq.finish)
		b.vtime, tq.finish = start, start+1
		q.pending++
	} else {
		w.bound = true // never pending
	}
	if tq.n == 0 {
		delete(b.tenants, tq.name)
	}
	if b.n == 0 {
		for i, x := range q.bands {
			if x == b {
				q.bands = append(q.bands[:i], q.bands[i+1:]...)
				break
			}
		}
	}
	c.dropIfIdle(q)
	c.waiting.Add(-1)
	c.bytes -= int64(w.bytes)
	w.done <- err
}

// dropIfIdle forgets a model queue with nothing waiting or pending.
func (c *Controller) dropIfIdle(q *modelQueue) {
	if q.n == 0 && q.pending == 0 {
		delete(c.models, q.name)
	}
}

// Bound tells the queue that t, released, reached a worker: the pool's
// room now counts it. Idempotent; Done calls it too.
func (c *Controller) Bound(t *Ticket) {
	w := t.queued
	if w == nil {
		return
	}
	c.mu.Lock()
	if !w.bound {
		w.bound = true
		w.q.pending--
		if c.models[w.q.name] == w.q {
			c.dropIfIdle(w.q)
		}
	}
	c.mu.Unlock()
}

// wait queues t and blocks until it is released, times out, its client
// leaves or the queue closes.
func (c *Controller) wait(t *Ticket) error {
	if t.Prepare != nil {
		t.Prepare(t)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.stats.count(t.Tenant, Rejected)
		return ErrClosed
	}
	if int(c.waiting.Load()) >= c.cfg.Size || c.cfg.MaxBytes > 0 && c.bytes+int64(t.Bytes) > c.cfg.MaxBytes {
		c.mu.Unlock()
		c.stats.count(t.Tenant, Rejected)
		return ErrFull
	}
	w := c.enqueue(t)
	c.startLoop()
	c.mu.Unlock()
	c.poke()

	c.waiters.Add(1)
	defer c.waiters.Add(-1)
	timer := time.NewTimer(c.cfg.Timeout)
	defer timer.Stop()
	var err error
	select {
	case err = <-w.done:
	case <-timer.C:
		err = c.cancelWait(w, ErrTimeout)
	case <-t.Gone:
		err = c.cancelWait(w, ErrGone)
	}
	t.Waited = c.cfg.Now().Sub(w.arrived)
	c.stats.waited(t.Waited)
	switch err {
	case nil:
		t.queued = w
		c.stats.count(t.Tenant, Released)
	case ErrTimeout:
		c.stats.count(t.Tenant, Expired)
	case ErrGone:
		c.stats.count(t.Tenant, Abandoned)
	default:
		c.stats.count(t.Tenant, Rejected)
	}
	return err
}

// cancelWait takes w out of the queue with why, unless it was released or
// closed meanwhile: then that verdict stands.
func (c *Controller) cancelWait(w *waiter, why error) error {
	c.mu.Lock()
	c.finish(w, why)
	c.mu.Unlock()
	return <-w.done
}

// startLoop starts the release loop unless it runs. c.mu held.
func (c *Controller) startLoop() {
	if c.started {
		return
	}
	c.started = true
	go c.loop()
}

// loop releases what it can whenever poked, and every Tick while requests
// wait (a pool's room also grows without any request of this router
// ending: other replicas', a fresh scrape); it ends when none waits.
func (c *Controller) loop() {
	tick := time.NewTicker(c.cfg.Tick)
	defer tick.Stop()
	for {
		select {
		case <-c.kick:
		case <-tick.C:
		}
		c.mu.Lock()
		c.release()
		if c.waiting.Load() == 0 {
			c.started = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
	}
}

// release lets waiting requests go, best first, while their pools have
// room and the in-flight bound allows. c.mu held.
func (c *Controller) release() {
	for c.waiting.Load() > 0 {
		var best *waiter
		for _, q := range c.models {
			if q.n == 0 {
				continue
			}
			if room := c.cfg.Room(q.name); room >= 0 && room-q.pending <= 0 {
				continue
			}
			if w := q.peek(); best == nil || w.prio < best.prio || w.prio == best.prio && w.seq < best.seq {
				best = w
			}
		}
		if best == nil || !c.take() {
			return
		}
		c.finish(best, nil)
	}
}
