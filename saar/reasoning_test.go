package saar

import (
	"context"
	"crypto/sha256"
	"testing"

	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/sessionshard"
)

func rid(s string) reqview.ReasoningID {
	sum := sha256.Sum256([]byte(s))
	return reqview.ReasoningID(sum[:16])
}

func (b *tb) reasoning(id reqview.ReasoningID) *tb {
	b.t.OpaqueReasoning, b.t.ReasoningID = true, id
	return b
}

// A turn carrying an opaque artifact goes to the model and worker that
// produced it, without a session id, whatever the session's memory says
// (docs/design.md §5).
func TestReasoningLock(t *testing.T) {
	r, _ := newRouter(t, demoConfig(t), Options{})
	r.Observe(nil, "sim-small", "w-small-2", Observed{ReasoningIDs: []reqview.ReasoningID{rid("enc-1")}})
	for _, sess := range []string{"", "s1"} {
		s := r.Select(turn(sess, "prove the theorem step by step").effort("high").reasoning(rid("enc-1")).T(), allUp)
		expect(t, s, "sim-small", ActionHardLock, PhaseProviderState, ReasonOpaqueReasoning)
		if s.PinnedWorker != "w-small-2" || s.LockModel != "sim-small" {
			t.Fatalf("session %q: %+v", sess, s)
		}
		rec, _ := r.Record(s.ReplayID)
		if rec.Inputs.ReasoningSource != lockSourceIndex || rec.Inputs.ReasoningID == "" {
			t.Fatalf("inputs %+v", rec.Inputs)
		}
		if out := Decide(r.cfg.Load(), r.opt.Policy, &rec.Inputs, rec.Memory, rec.Time); out.Reason != s.Reason || out.Model != s.Model {
			t.Fatalf("replay: %+v", out)
		}
	}
	// Streamed: indexed as soon as the stream shows it.
	r.NoteReasoning("sim-medium", "w-med-1", []reqview.ReasoningID{rid("sig-2")})
	s := r.Select(turn("", "hello").reasoning(rid("sig-2")).T(), allUp)
	expect(t, s, "sim-medium", ActionHardLock, PhaseProviderState, ReasonOpaqueReasoning)
	// An unknown artifact: the session's memory, as before; none: chosen freely.
	r.Select(turn("s3", "hello").c(1).T(), allUp)
	r.Observe([]byte("s3"), "sim-medium", "w-med-1", Observed{})
	s = r.Select(turn("s3", "prove it").effort("high").reasoning(rid("unknown")).T(), allUp)
	expect(t, s, "sim-medium", ActionHardLock, PhaseProviderState, ReasonOpaqueReasoning)
	s = r.Select(turn("", "hello").reasoning(rid("unknown")).T(), allUp)
	expect(t, s, s.Model, ActionFirst, PhaseProviderState, ReasonProviderNoOwner)
	// A known previous_response_id's owner comes first.
	r.Observe(nil, "sim-large", "w-large-1", Observed{ResponseID: []byte("resp_9")})
	s = r.Select(turn("", "hello").prev("resp_9").reasoning(rid("enc-1")).T(), allUp)
	expect(t, s, "sim-large", ActionHardLock, PhaseProviderState, ReasonProviderState)
}

// The artifact's lock, written by replica A, pins the turn on replica B;
// while Redis is down an unknown artifact takes a redis_down reason.
func TestSharedReasoningLock(t *testing.T) {
	rs := startReplicas(t)
	a, b := rs.r[0], rs.r[1]
	ids := []reqview.ReasoningID{rid("enc-a")}
	if err := a.ShareLocks(context.Background(), "sim-small", "http://w-small-2", nil, nil, ids); err != nil {
		t.Fatal(err)
	}
	a.Observe(nil, "sim-small", "http://w-small-2", Observed{ReasoningIDs: ids})
	sel := b.Select(turn("", "prove the theorem step by step").reasoning(ids[0]).c(1).T(), allUp)
	expect(t, sel, "sim-small", ActionHardLock, PhaseProviderState, ReasonOpaqueReasoning)
	if rec := rs.record(1, sel); sel.PinnedWorker != "http://w-small-2" || rec.Inputs.ReasoningSource != lockSourceShared {
		t.Fatalf("pinned %q, source %q", sel.PinnedWorker, rec.Inputs.ReasoningSource)
	}
	if n := counterOf(rs.set[1], `vllm_router_saar_shared_locks_found_total{index="reasoning"}`); n != 1 {
		t.Fatalf("reasoning locks found in Redis: %d", n)
	}

	rs.redis.Stop()
	testwait.Until(t, "B sees Redis down", func() bool { return !rs.st[1].Up() })
	b.Select(turn("r2", "hello").c(0).T(), allUp) // a session B knows
	sel = b.Select(turn("r2", "prove it").reasoning(rid("enc-unknown")).c(1).T(), allUp)
	expect(t, sel, sel.Model, ActionHardLock, PhaseProviderState, ReasonOpaqueReasoningDown)
	sel = b.Select(turn("", "prove it").reasoning(rid("enc-unknown")).c(1).T(), allUp)
	expect(t, sel, sel.Model, ActionFirst, PhaseProviderState, ReasonProviderNoOwnerDown)
	if n := counterOf(rs.set[1], `vllm_router_saar_lock_unreachable_total{kind="provider_state"}`); n != 2 {
		t.Fatalf("provider_state unreachable %d, want 2", n)
	}
	// A known artifact still locks (local index).
	sel = b.Select(turn("", "hello").reasoning(ids[0]).T(), allUp)
	expect(t, sel, "sim-small", ActionHardLock, PhaseProviderState, ReasonOpaqueReasoning)
}

func TestDecideReasoningReasons(t *testing.T) {
	mem := &sessionshard.MemoryState{Model: "sim-medium", Worker: "w2", Decision: "default", Turns: 2, TurnsOnModel: 2, LastAccess: 1, LastEnd: 1}
	expectReasons(t, mem, []reasonCase{
		{Inputs{OpaqueReasoning: true}, true, ReasonOpaqueReasoning, "w2"}, // records before reasoning ids
		{Inputs{OpaqueReasoning: true, ReasoningID: "x", ReasoningModel: "sim-small", ReasoningWorker: "w1"}, true, ReasonOpaqueReasoning, "w1"},
		{Inputs{OpaqueReasoning: true, ReasoningID: "x", ReasoningOwnerUnreachable: true}, true, ReasonOpaqueReasoningDown, "w2"},
		{Inputs{OpaqueReasoning: true, ReasoningID: "x", ReasoningOwnerUnreachable: true}, false, ReasonProviderNoOwnerDown, ""},
		{Inputs{OpaqueReasoning: true, ReasoningID: "x", ReasoningModel: "sim-small", ReasoningWorker: "w1", WorkersDown: []string{"w1"}}, false, ReasonWorkerFailover, ""},
	})
}
