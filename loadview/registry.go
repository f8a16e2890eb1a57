package loadview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"
)

// Config holds the registry settings (the router's flags).
type Config struct {
	DPSize             int               // --intra-node-data-parallel-size: ranks per URL without an explicit @rank
	RequestTimeout     time.Duration     // upstream read/write timeout
	HealthEndpoint     string            // --health-check-endpoint, default /health
	HealthInterval     time.Duration     // --health-check-interval-secs
	HealthTimeout      time.Duration     // one health check's deadline
	FailureThreshold   int               // consecutive failed checks before unhealthy
	SuccessThreshold   int               // consecutive good checks before healthy again
	CBFailureThreshold int               // consecutive failed requests that open the circuit (mark unhealthy); 0 disables
	APIKey             string            // sent as a bearer token on health and discovery calls
	Dial               fasthttp.DialFunc // upstream dialer; nil: TCP (benchmarks dial in-memory listeners)
	Logger             *slog.Logger
}

func (c *Config) setDefaults() {
	if c.DPSize < 1 {
		c.DPSize = 1
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 1800 * time.Second
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
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// snapshot is an immutable view of the fleet. Never modified after publish.
type snapshot struct {
	all      []*Worker
	byURL    map[string]*Worker
	byID     map[uint32]*Worker
	byModel  map[string][]*Worker // explicit servers of a model, plus wildcard workers
	wildcard []*Worker            // workers whose models are unknown
	models   []string             // sorted model names served explicitly
}

// Registry is the set of workers. Reads are lock-free snapshot loads; writes
// (Add, Remove, discovery) are serialized by mu and publish a new snapshot.
type Registry struct {
	cfg    Config
	mu     sync.Mutex
	nextID uint32
	snap   atomic.Pointer[snapshot]
	// clients are shared by every rank of one base URL.
	clients  map[string]*fasthttp.HostClient
	onRemove []func(*Worker) // under mu; see OnRemove
}

// NewRegistry returns an empty registry.
func NewRegistry(cfg Config) *Registry {
	cfg.setDefaults()
	r := &Registry{cfg: cfg, clients: map[string]*fasthttp.HostClient{}}
	r.snap.Store(buildSnapshot(nil))
	return r
}

// ErrDuplicate is returned when adding a worker URL that is already present.
var ErrDuplicate = errors.New("worker already registered")

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// Add registers rawURL ("http://h:p" or "http://h:p@rank"). Without an explicit
// rank and with DPSize > 1 it adds one worker per rank. models, when non-nil,
// fixes the served models; otherwise they are discovered from GET /v1/models
// (a worker whose discovery fails serves any model until discovery succeeds).
// The new workers start healthy when their first health check passes.
func (r *Registry) Add(ctx context.Context, rawURL string, models []string) ([]*Worker, error) {
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
	if models == nil {
		models, _ = r.discover(ctx, base)
	}
	healthy := r.probe(ctx, base)

	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.snap.Load()
	var added []*Worker
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
		client := r.clients[base]
		if client == nil {
			client = newHostClient(base, r.cfg.RequestTimeout)
			client.Dial = r.cfg.Dial
			r.clients[base] = client
		}
		r.nextID++
		w := &Worker{id: r.nextID, url: url, base: base, rank: rk, client: client, hash: Hash64([]byte(url))}
		if rk >= 0 {
			w.rankS = strconv.Itoa(rk)
		}
		if models != nil {
			ms := append([]string(nil), models...)
			w.models.Store(&ms)
		}
		w.healthy.Store(healthy)
		added = append(added, w)
	}
	if len(added) == 0 {
		return nil, fmt.Errorf("%s: %w", base, ErrDuplicate)
	}
	all := append(append([]*Worker(nil), old.all...), added...)
	r.snap.Store(buildSnapshot(all))
	for _, w := range added {
		r.cfg.Logger.Info("worker added", "worker", w.url, "models", w.Models(), "healthy", healthy)
	}
	return added, nil
}

// Remove drops rawURL: one rank when it names "url@rank", every rank of a base
// URL otherwise. It returns the removed workers; the OnRemove listeners run
// for each.
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
	}
	listeners := r.onRemove
	r.mu.Unlock()
	for _, w := range gone {
		w.removed.Store(true)
		for _, f := range listeners {
			f(w)
		}
		r.cfg.Logger.Info("worker removed", "worker", w.url)
	}
	return gone
}

