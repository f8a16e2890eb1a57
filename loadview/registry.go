package loadview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	transport "github.com/warmroute/warmroute/upstream"

	"github.com/warmroute/warmroute/promtext"
)

// Config holds the registry settings (the router's flags). Zero values take
// the defaults noted; NewRegistry copies the Config.
type Config struct {
	DPSize           int           // --intra-node-data-parallel-size: ranks per URL without an explicit @rank
	RequestTimeout   time.Duration // upstream read/write timeout; default 1800 s (vLLM router --request-timeout-secs)
	ConnectTimeout   time.Duration // upstream, health and discovery dial timeout; default 5 s
	HealthEndpoint   string        // --health-check-endpoint, default /health
	HealthInterval   time.Duration // --health-check-interval-secs: probe period of healthy workers; default 60 s
	HealthTimeout    time.Duration // one health check's or discovery's deadline; default 5 s
	FailureThreshold int           // consecutive failed checks before unhealthy; default 3
	SuccessThreshold int           // consecutive good checks before healthy again; default 2

	// UnhealthyProbeInterval is the probe period of workers that are not
	// healthy (health checks failing, or circuit breaker not Closed); default
	// 1 s, so that a restarted worker serves again about
	// SuccessThreshold × UnhealthyProbeInterval (2 s) after its /health passes.
	UnhealthyProbeInterval time.Duration

	// Circuit breaker, with the vLLM router's flags and meanings (see
	// RecordFailure). CBFailureThreshold: consecutive failed requests that
	// open it, 0 disables it (the router flag defaults to 10).
	// CBSuccessThreshold: consecutive successes in HalfOpen that close it;
	// default 3. CBTimeoutDuration: how long it stays Open before HalfOpen;
	// default 60 s. CBWindowDuration: failures older than this no longer count
	// towards opening; default 120 s.
	CBFailureThreshold int
	CBSuccessThreshold int
	CBTimeoutDuration  time.Duration
	CBWindowDuration   time.Duration

	// AllowedWorkers restricts the URLs that Admit accepts (the admin API):
	// hostnames (exact, case-insensitive) and CIDRs (for IP-literal hosts);
	// see ParseAllowList and Admit. Empty: any host. Add is not restricted.
	AllowedWorkers []string
	// MaxWorkers caps the registry's workers, ranks counted; default 1024.
	MaxWorkers int

	// LoadScrapeInterval is the period of RunLoadScrapes, which reads each
	// worker's vLLM load from LoadMetricsEndpoint (docs/design.md §8.3);
	// 0: off, Worker.FleetLoad is then the local in-flight count. A report
	// older than 3 intervals is ignored.
	LoadScrapeInterval  time.Duration
	LoadMetricsEndpoint string // default /metrics

	// KVEvents, when set, subscribes to each worker's KV-cache events
	// (kvevents.go): one subscriber per worker, started by Add, closed by
	// Remove, its batches handed to OnKVEvents. nil: off. Invalid settings
	// are logged and leave it off (validate flags with CheckKVEvents first).
	KVEvents *KVEventsConfig

	APIKey string            // sent as a bearer token on health and discovery calls
	Dial   fasthttp.DialFunc // upstream, health and discovery dialer; nil: TCP (benchmarks dial in-memory listeners)
	Now    func() time.Time  // clock of the circuit breaker; nil: time.Now (tests inject one)
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.DPSize < 1 {
		c.DPSize = 1
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 1800 * time.Second
	}
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	if c.HealthEndpoint == "" {
		c.HealthEndpoint = "/health"
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = 60 * time.Second
	}
	if c.HealthTimeout <= 0 {
		c.HealthTimeout = 5 * time.Second
	}
	if c.FailureThreshold < 1 {
		c.FailureThreshold = 3
	}
	if c.SuccessThreshold < 1 {
		c.SuccessThreshold = 2
	}
	if c.UnhealthyProbeInterval <= 0 {
		c.UnhealthyProbeInterval = time.Second
	}
	if c.CBSuccessThreshold < 1 {
		c.CBSuccessThreshold = 3
	}
	if c.CBTimeoutDuration <= 0 {
		c.CBTimeoutDuration = 60 * time.Second
	}
	if c.CBWindowDuration <= 0 {
		c.CBWindowDuration = 120 * time.Second
	}
	if c.MaxWorkers < 1 {
		c.MaxWorkers = 1024
	}
	if c.LoadMetricsEndpoint == "" {
		c.LoadMetricsEndpoint = "/metrics"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// maxProbeBody bounds a health or discovery response: a worker cannot make
// the router allocate more than this per call.
const maxProbeBody = 1 << 20

// maxModels bounds the models one worker may list.
const maxModels = 4096

// snapshot is an immutable view of the fleet. Never modified after publish.
type snapshot struct {
	all    []*Worker // every worker, whatever its role
	byURL  map[string]*Worker
	byID   map[uint32]*Worker
	entry  roleView // Regular and Prefill workers: the worker step's candidates
	decode roleView // Decode workers
	models []string // sorted model names the entry workers serve explicitly
	minCtx int      // smallest max_model_len any entry worker reports (0: none reports one)
}

// roleView indexes the workers of one side of the fleet by model.
type roleView struct {
	all      []*Worker
	byModel  map[string][]*Worker // explicit servers of a model, plus wildcard workers
	wildcard []*Worker            // workers whose models are unknown
}

// forModel is ForModel on one side of the fleet.
func (v *roleView) forModel(model []byte) ([]*Worker, bool) {
	if len(model) == 0 {
		return v.all, len(v.all) > 0
	}
	if ws, ok := v.byModel[string(model)]; ok {
		return ws, true
	}
	return v.wildcard, len(v.wildcard) > 0
}

// Registry is the set of workers. Reads are lock-free snapshot loads; writes
// (Add, Remove, discovery) are serialized by mu and publish a new snapshot.
type Registry struct {
	cfg    Config
	mu     sync.Mutex
	nextID uint32
	snap   atomic.Pointer[snapshot]
	// ups are shared by every rank of one base URL; under mu.
	ups      map[string]*upstream
	onRemove []func(*Worker)           // under mu; see OnRemove
	onModels []func(ModelChange)       // under mu; see OnModelsChange
	allow    atomic.Pointer[allowList] // swapped whole by SetAllowedWorkers
	apiKey   atomic.Pointer[string]    // the bearer token of health, discovery and load calls (SetAPIKey)
	probeHC  *fasthttp.Client
	xport    *transport.Transport // buffered upstream exchanges, cancellable when the client leaves
	probes   sync.WaitGroup       // asynchronous probes (ProbeSoon, RunHealthChecks)
	dns      []*DNSDiscovery      // under mu; their series are written by WriteMetrics
	k8s      []*K8sDiscovery      // under mu; likewise
	kv       *kvState             // nil: KVEvents off
}

// NewRegistry returns an empty registry. Invalid AllowedWorkers entries are
// logged and allow nothing (validate flags with ParseAllowList first).
func NewRegistry(cfg Config) *Registry {
	cfg.setDefaults()
	r := &Registry{cfg: cfg, ups: map[string]*upstream{}}
	r.xport = transport.NewTransport(transport.Config{ConnectTimeout: cfg.ConnectTimeout, ReadBufferSize: 16 << 10, WriteBufferSize: 16 << 10})
	allow, errs := newAllowList(cfg.AllowedWorkers)
	for _, err := range errs {
		cfg.Logger.Error("ignoring allowed-worker entry", "err", err)
	}
	r.allow.Store(&allow)
	r.SetAPIKey(cfg.APIKey)
	r.probeHC = &fasthttp.Client{
		Name:                     "warmroute",
		NoDefaultUserAgentHeader: true,
		DialTimeout:              dialer(cfg.Dial, cfg.ConnectTimeout),
		MaxResponseBodySize:      maxProbeBody,
		MaxIdleConnDuration:      4 * time.Second,
		ReadTimeout:              cfg.HealthTimeout,
		WriteTimeout:             cfg.HealthTimeout,
	}
	r.snap.Store(buildSnapshot(nil))
	var err error
	if r.kv, err = newKVState(cfg.KVEvents); err != nil {
		cfg.Logger.Error("KV events off: invalid settings", "err", err)
	}
	return r
}

// SetAPIKey replaces the bearer token of the registry's own calls to the
// workers (Config.APIKey; a reload, docs/design.md §8, "Reload and audit").
func (r *Registry) SetAPIKey(key string) { r.apiKey.Store(&key) }

// SetAllowedWorkers replaces the allow-list of Admit (Config.AllowedWorkers;
// a reload): entries as ParseAllowList returns them. An invalid entry is an
// error and changes nothing. Workers already registered stay.
func (r *Registry) SetAllowedWorkers(entries []string) error {
	a, errs := newAllowList(entries)
	if len(errs) > 0 {
		return errs[0]
	}
	r.allow.Store(&a)
	return nil
}

// SetModels replaces the models of the registered worker rawURL (every rank
// of a base URL) that was added with fixed models (AddRole with models):
// the operator's config changed them on a reload. Workers whose models are
// discovered keep discovering them. It reports whether any worker changed.
func (r *Registry) SetModels(rawURL string, models []string) bool {
	base, rank, err := ParseWorkerURL(rawURL)
	if err != nil {
		return false
	}
	var ws []*Worker
	for _, w := range r.Workers() {
		if w.base == base && (rank < 0 || w.rank == rank) && w.fixed {
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return false
	}
	r.setModels(ws, fixedModelSet(models))
	return true
}

// ErrDuplicate is returned when adding a worker URL that is already present.
var ErrDuplicate = errors.New("worker already registered")

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// Add registers rawURL ("http://h:p" or "http://h:p@rank"). Without an explicit
// rank and with DPSize > 1 it adds one worker per rank. models, when non-nil,
// fixes the served models; otherwise they are discovered from GET /v1/models
// (a worker whose discovery fails serves any model until discovery succeeds)
// and rediscovered after every successful health check (models.go).
// The new workers start healthy when their first health check passes.
// Add is not restricted by AllowedWorkers (call Admit first for URLs from
// requests); it fails with ErrTooManyWorkers when the registry would hold more
// than MaxWorkers workers, and adds none of the ranks then.
func (r *Registry) Add(ctx context.Context, rawURL string, models []string) ([]*Worker, error) {
	return r.AddRole(ctx, rawURL, models, Regular)
}

// AddRole is Add for a worker of the given role (docs/design.md §9,
// "Disaggregated fleets"). A URL has one role: adding it again under
// another is ErrDuplicate.
func (r *Registry) AddRole(ctx context.Context, rawURL string, models []string, role Role) ([]*Worker, error) {
	base, rank, err := ParseWorkerURL(rawURL)
	if err != nil {
		return nil, err
	}
	ranks := []int{rank}
	if rank < 0 && r.cfg.DPSize > 1 {
		ranks = ranks[:0]
		for i := 0; i < r.cfg.DPSize; i++ {
			ranks = append(ranks, i)
		}
	}
	if n := len(r.Workers()); n >= r.cfg.MaxWorkers {
		return nil, fmt.Errorf("%s: %w (%d, the maximum)", base, ErrTooManyWorkers, n)
	}
	var set *modelSet
	if models != nil {
		set = fixedModelSet(models)
	} else {
		set, _ = r.discover(ctx, base)
	}
	healthy := r.probe(ctx, base)

	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.snap.Load()
	var fresh []int // ranks not registered yet
	for _, rk := range ranks {
		url := base
		if rk >= 0 {
			url = base + "@" + strconv.Itoa(rk)
		}
		if _, ok := old.byURL[url]; ok {
			if len(ranks) == 1 {
				return nil, fmt.Errorf("%s: %w", url, ErrDuplicate)
			}
			continue
		}
		fresh = append(fresh, rk)
	}
	if len(fresh) == 0 {
		return nil, fmt.Errorf("%s: %w", base, ErrDuplicate)
	}
	if len(old.all)+len(fresh) > r.cfg.MaxWorkers {
		return nil, fmt.Errorf("%s: %w (%d + %d > %d)", base, ErrTooManyWorkers, len(old.all), len(fresh), r.cfg.MaxWorkers)
	}
	up := r.ups[base]
	if up == nil {
		up = &upstream{client: newHostClient(base, r.cfg.RequestTimeout, r.cfg.ConnectTimeout, r.cfg.Dial), discovering: make(chan struct{}, 1)}
		up.client.Transport = r.xport
		r.ups[base] = up
	}
	var added []*Worker
	for _, rk := range fresh {
		url := base
		if rk >= 0 {
			url = base + "@" + strconv.Itoa(rk)
		}
		r.nextID++
		w := &Worker{id: r.nextID, url: url, base: base, rank: rk, client: up.client, up: up, reg: r, hash: Hash64([]byte(url)), fixed: models != nil, role: role}
		if rk >= 0 {
			w.rankS = strconv.Itoa(rk)
		}
		if set != nil {
			w.models.Store(set)
		}
		w.healthy.Store(healthy)
		added = append(added, w)
	}
	all := append(append([]*Worker(nil), old.all...), added...)
	r.snap.Store(buildSnapshot(all))
	r.subscribeKV(added)
	for _, w := range added {
		r.cfg.Logger.Info("worker added", "worker", w.url, "role", w.role.String(), "models", w.Models(), "healthy", healthy)
	}
	return added, nil
}

// Remove drops rawURL: one rank when it names "url@rank", every rank of a base
// URL otherwise. It returns the removed workers; their KV-event
// subscriptions are closed, then the OnRemove listeners run for each.
func (r *Registry) Remove(rawURL string) []*Worker {
	base, rank, err := ParseWorkerURL(rawURL)
	if err != nil {
		return nil
	}
	r.mu.Lock()
	old := r.snap.Load()
	var keep, gone []*Worker
	for _, w := range old.all {
		if w.base == base && (rank < 0 || w.rank == rank) {
			gone = append(gone, w)
			continue
		}
		keep = append(keep, w)
	}
	if len(gone) > 0 {
		r.snap.Store(buildSnapshot(keep))
		if rank < 0 || !hasBase(keep, base) {
			delete(r.ups, base) // in-flight requests keep their *Worker and client
		}
	}
	listeners := r.onRemove
	subs := r.unsubscribeKV(gone)
	r.mu.Unlock()
	for _, s := range subs {
		s.Close() // no batch of a removed worker after its OnRemove listeners start
	}
	for _, w := range gone {
		w.removed.Store(true)
		for _, f := range listeners {
			f(w)
		}
		r.cfg.Logger.Info("worker removed", "worker", w.url)
	}
	return gone
}

func hasBase(ws []*Worker, base string) bool {
	for _, w := range ws {
		if w.base == base {
			return true
		}
	}
	return false
}

// OnRemove registers f to run after each worker leaves the registry, so
// that the owner of per-worker state (a policy) drops it eagerly.
func (r *Registry) OnRemove(f func(*Worker)) {
	r.mu.Lock()
	r.onRemove = append(r.onRemove[:len(r.onRemove):len(r.onRemove)], f)
	r.mu.Unlock()
}

// Workers returns every registered worker, whatever its role. The slice is
// shared: do not modify.
func (r *Registry) Workers() []*Worker { return r.snap.Load().all }

// Models returns the sorted names of the models entry workers (Regular or
// Prefill) serve explicitly.
func (r *Registry) Models() []string { return r.snap.Load().models }

// MinModelLen returns the smallest max_model_len any worker reports for any
// model, 0 when none reports one: a request shorter than it fits everywhere
// (docs/design.md §8.4).
func (r *Registry) MinModelLen() int { return r.snap.Load().minCtx }

// ByID returns the worker with id, or nil when it is not registered.
func (r *Registry) ByID(id uint32) *Worker { return r.snap.Load().byID[id] }

// ByURL returns the worker named url ("base" or "base@rank"), or nil.
func (r *Registry) ByURL(url string) *Worker { return r.snap.Load().byURL[url] }

// ForModel returns the entry workers (Regular and Prefill: those the worker
// step chooses among) that may serve model, healthy or not (the slice is
// shared, do not modify), and whether any does. An empty model means every
// entry worker. Lock-free and allocation-free.
func (r *Registry) ForModel(model []byte) ([]*Worker, bool) {
	s := r.snap.Load()
	return s.entry.forModel(model)
}

// DecodeWorkers is ForModel for the Decode workers of model.
func (r *Registry) DecodeWorkers(model []byte) ([]*Worker, bool) {
	s := r.snap.Load()
	return s.decode.forModel(model)
}

// Serves reports whether some entry worker serves model explicitly.
func (r *Registry) Serves(model string) bool {
	_, ok := r.snap.Load().entry.byModel[model]
	return ok
}

func buildSnapshot(all []*Worker) *snapshot {
	s := &snapshot{
		all:    all,
		byURL:  make(map[string]*Worker, len(all)),
		byID:   make(map[uint32]*Worker, len(all)),
		entry:  roleView{byModel: map[string][]*Worker{}},
		decode: roleView{byModel: map[string][]*Worker{}},
	}
	for _, w := range all {
		s.byURL[w.url] = w
		s.byID[w.id] = w
		v := &s.entry
		if w.role == Decode {
			v = &s.decode
		}
		v.all = append(v.all, w)
		ms := w.Models()
		if ms == nil {
			v.wildcard = append(v.wildcard, w)
			continue
		}
		for _, m := range ms {
			v.byModel[m] = append(v.byModel[m], w)
			if l := w.MaxModelLen(m); v == &s.entry && l > 0 && (s.minCtx == 0 || l < s.minCtx) {
				s.minCtx = l
			}
		}
	}
	for _, v := range []*roleView{&s.entry, &s.decode} {
		for m := range v.byModel {
			v.byModel[m] = append(v.byModel[m], v.wildcard...)
		}
	}
	for m := range s.entry.byModel {
		s.models = append(s.models, m)
	}
	sortStrings(s.models)
	return s
}

// SetHealthy forces a worker's health-check state (admin and tests) and
// closes its circuit breaker.
func (r *Registry) SetHealthy(w *Worker, ok bool) {
	w.fails.Store(0)
	w.oks.Store(0)
	r.resetBreaker(w)
	w.healthy.Store(ok)
}

// needsProbe reports whether w is probed every UnhealthyProbeInterval rather
// than every HealthInterval.
func needsProbe(w *Worker) bool { return !w.healthy.Load() || w.cbUntil.Load() != 0 }

// RunHealthChecks probes each base URL until ctx ends: every HealthInterval
// while all its workers are healthy, every UnhealthyProbeInterval while one is
// not (health checks failing, or breaker Open or HalfOpen). Health flips after
// FailureThreshold failures or SuccessThreshold successes; after a successful
// check the models are rediscovered (models.go). Probes run asynchronously, at
// most one per base URL at a time (shared with ProbeSoon), so a slow worker
// delays nobody else's probes. Run it once per registry.
func (r *Registry) RunHealthChecks(ctx context.Context) {
	tick := min(r.cfg.UnhealthyProbeInterval, r.cfg.HealthInterval)
	every := func(d time.Duration) uint64 { return uint64(max(1, (d+tick/2)/tick)) }
	everyHealthy, everyUnhealthy := every(r.cfg.HealthInterval), every(r.cfg.UnhealthyProbeInterval)
	t := time.NewTicker(tick)
	defer t.Stop()
	last := map[string]uint64{} // base URL → tick of its last probe
	var n uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n++
		bases, byBase := groupByBase(r.Workers())
		seen := make(map[string]struct{}, len(bases))
		for _, b := range bases {
			seen[b] = struct{}{}
			ws := byBase[b]
			period := everyHealthy
			for _, w := range ws {
				if needsProbe(w) {
					period = everyUnhealthy
					break
				}
			}
			if n-last[b] >= period && r.probeAsync(ctx, ws[0]) {
				last[b] = n
			}
		}
		for b := range last {
			if _, ok := seen[b]; !ok {
				delete(last, b)
			}
		}
	}
}

// ProbeSoon starts a health probe (and pending discovery) of w's base URL
// now, in the background, unless one is already in flight for that base URL.
// It never blocks: call it from the request path when a worker looks dead
// (a first-byte timeout, a connect error). RecordFailure calls it when the
// breaker opens.
func (r *Registry) ProbeSoon(w *Worker) {
	r.probeAsync(context.Background(), w)
}

// probeAsync starts a probe of w's base URL unless one is in flight, and
// reports whether it started one.
func (r *Registry) probeAsync(ctx context.Context, w *Worker) bool {
	up := w.up
	if up == nil || w.removed.Load() || !up.probing.CompareAndSwap(false, true) {
		return false
	}
	r.probes.Add(1)
	go func() {
		defer r.probes.Done()
		defer up.probing.Store(false)
		var ws []*Worker
		for _, o := range r.Workers() {
			if o.up == up {
				ws = append(ws, o)
			}
		}
		if len(ws) > 0 {
			r.checkBase(ctx, w.base, ws, false)
		}
	}()
	return true
}

func groupByBase(all []*Worker) ([]string, map[string][]*Worker) {
	byBase := map[string][]*Worker{}
	var bases []string
	for _, w := range all {
		if _, ok := byBase[w.base]; !ok {
			bases = append(bases, w.base)
		}
		byBase[w.base] = append(byBase[w.base], w)
	}
	return bases, byBase
}

// CheckOnce runs one round of health checks (and model rediscovery) of every
// base URL and returns when all are done. It probes regardless of probes in
// flight from RunHealthChecks or ProbeSoon, and waits for their discovery.
func (r *Registry) CheckOnce(ctx context.Context) {
	bases, byBase := groupByBase(r.Workers())
	var wg sync.WaitGroup
	for _, b := range bases {
		wg.Add(1)
		go func(base string, ws []*Worker) {
			defer wg.Done()
			r.checkBase(ctx, base, ws, true)
		}(b, byBase[b])
	}
	wg.Wait()
}

// checkBase probes base and feeds the result to each of its workers ws;
// when the probe passed, it rediscovers their models, waiting for a
// discovery in flight when wait is set and skipping it otherwise.
func (r *Registry) checkBase(ctx context.Context, base string, ws []*Worker, wait bool) {
	started := r.nowNano()
	ok := r.probe(ctx, base)
	if !ok && ctx.Err() != nil {
		return // shutting down: not the worker's failure
	}
	for _, w := range ws {
		r.observeHealth(w, ok, started)
	}
	if ok {
		_ = r.rediscover(ctx, ws[0].up, base, wait) // a failure changes nothing
	}
}

func (r *Registry) observeHealth(w *Worker, ok bool, started int64) {
	if ok {
		w.fails.Store(0)
		n := w.oks.Add(1)
		if !w.healthy.Load() && int(n) >= r.cfg.SuccessThreshold {
			w.healthy.Store(true)
			r.cfg.Logger.Info("worker healthy", "worker", w.url)
		}
		r.breakerProbe(w, true, started, int(n))
		return
	}
	w.oks.Store(0)
	if n := w.fails.Add(1); w.healthy.Load() && int(n) >= r.cfg.FailureThreshold {
		w.healthy.Store(false)
		r.cfg.Logger.Warn("worker unhealthy", "worker", w.url, "consecutive_failures", n)
	}
	r.breakerProbe(w, false, started, 0)
}

func (r *Registry) probe(ctx context.Context, base string) bool {
	code, _, err := r.get(ctx, base+r.cfg.HealthEndpoint)
	return err == nil && code >= 200 && code < 300
}

// get fetches url with the probe client: the connect timeout, HealthTimeout
// (or ctx's deadline, when sooner) for the whole call, and a 1 MiB body limit
// (fasthttp.ErrBodyTooLarge beyond it).
func (r *Registry) get(ctx context.Context, url string) (int, []byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodGet)
	if k := *r.apiKey.Load(); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	timeout := r.cfg.HealthTimeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	if err := r.probeHC.DoTimeout(req, resp, timeout); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

// WriteMetrics writes the per-worker series of this registry in Prometheus
// text format: the gauges vllm_router_running_requests{worker},
// vllm_router_worker_health{worker} (1 when Healthy) and
// vllm_router_circuit_breaker_state{worker} (0 closed, 1 open, 2 half-open),
// the counter vllm_router_circuit_breaker_opens_total{worker}, the info
// gauge vllm_router_worker_role{worker,role} (always 1).
// With LoadScrapeInterval set (docs/design.md §8.3) it adds
// vllm_router_worker_fleet_load{worker} (Worker.FleetLoad),
// vllm_router_worker_load_scrape_failures_total{worker} and, for workers
// with a fresh report, vllm_router_worker_reported_running{worker},
// vllm_router_worker_reported_waiting{worker} and
// vllm_router_worker_kv_cache_usage{worker} (0..1, when reported), and
// vllm_router_worker_kv_capacity_tokens{worker} for workers whose engine
// states its capacity (Worker.KVCapacityTokens), and
// vllm_router_worker_kv_load_failures_total{worker} for decode workers
// (Worker.KVLoadFailures). With KVEvents set it adds, per worker whose
// engine it follows, the counters vllm_router_kv_events_batches_total,
// _gaps_total, _replays_total, _resyncs_total, _decode_errors_total and
// _connects_total{worker} (kvevents.Counters). And the series of each
// DNSDiscovery and K8sDiscovery of the registry.
func (r *Registry) WriteMetrics(w io.Writer) {
	ws := r.Workers()
	labels := make([]string, len(ws))
	for i, wk := range ws {
		labels[i] = "{" + promtext.Label("worker", wk.url) + "}"
	}
	for i, wk := range ws {
		metrics.WriteGaugeUint64(w, "vllm_router_running_requests"+labels[i], uint64(max(wk.Load(), 0)))
	}
	for i, wk := range ws {
		h := uint64(0)
		if wk.Healthy() {
			h = 1
		}
		metrics.WriteGaugeUint64(w, "vllm_router_worker_health"+labels[i], h)
	}
	for i, wk := range ws {
		metrics.WriteGaugeUint64(w, "vllm_router_circuit_breaker_state"+labels[i], uint64(wk.BreakerState()))
	}
	for i, wk := range ws {
		metrics.WriteCounterUint64(w, "vllm_router_circuit_breaker_opens_total"+labels[i], wk.BreakerOpenings())
	}
	for i, wk := range ws {
		metrics.WriteGaugeUint64(w, "vllm_router_worker_role"+labels[i][:len(labels[i])-1]+","+promtext.Label("role", wk.role.String())+"}", 1)
	}
	if r.cfg.LoadScrapeInterval > 0 {
		r.writeLoadMetrics(w, ws, labels)
	}
	if r.kv != nil {
		r.writeKVMetrics(w, ws, labels)
	}
	r.mu.Lock()
	dns, k8s := r.dns, r.k8s
	r.mu.Unlock()
	for _, d := range dns {
		d.WriteMetrics(w)
	}
	for _, d := range k8s {
		d.WriteMetrics(w)
	}
}

func (r *Registry) writeLoadMetrics(w io.Writer, ws []*Worker, labels []string) {
	reps := make([]LoadReport, len(ws))
	fresh := make([]bool, len(ws))
	for i, wk := range ws {
		reps[i], fresh[i] = wk.LoadReport()
	}
	for i, wk := range ws {
		metrics.WriteGaugeUint64(w, "vllm_router_worker_fleet_load"+labels[i], uint64(max(wk.FleetLoad(), 0)))
	}
	for i, wk := range ws {
		metrics.WriteCounterUint64(w, "vllm_router_worker_load_scrape_failures_total"+labels[i], wk.LoadScrapeFailures())
	}
	for i := range ws {
		if fresh[i] {
			metrics.WriteGaugeUint64(w, "vllm_router_worker_reported_running"+labels[i], uint64(reps[i].Running))
		}
	}
	for i := range ws {
		if fresh[i] {
			metrics.WriteGaugeUint64(w, "vllm_router_worker_reported_waiting"+labels[i], uint64(reps[i].Waiting))
		}
	}
	for i := range ws {
		if fresh[i] && reps[i].KVCacheUsage >= 0 {
			metrics.WriteGaugeFloat64(w, "vllm_router_worker_kv_cache_usage"+labels[i], reps[i].KVCacheUsage)
		}
	}
	for i, wk := range ws {
		if c := wk.KVCapacityTokens(); c > 0 {
			metrics.WriteGaugeUint64(w, "vllm_router_worker_kv_capacity_tokens"+labels[i], uint64(c))
		}
	}
	for i, wk := range ws {
		if wk.role == Decode {
			metrics.WriteCounterUint64(w, "vllm_router_worker_kv_load_failures_total"+labels[i], wk.KVLoadFailures())
		}
	}
}
