// Command replicas is make bench-replicas (docs/design.md §8.3): several
// router replicas (fastproxy + route + the model step, in process, each
// with its own Redis client) on one real redis-server, in front of
// simulated workers serving the demo's three models, all over loopback.
// The tau-bench airline sessions (tool-using agents, ../shared/traces) are
// replayed through the logical model "auto", every turn sent to a replica
// chosen at random. Each run gets a fresh Redis, fresh workers (cold
// caches) and fresh routers; the workload is the same for every run of a
// seed. One table: the workers' prefix-cache hit rate against one replica,
// unsafe switches and continuity violations on tool-result turns, errors
// and latency, with and without session ids, and with Redis killed in the
// middle of a run.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/bench"
	"github.com/warmroute/warmroute/examples"
	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/sharedstate"
	"github.com/warmroute/warmroute/simworker"
)

type options struct {
	out           string
	trace         string
	sessions      int
	workersPerMod int
	replicas      int
	timeScale     float64
	think         time.Duration
	spread        time.Duration
	outage        time.Duration
	outageAt      time.Duration
	seed          uint64
	only          string
	explain       bool
}

func main() {
	var o options
	flag.StringVar(&o.out, "out", "bench/results", "directory of replicas.md (empty: stdout only)")
	flag.StringVar(&o.trace, "trace", filepath.Join("..", "shared", "traces", bench.TauFile), "tau-bench trajectories")
	flag.IntVar(&o.sessions, "sessions", 0, "sessions of the trace replayed (0: all 200)")
	flag.IntVar(&o.workersPerMod, "workers-per-model", 2, "simulated workers per physical model")
	flag.IntVar(&o.replicas, "replicas", 3, "router replicas")
	flag.Float64Var(&o.timeScale, "time-scale", 0.01, "simulated worker time scale (1: real time)")
	flag.DurationVar(&o.think, "think", 250*time.Millisecond, "mean pause between a session's turns (tool execution, the user), uniform in [0, 2×]")
	flag.DurationVar(&o.spread, "spread", 10*time.Second, "sessions start uniformly over this span")
	flag.DurationVar(&o.outage, "outage", 10*time.Second, "how long Redis is killed in the outage runs")
	flag.DurationVar(&o.outageAt, "outage-at", 4*time.Second, "when Redis is killed, after the run starts")
	flag.Uint64Var(&o.seed, "seed", 1, "sampling, complexity, streaming and replica-choice seed")
	flag.BoolVar(&o.explain, "explain", false, "print every unsafe switch (session, turn, replica, models, reason) to stderr")
	flag.StringVar(&o.only, "only", "", "run only the setups whose name contains this (exploration; the table then lacks rows)")
	flag.Parse()
	start := time.Now()
	rs, w, err := run(o)
	if errors.Is(err, bench.ErrTraceMissing) {
		fmt.Fprintln(os.Stderr, "bench-replicas: skipped:", err)
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-replicas:", err)
		os.Exit(1)
	}
	if err := write(o, w, rs, time.Since(start)); err != nil {
		fmt.Fprintln(os.Stderr, "bench-replicas:", err)
		os.Exit(1)
	}
}

// scenario is one run's setup.
type scenario struct {
	name     string
	replicas int
	redis    bool
	ids      bool
	outage   bool
	sticky   bool // each session keeps one replica (session index mod replicas)
}

// result is one run's measurements.
type result struct {
	scenario
	turns, errors    int
	toolTurns        int     // turns carrying a tool result
	toolTurnsUp      int     // of those, sent while every store was up
	judgedUp         int     // of those, judged (not unowned)
	reachOut         int     // outage: judged tool results sent to another replica than the one that served the call
	reachDown        int     // of those, decided with the explicit redis_down reason
	reachOwner       int     // of those, without it but on the call's model (Redis answered: the kill was not yet seen, or it was back)
	unowned          int     // tool results whose id no worker issued, without a session id: no lock by design (owner_unknown)
	unsafe           int     // judged tool-result turns on another model than the session's previous turn, without an explicit reason
	violations       int     // judged tool-result turns not on the model that issued the call, without an explicit reason
	routerViolations uint64  // the routers' own count (saar Stats.ContinuityViolations)
	redisDown        int     // turns whose replay record carries a redis_down reason
	unreachable      uint64  // the routers' vllm_router_saar_lock_unreachable_total
	outageTurns      int     // turns sent while Redis was down or the stores not yet back
	outageErrors     int     // of those, non-200 answers
	switches         int     // turns on another model than the session's previous turn
	hitRate          float64 // prefix tokens found in the workers' caches / looked up
	p50, p99         time.Duration
	wall             time.Duration
	shared           string
}