// OnRemove registers f to run after each worker leaves the registry, so
// that the owner of per-worker state (a policy) drops it eagerly.
func (r *Registry) OnRemove(f func(*Worker)) {
	r.mu.Lock()
	r.onRemove = append(r.onRemove[:len(r.onRemove):len(r.onRemove)], f)
	r.mu.Unlock()
}

// Workers returns every registered worker. The slice is shared: do not modify.
func (r *Registry) Workers() []*Worker { return r.snap.Load().all }

// Models returns the sorted names of the models served explicitly.
func (r *Registry) Models() []string { return r.snap.Load().models }

// ByID returns the worker with id, or nil when it is not registered.
func (r *Registry) ByID(id uint32) *Worker { return r.snap.Load().byID[id] }

// ByURL returns the worker named url ("base" or "base@rank"), or nil.
func (r *Registry) ByURL(url string) *Worker { return r.snap.Load().byURL[url] }

// ForModel returns the workers that may serve model (healthy or not; the
// slice is shared, do not modify) and whether any does. An empty model means
// every worker. Lock-free and allocation-free.
func (r *Registry) ForModel(model []byte) ([]*Worker, bool) {
	s := r.snap.Load()
	if len(model) == 0 {
		return s.all, len(s.all) > 0
	}
	if ws, ok := s.byModel[string(model)]; ok {
		return ws, true
	}
	return s.wildcard, len(s.wildcard) > 0
}

// Serves reports whether some worker serves model explicitly.
func (r *Registry) Serves(model string) bool {
	_, ok := r.snap.Load().byModel[model]
	return ok
}

func buildSnapshot(all []*Worker) *snapshot {
	s := &snapshot{
		all:     all,
		byURL:   make(map[string]*Worker, len(all)),
		byID:    make(map[uint32]*Worker, len(all)),
		byModel: map[string][]*Worker{},
	}
	for _, w := range all {
		s.byURL[w.url] = w
		s.byID[w.id] = w
		ms := w.Models()
		if ms == nil {
			s.wildcard = append(s.wildcard, w)
			continue
		}
		for _, m := range ms {
			s.byModel[m] = append(s.byModel[m], w)
		}
	}
	for m := range s.byModel {
		s.byModel[m] = append(s.byModel[m], s.wildcard...)
		s.models = append(s.models, m)
	}
	sortStrings(s.models)
	return s
}

// RecordResult feeds the circuit breaker with the outcome of one proxied
// request: CBFailureThreshold consecutive failures mark the worker unhealthy
// until health checks pass SuccessThreshold times.
func (r *Registry) RecordResult(w *Worker, ok bool) {
	if ok {
		if w.errs.Load() != 0 { // read first: no cache-line write per request
			w.errs.Store(0)
		}
		return
	}
	n := w.errs.Add(1)
	if r.cfg.CBFailureThreshold > 0 && int(n) >= r.cfg.CBFailureThreshold && w.healthy.CompareAndSwap(true, false) {
		w.oks.Store(0)
		r.cfg.Logger.Warn("circuit opened: worker marked unhealthy", "worker", w.url, "consecutive_failures", n)
	}
}

// SetHealthy forces a worker's health (admin and tests).
func (r *Registry) SetHealthy(w *Worker, ok bool) {
	w.fails.Store(0)
	w.oks.Store(0)
	w.errs.Store(0)
	w.healthy.Store(ok)
}

