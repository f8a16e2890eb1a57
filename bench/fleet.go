package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

// Model is the model name the fleet serves and the replayer requests.
const Model = "sim-model"

// fleet is one run's simulated workers and the real router in front of them,
// all on loopback in this process.
type fleet struct {
	sims   []*simworker.Worker
	urls   []string
	entry  int // sims[:entry] are the entry side (regular or prefill workers), the rest decode workers
	reg    *loadview.Registry
	policy route.Policy
	srv    *fastproxy.Server
	url    string             // the router's base URL
	stop   context.CancelFunc // ends the load scrapes
	// announce, when set, is told each request body before it is sent and
	// returns what to call once its answer ended (the precise policy).
	announce func(body []byte) (done func())
}

// seqRand returns a concurrency-safe deterministic random source
// (splitmix64 over an atomic counter).
func seqRand(seed uint64) func() uint64 {
	var s atomic.Uint64
	s.Store(seed*0x9e3779b97f4a7c15 + 1)
	return func() uint64 {
		z := s.Add(0x9e3779b97f4a7c15)
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		return z ^ (z >> 31)
	}
}

// newPolicy builds the named policy over reg.
func newPolicy(name string, reg *loadview.Registry, ca route.CacheAwareConfig, rnd func() uint64) (route.Policy, error) {
	if base, ok := controlOf(name); ok {
		name = base
	}
	switch name {
	case PolicySticky:
		return NewSticky(reg, rnd), nil
	case PolicyPreRFC:
		return NewPreRFC(reg, ca.Threshold, ca.BalanceAbs, ca.BalanceRel, rnd), nil
	case PolicyOracle:
		return route.New(route.RoundRobin, reg, route.Options{Rand: rnd})
	case PolicyPrecise:
		return NewPrecise(reg, ca, rnd), nil
	case PolicyCacheAwareEvents:
		return route.New("cache_aware", reg, route.Options{CacheAware: ca, Rand: rnd})
	}
	if c, ok := CacheAwareVariant(name, ca); ok {
		return route.New("cache_aware", reg, route.Options{CacheAware: c, Rand: rnd})
	}
	return route.New(name, reg, route.Options{CacheAware: ca, Rand: rnd})
}

// Policies lists every policy the harness knows, in report order.
var Policies = []string{route.RoundRobin, route.Random, route.PowerOfTwo, route.ConsistentHash,
	PolicySticky, PolicyPreRFC, "cache_aware", PolicyOracle}

// ValidPolicy reports whether name is a policy the harness can run: one of
// Policies or CacheAwareVariants, PolicyPrecise (not in a replay's default
// list: the matrix runs it), a disaggregated fleet's pair of two of them
// (PDPolicy; neither precise nor the oracle, which assume one side), or an
// A/A control of one (ControlSuffix).
func ValidPolicy(name string) bool {
	if base, ok := controlOf(name); ok {
		name = base
	}
	if p, d, pd := SplitPD(name); pd {
		return onePolicy(p) && onePolicy(d) && !oneSided(p) && !oneSided(d)
	}
	return onePolicy(name)
}

func onePolicy(name string) bool {
	return slices.Contains(Policies, name) || slices.Contains(CacheAwareVariants, name) || name == PolicyPrecise ||
		name == PolicyCacheAwareEvents ||
		slices.Contains(route.Names, name)
}

// oneSided reports whether a policy cannot run in a disaggregated fleet:
// precise reads the caches of a fleet whose workers serve whole requests,
// and the oracle is one worker.
func oneSided(name string) bool { return name == PolicyPrecise || name == PolicyOracle }