func run(o options) ([]result, *bench.Workload, error) {
	w, err := bench.LoadTrace(bench.TraceSpec{Kind: "tau", Path: o.trace}, bench.TraceOptions{Sessions: o.sessions, IDStyle: bench.IDSeq, Seed: o.seed})
	if err != nil {
		return nil, nil, err
	}
	tr := newTrace(w)
	// A discarded first run: process warm-up (connections, page cache)
	// would otherwise land in the first row's latency.
	warm := o
	warm.spread, warm.think = 0, 0
	if _, err := runOne(warm, &trace{sessions: tr.sessions[:min(20, len(tr.sessions))], tools: tr.tools}, scenario{name: "warm-up", replicas: 1, ids: true}); err != nil {
		return nil, nil, err
	}
	var rs []result
	n := o.replicas
	for _, ids := range []bool{true, false} {
		for _, sc := range []scenario{
			{name: "1 replica", replicas: 1},
			{name: fmt.Sprintf("%d replicas, no Redis", n), replicas: n},
			{name: fmt.Sprintf("%d replicas, Redis", n), replicas: n, redis: true},
			{name: fmt.Sprintf("%d replicas, Redis killed %v mid-run", n, o.outage), replicas: n, redis: true, outage: true},
			{name: fmt.Sprintf("%d replicas, Redis killed %v mid-run, a session held to one replica", n, o.outage), replicas: n, redis: true, outage: true, sticky: true},
		} {
			if !strings.Contains(sc.name, o.only) {
				continue
			}
			sc.ids = ids
			r, err := runOne(o, tr, sc)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", sc.name, err)
			}
			fmt.Fprintf(os.Stderr, "%-62s ids=%-5v %5.1fs hit %.3f turns %d (model switches %d) tool %d unsafe %d viol %d/%d redis_down %d errors %d p99 %v\n",
				sc.name, ids, r.wall.Seconds(), r.hitRate, r.turns, r.switches, r.toolTurns, r.unsafe, r.violations, r.routerViolations, r.redisDown, r.errors, r.p99)
			rs = append(rs, r)
		}
	}
	return rs, w, nil
}

// fleet is one run's servers.
type fleet struct {
	redis   *redistest.Server
	sims    []*simworker.Worker
	routers []*router
}

type router struct {
	url    string
	srv    *fastproxy.Server
	ca     *route.CacheAware
	models *saar.Router
	store  *sharedstate.Store
	stop   context.CancelFunc
}

func startFleet(o options, sc scenario, dir string) (*fleet, error) {
	f := &fleet{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if sc.redis {
		r, err := redistest.Launch(dir, redistest.Options{})
		if err != nil {
			return nil, err
		}
		f.redis = r
	}
	cfg, err := saar.ParseConfig(examples.Demo)
	if err != nil {
		f.close()
		return nil, err
	}
	for i := range cfg.Models {
		m := &cfg.Models[i]
		for j := 0; j < o.workersPerMod; j++ {
			w, url, err := simworker.Start(simworker.Config{Models: []string{m.Name}, TimeScale: o.timeScale, MaxTokens: 16, Seed: int64(len(f.sims) + 1)})
			if err != nil {
				f.close()
				return nil, err
			}
			f.sims = append(f.sims, w)
			m.Workers = append(m.Workers, url)
		}
	}
	for i := 0; i < sc.replicas; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		rt := &router{stop: cancel}
		f.routers = append(f.routers, rt)
		reg := loadview.NewRegistry(loadview.Config{HealthTimeout: time.Second, LoadScrapeInterval: 250 * time.Millisecond, Logger: quiet})
		ca := route.DefaultCacheAwareConfig()
		if f.redis != nil {
			st, err := sharedstate.Open(ctx, sharedstate.Config{URL: f.redis.URL(), Logger: quiet})
			if err != nil {
				f.close()
				return nil, err
			}
			rt.store, ca.Shared = st, st
		}
		p, err := route.New("cache_aware", reg, route.Options{CacheAware: ca})
		if err != nil {
			f.close()
			return nil, err
		}
		rt.ca = p.(*route.CacheAware)
		for _, m := range cfg.Models {
			for _, u := range m.Workers {
				if _, err := reg.Add(ctx, u, []string{m.Name}); err != nil {
					f.close()
					return nil, err
				}
			}
		}
		go reg.RunLoadScrapes(ctx)
		rt.models = saar.NewRouter(cfg, saar.Options{Shared: rt.store})
		rt.srv, err = fastproxy.New(fastproxy.Config{Registry: reg, Policy: p, Models: rt.models, Shared: rt.store,
			RetryMaxRetries: 3, RetryBackoff: time.Millisecond, RequestTimeout: 30 * time.Second, Logger: quiet, MaxConcurrentRequests: -1})
		if err != nil {
			f.close()
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			f.close()
			return nil, err
		}
		go rt.srv.Serve(ln) //nolint:errcheck
		rt.url = "http://" + ln.Addr().String() + "/v1/chat/completions"
	}
	return f, nil
}

