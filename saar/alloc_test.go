//go:build !race

package saar

import "testing"

// selectAllocs bounds the allocations of one Select on the hot path (a
// known session, no replay ring or log): the key of the session's memory
// entry, the scores, the replay id (its number and the id), and the user
// text or the first tool-call id. Decide keeps its work and Select's
// inputs on the stack (see decision).
const selectAllocs = 5

// TestSelectAllocs: a user turn and a tool result of a known session cost
// at most selectAllocs allocations under every policy version.
func TestSelectAllocs(t *testing.T) {
	for _, v := range replayVersions {
		r := NewRouter(demoConfig(t), Options{RingSize: -1, Policy: Policy{Version: v}})
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
				t.Errorf("v%d %s: %.1f allocations per Select, want at most %d", v, c.name, n, selectAllocs)
			}
		}
	}
}
