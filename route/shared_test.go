package route

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/sharedstate"
)

// fakeRedis is the shared store of the route tests: one map, several
// clients (replicas). A write invalidates the key on every other client
// that read or wrote it before, as Redis tracking does; down makes every call fail like a store in an
// outage (reads ErrDown, writes kept and applied on reconnect).
type fakeRedis struct {
	mu      sync.Mutex
	m       map[string]string
	at      map[string]int64 // when each binding was made or last used, as published
	down    bool
	kept    []func()
	clients []*fakeShared
}

type fakeShared struct {
	r       *fakeRedis
	inval   []func(sharedstate.Kind, string, string)
	reconn  []func()
	lookups int
	tracked map[string]bool // guarded by r.mu
}

var _ SharedBindings = (*fakeShared)(nil)

func newFakeRedis() *fakeRedis { return &fakeRedis{m: map[string]string{}, at: map[string]int64{}} }

func (r *fakeRedis) client() *fakeShared {
	c := &fakeShared{r: r, tracked: map[string]bool{}}
	r.mu.Lock()
	r.clients = append(r.clients, c)
	r.mu.Unlock()
	return c
}

func (r *fakeRedis) setDown(down bool) {
	r.mu.Lock()
	r.down = down
	kept := r.kept
	r.kept = nil
	r.mu.Unlock()
	if down {
		return
	}
	for _, f := range kept {
		f()
	}
	for _, c := range r.clients {
		for _, f := range c.reconn {
			f()
		}
	}
}

func (r *fakeRedis) get(model, key string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[model+"\x00"+key]
	return v, ok
}

// set writes silently (no invalidation): what an outage loses.
func (r *fakeRedis) set(model, key, v string) {
	r.mu.Lock()
	r.m[model+"\x00"+key] = v
	r.mu.Unlock()
}

func (c *fakeShared) LookupBinding(_ context.Context, model, session []byte) (string, bool, error) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	c.lookups++
	if c.r.down {
		return "", false, sharedstate.ErrDown
	}
	k := string(model) + "\x00" + string(session)
	c.tracked[k] = true
	v, ok := c.r.m[k]
	return v, ok, nil
}

func (c *fakeShared) PublishBindingAt(model, session []byte, url string, at int64, _ time.Duration) bool {
	m, k := string(model), string(session)
	write := func() {
		c.r.mu.Lock()
		c.r.m[m+"\x00"+k] = url
		c.r.at[m+"\x00"+k] = at
		var told []*fakeShared
		for _, o := range c.r.clients {
			if o != c && o.tracked[m+"\x00"+k] {
				told = append(told, o)
			}
		}
		c.tracked[m+"\x00"+k] = true
		c.r.mu.Unlock()
		for _, o := range told {
			for _, f := range o.inval {
				f(sharedstate.KindBinding, m, k)
			}
		}
	}
	c.r.mu.Lock()
	if c.r.down {
		c.r.kept = append(c.r.kept, write)
		c.r.mu.Unlock()
		return true
	}
	c.r.mu.Unlock()
	write()
	return true
}

func (c *fakeShared) OnInvalidate(fn func(sharedstate.Kind, string, string)) {
	c.inval = append(c.inval, fn)
}
func (c *fakeShared) OnReconnect(fn func()) { c.reconn = append(c.reconn, fn) }

// replicas builds n fixtures (routers) over the same worker URLs, sharing
// one fakeRedis.
func replicas(t *testing.T, n, workers int) ([]*fixture, *fakeRedis) {
	r := newFakeRedis()
	fs := make([]*fixture, n)
	for i := range fs {
		c := r.client()
		fs[i] = newFixture(t, workers, func(cfg *CacheAwareConfig) { cfg.Shared = c })
	}
	return fs, r
}

// pick returns the fixture's worker with url.
func (f *fixture) byURL(url string) int {
	for i, w := range f.ws {
		if w.URL() == url {
			return i
		}
	}
	f.t.Fatalf("no worker %s", url)
	return -1
}