func (f *fleet) close() {
	for _, r := range f.routers {
		if r.srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			r.srv.Shutdown(ctx) //nolint:errcheck
			cancel()
		}
		if r.models != nil {
			r.models.Close()
		}
		if r.store != nil {
			r.store.Close()
		}
		r.stop()
	}
	for _, w := range f.sims {
		w.Close()
	}
	if f.redis != nil {
		f.redis.Stop()
	}
}

func (f *fleet) storesUp() bool {
	for _, r := range f.routers {
		if r.store != nil && !r.store.Up() {
			return false
		}
	}
	return true
}

// trace is the replayed workload: per session, the trajectory's messages
// and, per turn, how many of them it sends and what the trace answered.
type trace struct {
	sessions []traceSession
	tools    string // JSON tool schemas: one per tool name the trace calls (the file has none)
}

type traceSession struct {
	id    string
	msgs  []json.RawMessage
	turns []traceTurn
}

type traceTurn struct {
	n        int    // messages sent: msgs[:n]
	toolTurn bool   // msgs[n-1] is a tool result
	callName string // the trace's answer (msgs[n]) calls this tool; "" when it answers text or is unknown
	callID   string // and its tool_call id in the trace
}

// newTrace rebuilds each session's message list from its turns (turn k
// sends a prefix of turn k+1's messages; the last turn's answer is not in
// the file) and the tool schemas from the calls.
func newTrace(w *bench.Workload) *trace {
	tr := &trace{}
	names := map[string]bool{}
	type msg struct {
		Role      string `json:"role"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	for si, s := range w.Sessions {
		ts := traceSession{id: s.ID, msgs: uniqueCallIDs(s.Turns[len(s.Turns)-1].Messages, si)}
		for k, t := range s.Turns {
			tt := traceTurn{n: len(t.Messages)}
			var m msg
			_ = json.Unmarshal(ts.msgs[tt.n-1], &m)
			tt.toolTurn = m.Role == "tool"
			if k+1 < len(s.Turns) {
				var a msg
				_ = json.Unmarshal(ts.msgs[tt.n], &a)
				if len(a.ToolCalls) > 0 {
					tt.callName, tt.callID = a.ToolCalls[0].Function.Name, a.ToolCalls[0].ID
				}
			}
			ts.turns = append(ts.turns, tt)
		}
		for _, raw := range ts.msgs {
			var m msg
			_ = json.Unmarshal(raw, &m)
			for _, c := range m.ToolCalls {
				names[c.Function.Name] = true
			}
		}
		tr.sessions = append(tr.sessions, ts)
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	var b strings.Builder
	b.WriteByte('[')
	for i, n := range sorted {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"function","function":{"name":` + jsonString(n) + `,"parameters":{"type":"object","properties":{}}}}`)
	}
	b.WriteByte(']')
	tr.tools = b.String()
	return tr
}

