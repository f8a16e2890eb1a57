package admission

import (
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/internal/testwait"
)

// fixture is a Controller over one model whose room the test sets, and
// the requests it admitted, in the order they were admitted.
type fixture struct {
	c        *Controller
	room     atomic.Int64
	admitted chan string
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	f := &fixture{admitted: make(chan string, 1024)}
	cfg.Room = func(string) int { return int(f.room.Load()) }
	if cfg.Size == 0 {
		cfg.Size = 100
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	cfg.Tick = time.Millisecond
	f.c = New(cfg)
	return f
}

// send admits a request in the background; its name goes to f.admitted
// once admitted (and is then bound to a worker at once), or name+":"+error.
func (f *fixture) send(gone <-chan struct{}, name string, t Ticket) {
	t.Gone = gone
	go func() {
		if err := f.c.Admit(&t); err != nil {
			f.admitted <- name + ":" + err.Error()
			return
		}
		f.admitted <- name
		f.c.Done(&t)
	}()
}

// enqueue sends a request whose client stays and waits until it is queued.
func (f *fixture) enqueue(t *testing.T, name string, tk Ticket) {
	t.Helper()
	n := f.c.Waiting()
	f.send(nil, name, tk)
	f.waitQueued(t, n+1)
}

// waitQueued waits until n requests wait.
func (f *fixture) waitQueued(t *testing.T, n int64) {
	t.Helper()
	testwait.Until(t, fmt.Sprintf("%d waiting", n), func() bool { return f.c.Waiting() == n })
}

// order lets the queue release one request at a time (room 1: the next
// goes only once the last is done) and returns the order.
func (f *fixture) order(t *testing.T, n int) string {
	t.Helper()
	f.room.Store(1)
	var got []string
	for range n {
		select {
		case name := <-f.admitted:
			got = append(got, name)
		case <-time.After(testwait.Timeout):
			t.Fatalf("released %v, then nothing", got)
		}
	}
	return strings.Join(got, " ")
}

func TestNothingWaitsWhileThePoolHasRoom(t *testing.T) {
	f := newFixture(t, Config{})
	f.room.Store(-1)
	tk := Ticket{Model: "m"}
	if err := f.c.Admit(&tk); err != nil || tk.Waited != 0 {
		t.Fatalf("Admit = %v after %v", err, tk.Waited)
	}
	if f.c.InFlight() != 1 {
		t.Fatalf("in flight %d", f.c.InFlight())
	}
	f.c.Done(&tk)
	if f.c.InFlight() != 0 {
		t.Fatalf("in flight %d after Done", f.c.InFlight())
	}
}

func TestReleaseOrderPriorityThenOldest(t *testing.T) {
	f := newFixture(t, Config{})
	f.enqueue(t, "batch1", Ticket{Model: "m", Priority: 10})
	f.enqueue(t, "batch2", Ticket{Model: "m", Priority: 10})
	f.enqueue(t, "interactive", Ticket{Model: "m", Priority: 0})
	f.enqueue(t, "urgent", Ticket{Model: "m", Priority: -5})
	if got := f.order(t, 4); got != "urgent interactive batch1 batch2" {
		t.Fatalf("released %q", got)
	}
}

// A tenant that floods gets its share, not the queue: two backlogged
// tenants alternate, whatever their arrival order.
func TestTenantsShareABand(t *testing.T) {
	f := newFixture(t, Config{})
	for i := range 6 {
		f.enqueue(t, fmt.Sprintf("a%d", i), Ticket{Model: "m", Tenant: "a"})
	}
	f.enqueue(t, "b0", Ticket{Model: "m", Tenant: "b"})
	f.enqueue(t, "b1", Ticket{Model: "m", Tenant: "b"})
	if got := f.order(t, 8); got != "a0 b0 a1 b1 a2 a3 a4 a5" {
		t.Fatalf("released %q", got)
	}
}

// Priority goes first, but a tenant's urgent releases spend its share:
// in the next band the tenant they left behind goes first until it has
// been served as much, so a flood of one tenant's urgent requests does not
// take the other's share of the batch band too.
func TestSharesCountAcrossPriorities(t *testing.T) {
	f := newFixture(t, Config{})
	for i := range 3 {
		f.enqueue(t, fmt.Sprintf("aUrgent%d", i), Ticket{Model: "m", Tenant: "a", Priority: 0})
	}
	for i := range 4 {
		f.enqueue(t, fmt.Sprintf("aBatch%d", i), Ticket{Model: "m", Tenant: "a", Priority: 10})
	}
	for i := range 4 {
		f.enqueue(t, fmt.Sprintf("bBatch%d", i), Ticket{Model: "m", Tenant: "b", Priority: 10})
	}
	want := "aUrgent0 aUrgent1 aUrgent2 bBatch0 bBatch1 bBatch2 aBatch0 bBatch3 aBatch1 aBatch2 aBatch3"
	if got := f.order(t, 11); got != want {
		t.Fatalf("released %q\nwant     %q", got, want)
	}
}

// A tenant back from idle starts level with the least served tenant
// waiting: no credit for having sent nothing. (Driven by hand, one
// release at a time, under the Controller's lock.)
func TestReturningTenantGetsNoCredit(t *testing.T) {
	h := newHandQueue()
	defer h.c.mu.Unlock()
	h.add("a0", "a")
	h.add("a1", "a")
	h.add("a2", "a")
	h.release(1)
	h.add("b0", "b") // level with a after a0: a1 is older
	h.add("b1", "b")
	h.release(4)
	if s := strings.Join(h.got, " "); s != "a0 a1 b0 a2 b1" {
		t.Fatalf("released %q", s)
	}
}

// handQueue drives a Controller's queue of model "m" by hand, one release
// at a time, under its lock (held from newHandQueue on), and records the
// order of release.
type handQueue struct {
	c      *Controller
	names  map[*waiter]string
	byName map[string]*waiter
	got    []string
}

func newHandQueue() *handQueue {
	h := &handQueue{c: New(Config{Size: 100, Timeout: time.Second, Room: func(string) int { return 0 }}),
		names: map[*waiter]string{}, byName: map[string]*waiter{}}
	h.c.mu.Lock()
	return h
}

func (h *handQueue) add(name, tenant string) {
	w := h.c.enqueue(&Ticket{Model: "m", Tenant: tenant})
	h.names[w], h.byName[name] = name, w
}

func (h *handQueue) release(n int) {
	for range n {
		w := h.c.models["m"].pick(nil)
		h.got = append(h.got, h.names[w])
		h.c.finish(w, nil)
	}
}

// A tenant with turns in flight, none waiting, is still active: when its
// next turn comes it keeps the lead the others took meanwhile, up to one
// release per turn in flight; with none in flight it starts level. (Driven
// by hand, one release at a time, under the Controller's lock.)
func TestTenantInFlightKeepsItsLag(t *testing.T) {
	for _, c := range []struct {
		name      string
		b0Done    bool
		want      string
		bInFlight int
	}{
		{"b0 in flight", false, "a0 b0 a1 a2 a3 b1 a4 b2 a5 b3", 1},
		{"b0 done: idle", true, "a0 b0 a1 a2 a3 a4 b1 a5 b2 b3", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHandQueue()
			defer h.c.mu.Unlock()
			for i := range 6 {
				h.add(fmt.Sprintf("a%d", i), "a")
			}
			h.add("b0", "b")
			h.release(5) // a0 b0 (level, then oldest), then a alone
			if c.b0Done {
				h.c.ended(h.byName["b0"])
			}
			if s := h.c.models["m"].shares["b"]; (s == nil) != (c.bInFlight == 0) || s != nil && s.inflight != c.bInFlight {
				t.Fatalf("b's share %+v, want %d in flight (none kept when idle)", s, c.bInFlight)
			}
			h.add("b1", "b")
			h.add("b2", "b")
			h.add("b3", "b")
			h.release(5)
			if s := strings.Join(h.got, " "); s != c.want {
				t.Fatalf("released %q\nwant     %q", s, c.want)
			}
		})
	}
}

