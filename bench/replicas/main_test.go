package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/bench"
)

// The trace reuses tool-call ids (GPT-4o's); the replay gives every call
// an id of its own, which the tool result after it answers, and tells each
// turn whether it carries a tool result and which call the trace answers.
func TestNewTraceUniqueCallIDs(t *testing.T) {
	raw := []string{
		`{"role":"system","content":"policy"}`,
		`{"role":"user","content":"find it"}`,
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_X","type":"function","function":{"name":"lookup","arguments":"{}"}}]}`,
		`{"role":"tool","tool_call_id":"call_X","content":"found"}`,
		`{"role":"assistant","content":"here"}`,
		`{"role":"user","content":"again"}`,
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_X","type":"function","function":{"name":"book","arguments":"{}"}}]}`,
		`{"role":"tool","tool_call_id":"call_X","content":"booked"}`,
		`{"role":"assistant","content":"done"}`,
	}
	msgs := make([]json.RawMessage, len(raw))
	for i, r := range raw {
		msgs[i] = json.RawMessage(r)
	}
	var s bench.Session
	for _, j := range []int{2, 4, 6, 8} {
		s.Turns = append(s.Turns, bench.Turn{Messages: msgs[:j:j]})
	}
	tr := newTrace(&bench.Workload{Sessions: []bench.Session{s}})
	got := tr.sessions[0]
	want := []traceTurn{
		{n: 2, callName: "lookup", callID: "call_trace0_2_0"},
		{n: 4, toolTurn: true},
		{n: 6, callName: "book", callID: "call_trace0_6_0"},
		{n: 8, toolTurn: true},
	}
	if len(got.turns) != len(want) {
		t.Fatalf("%d turns, want %d", len(got.turns), len(want))
	}
	for k := range want {
		if got.turns[k] != want[k] {
			t.Errorf("turn %d: %+v, want %+v", k, got.turns[k], want[k])
		}
	}
	for j, id := range map[int]string{3: "call_trace0_2_0", 7: "call_trace0_6_0"} {
		if !strings.Contains(string(got.msgs[j]), `"tool_call_id":"`+id+`"`) {
			t.Errorf("message %d answers the wrong call: %s", j, got.msgs[j])
		}
	}
	if string(msgs[2]) != raw[2] {
		t.Error("the workload's messages were modified")
	}
	if !strings.Contains(tr.tools, `"name":"book"`) || !strings.Contains(tr.tools, `"name":"lookup"`) {
		t.Errorf("tool schemas: %s", tr.tools)
	}
}
