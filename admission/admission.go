// Package admission decides when a request may go to a worker: at once,
// after waiting in the router's bounded queue, or not at all
// (docs/design.md §9, "Saturation"). Free of HTTP: the front end asks
// Admit before its worker step and calls Done when the request ends.
//
// A request goes on at once while nothing waits, its model's pool has
// room (Config.Room: how many more requests the model's workers take
// before their own queues show saturation) and the router's in-flight
// count is under its bound. Otherwise it waits, not counted in flight, in
// its model's queue, and is released by one goroutine whenever a request
// ends, a request arrives, and every Tick while any waits: the best
// waiting request of a model with room goes first (see queue.go for the
// order). The worker is chosen only after release (late binding).
package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Order is how waiting requests are released.
type Order uint8

const (
	// Fair releases by priority (lower first), then fairly between the
	// tenants of a priority (fair queueing over the tenants' releases in
	// every priority: the tenant released least goes first; one back from
	// idle starts level with the least released tenant waiting, and one
	// whose turns are in flight at most that many releases behind it),
	// then a tenant's warmest requests first (Warmth), then oldest; a
	// background request whose worker is full (Config.HomeRoom) is passed
	// over until it is not. A full queue makes room for a request by
	// refusing the newest, coldest request of the least urgent priority's
	// most backlogged tenant, when that request is less urgent than it or
	// its tenant holds more of the queue.
	Fair Order = iota
	// FIFO releases in arrival order only, as the vLLM router's queue does.
	FIFO
)

// Errors of Admit: the request does not go to a worker.
var (
	ErrFull    = errors.New("admission: the queue is full")                                // 429
	ErrTimeout = errors.New("admission: waited the queue timeout")                         // 503 queue_timeout
	ErrClosed  = errors.New("admission: the router is shutting down")                      // 503
	ErrGone    = errors.New("admission: the client left while its request waited")         // nothing to answer
	ErrBusy    = errors.New("admission: the router is at its bound of requests in flight") // 429, no queue
)

// Config configures a Controller.
type Config struct {
	MaxInFlight int64         // requests in flight at most (--max-concurrent-requests); ≤ 0: no bound
	Size        int           // requests waiting at most, all models together (--queue-size); 0: no queue
	MaxBytes    int64         // bytes of bodies held while waiting (--queue-max-bytes); ≤ 0: no bound
	Timeout     time.Duration // the longest wait (--queue-timeout-secs)
	Order       Order
	// Room reports how many more requests model's pool takes now before
	// its workers' own queues show it saturated; < 0: no limit known (a
	// model no worker serves included). It is called on arrivals and on
	// every release check, sometimes with the Controller's lock held: it
	// must be quick, lock-free, and must not call back.
	Room func(model string) int
	// Headroom, when set, is the part of model's room that the queue keeps
	// for requests of priority 0 (the default) or more urgent: a request
	// of positive priority (background work) is released only while the
	// room exceeds it, so an urgent request that arrives finds a slot at
	// once instead of waiting for one to free. Same rules as Room.
	Headroom func(model string) int
	// HomeRoom, when set, is how many more requests of positive priority
	// worker home (a Ticket's Home) takes for model before it is full,
	// less the headroom kept there for urgent requests; false: no limit
	// known (an unknown or unhealthy worker included). A background
	// request whose history home holds waits while this is not above the
	// requests already released to it, though the pool has room
	// elsewhere: sent now, it would queue in home's engine, first come
	// first served, ahead of the urgent turns of home's sessions, or
	// leave its cache to be prefilled again elsewhere. Same rules as Room.
	HomeRoom func(model string, home uint32) (int, bool)
	Tick     time.Duration // re-check of Room while requests wait; default 5 ms
	Now      func() time.Time
}

// Warmth is how much a request's session gains from going soon, in the
// order a tenant's requests are released.
type Warmth uint8

const (
	Cold     Warmth = iota // a new session's first turn, or a history no worker holds
	Held                   // a later turn whose history a healthy worker holds: it keeps that cache in use
	ToolLoop               // a turn mid tool loop whose history a worker holds: an agent is blocked on it
	Resumed                // the rest of a stream preempted for a more urgent request (Readmit): its client is mid-answer
)

// Ticket is one request as admission sees it. Only Model is read when
// the request need not wait; the rest may be filled by Prepare, which Admit
// calls once before the request waits.
type Ticket struct {
	Model    string // the physical model; copied when the request waits
	Priority int    // lower first
	Tenant   string // who sent it; copied when the request waits
	Warmth   Warmth // how much its session gains from going soon
	Home     uint32 // the worker holding its history (see Config.HomeRoom); 0: none
	Bytes    int    // the body held while it waits
	// Prepare, when set, fills the fields above but Model before the
	// request waits; it may set Gone.
	Prepare func(*Ticket)
	// Gone, when closed, ends the wait: the client left (ErrGone).
	Gone <-chan struct{}

	// Set by Admit.
	Waited time.Duration // time spent in the queue
	queued *waiter       // the queue entry, when it waited: bound by Bound
}

