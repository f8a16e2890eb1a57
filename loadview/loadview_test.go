package loadview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"unsafe"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestParseWorkerURL(t *testing.T) {
	f := func(in, base string, rank int, ok bool) {
		t.Helper()
		b, r, err := ParseWorkerURL(in)
		if (err == nil) != ok || (ok && (b != base || r != rank)) {
			t.Errorf("ParseWorkerURL(%q) = %q, %d, %v; want %q, %d, ok=%v", in, b, r, err, base, rank, ok)
		}
	}
	f("http://h:8000", "http://h:8000", -1, true)
	f("http://h:8000/", "http://h:8000", -1, true)
	f("http://h:8000@3", "http://h:8000", 3, true)
	f("https://gpu-1.example:443@0", "https://gpu-1.example:443", 0, true)
	f(" http://[::1]:8000 ", "http://[::1]:8000", -1, true)
	f("h:8000", "", 0, false)
	f("ftp://h:1", "", 0, false)
	f("http://", "", 0, false)
	f("http://h:1/v1", "", 0, false)
	f("http://h:1@-1", "", 0, false)
}

func TestCountersOnTheirOwnCacheLine(t *testing.T) {
	var w Worker
	if s := unsafe.Sizeof(w.inflight); s < 2*cacheLine {
		t.Fatalf("padded counters are %d bytes", s)
	}
	// Any cache line that holds a byte of the two adjacent counters holds
	// only them and padding, wherever the struct lands.
	first := unsafe.Offsetof(w.inflight.Int64)
	end := unsafe.Offsetof(w.inflight.awaiting) + 8
	if end-first != 16 {
		t.Fatal("the two counters are not adjacent")
	}
	if first < cacheLine-16 || unsafe.Sizeof(w.inflight)-end < cacheLine-16 {
		t.Fatal("counters share a cache line with other fields")
	}
}

// fleet registers n workers on refused ports (probe fails fast) and forces
// them healthy.
func fleet(t *testing.T, n int, cfg Config) (*Registry, []*Worker) {
	t.Helper()
	cfg.Logger = quiet()
	r := NewRegistry(cfg)
	var ws []*Worker
	for i := 0; i < n; i++ {
		added, err := r.Add(context.Background(), fmt.Sprintf("http://127.0.0.%d:1", i+1), []string{"m"})
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range added {
			r.SetHealthy(w, true)
		}
		ws = append(ws, added...)
	}
	return r, ws
}

func TestImbalancedGates(t *testing.T) {
	_, ws := fleet(t, 3, Config{})
	set := func(loads ...int64) {
		for i, w := range ws {
			w.inflight.Store(loads[i])
		}
	}
	f := func(loads [3]int64, abs int64, rel float64, want bool) {
		t.Helper()
		set(loads[:]...)
		if got := Imbalanced(ws, ws[0], abs, rel); got != want {
			t.Errorf("Imbalanced(loads %v, abs %d, rel %v) = %v, want %v", loads, abs, rel, got, want)
		}
	}
	f([3]int64{10, 0, 0}, 64, 1.5, false)   // under the absolute gate
	f([3]int64{100, 30, 50}, 64, 1.5, true) // 100-30 > 64 and 100 > 45
	f([3]int64{100, 40, 50}, 64, 1.5, false)
	f([3]int64{100, 30, 30}, 64, 4, false) // relative gate holds it
	ws[1].healthy.Store(false)
	ws[2].healthy.Store(false)
	f([3]int64{100, 0, 0}, 64, 1.5, false) // only itself is healthy
	set(0, 0, 0)
}

func TestAcquireReleaseConcurrent(t *testing.T) {
	_, ws := fleet(t, 1, Config{})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				ws[0].Acquire()
				ws[0].Release()
			}
		}()
	}
	wg.Wait()
	if l := ws[0].Load(); l != 0 {
		t.Fatalf("load %d after balanced acquire/release", l)
	}
}

