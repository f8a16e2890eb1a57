package loadview

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/kvevents"
)

func TestCanonicalKVEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"tcp://host:5557":            "tcp://host:5557",
		"tcp://HOST.Example:5557/":   "tcp://host.example:5557",
		"TCP://10.0.0.5:5557":        "tcp://10.0.0.5:5557",
		"tcp://127.1:5557":           "tcp://127.0.0.1:5557",
		"tcp://2130706433:5557":      "tcp://127.0.0.1:5557",
		"tcp://0177.0.0.1:5557":      "tcp://127.0.0.1:5557",
		"tcp://0x7f000001:5557":      "tcp://127.0.0.1:5557",
		"tcp://[::1]:5557":           "tcp://[::1]:5557",
		"tcp://[0:0:0:0:0:0:0:1]:80": "tcp://[::1]:80",
		" tcp://h:1 ":                "tcp://h:1",
	} {
		got, err := CanonicalKVEndpoint(in)
		if err != nil || got != want {
			t.Errorf("CanonicalKVEndpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{
		"", "host:5557", "tcp://host", "tcp://host:0", "tcp://host:65536", "tcp://host:-1",
		"ipc:///tmp/kv", "inproc://kv", "udp://host:5557",
		"tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557", "tcp://0:5557", "tcp://0x0:5557",
		"tcp://user@host:5557", "tcp://user:pw@host:5557", "tcp://host:5557/path", "tcp://host:5557?q=1", "tcp://host:5557#f",
		"tcp://256.1.1.1:5557", "tcp://1.2.3.4.5:5557", "tcp://ho%20st:5557", "tcp://:5557",
	} {
		if got, err := CanonicalKVEndpoint(bad); err == nil {
			t.Errorf("CanonicalKVEndpoint(%q) = %q, want an error", bad, got)
		}
	}
}

func TestParseKVEndpointMapping(t *testing.T) {
	for _, c := range []struct{ in, key, ep, replay string }{
		{"http://host:8000=tcp://host:5557", "http://host:8000", "tcp://host:5557", ""},
		{"http://host:8000/=tcp://host:5557,tcp://host:5558", "http://host:8000", "tcp://host:5557", "tcp://host:5558"},
		{"HTTP://HOST:80/=tcp://EVENTS.Example:5558/", "http://host", "tcp://events.example:5558", ""},
		{"https://h:443@2=tcp://h2:5557", "https://h@2", "tcp://h2:5557", ""},
		{"http://127.1:8000=tcp://127.1:5557", "http://127.0.0.1:8000", "tcp://127.0.0.1:5557", ""},
		{"http://[::1]:8000=tcp://[::1]:5557", "http://[::1]:8000", "tcp://[::1]:5557", ""},
	} {
		key, eps, err := ParseKVEndpointMapping(c.in)
		if err != nil || key != c.key || eps.Endpoint != c.ep || eps.Replay != c.replay {
			t.Errorf("%s: %q %+v %v; want %q %q %q", c.in, key, eps, err, c.key, c.ep, c.replay)
		}
	}
	for _, bad := range []string{
		"http://host:8000", "http://host:8000=", "=tcp://host:5557",
		"ftp://host=tcp://host:5557", "http://user:pass@host=tcp://host:5557", "http://host/path=tcp://host:5557",
		"http://host=tcp://host", "http://host=ipc:///tmp/publisher", "http://host=tcp://host:0",
		"http://worker:8000=tcp://*:5557", "http://worker:8000=tcp://0.0.0.0:5557",
		"http://host=tcp://host:5557,tcp://host:5557", "http://host=tcp://host:5557,ipc:///r",
	} {
		if k, e, err := ParseKVEndpointMapping(bad); err == nil {
			t.Errorf("%s accepted: %q %+v", bad, k, e)
		}
	}
}

func mapping(t *testing.T, specs ...string) map[string]KVEndpoints {
	t.Helper()
	out := map[string]KVEndpoints{}
	for _, s := range specs {
		k, e, err := ParseKVEndpointMapping(s)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = e
	}
	return out
}

// TestKVEndpointsFollowVLLMsRankOffset: each data-parallel rank's engine
// binds the configured ports plus its rank, derived or mapped; a url@rank
// mapping is that rank's own.
func TestKVEndpointsFollowVLLMsRankOffset(t *testing.T) {
	cfg, err := KVEventsConfig{ReplayPort: 6000, Endpoints: mapping(t,
		"http://m:8000=tcp://ev:7000",
		"http://r:8000=tcp://ev2:7000,tcp://ev2:7100",
		"http://r:8000@3=tcp://other:9000",
	)}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ url, ep, replay string }{
		{"http://h:8000", "tcp://h:5557", "tcp://h:6000"},
		{"http://H:8000@2", "tcp://h:5559", "tcp://h:6002"},
		{"http://[::1]:8000@1", "tcp://[::1]:5558", "tcp://[::1]:6001"},
		{"http://m:8000@1", "tcp://ev:7001", "tcp://ev:6001"},
		{"http://r:8000@1", "tcp://ev2:7001", "tcp://ev2:7101"},
		{"http://r:8000@3", "tcp://other:9000", ""},
	} {
		e, err := cfg.endpointsFor(c.url)
		if err != nil || e.Endpoint != c.ep || e.Replay != c.replay {
			t.Errorf("%s: %+v %v; want %s %s", c.url, e, err, c.ep, c.replay)
		}
	}
	cfg.Port = 65535
	if e, err := cfg.endpointsFor("http://h:1@1"); err == nil {
		t.Errorf("port 65535 + rank 1 gave %+v", e)
	}
}

