package saar

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/sessionshard"
	"github.com/warmroute/warmroute/sharedstate"
)

// replicas are model steps of two router replicas sharing one Redis, on one
// simulated clock (docs/design.md §8.3).
type replicas struct {
	redis  *redistest.Server
	clk    *fakeClock
	r      [2]*Router
	st     [2]*sharedstate.Store
	set    [2]*metrics.Set
	record func(i int, sel Selection) Record
}

func startReplicas(t *testing.T) *replicas {
	t.Helper()
	rs := &replicas{redis: redistest.Start(t, redistest.Options{}), clk: &fakeClock{t: time.Unix(1_700_000_000, 0)}}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range rs.r {
		st, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: rs.redis.URL(), Logger: quiet,
			// generous bounds: -race on shared cores
			ReadTimeout: 2 * time.Second, LockTimeout: 2 * time.Second, PingTimeout: 2 * time.Second, HealthInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		rs.st[i], rs.set[i] = st, metrics.NewSet()
		rs.r[i] = NewRouter(demoConfig(t), Options{Now: rs.clk.Now, Shared: st, Metrics: rs.set[i]})
		t.Cleanup(rs.r[i].Close)
	}
	rs.record = func(i int, sel Selection) Record {
		t.Helper()
		rec, ok := rs.r[i].Record(sel.ReplayID)
		if !ok {
			t.Fatalf("no record %s", sel.ReplayID)
		}
		return rec
	}
	return rs
}

func counterOf(set *metrics.Set, name string) uint64 { return set.GetOrCreateCounter(name).Get() }

// A tool call answered through replica A; its result sent to replica B,
// which never saw the call, with or without the session: the same model.
func TestSharedToolLockAcrossReplicas(t *testing.T) {
	rs := startReplicas(t)
	a, b := rs.r[0], rs.r[1]
	first := a.Select(turn("s1", "look it up").tools().c(0).T(), allUp)
	if first.Model != "sim-small" {
		t.Fatalf("turn 1 on A chose %s; the test needs sim-small", first.Model)
	}
	if err := a.ShareLocks(context.Background(), first.Model, "http://w-small-1", bs("call_a1"), nil, nil); err != nil {
		t.Fatal(err)
	}
	a.Observe([]byte("s1"), first.Model, "http://w-small-1", Observed{ToolCallIDs: bs("call_a1")})
	rs.clk.Add(time.Second)

	for _, session := range []string{"", "s1"} {
		// The text asks for the reasoning decision (sim-large, sim-medium):
		// only the lock keeps sim-small.
		sel := b.Select(turn(session, "prove the theorem step by step").results("call_a1").c(1).T(), allUp)
		expect(t, sel, "sim-small", ActionHardLock, PhaseToolLoop, ReasonToolLoop)
		if rec := rs.record(1, sel); rec.Inputs.ToolOwnerSource != lockSourceShared && session == "" {
			t.Fatalf("session %q: owner source %q, want %q", session, rec.Inputs.ToolOwnerSource, lockSourceShared)
		}
	}
	if n := counterOf(rs.set[1], `vllm_router_saar_shared_locks_found_total{index="tool_call"}`); n != 1 {
		t.Fatalf("locks found in Redis: %d, want 1 (the second turn is served by the local index)", n)
	}
}

// previous_response_id created through A: B pins the same model and worker.
func TestSharedResponseLockPinsWorker(t *testing.T) {
	rs := startReplicas(t)
	a, b := rs.r[0], rs.r[1]
	if err := a.ShareLocks(context.Background(), "sim-large", "http://w-large-2", nil, []byte("resp_1"), nil); err != nil {
		t.Fatal(err)
	}
	sel := b.Select(turn("", "hello").prev("resp_1").c(0).T(), allUp)
	expect(t, sel, "sim-large", ActionHardLock, PhaseProviderState, ReasonProviderState)
	if sel.PinnedWorker != "http://w-large-2" {
		t.Fatalf("pinned %q", sel.PinnedWorker)
	}
	if m, w, ok, _ := b.LookupResponse([]byte("resp_1")); !ok || m != "sim-large" || w != "http://w-large-2" {
		t.Fatalf("LookupResponse = %s %s %v", m, w, ok)
	}
	b.ForgetResponse([]byte("resp_1")) // DELETE /v1/responses/{id} through B: gone for A too
	if _, _, ok, down := a.LookupResponse([]byte("resp_1")); ok || down {
		t.Fatalf("a deleted response is still known (%v) or Redis unreachable (%v)", ok, down)
	}
}