// RunHealthChecks probes every base URL each HealthInterval until ctx ends,
// flipping health after FailureThreshold failures or SuccessThreshold
// successes, and retrying model discovery where it has not succeeded.
func (r *Registry) RunHealthChecks(ctx context.Context) {
	t := time.NewTicker(r.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.CheckOnce(ctx)
		}
	}
}

// CheckOnce runs one round of health checks (and pending discovery).
func (r *Registry) CheckOnce(ctx context.Context) {
	byBase := map[string][]*Worker{}
	var bases []string
	for _, w := range r.Workers() {
		if _, ok := byBase[w.base]; !ok {
			bases = append(bases, w.base)
		}
		byBase[w.base] = append(byBase[w.base], w)
	}
	var wg sync.WaitGroup
	for _, b := range bases {
		wg.Add(1)
		go func(base string, ws []*Worker) {
			defer wg.Done()
			ok := r.probe(ctx, base)
			for _, w := range ws {
				r.observeHealth(w, ok)
			}
			if ok && ws[0].models.Load() == nil {
				if ms, err := r.discover(ctx, base); err == nil {
					r.setModels(ws, ms)
				}
			}
		}(b, byBase[b])
	}
	wg.Wait()
}

func (r *Registry) observeHealth(w *Worker, ok bool) {
	if ok {
		w.fails.Store(0)
		if n := w.oks.Add(1); !w.healthy.Load() && int(n) >= r.cfg.SuccessThreshold {
			w.errs.Store(0)
			w.healthy.Store(true)
			r.cfg.Logger.Info("worker healthy", "worker", w.url)
		}
		return
	}
	w.oks.Store(0)
	if n := w.fails.Add(1); w.healthy.Load() && int(n) >= r.cfg.FailureThreshold {
		w.healthy.Store(false)
		r.cfg.Logger.Warn("worker unhealthy", "worker", w.url, "consecutive_failures", n)
	}
}

func (r *Registry) setModels(ws []*Worker, models []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ws {
		ms := append([]string(nil), models...)
		w.models.Store(&ms)
	}
	r.snap.Store(buildSnapshot(r.snap.Load().all))
	r.cfg.Logger.Info("models discovered", "worker", ws[0].base, "models", models)
}

func (r *Registry) probe(ctx context.Context, base string) bool {
	code, _, err := r.get(ctx, base+r.cfg.HealthEndpoint)
	return err == nil && code >= 200 && code < 300
}

// discover asks base for GET /v1/models and returns the model ids.
func (r *Registry) discover(ctx context.Context, base string) ([]string, error) {
	code, body, err := r.get(ctx, base+"/v1/models")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s/v1/models: status %d", base, code)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := sonic.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("GET %s/v1/models: %w", base, err)
	}
	models := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID != "" {
			models = append(models, m.ID)
		}
	}
	if len(models) == 0 {
		return nil, fmt.Errorf("GET %s/v1/models: no models", base)
	}
	return models, nil
}

func (r *Registry) get(ctx context.Context, url string) (int, []byte, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(fasthttp.MethodGet)
	if r.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.cfg.APIKey)
	}
	timeout := r.cfg.HealthTimeout
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	if err := fasthttp.DoTimeout(req, resp, timeout); err != nil {
		return 0, nil, err
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), nil
}

// WriteMetrics writes the per-worker gauges of this registry in Prometheus
// text format: vllm_router_running_requests{worker} and
// vllm_router_worker_health{worker}.
func (r *Registry) WriteMetrics(w io.Writer) {
	ws := r.Workers()
	for _, wk := range ws {
		metrics.WriteGaugeUint64(w, `vllm_router_running_requests{worker=`+strconv.Quote(wk.url)+`}`, uint64(max(wk.Load(), 0)))
	}
	for _, wk := range ws {
		h := uint64(0)
		if wk.Healthy() {
			h = 1
		}
		metrics.WriteGaugeUint64(w, `vllm_router_worker_health{worker=`+strconv.Quote(wk.url)+`}`, h)
	}
}
