package loadview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/simworker"
)

// simFleet starts n simulated workers serving "base" (max_model_len 4096)
// and registers them, discovered, in a new registry.
func simFleet(t *testing.T, n int, cfg Config) (*Registry, []*simworker.Worker, []*Worker, []string) {
	t.Helper()
	cfg.Logger = quiet()
	r := NewRegistry(cfg)
	var sims []*simworker.Worker
	var ws []*Worker
	var urls []string
	for range n {
		sw, url, err := simworker.Start(simworker.Config{Models: []string{"base"}, MaxModelLen: 4096, TimeScale: 0})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sw.Close() })
		added, err := r.Add(context.Background(), url, nil)
		if err != nil {
			t.Fatal(err)
		}
		sims, urls = append(sims, sw), append(urls, url)
		ws = append(ws, added...)
	}
	return r, sims, ws, urls
}

// adapterCall POSTs a LoRA adapter call to a worker over loopback.
func adapterCall(t *testing.T, url, op, name string) {
	t.Helper()
	body := `{"lora_name":"` + name + `","lora_path":"/adapters/` + name + `"}`
	resp, err := http.Post(url+"/v1/"+op+"_lora_adapter", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: %d %s", op, name, resp.StatusCode, b)
	}
}

// forModel returns ForModel's answer as text.
func forModel(r *Registry, model string) string {
	ws, ok := r.ForModel([]byte(model))
	return fmt.Sprint(ws, ok)
}

// waitChange returns the next model change, failing after a generous bound.
func waitChange(t *testing.T, ch <-chan ModelChange) ModelChange {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(20 * time.Second):
		t.Fatal("no model change")
		return ModelChange{}
	}
}