func TestRegistryAddRemoveModels(t *testing.T) {
	var removed []string
	r, _ := fleet(t, 0, Config{})
	r.OnRemove(func(w *Worker) { removed = append(removed, w.URL()) })
	ctx := context.Background()
	a, _ := r.Add(ctx, "http://127.0.0.1:1", []string{"small"})
	b, _ := r.Add(ctx, "http://127.0.0.2:1", []string{"small", "large"})
	c, _ := r.Add(ctx, "http://127.0.0.3:1@1", nil) // undiscovered: serves anything
	if _, err := r.Add(ctx, "http://127.0.0.1:1", nil); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("duplicate add: %v", err)
	}
	f := func(model string, want ...*Worker) {
		t.Helper()
		got, ok := r.ForModel([]byte(model))
		if !ok && len(want) > 0 || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("ForModel(%q) = %v, want %v", model, got, want)
		}
	}
	f("small", a[0], b[0], c[0])
	f("large", b[0], c[0])
	f("other", c[0])
	if fmt.Sprint(r.Models()) != "[large small]" {
		t.Errorf("models %v", r.Models())
	}
	r.SetHealthy(b[0], true)
	if got := r.Remove("http://127.0.0.2:1"); len(got) != 1 || got[0] != b[0] || b[0].Healthy() {
		t.Fatalf("remove: %v", got)
	}
	f("large", c[0])
	if r.ByID(b[0].ID()) != nil || r.ByURL("http://127.0.0.2:1") != nil {
		t.Fatal("removed worker still found")
	}
	if fmt.Sprint(removed) != "[http://127.0.0.2:1]" {
		t.Fatalf("OnRemove calls %v", removed)
	}
}

func TestDataParallelExpansion(t *testing.T) {
	r, ws := fleet(t, 1, Config{DPSize: 3})
	if len(ws) != 3 || ws[2].URL() != "http://127.0.0.1:1@2" || ws[2].BaseURL() != "http://127.0.0.1:1" || ws[2].RankString() != "2" {
		t.Fatalf("ranks: %v", ws)
	}
	if ws[0].Client() != ws[2].Client() {
		t.Fatal("ranks of one URL must share one upstream client")
	}
	if got := r.Remove("http://127.0.0.1:1@1"); len(got) != 1 || len(r.Workers()) != 2 {
		t.Fatalf("removing one rank: %v, left %d", got, len(r.Workers()))
	}
	if got := r.Remove("http://127.0.0.1:1"); len(got) != 2 || len(r.Workers()) != 0 {
		t.Fatalf("removing the base: %v", got)
	}
}

func TestCircuitBreaker(t *testing.T) {
	r, ws := fleet(t, 1, Config{CBFailureThreshold: 3})
	w := ws[0]
	r.RecordResult(w, false)
	r.RecordResult(w, false)
	r.RecordResult(w, true) // a success resets the streak
	r.RecordResult(w, false)
	r.RecordResult(w, false)
	if !w.Healthy() {
		t.Fatal("opened before 3 consecutive failures")
	}
	r.RecordResult(w, false)
	if w.Healthy() {
		t.Fatal("still healthy after 3 consecutive failures")
	}
}

func TestHealthChecksAndDiscovery(t *testing.T) {
	var mu sync.Mutex
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch req.URL.Path {
		case "/healthz":
			w.WriteHeader(status)
		case "/v1/models":
			if req.Header.Get("Authorization") != "Bearer k" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			io.WriteString(w, `{"object":"list","data":[{"id":"qwen"},{"id":"llama"}]}`) //nolint:errcheck
		}
	}))
	defer srv.Close()
	r := NewRegistry(Config{HealthEndpoint: "/healthz", FailureThreshold: 2, SuccessThreshold: 2, APIKey: "k", Logger: quiet()})
	ws, err := r.Add(context.Background(), srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := ws[0]
	if !w.Healthy() || fmt.Sprint(w.Models()) != "[qwen llama]" {
		t.Fatalf("healthy %v models %v", w.Healthy(), w.Models())
	}
	set := func(s int) { mu.Lock(); status = s; mu.Unlock() }
	set(http.StatusServiceUnavailable)
	r.CheckOnce(context.Background())
	if !w.Healthy() {
		t.Fatal("flipped after 1 failure with threshold 2")
	}
	r.CheckOnce(context.Background())
	if w.Healthy() {
		t.Fatal("still healthy after 2 failures")
	}
	set(http.StatusOK)
	r.CheckOnce(context.Background())
	if w.Healthy() {
		t.Fatal("recovered after 1 success with threshold 2")
	}
	r.CheckOnce(context.Background())
	if !w.Healthy() {
		t.Fatal("not recovered after 2 successes")
	}
}

func TestUnreachableWorkerStartsUnhealthy(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	r := NewRegistry(Config{Logger: quiet()})
	ws, err := r.Add(context.Background(), "http://"+addr, nil)
	if err != nil || ws[0].Healthy() || ws[0].Models() != nil {
		t.Fatalf("unreachable worker: err %v healthy %v models %v", err, ws[0].Healthy(), ws[0].Models())
	}
}