// The session memory written by A is read by B on a local miss, and B's
// copy follows A's later turns after the invalidation; a replica's own
// writes never roll its memory back.
func TestSharedMemory(t *testing.T) {
	rs := startReplicas(t)
	a, b := rs.r[0], rs.r[1]
	ctx := context.Background()
	for i := 0; i < 3; i++ { // A's own invalidations must not lose turns
		a.Select(turn("m1", "hello").c(0).T(), allUp)
		rs.clk.Add(time.Second)
	}
	if err := rs.st[0].Flush(ctx); err != nil {
		t.Fatal(err)
	}
	a.sh.stale.Delete(memHash([]byte("auto"), []byte("m1"))) // A's own writes marked it; the mark awaited below is B's
	sel := b.Select(turn("m1", "hello again").c(0).T(), allUp)
	rec := rs.record(1, sel)
	if rec.Memory == nil || rec.Memory.Turns != 3 || sel.Action == ActionFirst {
		t.Fatalf("B did not start from A's memory: %+v, %+v", rec.Memory, sel)
	}
	if err := rs.st[1].Flush(ctx); err != nil {
		t.Fatal(err)
	}
	rs.clk.Add(time.Second)
	// A had a local entry: B's write invalidated it.
	testwait.Within(t, 5*time.Second, "A told of B's write", func() bool {
		_, ok := a.sh.stale.Load(memHash([]byte("auto"), []byte("m1")))
		return ok
	})
	sel = a.Select(turn("m1", "and now").c(0).T(), allUp)
	if rec := rs.record(0, sel); rec.Memory == nil || rec.Memory.Turns != 4 {
		t.Fatalf("A did not take B's newer memory: %+v", rec.Memory)
	}
	if n := counterOf(rs.set[0], `vllm_router_saar_shared_memory_loads_total`); n != 1 {
		t.Fatalf("A adopted %d records, want 1 (its own writes are older than its state)", n)
	}
}

// Redis down: a turn whose lock is unknown here gets an explicit, counted
// redis_down reason; locks written meanwhile are kept and, once Redis is
// back, replayed and found.
func TestSharedLocksRedisDown(t *testing.T) {
	rs := startReplicas(t)
	a, b := rs.r[0], rs.r[1]
	rs.redis.Stop()
	testwait.Until(t, "both stores see Redis down", func() bool { return !rs.st[0].Up() && !rs.st[1].Up() })

	first := a.Select(turn("d1", "look it up").tools().c(0).T(), allUp)
	err := a.ShareLocks(context.Background(), first.Model, "http://w-small-1", bs("call_d1"), nil, nil)
	if !errors.Is(err, sharedstate.ErrDown) {
		t.Fatalf("lock write while Redis is down: %v, want ErrDown", err)
	}
	if n := counterOf(rs.set[0], `vllm_router_saar_shared_lock_write_failures_total`); n != 1 {
		t.Fatalf("lock write failures %d", n)
	}

	sel := b.Select(turn("", "prove the theorem").results("call_d1").c(1).T(), allUp)
	expect(t, sel, sel.Model, ActionFirst, PhaseToolLoop, ReasonToolLoopNoOwnerDown)
	if rec := rs.record(1, sel); !rec.Inputs.ToolOwnerUnreachable {
		t.Fatalf("the record does not say the owner was out of reach: %+v", rec.Inputs)
	}
	b.Select(turn("d2", "hello").c(0).T(), allUp) // a session B knows
	sel = b.Select(turn("d2", "prove it").results("call_unknown").c(1).T(), allUp)
	expect(t, sel, sel.Model, ActionHardLock, PhaseToolLoop, ReasonToolLoopFallbackDown)
	sel = b.Select(turn("", "hi").prev("resp_unknown").c(0).T(), allUp)
	expect(t, sel, sel.Model, ActionFirst, PhaseProviderState, ReasonProviderNoOwnerDown)
	if _, _, ok, down := b.LookupResponse([]byte("resp_unknown")); ok || !down {
		t.Fatalf("LookupResponse with Redis down: ok %v, unreachable %v", ok, down)
	}
	if st := b.Stats(); st.LockUnreachable != 3 {
		t.Fatalf("Stats.LockUnreachable = %d, want 3", st.LockUnreachable)
	}
	if n := counterOf(rs.set[1], `vllm_router_saar_lock_unreachable_total{kind="tool_loop"}`); n != 2 {
		t.Fatalf("tool_loop unreachable %d, want 2", n)
	}
	if n := counterOf(rs.set[1], `vllm_router_saar_lock_unreachable_total{kind="provider_state"}`); n != 1 {
		t.Fatalf("provider_state unreachable %d, want 1", n)
	}

	rs.redis.Start()
	testwait.Until(t, "A replays its locks", func() bool { return rs.st[0].Up() })
	testwait.Until(t, "B reconnects", func() bool { return rs.st[1].Up() })
	sel = b.Select(turn("", "prove the theorem").results("call_d1").c(1).T(), allUp)
	expect(t, sel, first.Model, ActionHardLock, PhaseToolLoop, ReasonToolLoop)
}