// uniqueCallIDs returns a copy of a session's messages in which every tool
// call has an id of its own: the trace reuses ids within and across
// sessions (GPT-4o's), and a reused id would be locked to the model that
// issued it first. A tool result takes the id of the latest call it names.
func uniqueCallIDs(msgs []json.RawMessage, session int) []json.RawMessage {
	out := make([]json.RawMessage, len(msgs))
	cur := map[string]string{}
	for j, raw := range msgs {
		var m struct {
			Role      string `json:"role"`
			ID        string `json:"tool_call_id"`
			ToolCalls []struct {
				ID string `json:"id"`
			} `json:"tool_calls"`
		}
		_ = json.Unmarshal(raw, &m)
		out[j] = raw
		switch {
		case m.Role == "assistant":
			for i, c := range m.ToolCalls {
				u := fmt.Sprintf("call_trace%d_%d_%d", session, j, i)
				cur[c.ID] = u
				out[j] = bytes.ReplaceAll(out[j], []byte(`"`+c.ID+`"`), []byte(`"`+u+`"`))
			}
		case m.Role == "tool" && cur[m.ID] != "":
			out[j] = bytes.ReplaceAll(raw, []byte(`"`+m.ID+`"`), []byte(`"`+cur[m.ID]+`"`))
		}
	}
	return out
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

var callRe = regexp.MustCompile(`"id":"(call_[^"]+)"`)

// tally is what the clients of one run count.
type tally struct {
	mu                                      sync.Mutex
	lat                                     []time.Duration
	errors, toolTurns, toolTurnsUp, unowned int
	unsafe, violations, redisDown, switches int
	outageTurns, outageErrors               int
	judgedUp                                int          // judged tool-result turns sent while every store was up
	reachOut, reachDown, reachOwner         int          // outage: judged tool results on another replica than the call's; of those with redis_down; served by the owner without it
	outageFrom, outageTo                    atomic.Int64 // unix ns; outageTo 0: not over
}

func (t *tally) inOutage(at time.Time) bool {
	from, to := t.outageFrom.Load(), t.outageTo.Load()
	ns := at.UnixNano()
	return from != 0 && ns >= from && (to == 0 || ns <= to)
}

func runOne(o options, tr *trace, sc scenario) (result, error) {
	dir, err := os.MkdirTemp("", "bench-replicas-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	f, err := startFleet(o, sc, dir)
	if err != nil {
		return result{}, err
	}
	defer f.close()
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 512}}
	t := &tally{}
	start := time.Now()
	outageDone := make(chan struct{})
	if sc.outage {
		go func() { // kill Redis at outageAt, bring it back o.outage later; the window ends when every store is up again
			defer close(outageDone)
			time.Sleep(o.outageAt)
			t.outageFrom.Store(time.Now().UnixNano())
			f.redis.Kill()
			time.Sleep(o.outage)
			f.redis.Start()
			for !f.storesUp() {
				time.Sleep(10 * time.Millisecond)
			}
			t.outageTo.Store(time.Now().UnixNano())
		}()
	} else {
		close(outageDone)
	}
	var wg sync.WaitGroup
	for i := range tr.sessions {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(o.seed, uint64(i)))
			if o.spread > 0 {
				time.Sleep(time.Duration(int64(i) * int64(o.spread) / int64(len(tr.sessions))))
			}
			c := &client{hc: hc, f: f, sc: sc, t: t, s: &tr.sessions[i], tools: tr.tools, rnd: rnd, home: i % len(f.routers), explain: o.explain, start: start}
			for k := range c.s.turns {
				if k > 0 && o.think > 0 {
					time.Sleep(time.Duration(rnd.Int64N(2 * int64(o.think))))
				}
				c.turn(k)
			}
		}(i)
	}
	wg.Wait()
	<-outageDone
	r := result{scenario: sc, wall: time.Since(start), turns: len(t.lat), errors: t.errors, toolTurns: t.toolTurns, toolTurnsUp: t.toolTurnsUp, judgedUp: t.judgedUp,
		reachOut: t.reachOut, reachDown: t.reachDown, reachOwner: t.reachOwner,
		unowned: t.unowned, unsafe: t.unsafe, violations: t.violations, redisDown: t.redisDown, switches: t.switches,
		outageTurns: t.outageTurns, outageErrors: t.outageErrors}
	var q, h uint64
	for _, w := range f.sims {
		st := w.Stats()
		q += st.PrefixQueries
		h += st.PrefixHits
	}
	if q > 0 {
		r.hitRate = float64(h) / float64(q)
	}
	slices.Sort(t.lat)
	r.p50, r.p99 = t.lat[len(t.lat)/2], t.lat[len(t.lat)*99/100]
	var hit, miss, down uint64
	for _, rt := range f.routers {
		st := rt.models.Stats()
		r.routerViolations += st.ContinuityViolations
		r.unreachable += st.LockUnreachable
		var b strings.Builder
		rt.ca.WriteMetrics(&b)
		hit += metricValue(b.String(), `vllm_router_shared_lookups_total{result="hit"}`)
		miss += metricValue(b.String(), `vllm_router_shared_lookups_total{result="miss"}`)
		down += metricValue(b.String(), `vllm_router_shared_lookups_total{result="down"}`)
	}
	if sc.redis {
		r.shared = fmt.Sprintf("%d / %d / %d", hit, miss, down)
	}
	if o.explain && sc.redis { // the stores' replays and the writes Redis refused as older (docs/design.md §8.3)
		var replayed, olderB, olderM, timeouts, errs uint64
		for _, rt := range f.routers {
			var b bytes.Buffer
			rt.store.Metrics().WritePrometheus(&b)
			replayed += metricValue(b.String(), "warmroute_redis_replayed_writes_total")
			olderB += metricValue(b.String(), `warmroute_redis_older_writes_total{kind="binding"}`)
			olderM += metricValue(b.String(), `warmroute_redis_older_writes_total{kind="memory"}`)
			timeouts += metricValue(b.String(), "warmroute_redis_timeouts_total")
			errs += metricValue(b.String(), "warmroute_redis_errors_total")
		}
		fmt.Fprintf(os.Stderr, "STORES %s ids=%v: replayed %d writes; refused as older: %d bindings, %d memory records; errors %d (timeouts %d)\n",
			sc.name, sc.ids, replayed, olderB, olderM, errs, timeouts)
	}
	return r, nil
}