func TestHealthChecksFollowAdaptersAtRunTime(t *testing.T) {
	r, _, ws, urls := simFleet(t, 2, Config{HealthInterval: 20 * time.Millisecond, UnhealthyProbeInterval: 20 * time.Millisecond})
	changes := make(chan ModelChange, 16)
	r.OnModelsChange(func(c ModelChange) { changes <- c })
	if got, want := forModel(r, "base"), fmt.Sprint(ws, true); got != want || ws[0].MaxModelLen("base") != 4096 || r.MinModelLen() != 4096 {
		t.Fatalf("base: %s, max_model_len %d, fleet's smallest %d", got, ws[0].MaxModelLen("base"), r.MinModelLen())
	}
	if got := forModel(r, "ad"); got != "[] false" {
		t.Fatalf("ad before loading: %s", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.RunHealthChecks(ctx)

	adapterCall(t, urls[0], "load", "ad")
	c := waitChange(t, changes)
	if c.Worker != ws[0] || fmt.Sprint(c.Added, c.Removed) != "[ad] []" {
		t.Fatalf("change %+v", c)
	}
	if got, want := forModel(r, "ad"), fmt.Sprint([]*Worker{ws[0]}, true); got != want {
		t.Fatalf("ad loaded on worker 0: ForModel %s, want %s", got, want)
	}
	info, ok := ws[0].ModelInfo("ad")
	if !ok || info.Parent != "base" || info.Root != "/adapters/ad" || info.MaxModelLen != 0 || ws[0].MaxModelLen("ad") != 4096 {
		t.Fatalf("ad info %+v ok %v, MaxModelLen %d", info, ok, ws[0].MaxModelLen("ad"))
	}
	if !ws[0].Serves("ad") || ws[1].Serves("ad") || fmt.Sprint(r.Models()) != "[ad base]" {
		t.Fatalf("serves %v %v, models %v", ws[0].Serves("ad"), ws[1].Serves("ad"), r.Models())
	}

	adapterCall(t, urls[0], "unload", "ad")
	c = waitChange(t, changes)
	if c.Worker != ws[0] || fmt.Sprint(c.Added, c.Removed) != "[] [ad]" {
		t.Fatalf("change %+v", c)
	}
	if got := forModel(r, "ad"); got != "[] false" || ws[0].Serves("ad") {
		t.Fatalf("ad unloaded: ForModel %s", got)
	}
	if got, want := forModel(r, "base"), fmt.Sprint(ws, true); got != want {
		t.Fatalf("base after unload: %s", got)
	}
	for _, w := range ws {
		if !w.Healthy() {
			t.Fatalf("%s unhealthy", w.URL())
		}
	}
}

func TestRediscoverAfterAdapterCall(t *testing.T) {
	// No health-check loop: Rediscover alone makes the change visible, to
	// every data-parallel rank of the URL.
	r, sims, ws, urls := simFleet(t, 1, Config{DPSize: 2})
	var mu sync.Mutex
	var seen []string
	r.OnModelsChange(func(c ModelChange) {
		mu.Lock()
		seen = append(seen, fmt.Sprint(c.Worker.URL()+" ", c.Added, c.Removed))
		mu.Unlock()
	})
	ctx := context.Background()
	adapterCall(t, urls[0], "load", "ad")
	if err := r.Rediscover(ctx, ws[0]); err != nil {
		t.Fatal(err)
	}
	if got, want := forModel(r, "ad"), fmt.Sprint(ws, true); got != want {
		t.Fatalf("ad: %s, want %s", got, want)
	}
	if err := r.Rediscover(ctx, ws[1]); err != nil { // nothing changed: no call
		t.Fatal(err)
	}
	if !sims[0].UnloadAdapter("ad") {
		t.Fatal("unload")
	}
	if err := r.Rediscover(ctx, ws[1]); err != nil {
		t.Fatal(err)
	}
	if got := forModel(r, "ad"); got != "[] false" {
		t.Fatalf("ad after unload: %s", got)
	}
	mu.Lock()
	defer mu.Unlock()
	want := fmt.Sprint([]string{urls[0] + "@0 [ad] []", urls[0] + "@1 [ad] []", urls[0] + "@0 [] [ad]", urls[0] + "@1 [] [ad]"})
	if fmt.Sprint(seen) != want {
		t.Fatalf("changes %v, want %v", seen, want)
	}
}

func TestRediscoveryIgnoresBadAnswers(t *testing.T) {
	var mu sync.Mutex
	status, body := 200, `{"object":"list","data":[{"id":"a","max_model_len":8192,"root":"/m/a"},{"id":"b","max_model_len":4096}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/models" {
			return // /health: 200
		}
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
		io.WriteString(w, body) //nolint:errcheck
	}))
	defer srv.Close()
	set := func(s int, b string) { mu.Lock(); status, body = s, b; mu.Unlock() }
	r := NewRegistry(Config{Logger: quiet()})
	changes := 0
	r.OnModelsChange(func(ModelChange) { changes++ })
	ws, err := r.Add(context.Background(), srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := ws[0]
	check := func(what string) {
		t.Helper()
		if fmt.Sprint(w.Models()) != "[a b]" || w.MaxModelLen("a") != 8192 || w.MaxModelLen("b") != 4096 ||
			!w.Healthy() || changes != 0 || forModel(r, "b") != fmt.Sprint(ws, true) {
			t.Fatalf("%s: models %v, max %d/%d, healthy %v, changes %d", what, w.Models(), w.MaxModelLen("a"), w.MaxModelLen("b"), w.Healthy(), changes)
		}
	}
	check("discovered")
	for _, bad := range []struct {
		status int
		body   string
	}{
		{500, `{"data":[{"id":"a"}]}`},
		{200, `{"data":[{"id":"a"}`},
		{200, `{"data":[]}`},
		{200, `{"object":"list"}`},
		{200, `{"data":[{"id":""}]}`},
		{200, `{"data":[{"id":"a","max_model_len":-1}]}`},
		{200, `{"data":[{"id":"a","max_model_len":"big"}]}`},
		{200, `{"data":{"id":"a"}}`},
		{200, `{"data":[{"id":"a"}` + strings.Repeat(`,{"id":"x"}`, maxModels) + `]}`},
	} {
		set(bad.status, bad.body)
		if err := r.Rediscover(context.Background(), w); err == nil {
			t.Errorf("%d %.60s: no error", bad.status, bad.body)
		}
		r.CheckOnce(context.Background())
		check(fmt.Sprintf("%d %.60s", bad.status, bad.body))
	}
	// A good answer applies; null max_model_len is unknown.
	set(200, `{"data":[{"id":"a","max_model_len":null}]}`)
	r.CheckOnce(context.Background())
	if fmt.Sprint(w.Models()) != "[a]" || w.MaxModelLen("a") != 0 || changes != 1 || forModel(r, "b") != "[] false" {
		t.Fatalf("good answer: models %v max %d changes %d", w.Models(), w.MaxModelLen("a"), changes)
	}
}

func TestFixedModelsAreNotRediscovered(t *testing.T) {
	sw, url, err := simworker.Start(simworker.Config{Models: []string{"base"}, TimeScale: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	r := NewRegistry(Config{Logger: quiet()})
	ws, err := r.Add(context.Background(), url, []string{"given"})
	if err != nil {
		t.Fatal(err)
	}
	r.CheckOnce(context.Background())
	if err := r.Rediscover(context.Background(), ws[0]); err != nil || fmt.Sprint(ws[0].Models()) != "[given]" || ws[0].MaxModelLen("given") != 0 {
		t.Fatalf("err %v models %v", err, ws[0].Models())
	}
}

func TestRediscoverWaitsForTheOneInFlight(t *testing.T) {
	hits := make(chan struct{}, 8)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/v1/models" {
			return
		}
		hits <- struct{}{}
		<-release
		io.WriteString(w, `{"data":[{"id":"m"}]}`) //nolint:errcheck
	}))
	defer srv.Close()
	defer close(release)
	r := NewRegistry(Config{Logger: quiet()})
	ws, err := r.Add(context.Background(), srv.URL, []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	ws[0].fixed = false // before any concurrent use: let it be rediscovered
	first := make(chan error, 1)
	go func() { first <- r.Rediscover(context.Background(), ws[0]) }()
	<-hits // the first discovery is in flight, held by the server
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Rediscover(ctx, ws[0]); !errors.Is(err, context.Canceled) {
		t.Fatalf("second Rediscover while one is in flight: %v, want context.Canceled", err)
	}
	r.ProbeSoon(ws[0]) // a health probe skips discovery while one is in flight
	r.probes.Wait()
	if n := len(hits); n != 0 {
		t.Fatalf("%d more /v1/models requests while one was in flight", n)
	}
	release <- struct{}{}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// RediscoverAll asks every base URL at once and applies each answer to
// every rank of it, as Rediscover does one URL.
func TestRediscoverAllAsksEveryWorker(t *testing.T) {
	r, sims, ws, _ := simFleet(t, 2, Config{DPSize: 2})
	for i, s := range sims {
		if err := s.LoadAdapter(fmt.Sprint("ad", i), "/adapters/x"); err != nil {
			t.Fatal(err)
		}
	}
	if got := forModel(r, "ad0"); got != "[] false" {
		t.Fatalf("ad0 before the round: %s", got)
	}
	r.RediscoverAll(context.Background())
	if got, want := forModel(r, "ad0"), fmt.Sprint(ws[:2], true); got != want {
		t.Fatalf("ad0: %s, want %s", got, want)
	}
	if got, want := forModel(r, "ad1"), fmt.Sprint(ws[2:], true); got != want {
		t.Fatalf("ad1: %s, want %s", got, want)
	}
}
