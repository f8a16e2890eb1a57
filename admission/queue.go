package admission

import (
	"strings"
	"time"
)

// The queue: per model, bands of one priority each, lowest first; in a
// band, the tenants with requests waiting; per tenant, its warm requests
// and its others, each oldest first. A tenant's share of the model is
// counted across its bands (see share). Everything here runs under
// Controller.mu.

// waiter is one request in the queue.
type waiter struct {
	q       *modelQueue
	tenant  *tenantQueue
	prio    int
	warmth  Warmth
	home    uint32 // Ticket.Home
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

// share is what one active tenant of a model was released there: its
// virtual finish time, one per release, whatever the priority. A band
// serves its tenants lowest finish first, so priority decides which band
// goes, and the tenants' releases in every band decide who goes within
// one: a tenant whose urgent requests went first has spent its share, and
// the others catch up in the next band (docs/design.md §9, "Order of
// release"). Strict priority with fairness per band alone would let a
// flood of urgent requests take a batch tenant's share twice.
//
// A tenant is active while it has requests waiting or released through
// the queue and not yet done: an agent's sessions are closed loops, whose
// next turns wait for the answers in flight, so a tenant served below its
// share often has none waiting at the moment. Its lag behind the others
// is kept, bounded by its requests in flight (see lift).
type share struct {
	finish   uint64
	n        int // its requests waiting, all bands
	inflight int // its requests released through the queue and not yet done
}

// tenantQueue is one tenant's requests in one band.
type tenantQueue struct {
	name  string
	lists [Resumed + 1]list // by warmth
	n     int
	share *share
}

// first is the tenant's warmest, oldest request that may allows (nil:
// any), spending one of budget on each it refuses.
func (t *tenantQueue) first(may func(*waiter) bool, budget *int) *waiter {
	for wm := Resumed; ; wm-- {
		for w := t.lists[wm].head; w != nil && *budget > 0; w = w.next {
			if may == nil || may(w) {
				return w
			}
			*budget--
		}
		if wm == Cold {
			return nil
		}
	}
}

// last is the tenant's request to refuse first: the newest of its coldest;
// nil when it holds only Resumed ones, which are never refused.
func (t *tenantQueue) last() *waiter {
	for w := Cold; ; w++ {
		if l := t.lists[w].tail; l != nil || w == ToolLoop {
			return l
		}
	}
}

// band is the requests of one priority in one model's queue.
type band struct {
	prio    int
	tenants map[string]*tenantQueue
	n       int
}

// modelQueue is one model's queue.
type modelQueue struct {
	name     string
	bands    []*band           // by priority, lowest first; none empty
	shares   map[string]*share // the active tenants
	n        int               // requests waiting
	pending  int               // released and not yet at a worker: the pool's room does not count them yet
	inflight int               // released and not yet done (their tenants' shares are kept)
	homes    map[uint32]int    // pending, per Home
}

// scanLimit bounds the waiters one pick looks past: a release check costs
// at most that many, however long the queue.
const scanLimit = 256

// pick returns the request to release next of those may allows (nil:
// any): of the most urgent band holding one, the tenant's with the lowest
// finish (then the oldest), that tenant's warmest, oldest. It looks past
// at most scanLimit requests that may refuses.
func (q *modelQueue) pick(may func(*waiter) bool) *waiter {
	budget := scanLimit
	for _, b := range q.bands {
		var best *waiter
		for _, t := range b.tenants {
			w := t.first(may, &budget)
			if w != nil && (best == nil || t.share.finish < best.tenant.share.finish ||
				t.share.finish == best.tenant.share.finish && w.seq < best.seq) {
				best = w
			}
		}
		if best != nil || budget <= 0 {
			return best
		}
	}
	return nil
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

// share returns tenant's share of q, lifted (see lift) when none of its
// requests waits.
func (q *modelQueue) share(tenant string) *share {
	s := q.shares[tenant]
	if s == nil {
		s = &share{}
		if q.shares == nil {
			q.shares = map[string]*share{}
		}
		q.shares[strings.Clone(tenant)] = s
	} else if s.n > 0 {
		return s
	}
	q.lift(s)
	return s
}

// lift brings the finish of s, a tenant none of whose requests waits,
// to at most its requests in flight behind the least served tenant
// waiting (every other tenant when none waits). An idle tenant, with none
// in flight, starts level: no credit for the time it sent nothing, and no
// debt for what it was served before. A tenant whose turns are in flight
// keeps the lead the others took meanwhile, up to one release per turn
// it has out, so a tenant served below its share goes first while it
// catches up, yet a burst after a long quiet spell cannot take the queue.
func (q *modelQueue) lift(s *share) {
	least, ok := q.least(s, true)
	if !ok {
		if least, ok = q.least(s, false); !ok {
			return
		}
	}
	if floor := least - min(least, uint64(s.inflight)); floor > s.finish {
		s.finish = floor
	}
}

// least is the lowest finish of the tenants other than s, of those
// waiting only when waiting is set; false when there is none.
func (q *modelQueue) least(s *share, waiting bool) (least uint64, ok bool) {
	for _, o := range q.shares {
		if o != s && (o.n > 0 || !waiting) && (!ok || o.finish < least) {
			least, ok = o.finish, true
		}
	}
	return least, ok
}

// each calls f for every waiter of q (f may finish it).
func (q *modelQueue) each(f func(*waiter)) {
	var all []*waiter
	for _, b := range q.bands {
		for _, t := range b.tenants {
			for i := range t.lists {
				for w := t.lists[i].head; w != nil; w = w.next {
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
// every request in one band of one tenant, all cold.
func (c *Controller) enqueue(t *Ticket) *waiter {
	q := c.models[t.Model]
	if q == nil {
		q = &modelQueue{name: strings.Clone(t.Model)} // the ticket's strings may alias a request buffer
		c.models[q.name] = q
	}
	prio, tenant, warmth, home := t.Priority, t.Tenant, min(t.Warmth, Resumed), t.Home
	if c.cfg.Order == FIFO {
		prio, tenant, warmth, home = 0, "", Cold, 0
	}
	b := q.band(prio)
	tq := b.tenants[tenant]
	if tq == nil {
		tq = &tenantQueue{name: strings.Clone(tenant), share: q.share(tenant)}
		b.tenants[tq.name] = tq
	}
	tq.share.n++
	c.seq++
	w := &waiter{q: q, tenant: tq, prio: prio, warmth: warmth, home: home, bytes: t.Bytes, seq: c.seq, arrived: c.cfg.Now(),
		done: make(chan error, 1), queued: true}
	tq.lists[warmth].push(w)
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
	tq.lists[w.warmth].remove(w)
	tq.n--
	b.n--
	q.n--
	tq.share.n--
	if err == nil {
		if w.warmth != Resumed { // its first release was counted
			tq.share.finish++
		}
		tq.share.inflight++
		q.pending++
		q.inflight++
		if w.home != 0 {
			if q.homes == nil {
				q.homes = map[uint32]int{}
			}
			q.homes[w.home]++
		}
	} else {
		w.bound = true // never pending
		q.forgetIfIdle(tq)
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

// forgetIfIdle forgets the share of tq's tenant once it is idle: nothing
// waiting, nothing in flight.
func (q *modelQueue) forgetIfIdle(tq *tenantQueue) {
	if s := tq.share; s.n == 0 && s.inflight == 0 && q.shares[tq.name] == s {
		delete(q.shares, tq.name)
	}
}

// dropIfIdle forgets a model queue with nothing waiting, pending or in
// flight.
func (c *Controller) dropIfIdle(q *modelQueue) {
	if q.n == 0 && q.pending == 0 && q.inflight == 0 && c.models[q.name] == q {
		delete(c.models, q.name)
	}
}

// Bound tells the queue that t, released, reached a worker: the pool's
// room now counts it. Idempotent; Done calls it too.
func (c *Controller) Bound(t *Ticket) {
	if w := t.queued; w != nil {
		c.mu.Lock()
		c.bind(w)
		c.mu.Unlock()
	}
}

// bind is Bound under c.mu.
func (c *Controller) bind(w *waiter) {
	if !w.bound {
		w.bound = true
		q := w.q
		q.pending--
		if w.home != 0 {
			if q.homes[w.home]--; q.homes[w.home] == 0 {
				delete(q.homes, w.home)
			}
		}
		c.dropIfIdle(q)
	}
}

// ended ends w, released and now done: its tenant has one request fewer in
// flight. c.mu held.
func (c *Controller) ended(w *waiter) {
	c.bind(w)
	w.tenant.share.inflight--
	w.q.inflight--
	w.q.forgetIfIdle(w.tenant)
	c.dropIfIdle(w.q)
}

// wait queues t and blocks until it is released, waited timeout, its
// client leaves or the queue closes. A Resumed request is never refused
// for a full queue.
func (c *Controller) wait(t *Ticket, timeout time.Duration) error {
	if t.Prepare != nil {
		t.Prepare(t)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.stats.count(t.Tenant, Rejected)
		return ErrClosed
	}
	for t.Warmth != Resumed && c.full(t.Bytes) {
		v := c.victim(t)
		if v == nil {
			c.mu.Unlock()
			c.stats.count(t.Tenant, Rejected)
			return ErrFull
		}
		c.finish(v, ErrFull) // its Admit counts it
	}
	w := c.enqueue(t)
	c.startLoop()
	c.mu.Unlock()
	c.poke()

	c.waiters.Add(1)
	defer c.waiters.Add(-1)
	timer := time.NewTimer(timeout)
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
			room := c.cfg.Room(q.name)
			if room >= 0 && room-q.pending <= 0 {
				continue
			}
			// The rest of a pool's room is kept for urgent requests, and
			// so is a full worker's, even where its sessions' history is.
			reserved := room >= 0 && c.cfg.Headroom != nil && room-q.pending <= c.cfg.Headroom(q.name)
			w := q.pick(func(w *waiter) bool { return w.prio <= 0 || !reserved && c.homeTakes(q, w) })
			if w == nil {
				continue
			}
			if best == nil || w.prio < best.prio || w.prio == best.prio && w.seq < best.seq {
				best = w
			}
		}
		if best == nil || !c.take() {
			return
		}
		c.finish(best, nil)
	}
}

// homeTakes reports whether w's home worker takes it now: its room for
// background requests (Config.HomeRoom) exceeds the requests released to
// it and not yet there. A request of no home, or of a home of no known
// room, always may go. c.mu held.
func (c *Controller) homeTakes(q *modelQueue, w *waiter) bool {
	if w.home == 0 || c.cfg.HomeRoom == nil {
		return true
	}
	r, ok := c.cfg.HomeRoom(q.name, w.home)
	return !ok || r > q.homes[w.home]
}

// full reports whether a request of bytes would pass the queue's bounds.
// c.mu held.
func (c *Controller) full(bytes int) bool {
	return int(c.waiting.Load()) >= c.cfg.Size || c.cfg.MaxBytes > 0 && c.bytes+int64(bytes) > c.cfg.MaxBytes
}

// victim is the waiting request a full queue refuses to make room for t,
// or nil when t is the one to refuse: the newest, coldest request of the
// most backlogged tenant of the least urgent priority waiting, when that
// priority is less urgent than t's, or, at t's priority, when that tenant
// waits with more requests than t's tenant would. FIFO refuses t. c.mu
// held.
func (c *Controller) victim(t *Ticket) *waiter {
	if c.cfg.Order == FIFO {
		return nil
	}
	var worst *band
	for _, q := range c.models {
		if n := len(q.bands); n > 0 && (worst == nil || q.bands[n-1].prio > worst.prio) {
			worst = q.bands[n-1]
		}
	}
	if worst == nil || worst.prio < t.Priority {
		return nil
	}
	var most *tenantQueue
	for _, tq := range worst.tenants {
		if most == nil || tq.n > most.n {
			most = tq
		}
	}
	if worst.prio == t.Priority {
		mine := 0
		if tq := worst.tenants[t.Tenant]; tq != nil {
			mine = tq.n
		}
		if most.n <= mine+1 {
			return nil
		}
	}
	return most.last()
}