// startFleet starts n fresh simulated workers and a router with policy in
// front of them. The oracle gets one worker with an unbounded cache and
// unbounded max-num-seqs instead. With opt.Decode the fleet is
// disaggregated (docs/design.md §9): opt.Workers prefill workers and
// opt.Decode decode workers, the router in PD mode with policy's two
// legs (SplitPD).
func startFleet(opt *Options, policy string, seed uint64) (*fleet, error) {
	f := &fleet{}
	n := opt.Workers
	if policy == PolicyOracle {
		n = 1
	}
	f.entry = n
	base := policy
	if b, ok := controlOf(policy); ok {
		base = b
	}
	events := base == PolicyCacheAwareEvents
	if opt.Decode > 0 {
		n += opt.Decode
	}
	for i := 0; i < n; i++ {
		c := opt.Sim
		c.Models = []string{Model}
		c.Seed = int64(seed)*1000 + int64(i) + 1
		if policy == PolicyOracle {
			c.CacheBlocks = 1 << 30
			c.MaxNumSeqs = 1 << 20
		} else if opt.WorkerSim != nil {
			opt.WorkerSim(i, &c)
		}
		if events {
			c.KVEventsEndpoint = "tcp://127.0.0.1:0"
			c.KVEventsBufferSteps = 1024 // no replay socket here: the buffer only costs memory
		}
		w, url, err := simworker.Start(c)
		if err != nil {
			f.close()
			return nil, err
		}
		f.sims = append(f.sims, w)
		f.urls = append(f.urls, url)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The load scrape on, as cmd/warmroute runs it by default: it reads the
	// workers' load and the KV capacity each states (vllm:cache_config_info),
	// which budgets their parts of the cache-aware tree (docs/design.md §4).
	lc := loadview.Config{
		HealthTimeout: 2 * time.Second, RequestTimeout: opt.RequestTimeout, Logger: quiet,
		LoadScrapeInterval: time.Second,
	}
	if events { // each worker's events at the address it bound
		kv := &loadview.KVEventsConfig{Endpoints: map[string]loadview.KVEndpoints{}}
		for i, w := range f.sims {
			kv.Endpoints[f.urls[i]] = loadview.KVEndpoints{Endpoint: w.KVEventsAddr()}
		}
		lc.KVEvents = kv
	}
	f.reg = loadview.NewRegistry(lc)
	prefill, decode, _ := SplitPD(base)
	p, err := newPolicy(prefill, f.reg, opt.CacheAware, seqRand(seed))
	if err != nil {
		f.close()
		return nil, err
	}
	f.policy = p
	var pd *fastproxy.PDConfig
	if opt.Decode > 0 {
		dp, err := newPolicy(decode, f.reg, opt.CacheAware, seqRand(^seed))
		if err != nil {
			f.close()
			return nil, err
		}
		pd = &fastproxy.PDConfig{DecodePolicy: dp}
	}
	for i, u := range f.urls {
		role := loadview.Regular
		switch {
		case opt.Decode > 0 && i < f.entry:
			role = loadview.Prefill
		case opt.Decode > 0:
			role = loadview.Decode
		}
		if _, err := f.reg.AddRole(context.Background(), u, []string{Model}, role); err != nil {
			f.close()
			return nil, err
		}
	}
	for _, w := range f.reg.Workers() {
		if !w.Healthy() {
			f.close()
			return nil, fmt.Errorf("simulated worker %s is not healthy", w.URL())
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	f.stop = stop
	f.reg.ScrapeLoadOnce(ctx) // capacities known before the first request
	go f.reg.RunLoadScrapes(ctx)
	if pr, ok := p.(*Precise); ok {
		if err := pr.bind(f.sims, f.urls); err != nil {
			f.close()
			return nil, err
		}
		f.announce = pr.announce
	}
	f.srv, err = fastproxy.New(fastproxy.Config{
		Registry: f.reg, Policy: p, PD: pd, RequestTimeout: opt.RequestTimeout,
		RetryMaxRetries: 1, Logger: quiet,
	})
	if err != nil {
		f.close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.close()
		return nil, err
	}
	go f.srv.Serve(ln) //nolint:errcheck // ends at Shutdown
	f.url = "http://" + ln.Addr().String()
	return f, nil
}

func (f *fleet) close() {
	if f.stop != nil {
		f.stop()
	}
	if f.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		f.srv.Shutdown(ctx) //nolint:errcheck // best effort at the end of a run
		cancel()
	}
	if f.reg != nil {
		f.reg.StopKVEvents()
	}
	for _, w := range f.sims {
		w.Close() //nolint:errcheck // best effort at the end of a run
	}
}

// Router counters of predicted and served prefix tokens (docs/design.md §4,
// placement on a session miss): what the router expected each worker to
// hold, and what the workers reported as cached.
const (
	metricPredicted = "vllm_router_prefix_tokens_predicted_total"
	metricServed    = "vllm_router_prefix_tokens_served_total"
)

// routerCounters sums metricPredicted and metricServed over their labels in
// the in-process router's metrics text; ok is false when the router writes
// neither (a policy or a router version without them).
func (f *fleet) routerCounters() (predicted, served float64, ok bool) {
	var buf bytes.Buffer
	f.srv.WriteMetrics(&buf)
	return parseRouterCounters(buf.String())
}

func parseRouterCounters(text string) (predicted, served float64, ok bool) {
	for line := range strings.SplitSeq(text, "\n") {
		var dst *float64
		switch {
		case metricLine(line, metricPredicted):
			dst = &predicted
		case metricLine(line, metricServed):
			dst = &served
		default:
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		*dst += v
		ok = true
	}
	return predicted, served, ok
}

// metricLine reports whether line is a sample of the metric name.
func metricLine(line, name string) bool {
	rest, found := strings.CutPrefix(line, name)
	return found && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " "))
}

// prefixCounters is what one worker's /metrics says about its prefix cache.
type prefixCounters struct{ hits, queries float64 }

// scrape reads vllm:prefix_cache_hits_total and
// vllm:prefix_cache_queries_total (summed over model_name) from every
// worker's /metrics, as a Prometheus scraper would.
func (f *fleet) scrape(c *http.Client) ([]prefixCounters, error) {
	out := make([]prefixCounters, len(f.urls))
	for i, u := range f.urls {
		resp, err := c.Get(u + "/metrics")
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			var dst *float64
			switch {
			case strings.HasPrefix(line, "vllm:prefix_cache_hits_total"):
				dst = &out[i].hits
			case strings.HasPrefix(line, "vllm:prefix_cache_queries_total"):
				dst = &out[i].queries
			default:
				continue
			}
			sp := strings.LastIndexByte(line, ' ')
			v, err := strconv.ParseFloat(line[sp+1:], 64)
			if err != nil {
				resp.Body.Close()
				return nil, fmt.Errorf("%s/metrics: %q: %w", u, line, err)
			}
			*dst += v
		}
		resp.Body.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}