func TestCheckKVEvents(t *testing.T) {
	ok := []struct {
		c       KVEventsConfig
		workers []string
		dp      int
	}{
		{KVEventsConfig{}, []string{"http://a:8000", "http://b:8000"}, 1},
		{KVEventsConfig{ReplayPort: 5600}, []string{"http://a:8000", "http://a:8000"}, 4},
		{KVEventsConfig{Endpoints: mapping(t, "http://host:8000/=tcp://host:5557", "http://host:8001=tcp://host:5558")},
			[]string{"http://host:8000", "http://host:8001"}, 1},
		{KVEventsConfig{Endpoints: mapping(t, "http://0.0.0.0:8000=tcp://10.0.0.1:5557")}, []string{"http://0.0.0.0:8000"}, 1},
	}
	for i, c := range ok {
		if err := CheckKVEvents(c.c, c.workers, c.dp); err != nil {
			t.Errorf("ok %d: %v", i, err)
		}
	}
	bad := []struct {
		c       KVEventsConfig
		workers []string
		dp      int
		want    string
	}{
		{KVEventsConfig{}, []string{"http://host:8000", "http://host:8001"}, 1, "cannot share the KV endpoint tcp://host:5557"},
		{KVEventsConfig{}, []string{"http://127.0.0.1:8000", "http://127.1:8001"}, 1, "cannot share"},
		{KVEventsConfig{Endpoints: mapping(t, "http://a:8000=tcp://HOST.Example:5557", "http://b:8000=tcp://host.example:5557")},
			[]string{"http://a:8000", "http://b:8000"}, 1, "cannot share the KV endpoint tcp://host.example:5557"},
		{KVEventsConfig{Endpoints: mapping(t, "http://a:8000=tcp://[::1]:5557", "http://b:8000=tcp://[0:0:0:0:0:0:0:1]:5557")},
			[]string{"http://a:8000", "http://b:8000"}, 1, "cannot share"},
		// vLLM's own default ports: rank 1's PUB is rank 0's replay.
		{KVEventsConfig{ReplayPort: 5558}, []string{"http://a:8000"}, 2, "cannot share the KV endpoint tcp://a:5558"},
		// A mapped worker's rank 1 on another's derived endpoint.
		{KVEventsConfig{Endpoints: mapping(t, "http://a:8000=tcp://b:5556")}, []string{"http://a:8000", "http://b:8000"}, 2, "cannot share"},
		{KVEventsConfig{}, []string{"http://0.0.0.0:8000"}, 1, "unspecified"},
		{KVEventsConfig{}, []string{"http://[::]:8000"}, 1, "unspecified"},
		{KVEventsConfig{Port: 65535}, []string{"http://a:8000"}, 2, "over 65535"},
		{KVEventsConfig{Port: 70000}, []string{"http://a:8000"}, 1, "1-65535"},
		{KVEventsConfig{Port: 5557, ReplayPort: 5557}, nil, 1, "both"},
		{KVEventsConfig{ReplayPort: -1}, nil, 1, "replay port"},
		{KVEventsConfig{Endpoints: map[string]KVEndpoints{"http://h": {Endpoint: "tcp://h:1"}, "HTTP://H:80/": {Endpoint: "tcp://h:2"}}}, nil, 1, "two KV endpoint mappings"},
		{KVEventsConfig{Endpoints: map[string]KVEndpoints{"http://h": {Endpoint: "tcp://*:1"}}}, nil, 1, "wildcard"},
	}
	for i, c := range bad {
		err := CheckKVEvents(c.c, c.workers, c.dp)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("bad %d: %v, want an error with %q", i, err, c.want)
		}
	}
}