// Handoff returns what Done needs of t, for whoever ends the request
// after t's owner is gone (a stream's relay); t's owner then must not call
// Done. Nothing of the request's buffers is kept.
func (t *Ticket) Handoff() Ticket { return Ticket{queued: t.queued} }

// Controller admits requests. Safe for concurrent use.
type Controller struct {
	cfg      Config
	inflight atomic.Int64
	waiting  atomic.Int64 // requests in the queue, all models
	waiters  atomic.Int64 // Admit calls blocked in the queue (for Close)
	kick     chan struct{}

	mu      sync.Mutex
	models  map[string]*modelQueue // models with requests waiting or released and not yet bound
	bytes   int64
	closed  bool
	seq     uint64
	stats   *Stats
	started bool // the release loop runs

	rooms    roomCache // the pools' room as the path of a request that does not wait reads it
	stop     chan struct{}
	stopOnce sync.Once
}

// New returns a Controller for cfg.
func New(cfg Config) *Controller {
	if cfg.Tick <= 0 {
		cfg.Tick = 5 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Room == nil {
		cfg.Room = func(string) int { return -1 }
	}
	c := &Controller{cfg: cfg, kick: make(chan struct{}, 1), models: map[string]*modelQueue{}, stats: newStats(),
		stop: make(chan struct{})}
	c.rooms.room = cfg.Room
	if cfg.Size > 0 {
		go c.rooms.refresh(cfg.Tick, c.stop)
	}
	return c
}

// InFlight is the number of admitted requests not yet Done.
func (c *Controller) InFlight() int64 { return c.inflight.Load() }

// Waiting is the number of requests in the queue.
func (c *Controller) Waiting() int64 { return c.waiting.Load() }

// Backlog is how many requests of model the queue holds: waiting, or
// released and not yet at a worker (the pool's room does not count them
// yet). It takes the queue's lock unless nothing waits.
func (c *Controller) Backlog(model string) int {
	if c.waiting.Load() == 0 {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if q := c.models[model]; q != nil {
		return q.n + q.pending
	}
	return 0
}

// Stats is what the queue has done, per tenant and outcome.
func (c *Controller) Stats() *Stats { return c.stats }

// Admit returns nil when t may go to a worker now — counted in flight
// until Done — after waiting if it must; else why not. A request that
// waits ends its wait when t.Gone closes (the client left: ErrGone).
// Without a queue (Size 0) a request goes on whatever its pool's room, up
// to MaxInFlight. On the path where nothing waits and the pool has room
// it takes no lock and allocates nothing.
func (c *Controller) Admit(t *Ticket) error {
	t.Waited, t.queued = 0, nil
	if c.cfg.Size <= 0 {
		if c.take() {
			return nil
		}
		c.stats.count(t.Tenant, Rejected)
		return ErrBusy
	}
	if c.waiting.Load() == 0 && c.rooms.take(t.Model) && c.take() {
		return nil
	}
	return c.wait(t, c.cfg.Timeout)
}

// Readmit is Admit for a request that gave its slot up mid-answer (a
// stream preempted for a more urgent one, docs/design.md §9): it waits in
// the queue whatever the pools' room, so that the order of release and
// the reserves decide when it goes on, as the warmest of its tenant's
// requests (Resumed). It was admitted once, so it is neither refused for
// a full queue nor pushed out by a newcomer, and its release does not
// count against its tenant's share again; it waits at most timeout (what
// is left of its request's time). A Controller without a queue (Size 0)
// admits it as Admit does.
func (c *Controller) Readmit(t *Ticket, timeout time.Duration) error {
	t.Waited, t.queued = 0, nil
	if c.cfg.Size <= 0 {
		return c.Admit(t)
	}
	t.Warmth = Resumed
	return c.wait(t, timeout)
}

// take counts one more request in flight unless that passes MaxInFlight.
func (c *Controller) take() bool {
	n := c.inflight.Add(1)
	if max := c.cfg.MaxInFlight; max > 0 && n > max {
		c.inflight.Add(-1)
		return false
	}
	return true
}

// Done ends t, an admitted request: its slot may go to a waiting one.
func (c *Controller) Done(t *Ticket) {
	if w := t.queued; w != nil {
		t.queued = nil
		c.mu.Lock()
		c.ended(w)
		c.mu.Unlock()
	}
	c.inflight.Add(-1)
	if c.waiting.Load() > 0 {
		c.poke()
	}
}

// poke wakes the release loop.
func (c *Controller) poke() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Close ends every wait with ErrClosed and refuses new waits; requests
// that need no wait are still admitted (a draining router serves what it
// can). Idempotent.
func (c *Controller) Close() {
	c.mu.Lock()
	c.closed = true
	for _, q := range c.models {
		q.each(func(w *waiter) { c.finish(w, ErrClosed) })
	}
	c.mu.Unlock()
}

// Stop ends the Controller's background work; Close it first. A stopped
// Controller reads each pool's room as it stood when it stopped.
func (c *Controller) Stop() {
	c.Close()
	c.stopOnce.Do(func() { close(c.stop) })
}

// Drained waits until no Admit call is blocked in the queue, or until ctx
// ends.
func (c *Controller) Drained(ctx context.Context) {
	for c.waiters.Load() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Millisecond):
		}
	}
}
