package loadview

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/k8swatch"
	"github.com/warmroute/warmroute/promtext"
)

// BootstrapPortAnnotation is the pod annotation the vLLM router reads a
// prefill worker's bootstrap port from (a number 1..65535; anything else
// is no port). NIXL needs none: it is recorded and logged, not used.
const BootstrapPortAnnotation = "vllm.ai/bootstrap-port"

// K8sSource is one watched selector and the role of the workers its pods
// become.
type K8sSource struct {
	Watcher *k8swatch.Watcher // configured with BootstrapPortAnnotation among its Annotations
	Role    Role
}

// K8sConfig configures a K8sDiscovery (docs/design.md §8.3, "Kubernetes
// discovery").
type K8sConfig struct {
	Port    int // the workers' port on each pod IP (--service-discovery-port)
	Sources []K8sSource
}

// K8sWorker is a worker a K8sDiscovery added and holds.
type K8sWorker struct {
	URL           string
	Role          Role
	Pod           string // namespace/name
	BootstrapPort int    // a prefill pod's vllm.ai/bootstrap-port; 0: none
}

// K8sDiscovery keeps the registry's workers in step with the pods that
// label selectors pick (docs/design.md §8.3, "Kubernetes discovery"), by
// the rules of DNSDiscovery: each ready pod (an IP, phase Running, the
// Ready condition True, not being deleted) is registered as
// http://PODIP:PORT in its source's role through Admit and AddRole; a
// worker of its own whose pod is gone, not ready or changed role is removed
// with Registry.Remove, which drains it. It removes only workers it added,
// and only on what the API server stated: a watch that fails keeps its
// last pods, so an API outage empties nothing. A pod two selectors pick
// takes the first role of prefill, decode, regular (the vLLM router's
// order).
type K8sDiscovery struct {
	reg  *Registry
	cfg  K8sConfig
	port string

	mu    sync.Mutex              // serializes Sync
	fleet ownedWorkers[K8sWorker] // the workers this discovery added; under mu
	noted map[string]struct{}     // the workers held whose bootstrap port was logged; under mu

	wake      chan struct{} // a watcher changed (buffer 1)
	firstSync chan struct{} // closed after the first Sync with every watcher synced
	closed    atomic.Bool
	byRole    [3]atomic.Int64 // owned workers per role
}

// NewK8sDiscovery returns a discovery of cfg's sources for r; Run starts
// it. Its series are written by r.WriteMetrics. Each watcher's OnChange
// must call the discovery's Notify.
func NewK8sDiscovery(r *Registry, cfg K8sConfig) (*K8sDiscovery, error) {
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, errors.New("Kubernetes discovery: the workers' port must be 1-65535")
	}
	if len(cfg.Sources) == 0 {
		return nil, errors.New("Kubernetes discovery: no selector")
	}
	d := &K8sDiscovery{reg: r, cfg: cfg, port: strconv.Itoa(cfg.Port), noted: map[string]struct{}{},
		wake: make(chan struct{}, 1), firstSync: make(chan struct{})}
	d.fleet = newOwnedWorkers(r, func(w K8sWorker) Role { return w.Role },
		func(u string, w K8sWorker) {
			r.cfg.Logger.Info("worker's pod gone or not ready: removed", "worker", u, "pod", w.Pod, "role", w.Role.String())
		},
		func(u string, w K8sWorker, err error) {
			r.cfg.Logger.Warn("worker from Kubernetes not added", "worker", u, "pod", w.Pod, "err", err)
		})
	r.mu.Lock()
	r.k8s = append(r.k8s, d)
	r.mu.Unlock()
	return d, nil
}

// Notify asks Run for a Sync (a watcher's OnChange); it never blocks.
func (d *K8sDiscovery) Notify() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Run runs the watchers and syncs after their changes until ctx ends.
func (d *K8sDiscovery) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, s := range d.cfg.Sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Watcher.Run(ctx)
		}()
	}
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		}
		d.Sync(ctx)
	}
}