// kvRecorder keeps what the registry hands its consumers.
type kvRecorder struct {
	mu      sync.Mutex
	batches map[*Worker][]kvevents.Message
	resyncs map[*Worker][]kvevents.Resync
}

func newKVRecorder(r *Registry) *kvRecorder {
	rec := &kvRecorder{batches: map[*Worker][]kvevents.Message{}, resyncs: map[*Worker][]kvevents.Resync{}}
	r.OnKVEvents(func(w *Worker, m kvevents.Message) {
		rec.mu.Lock()
		rec.batches[w] = append(rec.batches[w], m)
		rec.mu.Unlock()
	})
	r.OnKVResync(func(w *Worker, x kvevents.Resync) {
		rec.mu.Lock()
		rec.resyncs[w] = append(rec.resyncs[w], x)
		rec.mu.Unlock()
	})
	return rec
}

func (rec *kvRecorder) batchesOf(w *Worker) []kvevents.Message {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]kvevents.Message(nil), rec.batches[w]...)
}

func (rec *kvRecorder) resyncsOf(w *Worker) []kvevents.Resync {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]kvevents.Resync(nil), rec.resyncs[w]...)
}

func (rec *kvRecorder) String() string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var b strings.Builder
	for w, ms := range rec.batches {
		fmt.Fprintf(&b, "%s: %d batches; ", w.URL(), len(ms))
	}
	for w, xs := range rec.resyncs {
		fmt.Fprintf(&b, "%s: resyncs %+v; ", w.URL(), xs)
	}
	return b.String()
}