// Headroom keeps the pool's last slots for requests of priority 0 or more
// urgent: a background request waits while the room is no more than it,
// an urgent one goes at once. (Driven by hand under the Controller's lock.)
func TestHeadroomKeepsRoomForUrgentRequests(t *testing.T) {
	room := 1
	c := New(Config{Size: 100, Timeout: time.Second, Room: func(string) int { return room },
		Headroom: func(string) int { return 1 }})
	c.mu.Lock()
	defer c.mu.Unlock()
	batch := c.enqueue(&Ticket{Model: "m", Priority: 10})
	c.release()
	if !batch.queued {
		t.Fatal("a background request took the headroom")
	}
	urgent := c.enqueue(&Ticket{Model: "m", Priority: 0})
	c.release()
	if urgent.queued || !batch.queued {
		t.Fatalf("urgent released %v, batch released %v: want the urgent one only", !urgent.queued, !batch.queued)
	}
	room = 3 // the urgent one, released, counts until it reaches a worker: 3 − 1 left
	c.release()
	if batch.queued {
		t.Fatal("a background request waits with room past the headroom")
	}
}

// A background request whose history a full worker holds waits, though
// the pool has room elsewhere and though it is older than the requests
// that pass it; an urgent one goes to its full worker at once. Requests
// released to a worker and not yet there count against its room; a worker
// of no known room keeps nothing waiting. (Driven by hand under the
// Controller's lock.)
func TestBackgroundWaitsForItsFullHome(t *testing.T) {
	const a, b, unknown = 1, 2, 3
	homeRoom := map[uint32]int{a: 0, b: 1}
	c := New(Config{Size: 100, Timeout: time.Second, Room: func(string) int { return 10 },
		HomeRoom: func(_ string, home uint32) (int, bool) { r, ok := homeRoom[home]; return r, ok }})
	c.mu.Lock()
	defer c.mu.Unlock()
	batchA := c.enqueue(&Ticket{Model: "m", Priority: 10, Home: a})
	batchB := c.enqueue(&Ticket{Model: "m", Priority: 10, Home: b})
	batchB2 := c.enqueue(&Ticket{Model: "m", Priority: 10, Home: b})
	cold := c.enqueue(&Ticket{Model: "m", Priority: 10})
	lost := c.enqueue(&Ticket{Model: "m", Priority: 10, Home: unknown})
	urgentA := c.enqueue(&Ticket{Model: "m", Priority: 0, Home: a})
	c.release()
	waits := func() string {
		var s string
		for _, w := range []*waiter{batchA, batchB, batchB2, cold, lost, urgentA} {
			if w.queued {
				s += fmt.Sprint(w.seq, " ")
			}
		}
		return s
	}
	if got := waits(); got != fmt.Sprint(batchA.seq, " ", batchB2.seq, " ") {
		t.Fatalf("waiting after the first release (by arrival): %q; want the one homed on the full worker and "+
			"the second homed on the worker with one slot", got)
	}
	homeRoom[a] = 1 // a slot frees at a, but the urgent turn released there has not reached it yet
	c.release()
	if !batchA.queued {
		t.Fatal("a background request went to a worker whose last slot an urgent one is on its way to")
	}
	c.bind(urgentA)
	c.release()
	if batchA.queued || !batchB2.queued {
		t.Fatalf("after the urgent turn reached a: batchA waits %v (want released), batchB2 waits %v (want waiting)",
			batchA.queued, batchB2.queued)
	}
}

