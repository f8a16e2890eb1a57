package saar

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/sharedstate"
)

// mapStore is SharedState over maps, counting what reaches it: routers
// given one mapStore are replicas sharing it, with no Redis.
type mapStore struct {
	mu                             sync.Mutex
	locks                          map[string]sharedstate.Lock // kind byte + id
	memories                       map[string][]byte           // logical + NUL + session
	lockReads, memReads, memWrites int
}

var _ SharedState = (*mapStore)(nil)

func newMapStore() *mapStore {
	return &mapStore{locks: map[string]sharedstate.Lock{}, memories: map[string][]byte{}}
}

func lockKey(kind sharedstate.Kind, id []byte) string { return string(kind) + string(id) }

func memKey(logical, session []byte) string { return string(logical) + "\x00" + string(session) }

func (m *mapStore) GetLock(_ context.Context, kind sharedstate.Kind, id []byte) (sharedstate.Lock, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lockReads++
	l, ok := m.locks[lockKey(kind, id)]
	return l, ok, nil
}

func (m *mapStore) PutLocks(_ context.Context, ws []sharedstate.LockWrite, _ time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range ws {
		m.locks[lockKey(w.Kind, w.ID)] = w.Lock
	}
	return nil
}

func (m *mapStore) DeleteLock(_ context.Context, kind sharedstate.Kind, id []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.locks, lockKey(kind, id))
	return nil
}

func (m *mapStore) GetMemory(_ context.Context, logical, session []byte) ([]byte, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.memReads++
	b, ok := m.memories[memKey(logical, session)]
	return b, ok, nil
}

func (m *mapStore) PutMemory(logical, session, record []byte, _ time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.memWrites++
	m.memories[memKey(logical, session)] = append([]byte(nil), record...)
	return true
}

func (m *mapStore) OnInvalidate(func(kind sharedstate.Kind, model, key string)) {}

func (m *mapStore) OnReconnect(func()) {}

func (m *mapStore) counts() (lockReads, memReads, memWrites int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lockReads, m.memReads, m.memWrites
}

// The shared store is asked only for what this replica does not know: a
// session's memory when the session is new here, a lock owner when neither
// the session nor the index knows the id. Every change of a session's
// memory is written to it, and a lock another replica shared locks the turn.
func TestSharedStoreAskedOnLocalMiss(t *testing.T) {
	st := newMapStore()
	a, _ := newRouter(t, demoConfig(t), Options{Shared: st})
	want := func(what string, lockReads, memReads, memWrites int) {
		t.Helper()
		if l, r, w := st.counts(); l != lockReads || r != memReads || w != memWrites {
			t.Fatalf("%s: lock reads %d, memory reads %d, memory writes %d; want %d, %d, %d", what, l, r, w, lockReads, memReads, memWrites)
		}
	}
	first := a.Select(turn("s1", "look it up").tools().c(0).T(), allUp)
	want("a new session", 0, 1, 1)
	a.Observe([]byte("s1"), first.Model, "w1", Observed{ToolCallIDs: bs("call_1")})
	want("its answer", 0, 1, 2)
	a.Select(turn("s1", "x").results("call_1").T(), allUp)
	want("a known session and id", 0, 1, 3)
	a.Select(turn("", "x").results("call_1").T(), allUp)
	want("an id the index knows", 0, 1, 3)
	sel := a.Select(turn("", "x").results("call_elsewhere").T(), allUp)
	want("an id unknown here", 1, 1, 3)
	expect(t, sel, sel.Model, ActionFirst, PhaseToolLoop, ReasonToolLoopNoOwner)

	if err := a.ShareLocks(context.Background(), "sim-large", "w9", bs("call_large"), nil, nil); err != nil {
		t.Fatal(err)
	}
	b, _ := newRouter(t, demoConfig(t), Options{Shared: st})
	sel = b.Select(turn("", "hello").results("call_large").T(), allUp)
	expect(t, sel, "sim-large", ActionHardLock, PhaseToolLoop, ReasonToolLoop)
	sel = b.Select(turn("s1", "hello").results("call_1").T(), allUp)
	expect(t, sel, first.Model, ActionHardLock, PhaseToolLoop, ReasonToolLoopFallback) // s1's memory came from the store
}

// A nil *sharedstate.Store in Options.Shared (a caller passing its store
// when there is no Redis) is local state only, not a non-nil interface
// over no store.
func TestNilSharedStoreIsLocalState(t *testing.T) {
	var store *sharedstate.Store
	r, _ := newRouter(t, demoConfig(t), Options{Shared: store})
	if r.SharesLocks() {
		t.Fatal("a nil store shares locks")
	}
	sel := r.Select(turn("s", "hello").tools().T(), allUp)
	r.Observe([]byte("s"), sel.Model, "w1", Observed{ToolCallIDs: bs("call_1"), ResponseID: []byte("resp_1")})
	if err := r.ShareLocks(context.Background(), sel.Model, "w1", bs("call_1"), []byte("resp_1"), nil); err != nil {
		t.Fatal(err)
	}
	r.ForgetResponse([]byte("resp_1"))
	sel = r.Select(turn("", "x").results("call_unknown").T(), allUp)
	expect(t, sel, sel.Model, ActionFirst, PhaseToolLoop, ReasonToolLoopNoOwner)
}