// engine stands in for a worker's vLLM engine: the real publisher, on
// loopback.
func engine(t *testing.T, endpoint string) *kvevents.Publisher {
	t.Helper()
	p, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: endpoint, DPRank: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// removed publishes one batch naming block id.
func removed(t *testing.T, p *kvevents.Publisher, id uint64) {
	t.Helper()
	if _, err := p.Publish(kvevents.Batch{Events: []kvevents.Event{kvevents.BlockRemoved{BlockHashes: []kvevents.BlockHash{kvevents.BlockHash(id)}}}, DPRank: -1}); err != nil {
		t.Fatal(err)
	}
}

func blockOf(m kvevents.Message) uint64 {
	return uint64(m.Batch.Events[0].(kvevents.BlockRemoved).BlockHashes[0])
}

func kvRegistry(t *testing.T, kv KVEventsConfig, dp int) *Registry {
	t.Helper()
	kv.MinBackoff, kv.MaxBackoff = 5*time.Millisecond, 50*time.Millisecond
	r := NewRegistry(Config{Logger: quiet(), KVEvents: &kv, DPSize: dp})
	t.Cleanup(r.StopKVEvents)
	return r
}

func addWorker(t *testing.T, r *Registry, url string) []*Worker {
	t.Helper()
	ws, err := r.Add(context.Background(), url, []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	return ws
}

func subscribed(t *testing.T, p *kvevents.Publisher, n int) {
	t.Helper()
	testwait.Until(t, fmt.Sprintf("%d subscribers at %s", n, p.Addr()), func() bool { return p.Subscribers() == n })
}

// subscriberGoroutines counts the goroutines of kvevents subscribers.
func subscriberGoroutines() int { return len(subscriberStacks()) }

// subscriberStacks are the stacks of the goroutines kvevents subscribers
// run, for a failure to show where one is stuck.
func subscriberStacks() []string {
	buf := make([]byte, 4<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	var out []string
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, "kvevents.(*Subscriber)") {
			out = append(out, g)
		}
	}
	return out
}

// subscribersEnded waits until no more kvevents subscriber goroutines run
// than before (a goroutine of an earlier test that ends meanwhile does
// not hold the wait), and shows their stacks if some never end.
func subscribersEnded(t *testing.T, before int) {
	t.Helper()
	testwait.Until(t, "the subscribers' goroutines to end", func() bool { return subscriberGoroutines() <= before },
		func() string { return strings.Join(subscriberStacks(), "\n\n") })
}

func portOf(t *testing.T, endpoint string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// TestKVEventsReachTheirWorker: with KVEvents on, each worker's engine
// batches reach the consumer with that worker, in order, derived endpoint
// (host of the worker, fallback port) or mapped.
func TestKVEventsReachTheirWorker(t *testing.T) {
	a := engine(t, "tcp://127.0.0.1:0")
	b := engine(t, "tcp://127.0.0.1:0")
	r := kvRegistry(t, KVEventsConfig{
		Port:      portOf(t, a.Addr()),
		Endpoints: mapping(t, "http://127.0.0.1:2="+b.Addr()),
	}, 1)
	rec := newKVRecorder(r)
	wa := addWorker(t, r, "http://127.0.0.1:1")[0]
	wb := addWorker(t, r, "http://127.0.0.1:2")[0]
	if e, ok := r.KVEventsEndpoints(wa); !ok || e.Endpoint != a.Addr() {
		t.Fatalf("worker a follows %+v %v, want %s", e, ok, a.Addr())
	}
	subscribed(t, a, 1)
	subscribed(t, b, 1)
	for i := range 3 {
		removed(t, a, uint64(100+i))
		removed(t, b, uint64(200+i))
	}
	testwait.Until(t, "three batches each", func() bool { return len(rec.batchesOf(wa)) == 3 && len(rec.batchesOf(wb)) == 3 }, rec.String)
	for w, base := range map[*Worker]uint64{wa: 100, wb: 200} {
		for i, m := range rec.batchesOf(w) {
			if m.Seq != uint64(i) || blockOf(m) != base+uint64(i) {
				t.Fatalf("%s batch %d: seq %d block %d", w.URL(), i, m.Seq, blockOf(m))
			}
		}
	}
	if got := r.UnusedKVMappings(); len(got) != 0 {
		t.Fatalf("unused mappings %v", got)
	}
}

// TestKVEventsFollowEachDataParallelRank: a worker URL with DPSize 2 is
// two engines, rank r's endpoint the fallback port plus r (vLLM's offset).
func TestKVEventsFollowEachDataParallelRank(t *testing.T) {
	var p0, p1 *kvevents.Publisher
	for try := 0; p1 == nil; try++ {
		p0 = engine(t, "tcp://127.0.0.1:0")
		var err error
		p1, err = kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, p0.Addr())+1), DPRank: -1})
		if err != nil && try == 20 {
			t.Fatalf("no two consecutive free ports: %v", err)
		}
	}
	t.Cleanup(func() { p1.Close() })
	r := kvRegistry(t, KVEventsConfig{Port: portOf(t, p0.Addr())}, 2)
	rec := newKVRecorder(r)
	ws := addWorker(t, r, "http://127.0.0.1:1")
	if len(ws) != 2 {
		t.Fatalf("%d workers", len(ws))
	}
	subscribed(t, p0, 1)
	subscribed(t, p1, 1)
	removed(t, p0, 10)
	removed(t, p1, 11)
	testwait.Until(t, "one batch per rank", func() bool { return len(rec.batchesOf(ws[0])) == 1 && len(rec.batchesOf(ws[1])) == 1 }, rec.String)
	if blockOf(rec.batchesOf(ws[0])[0]) != 10 || blockOf(rec.batchesOf(ws[1])[0]) != 11 {
		t.Fatalf("ranks crossed: %s", rec.String())
	}
}