// Within a tenant, a turn mid tool loop whose history is hot goes before
// a new session's first turn that came earlier.
func TestWarmTurnFirst(t *testing.T) {
	f := newFixture(t, Config{})
	f.enqueue(t, "new1", Ticket{Model: "m"})
	f.enqueue(t, "new2", Ticket{Model: "m"})
	f.enqueue(t, "toolloop", Ticket{Model: "m", Warmth: ToolLoop})
	if got := f.order(t, 3); got != "toolloop new1 new2" {
		t.Fatalf("released %q", got)
	}
}

func TestFIFOIgnoresPriorityTenantAndWarmth(t *testing.T) {
	f := newFixture(t, Config{Order: FIFO})
	f.enqueue(t, "first", Ticket{Model: "m", Priority: 10, Tenant: "a"})
	f.enqueue(t, "second", Ticket{Model: "m", Priority: 0, Tenant: "b", Warmth: ToolLoop})
	if got := f.order(t, 2); got != "first second" {
		t.Fatalf("released %q", got)
	}
}

func TestBoundsAndEndsOfAWait(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		f := newFixture(t, Config{Timeout: 20 * time.Millisecond})
		tk := Ticket{Model: "m", Tenant: "a"}
		if err := f.c.Admit(&tk); !errors.Is(err, ErrTimeout) || tk.Waited < 20*time.Millisecond {
			t.Fatalf("Admit = %v after %v, want ErrTimeout after the timeout", err, tk.Waited)
		}
		if f.c.Waiting() != 0 || f.c.InFlight() != 0 || f.c.Stats().Count("a", Expired) != 1 {
			t.Fatalf("waiting %d, in flight %d, expired %d", f.c.Waiting(), f.c.InFlight(), f.c.Stats().Count("a", Expired))
		}
	})
	t.Run("size", func(t *testing.T) {
		f := newFixture(t, Config{Size: 2})
		f.enqueue(t, "1", Ticket{Model: "m"})
		f.enqueue(t, "2", Ticket{Model: "m"})
		if err := f.c.Admit(&Ticket{Model: "m"}); !errors.Is(err, ErrFull) {
			t.Fatalf("Admit past the size = %v", err)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		f := newFixture(t, Config{MaxBytes: 100})
		f.enqueue(t, "1", Ticket{Model: "m", Bytes: 60})
		if err := f.c.Admit(&Ticket{Model: "m", Bytes: 50}); !errors.Is(err, ErrFull) {
			t.Fatalf("Admit past the bytes = %v", err)
		}
		f.enqueue(t, "2", Ticket{Model: "m", Bytes: 40}) // fits
	})
	t.Run("client gone", func(t *testing.T) {
		f := newFixture(t, Config{})
		gone := make(chan struct{})
		f.send(gone, "gone", Ticket{Model: "m", Tenant: "a"})
		f.waitQueued(t, 1)
		close(gone)
		if got := <-f.admitted; got != "gone:"+ErrGone.Error() {
			t.Fatalf("got %q", got)
		}
		f.room.Store(-1)
		if f.c.Waiting() != 0 || f.c.InFlight() != 0 || f.c.Stats().Count("a", Abandoned) != 1 {
			t.Fatal("an abandoned request stayed counted")
		}
	})
	t.Run("close", func(t *testing.T) {
		f := newFixture(t, Config{})
		f.enqueue(t, "drained", Ticket{Model: "m"})
		f.c.Close()
		if got := <-f.admitted; got != "drained:"+ErrClosed.Error() {
			t.Fatalf("got %q", got)
		}
		f.room.Store(-1)
		testwait.Until(t, "the pool's room refreshed", func() bool {
			v, ok := f.c.rooms.byKey.Load("m")
			return ok && v.(*atomic.Int64).Load() > 0
		})
		if err := f.c.Admit(&Ticket{Model: "m"}); err != nil {
			t.Fatalf("a closed queue refused a request that needs no wait: %v", err)
		}
	})
}

