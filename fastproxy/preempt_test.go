package fastproxy

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/warmroute/warmroute/loadview"
)

// The victim of a preemption: the least urgent stream on the worker, the
// latest started among equals; never one as urgent as the request, never
// one on another worker, never one twice.
func TestPreemptionVictim(t *testing.T) {
	reg := loadview.NewRegistry(loadview.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var w [2]*loadview.Worker
	for i, u := range []string{"http://a:80", "http://b:80"} {
		ws, err := reg.Add(context.Background(), u, []string{"m"})
		if err != nil {
			t.Fatal(err)
		}
		w[i] = ws[0]
	}
	p := newPreemption()
	stream := func(w *loadview.Worker, prio int) *relay {
		r := &relay{w: w, prio: prio}
		p.add(r)
		return r
	}
	older, other, later, five := stream(w[0], 10), stream(w[1], 10), stream(w[0], 10), stream(w[0], 5)
	marked := func() [4]bool {
		return [4]bool{older.preempt.Load(), other.preempt.Load(), later.preempt.Load(), five.preempt.Load()}
	}
	p.take(w[0].ID(), 10) // none less urgent than 10
	if m := marked(); m != [4]bool{} {
		t.Fatalf("a request of priority 10 marked %v", m)
	}
	for i, want := range [][4]bool{
		{false, false, true, false}, // the latest of priority 10
		{true, false, true, false},  // then the older one
		{true, false, true, true},   // then priority 5
		{true, false, true, true},   // none left on the worker
	} {
		p.take(w[0].ID(), 0)
		if m := marked(); m != want {
			t.Fatalf("take %d marked %v, want %v", i+1, m, want)
		}
	}
	if len(p.streams[w[0].ID()]) != 0 || len(p.streams[w[1].ID()]) != 1 {
		t.Fatalf("candidates left: %d on the first worker, %d on the other", len(p.streams[w[0].ID()]), len(p.streams[w[1].ID()]))
	}
}
