package loadview

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"

	"github.com/bytedance/sonic"
)

// Models that change at run time (docs/design.md §8.4). A worker's models
// are rediscovered from GET /v1/models after every successful health check
// and whenever Registry.Rediscover asks (after a LoRA adapter call): a model
// that appears becomes routable, one that disappears is no longer offered
// (ForModel), and the OnModelsChange listeners learn both. Workers whose
// models were given to Add keep them. A failed, non-200, malformed or empty
// answer changes nothing and never touches health. At most one discovery
// per base URL is in flight; ranks of one URL share its answer.

// ModelInfo is what a worker's /v1/models says of one model, as vLLM lists
// it: a LoRA adapter has its path as Root and its base model as Parent.
type ModelInfo struct {
	ID          string
	Root        string
	Parent      string // a LoRA adapter's base model; "" for a base model
	MaxModelLen int    // 0: not reported (vLLM reports none for adapters)
	Created     int64
	OwnedBy     string
}

// modelSet is one worker's models: immutable once stored.
type modelSet struct {
	names []string       // in the worker's order, no duplicates
	infos []ModelInfo    // parallel to names
	byID  map[string]int // name → index
}

func newModelSet(infos []ModelInfo) *modelSet {
	s := &modelSet{byID: make(map[string]int, len(infos))}
	for _, m := range infos {
		if _, dup := s.byID[m.ID]; dup || m.ID == "" {
			continue
		}
		s.byID[m.ID] = len(s.infos)
		s.infos = append(s.infos, m)
		s.names = append(s.names, m.ID)
	}
	return s
}

// fixedModelSet is the set of models given to Add.
func fixedModelSet(names []string) *modelSet {
	infos := make([]ModelInfo, len(names))
	for i, n := range names {
		infos[i].ID = n
	}
	return newModelSet(infos)
}

func (s *modelSet) has(model string) bool {
	_, ok := s.byID[model]
	return ok
}

// diff returns the models of s absent from old, and those of old absent
// from s; a nil old (models unknown) has none.
func (s *modelSet) diff(old *modelSet) (added, removed []string) {
	for _, n := range s.names {
		if old == nil || !old.has(n) {
			added = append(added, n)
		}
	}
	if old != nil {
		for _, n := range old.names {
			if !s.has(n) {
				removed = append(removed, n)
			}
		}
	}
	return added, removed
}

// ModelChange is what one rediscovery changed on one worker: models it now
// serves and models it no longer serves. The registry's snapshot already
// reflects it when listeners run.
type ModelChange struct {
	Worker         *Worker
	Added, Removed []string
}

// OnModelsChange registers f to run after a rediscovery adds or removes
// models of a worker, so that the owner of per-model state (a policy) drops
// what it holds of the worker in each removed model. Listeners of one base
// URL run in discovery order, outside the registry lock.
func (r *Registry) OnModelsChange(f func(ModelChange)) {
	r.mu.Lock()
	r.onModels = append(r.onModels[:len(r.onModels):len(r.onModels)], f)
	r.mu.Unlock()
}

// Serves reports whether the worker serves model: true for every model
// while its models are unknown (as ForModel treats it).
func (w *Worker) Serves(model string) bool {
	s := w.models.Load()
	return s == nil || len(s.names) == 0 || s.has(model)
}

// ModelInfo returns what the worker's /v1/models said of model; false when
// it did not list it (or its models were given to Add, with ID alone).
func (w *Worker) ModelInfo(model string) (ModelInfo, bool) {
	s := w.models.Load()
	if s == nil {
		return ModelInfo{}, false
	}
	i, ok := s.byID[model]
	if !ok {
		return ModelInfo{}, false
	}
	return s.infos[i], true
}

// MaxModelLen returns the context length the worker reports for model (a
// LoRA adapter's is its parent's), 0 when unknown.
func (w *Worker) MaxModelLen(model string) int {
	m, ok := w.ModelInfo(model)
	if ok && m.MaxModelLen == 0 && m.Parent != "" {
		m, _ = w.ModelInfo(m.Parent)
	}
	return m.MaxModelLen
}

// Rediscover asks w's base URL for its models now and applies the answer to
// every rank of it, waiting for a discovery already in flight first (its
// answer may predate the caller's change). Call it after a LoRA adapter was
// loaded or unloaded. A failed answer changes nothing and is returned.
// Workers whose models were given to Add are left alone.
func (r *Registry) Rediscover(ctx context.Context, w *Worker) error {
	if w.up == nil || w.removed.Load() {
		return fmt.Errorf("%s: not registered", w.url)
	}
	return r.rediscover(ctx, w.up, w.base, true)
}

