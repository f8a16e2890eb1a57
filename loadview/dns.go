package loadview

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/promtext"
)

// DNSConfig configures a DNSDiscovery (docs/design.md §8.3).
type DNSConfig struct {
	Target   string        // NAME:PORT, e.g. a Kubernetes headless service "vllm.ns.svc.cluster.local:8000"
	Interval time.Duration // resolution period; default 10 s
	Timeout  time.Duration // one resolution's deadline; default min(Interval, 5 s)
	Network  string        // "ip" (A and AAAA; default), "ip4" (A) or "ip6" (AAAA)
	Resolver *net.Resolver // nil: net.DefaultResolver (tests point one at their own server)
	// Role is the role of the workers it adds (docs/design.md §9,
	// "Disaggregated fleets"); Regular by default.
	Role Role
}

// DNSDiscovery keeps the registry's workers in step with the addresses a
// name resolves to, without a Kubernetes client (docs/design.md §8.3). Each
// round resolves the name and, for each address, registers http://IP:PORT
// (IPv6 in brackets) in its Role through Admit and AddRole, so that the allow-list and
// MaxWorkers apply as to the admin API; workers it added whose address has
// vanished are removed with Registry.Remove, which drains them: they get no
// new requests and their requests in flight finish. It removes only workers
// it added (a URL already registered, e.g. by --worker-urls, is never its
// own), and nothing at all when the resolution fails or answers no address:
// a DNS outage must not empty the fleet. A worker of its own that someone
// else removed is forgotten, and added again while the name still lists it.
type DNSDiscovery struct {
	reg        *Registry
	cfg        DNSConfig
	name, port string
	res        *net.Resolver

	mu      sync.Mutex         // serializes Sync
	fleet   ownedWorkers[Role] // the workers this discovery added, in cfg.Role; under mu
	failing bool               // the last resolution failed (logged once per outage); under mu

	failures atomic.Uint64 // resolutions that failed or answered no address
	workers  atomic.Int64  // len(fleet.owned)
}

// ErrNoAddresses is the error of a resolution that succeeded with no address.
var ErrNoAddresses = errors.New("name resolved to no address")

// ParseDNSTarget checks a NAME:PORT target (a hostname, or an IP literal
// with IPv6 in brackets, and a port 1..65535) and returns its parts.
func ParseDNSTarget(target string) (name string, port int, err error) {
	host, p, err := net.SplitHostPort(strings.TrimSpace(target))
	if err != nil {
		return "", 0, fmt.Errorf("worker DNS target %q: want NAME:PORT: %v", target, err)
	}
	port, perr := strconv.Atoi(p)
	if perr != nil || port < 1 || port > 65535 || strings.ContainsAny(p, "+-") {
		return "", 0, fmt.Errorf("worker DNS target %q: invalid port", target)
	}
	if _, aerr := netip.ParseAddr(host); aerr != nil && !validHostname(strings.ToLower(host)) {
		return "", 0, fmt.Errorf("worker DNS target %q: invalid name", target)
	}
	return host, port, nil
}

// NewDNSDiscovery returns a discovery of cfg.Target for r; Run starts it.
// Its series are written by r.WriteMetrics.
func NewDNSDiscovery(r *Registry, cfg DNSConfig) (*DNSDiscovery, error) {
	name, port, err := ParseDNSTarget(cfg.Target)
	if err != nil {
		return nil, err
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = min(cfg.Interval, 5*time.Second)
	}
	switch cfg.Network {
	case "":
		cfg.Network = "ip"
	case "ip", "ip4", "ip6":
	default:
		return nil, fmt.Errorf("worker DNS network %q: want ip, ip4 or ip6", cfg.Network)
	}
	res := cfg.Resolver
	if res == nil {
		res = net.DefaultResolver
	}
	d := &DNSDiscovery{reg: r, cfg: cfg, name: name, port: strconv.Itoa(port), res: res}
	d.fleet = newOwnedWorkers(r, func(role Role) Role { return role },
		func(u string, _ Role) {
			r.cfg.Logger.Info("worker gone from DNS: removed", "target", cfg.Target, "worker", u)
		},
		func(u string, _ Role, err error) {
			r.cfg.Logger.Warn("worker from DNS not added", "target", cfg.Target, "worker", u, "err", err)
		})
	r.mu.Lock()
	r.dns = append(r.dns, d)
	r.mu.Unlock()
	return d, nil
}

// Run syncs at once and then every Interval until ctx ends.
func (d *DNSDiscovery) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	for {
		_ = d.Sync(ctx) // logged and counted
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Workers returns the sorted base URLs this discovery added and still holds.
func (d *DNSDiscovery) Workers() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]string, 0, len(d.fleet.owned))
	for u := range d.fleet.owned {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// Failures counts the resolutions that failed or answered no address.
func (d *DNSDiscovery) Failures() uint64 { return d.failures.Load() }

// Sync runs one round: resolve, remove the vanished workers of its own, add
// the new addresses. It returns the resolution's error (nothing changed
// then); refused or failed additions are logged, not returned.
func (d *DNSDiscovery) Sync(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	ips, err := d.res.LookupNetIP(lctx, d.cfg.Network, d.name)
	cancel()
	want := map[string]Role{}
	for _, ip := range ips {
		ip = ip.Unmap()
		if !ip.IsValid() || ip.Zone() != "" || d.cfg.Network == "ip4" && !ip.Is4() || d.cfg.Network == "ip6" && !ip.Is6() {
			continue
		}
		want["http://"+net.JoinHostPort(ip.String(), d.port)] = d.cfg.Role
	}
	if err == nil && len(want) == 0 {
		err = ErrNoAddresses
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d.failures.Add(1)
		if !d.failing {
			d.failing = true
			d.reg.cfg.Logger.Warn("worker DNS resolution failed; keeping the workers", "target", d.cfg.Target, "err", err)
		}
		return err
	}
	if d.failing {
		d.failing = false
		d.reg.cfg.Logger.Info("worker DNS resolution works again", "target", d.cfg.Target, "addresses", len(want))
	}
	d.fleet.sync(ctx, want)
	d.workers.Store(int64(len(d.fleet.owned)))
	return nil
}

// WriteMetrics writes vllm_router_dns_discovery_workers{target} (workers it
// added and holds) and vllm_router_dns_discovery_failures_total{target}.
func (d *DNSDiscovery) WriteMetrics(w io.Writer) {
	l := "{" + promtext.Label("target", d.cfg.Target) + "}"
	metrics.WriteGaugeUint64(w, "vllm_router_dns_discovery_workers"+l, uint64(max(d.workers.Load(), 0)))
	metrics.WriteCounterUint64(w, "vllm_router_dns_discovery_failures_total"+l, d.failures.Load())
}
