// Command replicas is make bench-replicas (docs/design.md §8.3): several
// router replicas (fastproxy + route, in process, each with its own Redis
// client) on one real redis-server, in front of simulated workers, all over
// loopback. Closed-loop agent sessions send every turn to a replica chosen
// at random. Each run gets a fresh Redis, fresh workers (cold caches) and
// fresh routers; the workload is the same for every run of a seed. One
// table: the workers' prefix-cache hit rate against one replica, turns
// that stayed on their previous turn's worker, errors, and latency, with
// and without session ids, and with Redis killed in the middle of a run.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/sharedstate"
	"github.com/warmroute/warmroute/simworker"
)

type options struct {
	out               string
	sessions, turns   int
	workers, replicas int
	timeScale         float64
	outage            time.Duration
	seed              uint64
}

func main() {
	var o options
	flag.StringVar(&o.out, "out", "bench/results", "directory of replicas.md")
	flag.IntVar(&o.sessions, "sessions", 48, "concurrent agent sessions")
	flag.IntVar(&o.turns, "turns", 10, "turns per session")
	flag.IntVar(&o.workers, "workers", 4, "simulated workers")
	flag.IntVar(&o.replicas, "replicas", 3, "router replicas")
	flag.Float64Var(&o.timeScale, "time-scale", 0.02, "simulated worker time scale (1: real time)")
	flag.DurationVar(&o.outage, "outage", 3*time.Second, "how long Redis is killed in the outage runs")
	flag.Uint64Var(&o.seed, "seed", 1, "workload and replica-choice seed")
	flag.Parse()
	if err := run(o); err != nil {
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
	flush    bool // the client waits for the serving replica's store.Flush: the proposed proxy hook (route.Choice.Published)
}

// result is one run's measurements.
type result struct {
	scenario
	requests, errors int
	hitRate          float64 // prefix tokens found in the workers' caches / looked up
	stayed           float64 // turns after the first on their previous turn's worker
	p50, p99         time.Duration
	shared           string // the routers' shared-store lookups: hit/miss/down
}

func run(o options) error {
	// A discarded first run: process warm-up (connections, page cache)
	// would otherwise land in the first row's latency.
	if _, err := runOne(o, scenario{name: "warm-up", replicas: 1, ids: true}); err != nil {
		return err
	}
	var rs []result
	for _, ids := range []bool{true, false} {
		for _, sc := range []scenario{
			{name: "1 replica", replicas: 1},
			{name: fmt.Sprintf("%d replicas, no Redis", o.replicas), replicas: o.replicas},
			{name: fmt.Sprintf("%d replicas, Redis", o.replicas), replicas: o.replicas, redis: true},
			{name: fmt.Sprintf("%d replicas, Redis, bindings flushed per answer", o.replicas), replicas: o.replicas, redis: true, flush: true},
			{name: fmt.Sprintf("%d replicas, Redis killed %v mid-run", o.replicas, o.outage), replicas: o.replicas, redis: true, outage: true},
		} {
			sc.ids = ids
			r, err := runOne(o, sc)
			if err != nil {
				return fmt.Errorf("%s: %w", sc.name, err)
			}
			fmt.Fprintf(os.Stderr, "%-40s ids=%-5v hit %.3f stayed %.3f errors %d p99 %v\n", sc.name, ids, r.hitRate, r.stayed, r.errors, r.p99)
			rs = append(rs, r)
		}
	}
	return write(o, rs)
}

// fleet is one run's servers.
type fleet struct {
	redis   *redistest.Server
	sims    []*simworker.Worker
	routers []*router
}

type router struct {
	url   string
	srv   *fastproxy.Server
	ca    *route.CacheAware
	store *sharedstate.Store
	stop  context.CancelFunc
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
	var urls []string
	for i := 0; i < o.workers; i++ {
		w, url, err := simworker.Start(simworker.Config{Models: []string{"m"}, TimeScale: o.timeScale, MaxTokens: 24, Seed: int64(i + 1)})
		if err != nil {
			f.close()
			return nil, err
		}
		f.sims = append(f.sims, w)
		urls = append(urls, url)
	}
	for i := 0; i < sc.replicas; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		rt := &router{stop: cancel}
		f.routers = append(f.routers, rt)
		reg := loadview.NewRegistry(loadview.Config{HealthTimeout: time.Second, LoadScrapeInterval: 250 * time.Millisecond, Logger: quiet})
		cfg := route.DefaultCacheAwareConfig()
		if f.redis != nil {
			st, err := sharedstate.Open(ctx, sharedstate.Config{URL: f.redis.URL(), Logger: quiet})
			if err != nil {
				f.close()
				return nil, err
			}
			rt.store, cfg.Shared = st, st
		}
		p, err := route.New("cache_aware", reg, route.Options{CacheAware: cfg})
		if err != nil {
			f.close()
			return nil, err
		}
		rt.ca = p.(*route.CacheAware)
		for _, u := range urls {
			if _, err := reg.Add(ctx, u, nil); err != nil {
				f.close()
				return nil, err
			}
		}
		go reg.RunLoadScrapes(ctx)
		rt.srv, err = fastproxy.New(fastproxy.Config{Registry: reg, Policy: p, RetryMaxRetries: 3, RetryBackoff: time.Millisecond,
			RequestTimeout: 30 * time.Second, Logger: quiet, MaxConcurrentRequests: -1})
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

// session is one agent conversation of the workload: a shared system
// prompt and tool schemas, then turns of user text and assistant replies.
type session struct {
	id    string
	first string
	users []string
}

func workload(o options) []session {
	rnd := rand.New(rand.NewPCG(o.seed, 7))
	words := strings.Fields("flight booking change refund baggage seat upgrade loyalty points passenger itinerary " +
		"cancel reservation payment card airport gate delay connection hotel car rental insurance policy")
	text := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(words[rnd.IntN(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	ss := make([]session, o.sessions)
	for i := range ss {
		ss[i] = session{id: fmt.Sprintf("bench-%d-%d", o.seed, i), first: fmt.Sprintf("customer %d: %s", i, text(800))}
		for t := 0; t < o.turns; t++ {
			ss[i].users = append(ss[i].users, text(200+rnd.IntN(400)))
		}
	}
	return ss
}

var systemPrompt = strings.Repeat("You are an airline customer service agent. Follow the policy exactly; use the tools. ", 50)

const tools = `[{"type":"function","function":{"name":"get_reservation","parameters":{"type":"object","properties":{"id":{"type":"string"}}}}},` +
	`{"type":"function","function":{"name":"update_reservation","parameters":{"type":"object","properties":{"id":{"type":"string"},"seat":{"type":"string"}}}}}]`

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

func runOne(o options, sc scenario) (result, error) {
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
	ss := workload(o)
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	var (
		mu        sync.Mutex
		lat       []time.Duration
		errs      int
		stayed    int
		followups int
		done      atomic.Int64
	)
	total := int64(len(ss) * o.turns)
	outageDone := make(chan struct{})
	if sc.outage {
		go func() { // kill Redis a third of the way in, bring it back after o.outage
			defer close(outageDone)
			for done.Load() < total/3 {
				time.Sleep(5 * time.Millisecond)
			}
			f.redis.Kill()
			time.Sleep(o.outage)
			f.redis.Start()
		}()
	} else {
		close(outageDone)
	}
	var wg sync.WaitGroup
	for i, s := range ss {
		wg.Add(1)
		go func(i int, s session) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(o.seed, uint64(i)))
			msgs := []string{`{"role":"system","content":` + jsonString(systemPrompt) + `}`, `{"role":"user","content":` + jsonString(s.first) + `}`}
			prev := ""
			for t := 0; t < o.turns; t++ {
				rt := f.routers[rnd.IntN(len(f.routers))]
				body := `{"model":"m","max_tokens":24,"tools":` + tools + `,"messages":[` + strings.Join(msgs, ",") + `]}`
				req, _ := http.NewRequest("POST", rt.url, strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if sc.ids {
					req.Header.Set("X-Session-ID", s.id)
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				var reply string
				var w string
				ok := err == nil
				if ok {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					ok = resp.StatusCode == 200
					w = resp.Header.Get("x-vllm-router-worker")
					var cc struct {
						Choices []struct {
							Message struct {
								Content string `json:"content"`
							} `json:"message"`
						} `json:"choices"`
					}
					if json.Unmarshal(b, &cc) == nil && len(cc.Choices) > 0 {
						reply = cc.Choices[0].Message.Content
					}
				}
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				if !ok {
					errs++
				}
				if t > 0 && ok {
					followups++
					if w == prev {
						stayed++
					}
				}
				mu.Unlock()
				prev = w
				if sc.flush && rt.store != nil {
					rt.store.Flush(context.Background()) //nolint:errcheck // as a proxy would before the last byte
				}
				done.Add(1)
				msgs = append(msgs, `{"role":"assistant","content":`+jsonString(reply)+`}`, `{"role":"user","content":`+jsonString(s.users[t])+`}`)
			}
		}(i, s)
	}
	wg.Wait()
	<-outageDone
	var q, h uint64
	for _, w := range f.sims {
		st := w.Stats()
		q += st.PrefixQueries
		h += st.PrefixHits
	}
	slices.Sort(lat)
	r := result{scenario: sc, requests: len(lat), errors: errs, p50: lat[len(lat)/2], p99: lat[len(lat)*99/100]}
	if q > 0 {
		r.hitRate = float64(h) / float64(q)
	}
	if followups > 0 {
		r.stayed = float64(stayed) / float64(followups)
	}
	if sc.redis {
		var hit, miss, down uint64
		for _, rt := range f.routers {
			var b strings.Builder
			rt.ca.WriteMetrics(&b)
			hit += metricValue(b.String(), `vllm_router_shared_lookups_total{result="hit"}`)
			miss += metricValue(b.String(), `vllm_router_shared_lookups_total{result="miss"}`)
			down += metricValue(b.String(), `vllm_router_shared_lookups_total{result="down"}`)
		}
		r.shared = fmt.Sprintf("%d / %d / %d", hit, miss, down)
	}
	return r, nil
}

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

func write(o options, rs []result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Several replicas on one Redis (make bench-replicas)\n\n")
	fmt.Fprintf(&b, "%d closed-loop agent sessions × %d turns (system prompt and tool schemas shared, ~6 KB; "+
		"a 800-character first message; 200–600 characters per turn), every turn sent to a replica chosen at random; "+
		"%d simulated workers (time scale %g), fresh Redis, workers and routers per run, seed %d. "+
		"Hit rate: prompt tokens the workers found in their prefix caches over those looked up. "+
		"Stayed: turns served by the worker of the session's previous turn. "+
		"Latency: client-observed, whole non-streamed answer. Shared lookups: local misses answered by Redis (hit / miss / Redis down), all replicas. "+
		"Flushed: the client waits for the serving replica's store.Flush after each answer, as a proxy would before "+
		"the last byte when route.Choice.Published (not wired: fastproxy). "+
		"Outage runs kill redis-server (SIGKILL) when a third of the turns are done and restart it %v later on the same AOF.\n\n",
		o.sessions, o.turns, o.workers, o.timeScale, o.seed, o.outage)
	b.WriteString("| session ids | setup | hit rate | vs 1 replica | stayed | errors | p50 | p99 | p99 vs 1 replica | shared lookups |\n|---|---|---|---|---|---|---|---|---|---|\n")
	var base result
	for _, r := range rs {
		if r.replicas == 1 {
			base = r
		}
		ids := "no"
		if r.ids {
			ids = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %.1f %% | %+.1f pt | %.1f %% | %d / %d | %v | %v | %+v | %s |\n", ids, r.name, 100*r.hitRate,
			100*(r.hitRate-base.hitRate), 100*r.stayed, r.errors, r.requests, r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond),
			(r.p99 - base.p99).Round(time.Millisecond), r.shared)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	p := filepath.Join(o.out, "replicas.md")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Print(b.String())
	return nil
}