// rediscover runs one discovery of base, whose workers share up, and applies
// it. With wait false it does nothing when a discovery is in flight.
func (r *Registry) rediscover(ctx context.Context, up *upstream, base string, wait bool) error {
	if wait {
		select {
		case up.discovering <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	} else {
		select {
		case up.discovering <- struct{}{}:
		default:
			return nil
		}
	}
	defer func() { <-up.discovering }()
	var ws []*Worker
	for _, o := range r.Workers() {
		if o.up == up && !o.fixed {
			ws = append(ws, o)
		}
	}
	if len(ws) == 0 {
		return nil
	}
	set, err := r.discover(ctx, base)
	if err != nil {
		r.cfg.Logger.Debug("model discovery failed; models unchanged", "worker", base, "err", err)
		return err
	}
	r.setModels(ws, set)
	return nil
}

// setModels stores set on each of ws whose models differ, publishes a new
// snapshot if any did, then tells the OnModelsChange listeners.
func (r *Registry) setModels(ws []*Worker, set *modelSet) {
	r.mu.Lock()
	var changes []ModelChange
	changed := false
	for _, w := range ws {
		old := w.models.Load()
		if w.removed.Load() || (old != nil && slices.Equal(old.infos, set.infos)) {
			continue
		}
		w.models.Store(set)
		changed = true
		if added, removed := set.diff(old); len(added)+len(removed) > 0 {
			changes = append(changes, ModelChange{Worker: w, Added: added, Removed: removed})
		}
	}
	if changed {
		r.snap.Store(buildSnapshot(r.snap.Load().all))
	}
	listeners := r.onModels
	r.mu.Unlock()
	for _, c := range changes {
		r.cfg.Logger.Info("worker models changed", "worker", c.Worker.url, "added", c.Added, "removed", c.Removed)
		for _, f := range listeners {
			f(c)
		}
	}
}

// discover asks base for GET /v1/models. An answer that is not a 200 with
// a JSON model list of 1 to maxModels models, each max_model_len absent,
// null or positive, is an error.
func (r *Registry) discover(ctx context.Context, base string) (*modelSet, error) {
	code, body, err := r.get(ctx, base+"/v1/models")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s/v1/models: status %d", base, code)
	}
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			Root        string `json:"root"`
			Parent      string `json:"parent"`
			MaxModelLen *int64 `json:"max_model_len"`
			Created     int64  `json:"created"`
			OwnedBy     string `json:"owned_by"`
		} `json:"data"`
	}
	if err := sonic.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("GET %s/v1/models: %w", base, err)
	}
	if len(list.Data) > maxModels {
		return nil, fmt.Errorf("GET %s/v1/models: %d models, more than %d", base, len(list.Data), maxModels)
	}
	infos := make([]ModelInfo, 0, len(list.Data))
	for _, m := range list.Data {
		info := ModelInfo{ID: m.ID, Root: m.Root, Parent: m.Parent, Created: m.Created, OwnedBy: m.OwnedBy}
		if p := m.MaxModelLen; p != nil {
			if *p <= 0 || *p > 1<<40 {
				return nil, fmt.Errorf("GET %s/v1/models: model %q: max_model_len %d", base, m.ID, *p)
			}
			info.MaxModelLen = int(*p)
		}
		infos = append(infos, info)
	}
	set := newModelSet(infos)
	if len(set.names) == 0 {
		return nil, fmt.Errorf("GET %s/v1/models: no models", base)
	}
	return set, nil
}

// RediscoverAll asks every base URL whose models are discovered for them
// now, all at once, and returns when every answer is applied or failed,
// each call bounded by ctx's deadline and HealthTimeout; a discovery in
// flight for a base URL is waited for first. The router
// calls it, rate-limited, for a model no worker lists (docs/design.md
// §8.4): an adapter loaded on a worker directly is then routable at once.
func (r *Registry) RediscoverAll(ctx context.Context) {
	r.mu.Lock()
	ups := make(map[string]*upstream, len(r.ups))
	for base, up := range r.ups {
		ups[base] = up
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for base, up := range ups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.rediscover(ctx, up, base, true) // a failure changes nothing and is logged
		}()
	}
	wg.Wait()
}