// TestRemoveClosesTheSubscription: removing a worker closes its
// subscriber (the engine sees its subscriber leave, no subscriber
// goroutine is left), and no batch of it reaches the consumers once its
// OnRemove listeners ran.
func TestRemoveClosesTheSubscription(t *testing.T) {
	p := engine(t, "tcp://127.0.0.1:0")
	r := kvRegistry(t, KVEventsConfig{Port: portOf(t, p.Addr())}, 1)
	rec := newKVRecorder(r)
	before := subscriberGoroutines()
	w := addWorker(t, r, "http://127.0.0.1:1")[0]
	subscribed(t, p, 1)
	if subscriberGoroutines() <= before {
		t.Fatal("no subscriber goroutine after Add")
	}
	var gone, late atomic.Bool
	r.OnRemove(func(x *Worker) { gone.Store(x == w) })
	r.OnKVEvents(func(x *Worker, _ kvevents.Message) { late.Store(late.Load() || (x == w && gone.Load())) })
	removed(t, p, 0)
	testwait.Until(t, "the first batch", func() bool { return len(rec.batchesOf(w)) == 1 }, rec.String)
	stop := make(chan struct{})
	publishing := make(chan struct{})
	go func() { // batches keep coming while the worker leaves
		defer close(publishing)
		for i := uint64(1); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p.Publish(kvevents.Batch{Events: []kvevents.Event{kvevents.BlockRemoved{BlockHashes: []kvevents.BlockHash{kvevents.BlockHash(i)}}}})
		}
	}()
	testwait.Until(t, "batches in flight", func() bool { return len(rec.batchesOf(w)) > 1 }, rec.String)
	r.Remove("http://127.0.0.1:1")
	n := len(rec.batchesOf(w))
	close(stop)
	<-publishing
	if late.Load() {
		t.Fatal("a batch reached the consumers after the worker's OnRemove listeners ran")
	}
	if _, ok := r.KVEventsEndpoints(w); ok {
		t.Fatal("a removed worker is still followed")
	}
	subscribed(t, p, 0)
	subscribersEnded(t, before)
	removed(t, p, 1<<40)
	if m := len(rec.batchesOf(w)); m != n {
		t.Fatalf("%d batches after Remove returned, %d when it did", m, n)
	}
	// Added again, it is followed again.
	w2 := addWorker(t, r, "http://127.0.0.1:1")[0]
	subscribed(t, p, 1)
	removed(t, p, 3)
	testwait.Until(t, "a batch for the worker added again", func() bool { return len(rec.batchesOf(w2)) == 1 }, rec.String)
}