func TestSharedSessionAcrossReplicas(t *testing.T) {
	fs, r := replicas(t, 2, 4)
	a, b := fs[0], fs[1]
	hist := "system: be brief\nuser: hi"
	ca := a.sel("s1", hist)
	if !ca.Published() {
		t.Fatal("a placement did not say it published")
	}
	if got, ok := r.get("m", "s1"); !ok || got != ca.Worker.URL() {
		t.Fatalf("binding not published: %q %v", got, ok)
	}
	// Another replica, which never saw the session nor its history, keeps it
	// on the same worker, then serves it from its local map.
	w := a.idx(ca.Worker)
	b.expect("s1", hist+"\nassistant: hello\nuser: more", w, SessionIDMatch)
	n := b.ca.shared.(*fakeShared).lookups
	if b.sel("s1", hist+"\nassistant: hello\nuser: more").Published() {
		t.Fatal("a session hit said it published")
	}
	b.expect("s1", hist+"\nassistant: hello\nuser: more\nassistant: ok\nuser: again", w, SessionIDMatch)
	if got := b.ca.shared.(*fakeShared).lookups; got != n {
		t.Fatalf("a local session hit asked the store (%d lookups, want %d)", got, n)
	}
	// a rebinds (the load gate moves the session): b drops its copy on the
	// invalidation and follows.
	a.load(w, 200)
	moved := a.sel("s1", hist)
	if moved.Decision != LoadBalance || moved.Worker == ca.Worker {
		t.Fatalf("gate did not move the session: %s", moved.Decision)
	}
	b.expect("s1", hist, b.byURL(moved.Worker.URL()), SessionIDMatch)
	var m strings.Builder
	b.ca.WriteMetrics(&m)
	for _, s := range []string{`vllm_router_shared_lookups_total{result="hit"} 2`, `vllm_router_shared_invalidations_total 1`} {
		if !strings.Contains(m.String(), s) {
			t.Fatalf("metrics lack %s:\n%s", s, m.String())
		}
	}
	// A replica that just started routes its very first request by the
	// store too.
	fresh := NewCacheAware(a.reg, CacheAwareConfig{Threshold: 0.3, Shared: r.client()}, a.ca.rnd)
	if c := fresh.Select(&Request{Model: "m", Workers: a.reg.Workers(), Session: []byte("s1")}); c.Worker != moved.Worker || c.Decision != SessionIDMatch {
		t.Fatalf("first request of a new replica: %s", c.Decision)
	}
}

// Sweep republishes the sessions used since the previous sweep, so the
// store's TTL follows the last turn as the local one does.
func TestSharedRefreshOnSweep(t *testing.T) {
	fs, r := replicas(t, 1, 2)
	f := fs[0]
	f.sel("idle", "user: a")
	f.sel("busy", "user: b")
	f.ca.Sweep() // the first sweep only starts the clock
	pub := f.ca.sharedStats.published.Load()
	f.now.Add(int64(time.Minute))
	f.sel("busy", "user: b") // a local hit: publishes nothing
	if f.ca.sharedStats.published.Load() != pub {
		t.Fatal("a session hit published")
	}
	used := f.now.Load()
	f.now.Add(int64(time.Minute))
	f.ca.Sweep()
	if got := f.ca.sharedStats.published.Load() - pub; got != 1 {
		t.Fatalf("sweep republished %d sessions, want the one used since the last sweep", got)
	}
	// Stamped with the session's last use, not the sweep: the store keeps
	// the binding that expires last, and a refresh must not beat a
	// rebinding another replica made after that use.
	r.mu.Lock()
	at := r.at["m\x00busy"]
	r.mu.Unlock()
	if at != used {
		t.Fatalf("refresh published at %d, want the last use %d", at, used)
	}
}

