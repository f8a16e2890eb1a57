package resume

import "testing"

// BenchmarkObserve: following one token event of a chat stream, what a
// stream with no fault pays per event for being continuable:
//
//	go test -run '^$' -bench Observe -benchmem ./resume
func BenchmarkObserve(b *testing.B) {
	var a Answer
	a.Reset(Chat, 1<<30)
	ev := []byte(chunk("chatcmpl-1", " token"))
	b.SetBytes(int64(len(ev)))
	for i := 0; i < b.N; i++ {
		a.Observe(ev)
		if i%10000 == 0 {
			a.Reset(Chat, 1<<30)
		}
	}
}