// client drives one session.
type client struct {
	hc      *http.Client
	f       *fleet
	sc      scenario
	t       *tally
	s       *traceSession
	tools   string
	rnd     *rand.Rand
	home    int  // the replica of a sticky client
	explain bool // print every unsafe switch to stderr

	sent    []json.RawMessage // the messages as sent: trace ids replaced by the ids the workers issued
	ids     map[string]string // trace tool_call id → id a worker issued for it
	owner   map[string]string // id as sent → model that issued it (a worker's call) or answered it (the trace's call)
	issuer  map[string]int    // id as sent → the replica that served that turn
	model   string            // model of the session's previous turn
	prev    int               // and its replica
	prevAt  time.Time         // and when it was sent
	prevEnd time.Time         // and answered
	start   time.Time         // when the run started
}

// turn sends turn k. The trace's messages are sent as they are, except the
// tool_call ids: when the trace's answer to a turn calls a tool and the
// last message is the user's, the request names that tool (tool_choice)
// and the simulated worker issues the call; its id then replaces the
// trace's in the history, so the tool result that follows answers a call
// the router saw. A call the trace makes right after a tool result cannot
// be issued by a simulated worker (it calls tools on user turns only): it
// keeps the trace's id, owned by the model that served that turn (the
// trace's message stands for its answer); a router learns its owner from
// the session (session ids) or not at all (tool_loop:owner_unknown).
func (c *client) turn(k int) {
	tt := &c.s.turns[k]
	if c.ids == nil {
		c.ids, c.owner, c.issuer = map[string]string{}, map[string]string{}, map[string]int{}
	}
	for len(c.sent) < tt.n {
		m := c.s.msgs[len(c.sent)]
		for tid, wid := range c.ids {
			if bytes.Contains(m, []byte(tid)) {
				m = bytes.ReplaceAll(m, []byte(`"`+tid+`"`), []byte(`"`+wid+`"`))
			}
		}
		c.sent = append(c.sent, m)
	}
	var answered string // the id the tool result answers, as sent
	if tt.toolTurn {
		var m struct {
			ID string `json:"tool_call_id"`
		}
		_ = json.Unmarshal(c.sent[tt.n-1], &m)
		answered = m.ID
	}
	var body bytes.Buffer
	stream := c.rnd.IntN(2) == 0
	body.WriteString(`{"model":"auto","max_tokens":16,"stream":` + strconv.FormatBool(stream) + `,"tools":` + c.tools)
	if !tt.toolTurn {
		if tt.callName != "" {
			body.WriteString(`,"tool_choice":{"type":"function","function":{"name":` + jsonString(tt.callName) + `}}`)
		} else {
			body.WriteString(`,"tool_choice":"none"`)
		}
	}
	body.WriteString(`,"messages":[`)
	for i, m := range c.sent[:tt.n] {
		if i > 0 {
			body.WriteByte(',')
		}
		body.Write(m)
	}
	body.WriteString(`]}`)
	ri := c.home
	if !c.sc.sticky {
		ri = c.rnd.IntN(len(c.f.routers))
	}
	rt := c.f.routers[ri]
	req, _ := http.NewRequest("POST", rt.url, &body)
	req.Header.Set("Content-Type", "application/json")
	if c.sc.ids {
		req.Header.Set("X-Session-ID", c.s.id)
	}
	req.Header.Set("x-warmroute-complexity", strconv.FormatFloat(c.rnd.Float64(), 'f', 2, 64))
	t0 := time.Now()
	resp, err := c.hc.Do(req)
	var out []byte
	ok := err == nil
	if ok {
		out, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		ok = resp.StatusCode == http.StatusOK
	}
	d := time.Since(t0)
	var model, reason string
	if ok {
		model = resp.Header.Get("x-vsr-selected-model")
		if rec, found := rt.models.Record(resp.Header.Get("x-vsr-replay-id")); found {
			reason = rec.Outcome.Reason
		}
	}
	down := c.t.inOutage(t0)

	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	t := c.t
	t.lat = append(t.lat, d)
	if down {
		t.outageTurns++
	}
	if !ok {
		t.errors++
		if down {
			t.outageErrors++
		}
		c.model = "" // the turn did not happen; the next one is judged afresh
		return
	}
	explicit := strings.Contains(reason, ":redis_down") || strings.Contains(reason, ":lock_broken")
	if strings.Contains(reason, ":redis_down") {
		t.redisDown++
	}
	if c.model != "" && model != c.model {
		t.switches++
	}
	if tt.toolTurn {
		t.toolTurns++
		if !down {
			t.toolTurnsUp++
		}
		owner, issued := c.owner[answered]
		switch {
		case !issued || c.model == "":
			// the previous turn failed: nothing to judge against
		case !c.sc.ids && !c.workerIssued(answered):
			t.unowned++
		default:
			if !down {
				t.judgedUp++
			} else if c.issuer[answered] != ri {
				t.reachOut++
				switch {
				case strings.Contains(reason, ":redis_down"):
					t.reachDown++
				case model == owner:
					t.reachOwner++
				}
			}
			if model != c.model && !explicit {
				t.unsafe++
				if c.explain {
					fmt.Fprintf(os.Stderr, "UNSAFE %s turn %d replica %d (previous %d, sent at %v, answered at %v): %s -> %s owner %s id %s reason %q action %q, sent %v after the run started (outage %v)\n",
						c.s.id, k, ri, c.prev, c.prevAt.Sub(c.start).Round(time.Millisecond), c.prevEnd.Sub(c.start).Round(time.Millisecond), c.model, model, owner, answered, reason,
						resp.Header.Get("x-vsr-session-action"), t0.Sub(c.start).Round(time.Millisecond), down)
				}
			}
			if model != owner && !explicit && c.workerIssued(answered) {
				t.violations++
			}
		}
	}
	c.model, c.prev, c.prevAt, c.prevEnd = model, ri, t0, t0.Add(d)
	if tt.callID != "" { // the trace's answer calls a tool
		id := tt.callID
		if !tt.toolTurn {
			if m := callRe.FindSubmatch(out); m != nil {
				id = string(m[1])
				c.ids[tt.callID] = id
			}
		}
		c.owner[id], c.issuer[id] = model, ri
	}
}