// A binding to a worker this replica does not know, or knows unhealthy,
// does not route: the session is placed here and the binding replaced.
func TestSharedBindingStaleWorker(t *testing.T) {
	fs, r := replicas(t, 1, 3)
	f := fs[0]
	r.set("m", "s2", "http://127.0.0.99:1")
	c := f.sel("s2", "user: x")
	if c.Decision == SessionIDMatch {
		t.Fatal("followed a binding to an unknown worker")
	}
	if got, _ := r.get("m", "s2"); got != c.Worker.URL() {
		t.Fatalf("binding not replaced: %s", got)
	}
	r.set("m", "s3", f.ws[1].URL())
	f.reg.SetHealthy(f.ws[1], false)
	if c := f.sel("s3", "user: y"); c.Worker == f.ws[1] || c.Decision == SessionIDMatch {
		t.Fatalf("followed a binding to an unhealthy worker: %s", c.Decision)
	}
}

// Redis down: every request is routed on local state, no error; the
// bindings made meanwhile reach the store on recovery, and each replica
// drops its local copies then, so all agree again.
func TestSharedDownAndResync(t *testing.T) {
	fs, r := replicas(t, 2, 4)
	a, b := fs[0], fs[1]
	r.setDown(true)
	ca := a.sel("s1", "user: a")
	cb := b.sel("s1", "user: a")
	for _, c := range []Choice{ca, cb} {
		if c.Worker == nil || c.Decision == SessionIDMatch {
			t.Fatalf("down: %v %s", c.Worker, c.Decision)
		}
	}
	a.expect("s1", "user: a", a.idx(ca.Worker), SessionIDMatch) // local state serves
	var m strings.Builder
	a.ca.WriteMetrics(&m)
	if !strings.Contains(m.String(), `vllm_router_shared_lookups_total{result="down"} 1`) {
		t.Fatal(m.String())
	}
	r.setDown(false) // replays a's then b's binding: b's wins
	want, _ := r.get("m", "s1")
	a.expect("s1", "user: a", a.byURL(want), SessionIDMatch)
	b.expect("s1", "user: a", b.byURL(want), SessionIDMatch)
	// A rebinding whose invalidation was lost in an outage is picked up
	// after the reconnect.
	other := fs[0].ws[(a.byURL(want)+1)%4].URL()
	r.set("m", "s1", other)
	a.expect("s1", "user: a", a.byURL(want), SessionIDMatch) // not told
	r.setDown(true)
	r.setDown(false)
	a.expect("s1", "user: a", a.byURL(other), SessionIDMatch)
}

// chatKey is reqview's history key of a chat body of messages.
func chatKey(t testing.TB, msgs ...string) []byte {
	var v reqview.View
	body := `{"model":"m","tools":[{"type":"function","function":{"name":"lookup","parameters":{}}}],"messages":[` + strings.Join(msgs, ",") + `]}`
	if err := reqview.Parse(&v, []byte(body), reqview.Chat); err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), v.History...)
}

func TestParentLen(t *testing.T) {
	sys := `{"role":"system","content":"` + strings.Repeat("rules ", 2000) + `"}`
	u1 := `{"role":"user","content":"book a flight"}`
	a1 := `{"role":"assistant","content":"checking","tool_calls":[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"q\":1}"}}]}`
	tr := `{"role":"tool","tool_call_id":"call_1","content":"found 3"}`
	a2 := `{"role":"assistant","content":"which one?"}`
	u2 := `{"role":"user","content":"the first"}`
	t1 := chatKey(t, sys, u1)
	t2 := chatKey(t, sys, u1, a1, tr)
	t3 := chatKey(t, sys, u1, a1, tr, a2, u2)
	if !isHistory(t1) || isHistory([]byte("a /v1/completions prompt")) {
		t.Fatal("isHistory")
	}
	if parentLen(t1) != 0 {
		t.Fatal("a first turn has a parent")
	}
	if p := parentLen(t2); string(t2[:p]) != string(t1) {
		t.Fatalf("turn 2's parent is not turn 1's key (%d of %d)", p, len(t1))
	}
	if p := parentLen(t3); string(t3[:p]) != string(t2) {
		t.Fatal("turn 3's parent is not turn 2's key")
	}
	if fingerprint(t1) == fingerprint(t2) || fingerprint(t3[:parentLen(t3)]) != fingerprint(t2) {
		t.Fatal("fingerprints")
	}
	// Same length, same head and tail windows, a different middle: the
	// documented blind spot, which only shares a worker.
	long := []byte(strings.Repeat("a", 3*fpWindow))
	other := append([]byte(nil), long...)
	other[len(other)/2] = 'b'
	if fingerprint(long) != fingerprint(other) {
		t.Fatal("fingerprint reads more than its windows")
	}
}