// The in-flight bound holds whatever the pools' room: past it requests
// wait (not counted in flight) and go as others end.
func TestInFlightBoundQueues(t *testing.T) {
	f := newFixture(t, Config{MaxInFlight: 1})
	f.room.Store(-1)
	first := Ticket{Model: "m"}
	if err := f.c.Admit(&first); err != nil {
		t.Fatal(err)
	}
	f.enqueue(t, "second", Ticket{Model: "m"})
	if f.c.InFlight() != 1 {
		t.Fatalf("in flight %d while one waits", f.c.InFlight())
	}
	f.c.Done(&first)
	if got := <-f.admitted; got != "second" {
		t.Fatalf("got %q", got)
	}
}

// Without a queue the router behaves as before it had one: straight to a
// worker up to the in-flight bound, refused past it.
func TestNoQueueIsPassThrough(t *testing.T) {
	f := newFixture(t, Config{MaxInFlight: 1})
	f.c.cfg.Size = 0
	tk := Ticket{Model: "m"} // room 0: a saturated pool does not hold it
	if err := f.c.Admit(&tk); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Admit(&Ticket{Model: "m"}); !errors.Is(err, ErrBusy) {
		t.Fatalf("past the bound: %v, want ErrBusy", err)
	}
}

// A released request counts against its pool's room until it reaches a
// worker (Bound), so one release loop turn does not flood a pool whose
// room the workers' next reports have not seen shrink.
func TestReleasedCountsUntilBound(t *testing.T) {
	f := newFixture(t, Config{})
	got := make(chan *Ticket, 2)
	for range 2 {
		go func() {
			tk := &Ticket{Model: "m"}
			if f.c.Admit(tk) == nil {
				got <- tk
			}
		}()
	}
	f.waitQueued(t, 2)
	f.room.Store(1)
	first := <-got
	select {
	case <-got:
		t.Fatal("a second request released while the first was not at a worker")
	case <-time.After(20 * time.Millisecond):
	}
	f.c.Bound(first) // now the pool's room (still 1, as the test says) counts it itself
	second := <-got
	f.c.Done(first)
	f.c.Done(second)
	testwait.Until(t, "nothing left", func() bool { return f.c.InFlight() == 0 && len(f.c.models) == 0 })
}