// workerIssued reports whether id was issued by a simulated worker (the
// trace's own ids start "call_" followed by 24 random characters; the
// workers' carry their model's name).
func (c *client) workerIssued(id string) bool { return strings.HasPrefix(id, "call_sim-") }

func metricValue(text, name string) uint64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var n uint64
			fmt.Sscan(v, &n) //nolint:errcheck
			return n
		}
	}
	return 0
}

func write(o options, w *bench.Workload, rs []result, took time.Duration) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Several replicas on one Redis (make bench-replicas)\n\n")
	fmt.Fprintf(&b, "`go run ./bench/replicas %s` (%s, %.0f s in all)\n\n", strings.Join(os.Args[1:], " "), time.Now().UTC().Format("2006-01-02"), took.Seconds())
	fmt.Fprintf(&b, "%s. Replayed through the logical model `auto` (examples/demo.yaml: sim-small, sim-medium, sim-large, "+
		"%d simulated workers each, time scale %g), a complexity drawn per turn (`x-warmroute-complexity`), half the turns streamed; "+
		"sessions start over %v and pause 0–%v between turns; every turn goes to a replica chosen at random unless said otherwise. "+
		"Fresh Redis (appendfsync always), workers and routers per run, seed %d.\n\n",
		w.Note, o.workersPerMod, o.timeScale, o.spread, 2*o.think, o.seed)
	b.WriteString("Columns. **Hit rate**: prompt tokens the workers found in their prefix caches over those looked up. " +
		"**Tool turns**: turns carrying a tool result (in brackets: sent while every replica's store was up). " +
		"**Unsafe switches**: tool-result turns served by another model than the session's previous turn, without an explicit " +
		"`lock_broken` or `redis_down` reason. **Continuity violations**: tool-result turns not served by the model whose worker issued " +
		"the call (from the response headers), without an explicit reason / the routers' own count. " +
		"Without session ids, a tool result answering a call the trace made after a tool result (an id no worker issued, see below) has " +
		"no owner by design (`tool_loop:owner_unknown`) and is not judged (**unowned**). " +
		"**redis_down**: turns whose replay record carries the explicit `…:redis_down` reason (= the routers' " +
		"`vllm_router_saar_lock_unreachable_total`). **Lock out of reach** (outage runs): judged tool-result turns sent during the outage to another replica " +
		"than the one that served the call: decided with `redis_down`, or served by the call's model because Redis answered after all " +
		"(the kill not yet noticed, or Redis back before the decision). **Errors**: non-200 answers (during the outage). " +
		"**p99 added**: client-observed p99 (whole answer) against one replica. **Shared lookups**: route's local misses answered by Redis (hit / miss / Redis down).\n\n")
	b.WriteString("| session ids | setup | hit rate | vs 1 replica | turns | tool turns (Redis up) | unsafe switches | continuity violations | unowned | redis_down (metric) | lock out of reach: redis_down + owner | errors (in outage) | p50 | p99 | p99 added | shared lookups |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	var base result
	for _, r := range rs {
		if r.replicas == 1 {
			base = r
		}
		ids := "no"
		if r.ids {
			ids = "yes"
		}
		outage, reach := "", ""
		if r.outage {
			outage = fmt.Sprintf(" (%d of %d turns)", r.outageErrors, r.outageTurns)
			reach = fmt.Sprintf("%d: %d + %d", r.reachOut, r.reachDown, r.reachOwner)
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f %% | %+.1f pt | %d | %d (%d) | %d | %d / %d | %d | %d (%d) | %s | %d%s | %v | %v | %+v | %s |\n",
			ids, r.name, 100*r.hitRate, 100*(r.hitRate-base.hitRate), r.turns, r.toolTurns, r.toolTurnsUp, r.unsafe,
			r.violations, r.routerViolations, r.unowned, r.redisDown, r.unreachable, reach, r.errors, outage,
			r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), (r.p99 - base.p99).Round(time.Millisecond), r.shared)
	}
	up, judged := 0, 0
	for _, r := range rs {
		if r.redis {
			up += r.toolTurnsUp
			judged += r.judgedUp
		}
	}
	fmt.Fprintf(&b, "\nTool-result turns through %d replicas while Redis was up, all Redis runs: %d, of which judged (not unowned): %d.\n\n", o.replicas, up, judged)
	b.WriteString("Tool-call ids. A simulated worker calls a tool only on a user turn (the request names the trace's tool in `tool_choice`); " +
		"its id replaces the trace's in the history that follows, so the tool result answers a call the router saw and locked " +
		"(written to Redis before the answer's last byte). A call the trace makes right after a tool result keeps the trace's id: " +
		"no worker issued it, so with session ids the lock is the session's last model (the model step's memory, shared), " +
		"and without them there is none.\n")
	text := b.String()
	fmt.Print(text)
	if o.out == "" {
		return nil
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(o.out, "replicas.md"), []byte(text), 0o644)
}
