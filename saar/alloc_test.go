//go:build !race

package saar

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warmroute/warmroute/sharedstate"
)

// selectAllocs bounds the allocations of one Select on the hot path (a
// known session, no replay ring or log): the key of the session's memory
// entry, the scores, the replay id (its number and the id), and the user
// text or the first tool-call id. Decide keeps its work and Select's
// inputs on the stack (see decision).
const selectAllocs = 5

// TestSelectAllocs: a user turn and a tool result of a known session cost
// at most selectAllocs allocations under every policy version, with a
// shared store too (one that costs nothing itself): the memory each turn
// publishes is encoded in a pooled buffer.
func TestSelectAllocs(t *testing.T) {
	for _, opt := range []Options{
		{Policy: Policy{Version: 1}}, {Policy: Policy{Version: 2}}, {Policy: Policy{Version: 3}},
		{Policy: Policy{Version: 3}, Shared: nopStore{}},
	} {
		opt.RingSize = -1
		v := fmt.Sprintf("v%d shared=%v", opt.Policy.Version, opt.Shared != nil)
		r := NewRouter(demoConfig(t), opt)
		t.Cleanup(r.Close)
		session, ids := []byte("alloc"), bs("call_1")
		sel := r.Select(&Turn{Logical: []byte("auto"), Session: session, LatestUserText: []byte("hello"), HistoryChars: 4000}, allUp)
		r.Observe(session, sel.Model, "http://w1", Observed{ToolCallIDs: ids, PromptTokens: 1000, CachedTokens: 900, Logical: []byte("auto")})
		for _, c := range []struct {
			name string
			turn Turn
		}{
			{"user_turn", Turn{Logical: []byte("auto"), Session: session, LatestUserText: []byte("and the next one"), HistoryChars: 4200}},
			{"tool_result", Turn{Logical: []byte("auto"), Session: session, HistoryChars: 4400, HasTools: true, ToolResults: 1, ToolResultIDs: ids}},
		} {
			if n := testing.AllocsPerRun(200, func() { r.Select(&c.turn, allUp) }); n > selectAllocs {
				t.Errorf("%s %s: %.1f allocations per Select, want at most %d", v, c.name, n, selectAllocs)
			}
		}
	}
}

// nopStore is a SharedState that stores nothing and allocates nothing.
type nopStore struct{}

func (nopStore) GetLock(context.Context, sharedstate.Kind, []byte) (sharedstate.Lock, bool, error) {
	return sharedstate.Lock{}, false, nil
}
func (nopStore) PutLocks(context.Context, []sharedstate.LockWrite, time.Duration) error { return nil }
func (nopStore) DeleteLock(context.Context, sharedstate.Kind, []byte) error             { return nil }
func (nopStore) GetMemory(context.Context, []byte, []byte) ([]byte, bool, error) {
	return nil, false, nil
}
func (nopStore) PutMemory([]byte, []byte, []byte, time.Duration) bool        { return true }
func (nopStore) OnInvalidate(func(kind sharedstate.Kind, model, key string)) {}
func (nopStore) OnReconnect(func())                                          {}
