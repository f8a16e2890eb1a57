package loadview

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/internal/testwait"
)

// TestOwnedWorkersBoundsParallelAdds: a round with more new workers than
// maxParallelAdds never has more Adds in flight than that (each Add's model
// discovery is held until the test lets one go), and every worker joins in
// the role given, as its own.
func TestOwnedWorkersBoundsParallelAdds(t *testing.T) {
	const n = 4 * maxParallelAdds
	var inflight, most atomic.Int64
	gate := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/v1/models" {
			cur := inflight.Add(1)
			for m := most.Load(); cur > m && !most.CompareAndSwap(m, cur); m = most.Load() {
			}
			<-gate
			inflight.Add(-1)
			io.WriteString(w, `{"data":[{"id":"m"}]}`) //nolint:errcheck
		}
	})
	want := map[string]Role{}
	for range n {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		want[srv.URL] = Decode
	}
	r := NewRegistry(Config{Logger: slogTo(io.Discard)})
	var refusals []string
	o := newOwnedWorkers(r, func(role Role) Role { return role },
		func(u string, _ Role) { t.Errorf("%s removed", u) },
		func(u string, _ Role, err error) { refusals = append(refusals, fmt.Sprint(u, err)) })
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); o.sync(context.Background(), want) }()
	t.Cleanup(func() { close(gate); wg.Wait() }) // before the servers close: lets a failed test's adds end
	for left := n; left > 0; left-- {
		testwait.Until(t, "adds in flight", func() bool {
			return most.Load() > maxParallelAdds || inflight.Load() == int64(min(left, maxParallelAdds))
		}, func() string { return fmt.Sprint(inflight.Load()) })
		if m := most.Load(); m > maxParallelAdds {
			t.Fatalf("%d adds in flight, want at most %d", m, maxParallelAdds)
		}
		gate <- struct{}{}
	}
	wg.Wait()
	if m := most.Load(); m != maxParallelAdds {
		t.Errorf("at most %d adds in flight, want %d", m, maxParallelAdds)
	}
	if len(o.owned) != n || len(r.Workers()) != n || len(refusals) != 0 {
		t.Fatalf("owned %d, registered %d, refused %v: want all %d", len(o.owned), len(r.Workers()), refusals, n)
	}
	for _, w := range r.Workers() {
		if w.Role() != Decode {
			t.Errorf("%s joined as %s", w.URL(), w.Role())
		}
	}
}