// TestRestartedEngineResyncs: an engine that restarts (same port, its
// sequence from 0 again) is a ResyncRestart for the consumers of its
// worker, before the first batch of the new history.
func TestRestartedEngineResyncs(t *testing.T) {
	p := engine(t, "tcp://127.0.0.1:0")
	addr := p.Addr()
	r := kvRegistry(t, KVEventsConfig{Port: portOf(t, addr)}, 1)
	rec := newKVRecorder(r)
	var order []string
	var mu sync.Mutex
	r.OnKVResync(func(*Worker, kvevents.Resync) { mu.Lock(); order = append(order, "resync"); mu.Unlock() })
	r.OnKVEvents(func(_ *Worker, m kvevents.Message) {
		mu.Lock()
		order = append(order, fmt.Sprint(blockOf(m)))
		mu.Unlock()
	})
	w := addWorker(t, r, "http://127.0.0.1:1")[0]
	subscribed(t, p, 1)
	for i := range 3 {
		removed(t, p, uint64(i))
	}
	testwait.Until(t, "three batches", func() bool { return len(rec.batchesOf(w)) == 3 }, rec.String)
	p.Close()
	p2 := engine(t, addr) // the engine restarted
	subscribed(t, p2, 1)
	removed(t, p2, 7)
	testwait.Until(t, "the restart's resync and batch", func() bool { return len(rec.batchesOf(w)) == 4 }, rec.String)
	xs := rec.resyncsOf(w)
	if len(xs) != 1 || xs[0].Reason != kvevents.ResyncRestart || xs[0].Want != 3 || xs[0].Got != 0 {
		t.Fatalf("resyncs %+v", xs)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order, " "); got != "0 1 2 resync 7" {
		t.Fatalf("order %q", got)
	}
	var buf bytes.Buffer
	r.WriteMetrics(&buf)
	if !strings.Contains(buf.String(), `vllm_router_kv_events_resyncs_total{worker="http://127.0.0.1:1"} 1`) {
		t.Fatalf("metrics:\n%s", buf.String())
	}
}

// TestSilentEndpointCostsNothing: an engine port that accepts and never
// speaks, or refuses, blocks neither Add nor Remove, and leaves no
// goroutine behind.
func TestSilentEndpointCostsNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, never a byte
		}
	}()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := "tcp://" + refused.Addr().String()
	refused.Close()
	before := subscriberGoroutines()
	r := kvRegistry(t, KVEventsConfig{Endpoints: mapping(t,
		"http://127.0.0.1:1=tcp://"+ln.Addr().String(),
		"http://127.0.0.1:2="+refusedAddr,
	)}, 1)
	start := time.Now()
	addWorker(t, r, "http://127.0.0.1:1")
	addWorker(t, r, "http://127.0.0.1:2")
	var held net.Conn
	select {
	case held = <-accepted:
		defer held.Close()
	case <-time.After(testwait.Timeout):
		t.Fatal("the subscriber never dialed the silent engine")
	}
	r.Remove("http://127.0.0.1:1") // mid-handshake
	r.Remove("http://127.0.0.1:2") // between refused dials
	// The handshake timeout is 5 s: returning well before it means Remove
	// cut the handshake rather than waited it out.
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Add and Remove took %v", d)
	}
	subscribersEnded(t, before)
}

// TestKVEventsMetrics: the counters per followed worker with KVEvents on,
// none without.
func TestKVEventsMetrics(t *testing.T) {
	p := engine(t, "tcp://127.0.0.1:0")
	r := kvRegistry(t, KVEventsConfig{Port: portOf(t, p.Addr())}, 1)
	rec := newKVRecorder(r)
	w := addWorker(t, r, "http://127.0.0.1:1")[0]
	subscribed(t, p, 1)
	removed(t, p, 1)
	testwait.Until(t, "a batch", func() bool { return len(rec.batchesOf(w)) == 1 }, rec.String)
	var buf bytes.Buffer
	r.WriteMetrics(&buf)
	for _, line := range []string{
		`vllm_router_kv_events_batches_total{worker="http://127.0.0.1:1"} 1`,
		`vllm_router_kv_events_gaps_total{worker="http://127.0.0.1:1"} 0`,
		`vllm_router_kv_events_replays_total{worker="http://127.0.0.1:1"} 0`,
		`vllm_router_kv_events_resyncs_total{worker="http://127.0.0.1:1"} 0`,
		`vllm_router_kv_events_decode_errors_total{worker="http://127.0.0.1:1"} 0`,
		`vllm_router_kv_events_connects_total{worker="http://127.0.0.1:1"} 1`,
	} {
		if !strings.Contains(buf.String(), line+"\n") {
			t.Errorf("no line %s in\n%s", line, buf.String())
		}
	}
	off := NewRegistry(Config{Logger: quiet()})
	addWorker(t, off, "http://127.0.0.1:1")
	buf.Reset()
	off.WriteMetrics(&buf)
	if strings.Contains(buf.String(), "kv_events") {
		t.Fatalf("KV events off, yet:\n%s", buf.String())
	}
	off.OnKVEvents(func(*Worker, kvevents.Message) {}) // harmless when off
	off.StopKVEvents()
}