// WaitFirstSync waits until every watcher has listed and the fleet follows
// them, or for at most timeout; it reports which.
func (d *K8sDiscovery) WaitFirstSync(ctx context.Context, timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-d.firstSync:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// Workers returns the workers this discovery added and holds, by URL.
func (d *K8sDiscovery) Workers() []K8sWorker {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]K8sWorker, 0, len(d.fleet.owned))
	for _, w := range d.fleet.owned {
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].URL < out[j].URL })
	return out
}

// rolePriority orders the roles of a pod several selectors pick.
func rolePriority(r Role) int {
	switch r {
	case Prefill:
		return 0
	case Decode:
		return 1
	}
	return 2
}

// want is the workers the synced watchers' ready pods call for, and
// whether every watcher has synced.
func (d *K8sDiscovery) want() (map[string]K8sWorker, bool) {
	want := map[string]K8sWorker{}
	all := true
	for _, s := range d.cfg.Sources {
		pods, synced := s.Watcher.Pods()
		all = all && synced
		for _, p := range pods {
			ip, err := netip.ParseAddr(p.IP)
			if !p.Ready || err != nil || ip.Zone() != "" {
				continue
			}
			u := "http://" + net.JoinHostPort(ip.Unmap().String(), d.port)
			if prev, ok := want[u]; ok && rolePriority(prev.Role) <= rolePriority(s.Role) {
				continue
			}
			w := K8sWorker{URL: u, Role: s.Role, Pod: p.Key()}
			if s.Role == Prefill {
				if n, err := strconv.Atoi(p.Annotations[BootstrapPortAnnotation]); err == nil && n >= 1 && n <= 65535 {
					w.BootstrapPort = n
				}
			}
			want[u] = w
		}
	}
	return want, all
}

// Sync makes the fleet follow the watchers' pods: remove the workers of
// its own whose pod is no longer wanted in its role, add the new ones
// (at most maxParallelAdds at a time). Refused or failed additions are
// logged once while their pod stays.
func (d *K8sDiscovery) Sync(ctx context.Context) {
	d.mu.Lock()
	defer d.mu.Unlock()
	want, all := d.want()
	d.fleet.sync(ctx, want)
	var n [3]int64
	for u, w := range d.fleet.owned {
		n[w.Role]++
		if w.BootstrapPort != 0 {
			if _, ok := d.noted[u]; !ok {
				d.noted[u] = struct{}{}
				d.reg.cfg.Logger.Info("prefill pod's "+BootstrapPortAnnotation+" is read and unused: NIXL needs none", "worker", u, "port", w.BootstrapPort)
			}
		}
	}
	for u := range d.noted { // bounded by the workers it holds: a pod that left is logged again if it returns
		if _, ok := d.fleet.owned[u]; !ok {
			delete(d.noted, u)
		}
	}
	for r := range n {
		d.byRole[r].Store(n[r])
	}
	if all && !d.closed.Swap(true) {
		close(d.firstSync)
	}
}

// WriteMetrics writes, per selector: vllm_router_k8s_discovery_workers
// (workers it added and holds), vllm_router_k8s_discovery_pods (pods the
// watch tracks, ready or not), vllm_router_k8s_discovery_failures_total
// (failed lists and watches), vllm_router_k8s_discovery_relists_total
// (lists: the first and one per 410 Gone) and
// vllm_router_k8s_discovery_ignored_pods_total (pods past the tracking
// bound), each labelled {selector, role}.
func (d *K8sDiscovery) WriteMetrics(w io.Writer) {
	for _, s := range d.cfg.Sources {
		l := "{" + promtext.Label("selector", s.Watcher.Selector().String()) + "," + promtext.Label("role", s.Role.String()) + "}"
		metrics.WriteGaugeUint64(w, "vllm_router_k8s_discovery_workers"+l, uint64(max(d.byRole[s.Role].Load(), 0)))
		metrics.WriteGaugeUint64(w, "vllm_router_k8s_discovery_pods"+l, uint64(s.Watcher.Len()))
		metrics.WriteCounterUint64(w, "vllm_router_k8s_discovery_failures_total"+l, s.Watcher.Failures())
		metrics.WriteCounterUint64(w, "vllm_router_k8s_discovery_relists_total"+l, s.Watcher.Lists())
		metrics.WriteCounterUint64(w, "vllm_router_k8s_discovery_ignored_pods_total"+l, s.Watcher.Ignored())
	}
}