// Records with the redis_down inputs replay to the same reasons, and the
// flags change nothing when an owner is known.
func TestDecideRedisDownReasons(t *testing.T) {
	mem := &sessionshard.MemoryState{Model: "sim-medium", Worker: "w2", Decision: "tools", Turns: 2, TurnsOnModel: 2, LastAccess: 1, LastEnd: 1}
	expectReasons(t, mem, []reasonCase{
		{Inputs{HasTools: true, ToolResults: 1, ToolOwnerUnreachable: true}, false, ReasonToolLoopNoOwnerDown, ""},
		{Inputs{HasTools: true, ToolResults: 1, ToolOwnerUnreachable: true}, true, ReasonToolLoopFallbackDown, ""},
		{Inputs{HasTools: true, ToolResults: 1, ToolOwnerUnreachable: true, ToolOwner: "sim-small"}, true, ReasonToolLoop, ""},
		{Inputs{HasTools: true, PreviousResponseID: "r", StateOwnerUnreachable: true}, false, ReasonProviderNoOwnerDown, ""},
		{Inputs{HasTools: true, PreviousResponseID: "r", StateOwnerUnreachable: true}, true, ReasonProviderFallbackDown, "w2"},
		{Inputs{HasTools: true, ToolResults: 1}, false, ReasonToolLoopNoOwner, ""},
	})
}

// reasonCase is one turn put to Decide: its inputs, whether the session
// has memory, and the reason and pinned worker it must give.
type reasonCase struct {
	in     Inputs
	mem    bool
	reason string
	worker string
}

// expectReasons decides each case under the default policy version, with
// mem as the session's memory where the case has one.
func expectReasons(t *testing.T, mem *sessionshard.MemoryState, cases []reasonCase) {
	t.Helper()
	cfg := demoConfig(t)
	for _, c := range cases {
		c.in.Logical = "auto"
		var m *sessionshard.MemoryState
		if c.mem {
			m = mem
		}
		if out := Decide(cfg, Policy{Version: PolicyVersion}, &c.in, m, 2); out.Reason != c.reason || out.PinnedWorker != c.worker {
			t.Errorf("%+v mem=%v: reason %s worker %q, want %s %q", c.in, c.mem, out.Reason, out.PinnedWorker, c.reason, c.worker)
		}
	}
}

// BenchmarkSelectShared is BenchmarkSelect with a shared store: each turn
// also checks its invalidation mark and queues its memory record.
//
//	go test -run '^$' -bench SelectShared -benchmem ./saar
func BenchmarkSelectShared(b *testing.B) {
	redis := redistest.Start(b, redistest.Options{})
	st, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: redis.URL(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	benchSelect(b, Options{Shared: st})
}

// Two replicas serve one session while Redis is down, each
// keeping its memory record; on recovery the replica with the older turn
// replays last. The newer record stays (docs/design.md §8.3), so a third
// replica locks the next tool result to the model of the session's last
// turn, not to the one before.
func TestSharedMemoryReplayKeepsNewest(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	replica := func(health time.Duration) (*Router, *sharedstate.Store) {
		st, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: redis.URL(), Logger: quiet,
			ReadTimeout: 2 * time.Second, LockTimeout: 2 * time.Second, PingTimeout: 2 * time.Second, HealthInterval: health})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		r := NewRouter(demoConfig(t), Options{Now: clk.Now, Shared: st, Metrics: metrics.NewSet()})
		t.Cleanup(r.Close)
		return r, st
	}
	a, sa := replica(3 * time.Second) // reconnects last: replays the older turn last
	b, sb := replica(20 * time.Millisecond)
	redis.Stop()
	testwait.Until(t, "both stores see Redis down", func() bool {
		for _, st := range []*sharedstate.Store{sa, sb} {
			st.PutLock(context.Background(), sharedstate.KindToolCall, []byte("probe"), sharedstate.Lock{Model: "x"}, time.Hour)
		}
		return !sa.Up() && !sb.Up()
	})
	older := a.Select(turn("s197", "hello").c(0).T(), allUp)
	clk.Add(time.Second)
	newer := b.Select(turn("s197", "prove the theorem").c(1).T(), allUp)
	if older.Model == newer.Model {
		t.Fatalf("both turns on %s: the test needs two models", older.Model)
	}
	redis.Start()
	testwait.Until(t, "B replays", sb.Up)
	if sa.Up() {
		t.Fatal("A replayed before B: the order is not tested")
	}
	testwait.Until(t, "A replays", sa.Up)
	clk.Add(time.Second)
	c, _ := replica(20 * time.Millisecond)
	sel := c.Select(turn("s197", "the result").results("call_unknown").c(0).T(), allUp)
	expect(t, sel, newer.Model, ActionHardLock, PhaseToolLoop, ReasonToolLoopFallback)
}