// TestSharedEndpointFollowedOnce: a worker whose engine endpoint another
// worker already follows gets no subscription (one engine's stream taken
// for two workers' would mislead both); once the first leaves, a later Add
// of it is followed.
func TestSharedEndpointFollowedOnce(t *testing.T) {
	p := engine(t, "tcp://127.0.0.1:0")
	r := kvRegistry(t, KVEventsConfig{Port: portOf(t, p.Addr())}, 1)
	w1 := addWorker(t, r, "http://127.0.0.1:1")[0]
	w2 := addWorker(t, r, "http://127.0.0.1:2")[0]
	if _, ok := r.KVEventsEndpoints(w1); !ok {
		t.Fatal("the first worker is not followed")
	}
	if e, ok := r.KVEventsEndpoints(w2); ok {
		t.Fatalf("the second worker follows the first's engine %+v", e)
	}
	r.Remove(w1.URL())
	r.Remove(w2.URL())
	w2 = addWorker(t, r, "http://127.0.0.1:2")[0]
	if _, ok := r.KVEventsEndpoints(w2); !ok {
		t.Fatal("the endpoint was not freed")
	}
}

// TestStopKVEvents closes every subscription, and later Adds start none.
func TestStopKVEvents(t *testing.T) {
	p := engine(t, "tcp://127.0.0.1:0")
	before := subscriberGoroutines()
	r := kvRegistry(t, KVEventsConfig{Port: portOf(t, p.Addr()), Endpoints: mapping(t, "http://127.0.0.1:9=tcp://127.0.0.1:1")}, 1)
	addWorker(t, r, "http://127.0.0.1:1")
	subscribed(t, p, 1)
	if got := r.UnusedKVMappings(); len(got) != 1 || got[0] != "http://127.0.0.1:9" {
		t.Fatalf("unused mappings %v", got)
	}
	r.StopKVEvents()
	subscribed(t, p, 0)
	w := addWorker(t, r, "http://127.0.0.2:1")[0]
	if _, ok := r.KVEventsEndpoints(w); ok {
		t.Fatal("an Add after StopKVEvents subscribed")
	}
	subscribersEnded(t, before)
	r.StopKVEvents()
}

// TestDNSWorkersFollowedAtTheirHost: a worker --worker-dns finds is
// followed at its address and the fallback port, and no longer once its
// record is gone.
func TestDNSWorkersFollowedAtTheirHost(t *testing.T) {
	p := engine(t, "tcp://127.0.0.1:0")
	kv := KVEventsConfig{Port: portOf(t, p.Addr()), MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	r, d, dns, _ := dnsFleet(t, Config{KVEvents: &kv}, nil, "127.0.0.1", "127.0.0.2")
	t.Cleanup(r.StopKVEvents)
	rec := newKVRecorder(r)
	dns.set("", "127.0.0.1")
	if err := d.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := r.ByURL("http://127.0.0.1:" + d.port)
	if e, ok := r.KVEventsEndpoints(w); !ok || e.Endpoint != p.Addr() {
		t.Fatalf("the DNS worker follows %+v %v, want %s", e, ok, p.Addr())
	}
	subscribed(t, p, 1)
	removed(t, p, 5)
	testwait.Until(t, "the DNS worker's batch", func() bool { return len(rec.batchesOf(w)) == 1 }, rec.String)
	dns.set("", "127.0.0.2")
	if err := d.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	subscribed(t, p, 0)
}