// A session-less conversation whose turns alternate between replicas stays
// on one worker: each turn finds where its previous turn ran.
func TestSharedConversationAcrossReplicas(t *testing.T) {
	fs, r := replicas(t, 3, 4)
	sys := `{"role":"system","content":"` + strings.Repeat("You are an airline agent. ", 100) + `"}`
	// Other conversations sharing the system prompt warm every worker.
	for i := 0; i < 8; i++ {
		fs[0].ca.Select(&Request{Model: "m", Workers: fs[0].reg.Workers(), Prefix: chatKey(t, sys, fmt.Sprintf(`{"role":"user","content":"other %d"}`, i))})
	}
	msgs := []string{sys, `{"role":"user","content":"turn 0"}`}
	var worker string
	for turn := 0; turn < 9; turn++ {
		f := fs[turn%3]
		c := f.ca.Select(&Request{Model: "m", Workers: f.reg.Workers(), Prefix: chatKey(t, msgs...)})
		if turn == 0 {
			worker = c.Worker.URL()
		} else if c.Worker.URL() != worker {
			t.Fatalf("turn %d on replica %d: %s (%s), want %s", turn, turn%3, c.Worker.URL(), c.Decision, worker)
		}
		if turn >= 1 && c.Decision != ConversationMatch { // no replica served the previous turn itself
			t.Fatalf("turn %d: %s, want %s", turn, c.Decision, ConversationMatch)
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":"answer %d"}`, turn), fmt.Sprintf(`{"role":"user","content":"turn %d"}`, turn+1))
	}
	if len(r.m) != 8+9 {
		t.Fatalf("%d bindings published, want one per request", len(r.m))
	}
	hits := 0
	for _, f := range fs {
		hits += int(f.ca.sharedStats.hit.Load())
	}
	if hits != 8 { // no replica served the previous turn itself
		t.Fatalf("%d turns found their previous turn's worker in the store, want 8", hits)
	}
	// The replica that served turn 8 decides turn 9 by its own tree, as one
	// replica does, without asking the store.
	if c := fs[2].ca.Select(&Request{Model: "m", Workers: fs[2].reg.Workers(), Prefix: chatKey(t, msgs...)}); c.Decision != CacheAffinity || fs[2].ca.sharedStats.hit.Load()+fs[2].ca.sharedStats.miss.Load() != 3 {
		t.Fatalf("same replica: %s, %d lookups", c.Decision, fs[2].ca.sharedStats.hit.Load()+fs[2].ca.sharedStats.miss.Load())
	}
	// A replica that just started places the next turn there too.
	fresh := NewCacheAware(fs[0].reg, CacheAwareConfig{Threshold: 0.3, Shared: r.client()}, fs[0].ca.rnd)
	if c := fresh.Select(&Request{Model: "m", Workers: fs[0].reg.Workers(), Prefix: chatKey(t, msgs...)}); c.Worker.URL() != worker {
		t.Fatalf("first request of a new replica: %s (%s)", c.Worker.URL(), c.Decision)
	}
}

// With Redis down a session-less turn on a replica that never saw the
// conversation is placed locally, without error.
func TestSharedConversationDown(t *testing.T) {
	fs, r := replicas(t, 2, 2)
	u := `{"role":"user","content":"q"}`
	fs[0].ca.Select(&Request{Model: "m", Workers: fs[0].reg.Workers(), Prefix: chatKey(t, u)})
	r.setDown(true)
	c := fs[1].ca.Select(&Request{Model: "m", Workers: fs[1].reg.Workers(), Prefix: chatKey(t, u, `{"role":"assistant","content":"a"}`, u)})
	if c.Worker == nil || fs[1].ca.sharedStats.down.Load() != 1 {
		t.Fatal(c.Decision, fs[1].ca.sharedStats.down.Load())
	}
}

// The gates and min-load read FleetLoad: requests of other replicas,
// reported by the worker, count.
func TestRoutesOnFleetLoad(t *testing.T) {
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/metrics" {
			io.WriteString(w, "vllm:num_requests_running 90\nvllm:num_requests_waiting 10\n") //nolint:errcheck
		}
	}))
	defer busy.Close()
	idle := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/metrics" {
			io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n") //nolint:errcheck
		}
	}))
	defer idle.Close()
	reg := loadview.NewRegistry(loadview.Config{LoadScrapeInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var ws []*loadview.Worker
	for _, u := range []string{busy.URL, idle.URL} {
		w, err := reg.Add(context.Background(), u, []string{"m"})
		if err != nil {
			t.Fatal(err)
		}
		reg.SetHealthy(w[0], true)
		ws = append(ws, w[0])
	}
	reg.ScrapeLoadOnce(context.Background())
	if ws[0].FleetLoad() != 100 || ws[0].Load() != 0 {
		t.Fatalf("fleet load %d", ws[0].FleetLoad())
	}
	seq := uint64(0)
	rnd := func() uint64 { seq++; return seq * 0x9e3779b97f4a7c15 }
	for i := 0; i < 8; i++ {
		if w := MinLoad(ws, rnd); w != ws[1] {
			t.Fatal("min-load chose the worker other replicas load")
		}
	}
	if !loadview.Imbalanced(ws, ws[0], 64, 1.5) || loadview.Imbalanced(ws, ws[1], 64, 1.5) {
		t.Fatal("gate blind to fleet load")
	}
	ca := NewCacheAware(reg, CacheAwareConfig{Threshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5}, rnd)
	ca.Select(&Request{Model: "m", Workers: ws, Session: []byte("warm")})
	// A session bound to the busy worker is moved by the gate.
	st, _ := ca.state("m")
	st.sessions.Set([]byte("s"), ws[0].ID())
	if c := ca.Select(&Request{Model: "m", Workers: ws, Session: []byte("s"), Prefix: []byte("user: x")}); c.Worker != ws[1] || c.Decision != LoadBalance {
		t.Fatalf("%s %s", c.Worker.URL(), c.Decision)
	}
	// A new conversation goes to the idle worker by the estimate.
	for i := 0; i < 8; i++ { // keys that share nothing: only the load decides
		if c := ca.Select(&Request{Model: "m", Workers: ws, Prefix: []byte(fmt.Sprintf("%c new conversation", 'a'+i))}); c.Worker != ws[1] {
			t.Fatalf("estimate placed a new conversation on the busy worker (%s)", c.Decision)
		}
	}
}

// BenchmarkConversationKey: what a session-less turn adds with a shared
// store before any lookup: the previous turn's boundary and two
// fingerprints (its own key, published; the previous turn's, looked up),
// on a 64 KB history.
func BenchmarkConversationKey(b *testing.B) {
	msgs := []string{`{"role":"system","content":"` + strings.Repeat("policy ", 8<<10) + `"}`, `{"role":"user","content":"hi"}`,
		`{"role":"assistant","content":"hello"}`, `{"role":"user","content":"` + strings.Repeat("more ", 200) + `"}`}
	k := chatKey(b, msgs...)
	b.SetBytes(int64(len(k)))
	b.ReportAllocs()
	var sink convKey
	for b.Loop() {
		p := parentLen(k)
		sink = fingerprint(k[:p])
		sink = fingerprint(k)
	}
	_ = sink
}