func TestTenantLabelsAreBounded(t *testing.T) {
	f := newFixture(t, Config{Size: 1})
	f.send(nil, "holder", Ticket{Model: "m"})
	f.waitQueued(t, 1)
	for i := range MaxTenantLabels + 10 {
		_ = f.c.Admit(&Ticket{Model: "m", Tenant: fmt.Sprint("t", i)}) // queue full: rejected
	}
	var b strings.Builder
	f.c.WriteMetrics(&b)
	tenants := map[string]bool{}
	for _, line := range strings.Split(b.String(), "\n") {
		if i := strings.Index(line, `tenant="`); i >= 0 {
			tenants[line[i:strings.Index(line[i+8:], `"`)+i+8]] = true
		}
	}
	if len(tenants) != MaxTenantLabels+1 || f.c.Stats().Count(OtherTenant, Rejected) != 10 {
		t.Fatalf("%d tenant labels, %d rejected as other", len(tenants), f.c.Stats().Count(OtherTenant, Rejected))
	}
	if !strings.Contains(b.String(), `vllm_router_queue_depth{model="m",priority="0"} 1`) {
		t.Fatalf("no depth series:\n%s", b.String())
	}
}

// Between refreshes a pool takes no more than the room it had: the path of
// a request that does not wait counts its admissions down.
func TestCachedRoomCountsDown(t *testing.T) {
	var c *Controller
	room := func(string) int { return 2 - int(c.InFlight()) } // a pool of two, as its workers would report it
	c = New(Config{Size: 10, Timeout: time.Second, Tick: time.Hour, Room: room})
	defer c.Stop()
	for i := range 2 {
		if err := c.Admit(&Ticket{Model: "m"}); err != nil || c.InFlight() != int64(i+1) {
			t.Fatalf("admission %d: %v", i, err)
		}
	}
	go c.Admit(&Ticket{Model: "m"}) //nolint:errcheck // the third waits
	testwait.Until(t, "the third request waiting", func() bool { return c.Waiting() == 1 })
}

// A ticket's model and tenant may alias a request buffer that is reused
// once its request ends: the queue keeps copies.
func TestQueueCopiesTheTicketsStrings(t *testing.T) {
	f := newFixture(t, Config{})
	buf := []byte("model-a tenant-x")
	tk := Ticket{Model: bytesconv.B2S(buf[:7]), Tenant: bytesconv.B2S(buf[8:])} // as the front end passes them
	go f.c.Admit(&tk)                                                           //nolint:errcheck
	f.waitQueued(t, 1)
	copy(buf, "XXXXXXXXXXXXXXXX") // the request buffer is reused
	ds := f.c.Depths()
	if len(ds) != 1 || ds[0].Model != "model-a" {
		t.Fatalf("the queue kept an alias: %+v", ds)
	}
	f.c.Close()
}

// A tenant's warmest requests go first: mid tool loop, then a later turn
// of a held session, then new sessions.
func TestWarmthOrder(t *testing.T) {
	f := newFixture(t, Config{})
	f.enqueue(t, "new", Ticket{Model: "m", Warmth: Cold})
	f.enqueue(t, "held", Ticket{Model: "m", Warmth: Held})
	f.enqueue(t, "toolloop", Ticket{Model: "m", Warmth: ToolLoop})
	if got := f.order(t, 3); got != "toolloop held new" {
		t.Fatalf("released %q", got)
	}
}

