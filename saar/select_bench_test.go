package saar

import (
	"strconv"
	"testing"
)

// BenchmarkSelect is the model step's hot path on local state: a user turn
// of a known session, and a tool result whose id the session issued.
//
//	go test -run '^$' -bench Select -benchmem ./saar
func BenchmarkSelect(b *testing.B) {
	benchSelect(b, Options{})
}

func benchSelect(b *testing.B, opt Options) {
	opt.RingSize = -1
	r := NewRouter(demoConfig(b), opt)
	b.Cleanup(r.Close)
	const sessions = 64
	ids, ss := make([][]byte, sessions), make([][]byte, sessions)
	for i := range ss {
		ids[i], ss[i] = []byte("call_"+strconv.Itoa(i)), []byte("bench-"+strconv.Itoa(i))
		sel := r.Select(&Turn{Logical: []byte("auto"), Session: ss[i], LatestUserText: []byte("hello"), HistoryChars: 4000}, allUp)
		r.Observe(ss[i], sel.Model, "http://w1", Observed{ToolCallIDs: ids[i : i+1], PromptTokens: 1000, CachedTokens: 900, Logical: []byte("auto")})
	}
	b.Run("user_turn", func(b *testing.B) {
		b.ReportAllocs()
		t := Turn{Logical: []byte("auto"), LatestUserText: []byte("and the next one"), HistoryChars: 4200}
		for i := 0; b.Loop(); i++ {
			t.Session = ss[i%sessions]
			r.Select(&t, allUp)
		}
	})
	b.Run("tool_result", func(b *testing.B) {
		b.ReportAllocs()
		t := Turn{Logical: []byte("auto"), HistoryChars: 4400, HasTools: true, ToolResults: 1}
		for i := 0; b.Loop(); i++ {
			t.Session, t.ToolResultIDs = ss[i%sessions], ids[i%sessions:i%sessions+1]
			r.Select(&t, allUp)
		}
	})
}