// A full queue makes room for a more urgent request, and for a tenant
// that holds less of it than the one that fills it; FIFO never does.
func TestFullQueuePushesOut(t *testing.T) {
	f := newFixture(t, Config{Size: 3})
	f.enqueue(t, "flood-old", Ticket{Model: "m", Tenant: "heavy", Priority: 10})
	f.enqueue(t, "flood-held", Ticket{Model: "m", Tenant: "heavy", Priority: 10, Warmth: Held})
	f.enqueue(t, "flood-new", Ticket{Model: "m", Tenant: "heavy", Priority: 10})
	f.send(nil, "light", Ticket{Model: "m", Tenant: "light", Priority: 10}) // heavy holds 3, light would hold 1
	if got := <-f.admitted; got != "flood-new:"+ErrFull.Error() {
		t.Fatalf("pushed out %q, want heavy's newest cold request", got)
	}
	f.waitQueued(t, 3)
	f.send(nil, "urgent", Ticket{Model: "m", Tenant: "light", Priority: 0}) // less urgent ones give way
	if got := <-f.admitted; got != "flood-old:"+ErrFull.Error() {
		t.Fatalf("pushed out %q", got)
	}
	f.waitQueued(t, 3)
	if err := f.c.Admit(&Ticket{Model: "m", Tenant: "light", Priority: 10}); !errors.Is(err, ErrFull) {
		t.Fatalf("a tenant that would hold as much as the others pushed one out: %v", err)
	}
	if got := f.order(t, 3); got != "urgent flood-held light" {
		t.Fatalf("released %q", got)
	}

	fifo := newFixture(t, Config{Size: 1, Order: FIFO})
	fifo.enqueue(t, "first", Ticket{Model: "m", Tenant: "heavy", Priority: 10})
	if err := fifo.c.Admit(&Ticket{Model: "m", Tenant: "light", Priority: 0}); !errors.Is(err, ErrFull) {
		t.Fatalf("FIFO pushed out: %v", err)
	}
}

// readmit readmits a request in the background, as send admits one, and
// waits until it is queued.
func (f *fixture) readmit(t *testing.T, name string, tk Ticket) {
	t.Helper()
	n := f.c.Waiting()
	go func() {
		if err := f.c.Readmit(&tk, 10*time.Second); err != nil {
			f.admitted <- name + ":" + err.Error()
			return
		}
		f.admitted <- name
		f.c.Done(&tk)
	}()
	f.waitQueued(t, n+1)
}

// A preempted stream's rest (Readmit) goes by the queue's rules even
// where a new request would go at once; a full queue neither refuses nor
// pushes it out; it goes first of its tenant's requests; and its release
// is not counted against its tenant's share a second time.
func TestReadmit(t *testing.T) {
	var headroom atomic.Int64
	headroom.Store(1)
	f := newFixture(t, Config{Headroom: func(string) int { return int(headroom.Load()) }})
	f.room.Store(1) // the pool's last slot, kept for urgent requests
	if err := f.c.Admit(&Ticket{Model: "m", Priority: 10}); err != nil {
		t.Fatal(err) // nothing waits and the pool has room: a new request goes at once
	}
	f.readmit(t, "resumed", Ticket{Model: "m", Priority: 10})
	headroom.Store(0)
	if got := <-f.admitted; got != "resumed" {
		t.Fatalf("got %q", got)
	}

	full := newFixture(t, Config{Size: 1})
	full.readmit(t, "resumed-a", Ticket{Model: "m", Tenant: "heavy", Priority: 10})
	full.readmit(t, "resumed-b", Ticket{Model: "m", Tenant: "heavy", Priority: 10}) // past the bound
	full.send(nil, "urgent", Ticket{Model: "m", Tenant: "light", Priority: 0})
	if got := <-full.admitted; got != "urgent:"+ErrFull.Error() {
		t.Fatalf("got %q, want the newcomer refused: only resumed requests wait", got)
	}

	// Order and shares: heavy's resumed request goes first of heavy's; it
	// costs heavy nothing, so heavy's tool-loop turn still goes before
	// light's newer request.
	o := newFixture(t, Config{})
	o.enqueue(t, "toolloop", Ticket{Model: "m", Tenant: "heavy", Priority: 10, Warmth: ToolLoop})
	o.enqueue(t, "heavy-cold", Ticket{Model: "m", Tenant: "heavy", Priority: 10})
	o.readmit(t, "resumed", Ticket{Model: "m", Tenant: "heavy", Priority: 10})
	o.enqueue(t, "light", Ticket{Model: "m", Tenant: "light", Priority: 10})
	if got := o.order(t, 4); got != "resumed toolloop light heavy-cold" {
		t.Fatalf("released %q", got)
	}
}
