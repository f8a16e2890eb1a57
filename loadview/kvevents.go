package loadview

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/kvevents"
)

// The subscription to each worker's KV-cache events: the transport under
// "the tree follows the engine: evictions from its KV events"
// (docs/design.md §9, the row for KV caches smaller than the working set).
// The registry follows one engine per worker, started by Add and closed by
// Remove, and hands the batches to the consumers of OnKVEvents; none of it
// is on the request path.

// DefaultKVEventsPort is vLLM's KV-events PUB port (its kv-events-config
// endpoint tcp://*:5557), the vLLM router's --kv-events-port.
const DefaultKVEventsPort = 5557

// KVEventsConfig turns on the subscription to each worker's KV-cache
// events. Where a worker's engine publishes: the endpoint its mapping names
// (Endpoints), else tcp://<the worker's host>:Port. A worker url@rank
// follows the rank's own engine: vLLM binds each data-parallel rank's
// endpoints at the configured ports plus the rank, so the rank is added to
// both ports, derived or mapped, unless a mapping names that url@rank.
type KVEventsConfig struct {
	// Port is the engines' PUB port when no mapping names the worker; 1 to
	// 65535, DefaultKVEventsPort when 0.
	Port int
	// ReplayPort is the engines' replay ROUTER port (vLLM's
	// replay_endpoint): on the worker's host, or on the mapped endpoint's
	// host when its mapping names no replay endpoint; 0: no replay, a gap
	// resyncs at once.
	ReplayPort int
	// Endpoints maps a worker URL, a base URL (every rank, offset) or
	// url@rank (that rank alone), to its engine's endpoints; keys are
	// compared in canonical form (ParseKVEndpointMapping).
	Endpoints map[string]KVEndpoints
	// Topic is the topic prefix subscribed to ("" takes all, vLLM's
	// default topic is "").
	Topic string
	// Limits bound every message an engine (or whoever reaches its port)
	// sends; zero fields take kvevents' defaults.
	Limits kvevents.Limits
	// MinBackoff and MaxBackoff bound the wait between connection attempts
	// to an engine; kvevents' defaults (100 ms, 5 s) when 0.
	MinBackoff, MaxBackoff time.Duration
}

// KVEndpoints are where one engine publishes: its PUB endpoint and its
// replay endpoint ("" for none), both tcp://HOST:PORT in canonical form.
type KVEndpoints struct {
	Endpoint string
	Replay   string
}

// ParseKVEndpointMapping reads the vLLM router's --kv-events-endpoint form
// WORKER_URL=tcp://HOST:PORT, here with an optional replay endpoint after a
// comma: WORKER_URL=tcp://HOST:PORT,tcp://HOST:REPLAY_PORT. WORKER_URL is a
// plain http(s) origin, optionally @rank. It returns the worker's canonical
// key and the canonical endpoints.
func ParseKVEndpointMapping(s string) (string, KVEndpoints, error) {
	worker, eps, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok {
		return "", KVEndpoints{}, errors.New("KV endpoint mapping must be WORKER_URL=tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT]")
	}
	key, err := kvWorkerKey(worker)
	if err != nil {
		return "", KVEndpoints{}, err
	}
	pub, replay, _ := strings.Cut(eps, ",")
	var out KVEndpoints
	if out.Endpoint, err = CanonicalKVEndpoint(pub); err != nil {
		return "", KVEndpoints{}, err
	}
	if replay != "" {
		if out.Replay, err = CanonicalKVEndpoint(replay); err != nil {
			return "", KVEndpoints{}, fmt.Errorf("replay: %w", err)
		}
		if out.Replay == out.Endpoint {
			return "", KVEndpoints{}, fmt.Errorf("KV endpoint %s given as both the PUB and the replay endpoint", out.Endpoint)
		}
	}
	return key, out, nil
}

// CanonicalKVEndpoint checks an endpoint to connect to and returns it in
// canonical form, so that two spellings of one socket compare equal: only
// tcp://HOST:PORT, port 1 to 65535, no credentials, path, query or
// fragment; the host neither a wildcard nor unspecified (those are bind
// addresses); IPv4 in any numeric form (127.1, 0x7f000001) written dotted,
// IPv6 compressed in brackets, names in lower case.
func CanonicalKVEndpoint(s string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil {
		return "", fmt.Errorf("invalid KV endpoint %q", s)
	}
	if u.Scheme != "tcp" || u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.ForceQuery ||
		u.Fragment != "" || (u.Path != "" && u.Path != "/") || u.Hostname() == "" {
		return "", fmt.Errorf("KV endpoint %q: want tcp://HOST:PORT without credentials or paths", s)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil || port < 1 || port > 65535 {
		return "", fmt.Errorf("KV endpoint %q: want a port 1-65535", s)
	}
	host, err := canonicalHost(u.Hostname())
	if err == nil {
		err = connectable(host)
	}
	if err != nil {
		return "", fmt.Errorf("KV endpoint %q: %w", s, err)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// connectable refuses a canonical host that names no peer to dial.
func connectable(host string) error {
	if host == "*" {
		return errors.New("the host cannot be a wildcard")
	}
	if a, err := netip.ParseAddr(host); err == nil && a.IsUnspecified() {
		return errors.New("the host cannot be unspecified")
	}
	return nil
}

// canonicalHost writes a URL's host one way: IPv6 compressed (zone kept),
// IPv4 dotted from any of the numeric forms URL parsers accept, names in
// lower case; "*" stays "*" for connectable to refuse.
func canonicalHost(h string) (string, error) {
	if h == "*" {
		return h, nil
	}
	if strings.Contains(h, ":") {
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is6() {
			return "", fmt.Errorf("invalid IPv6 host %q", h)
		}
		return a.String(), nil
	}
	h = strings.ToLower(h)
	if endsInNumber(h) {
		a, ok := parseIPv4(h)
		if !ok {
			return "", fmt.Errorf("invalid IPv4 host %q", h)
		}
		return a.String(), nil
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return "", fmt.Errorf("invalid host %q", h)
		}
	}
	return h, nil
}

// endsInNumber is the URL standard's test of a host to be read as IPv4:
// its last label (a trailing dot aside) is a number.
func endsInNumber(h string) bool {
	parts := strings.Split(h, ".")
	if len(parts) > 1 && parts[len(parts)-1] == "" {
		parts = parts[:len(parts)-1]
	}
	last := parts[len(parts)-1]
	if last == "" {
		return false
	}
	if strings.Trim(last, "0123456789") == "" {
		return true
	}
	_, ok := ipv4Number(last)
	return ok
}

// parseIPv4 reads one to four numbers, each decimal, octal (leading 0) or
// hex (0x), the last filling the bytes the others leave.
func parseIPv4(h string) (netip.Addr, bool) {
	parts := strings.Split(strings.TrimSuffix(h, "."), ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var v uint64
	for i, p := range parts {
		n, ok := ipv4Number(p)
		if !ok {
			return netip.Addr{}, false
		}
		if i < len(parts)-1 {
			if n > 255 {
				return netip.Addr{}, false
			}
			v |= n << (8 * (3 - i))
			continue
		}
		if n >= 1<<(8*(5-len(parts))) {
			return netip.Addr{}, false
		}
		v |= n
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

func ipv4Number(s string) (uint64, bool) {
	base := 10
	switch {
	case strings.HasPrefix(s, "0x"):
		s, base = s[2:], 16
		if s == "" {
			return 0, true
		}
	case len(s) > 1 && s[0] == '0':
		s, base = s[1:], 8
	}
	if s == "" || strings.ContainsAny(s, "+-_") {
		return 0, false
	}
	n, err := strconv.ParseUint(s, base, 32)
	return n, err == nil
}

// kvWorkerKey is a worker URL's key among the mappings: ParseWorkerURL's
// checks, then scheme and host canonical and the scheme's default port
// dropped, so "HTTP://Host:80/" and "http://host" are one worker.
func kvWorkerKey(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	if scheme, rest, ok := strings.Cut(raw, "://"); ok {
		raw = strings.ToLower(scheme) + "://" + rest
	}
	base, rank, err := ParseWorkerURL(raw)
	if err != nil {
		return "", err
	}
	u, err := url.Parse(base)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("worker url %q: want http(s)://host:port[@rank]", raw)
	}
	host, err := canonicalHost(u.Hostname())
	if err != nil || host == "*" {
		return "", fmt.Errorf("worker url %q: invalid host", raw)
	}
	key := u.Scheme + "://" + host
	if strings.Contains(host, ":") {
		key = u.Scheme + "://[" + host + "]"
	}
	if p := u.Port(); p != "" && !(u.Scheme == "http" && p == "80") && !(u.Scheme == "https" && p == "443") {
		key += ":" + p
	}
	if rank >= 0 {
		key += "@" + strconv.Itoa(rank)
	}
	return key, nil
}

// withDefaults checks c and returns it with canonical mapping keys and
// values and the default port.
func (c KVEventsConfig) withDefaults() (KVEventsConfig, error) {
	if c.Port == 0 {
		c.Port = DefaultKVEventsPort
	}
	if c.Port < 1 || c.Port > 65535 {
		return c, fmt.Errorf("KV events port %d: want 1-65535", c.Port)
	}
	if c.ReplayPort < 0 || c.ReplayPort > 65535 {
		return c, fmt.Errorf("KV events replay port %d: want 1-65535, or 0 for none", c.ReplayPort)
	}
	if c.ReplayPort == c.Port {
		return c, fmt.Errorf("KV events port %d given as both the PUB and the replay port", c.Port)
	}
	eps := make(map[string]KVEndpoints, len(c.Endpoints))
	for k, v := range c.Endpoints {
		key, err := kvWorkerKey(k)
		if err != nil {
			return c, err
		}
		var e KVEndpoints
		if e.Endpoint, err = CanonicalKVEndpoint(v.Endpoint); err != nil {
			return c, err
		}
		if v.Replay != "" {
			if e.Replay, err = CanonicalKVEndpoint(v.Replay); err != nil {
				return c, err
			}
		}
		if _, dup := eps[key]; dup {
			return c, fmt.Errorf("two KV endpoint mappings for %s", key)
		}
		eps[key] = e
	}
	c.Endpoints = eps
	return c, nil
}

// endpointsFor is where the engine of worker url@rank (rank -1: none)
// publishes.
func (c *KVEventsConfig) endpointsFor(rawURL string) (KVEndpoints, error) {
	key, err := kvWorkerKey(rawURL)
	if err != nil {
		return KVEndpoints{}, err
	}
	_, rank, _ := ParseWorkerURL(rawURL)
	if e, ok := c.Endpoints[key]; ok && rank >= 0 {
		return e, nil // this rank's own
	}
	base, _, _ := strings.Cut(key, "@")
	offset := max(rank, 0)
	if e, ok := c.Endpoints[base]; ok {
		out := KVEndpoints{}
		if out.Endpoint, err = offsetPort(e.Endpoint, "", offset); err != nil {
			return KVEndpoints{}, err
		}
		switch {
		case e.Replay != "":
			out.Replay, err = offsetPort(e.Replay, "", offset)
		case c.ReplayPort > 0:
			out.Replay, err = offsetPort(e.Endpoint, strconv.Itoa(c.ReplayPort), offset)
		}
		return out, err
	}
	u, _ := url.Parse(base)
	host := u.Hostname()
	if err := connectable(host); err != nil {
		return KVEndpoints{}, fmt.Errorf("%s: no KV endpoint to derive (%v): map one with --kv-events-endpoint", base, err)
	}
	ep := "tcp://" + net.JoinHostPort(host, "0")
	out := KVEndpoints{}
	if out.Endpoint, err = offsetPort(ep, strconv.Itoa(c.Port), offset); err != nil {
		return KVEndpoints{}, err
	}
	if c.ReplayPort > 0 {
		out.Replay, err = offsetPort(ep, strconv.Itoa(c.ReplayPort), offset)
	}
	return out, err
}

// offsetPort is canonical endpoint ep, its port replaced by port when not
// "", plus offset (vLLM's data-parallel rank).
func offsetPort(ep, port string, offset int) (string, error) {
	host, p, _ := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if port != "" {
		p = port
	}
	n, _ := strconv.Atoi(p)
	if n += offset; n > 65535 {
		return "", fmt.Errorf("KV endpoint tcp://%s: port %s plus rank %d is over 65535", net.JoinHostPort(host, p), p, offset)
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(n)), nil
}

// CheckKVEvents checks c for the workers known before the start (URLs as
// --worker-urls takes them; dpSize ranks for those without @rank): the
// ports and mappings valid, every worker with an endpoint to connect to,
// and no endpoint, PUB or replay, shared by two workers (one engine's
// stream would be taken for another's). It returns the first problem.
func CheckKVEvents(c KVEventsConfig, workers []string, dpSize int) error {
	c, err := c.withDefaults()
	if err != nil {
		return err
	}
	owner := map[string]string{}
	seen := map[string]bool{}
	for _, raw := range workers {
		base, rank, err := ParseWorkerURL(raw)
		if err != nil {
			return err
		}
		urls := []string{raw}
		if rank < 0 && dpSize > 1 {
			urls = urls[:0]
			for i := range dpSize {
				urls = append(urls, base+"@"+strconv.Itoa(i))
			}
		}
		for _, u := range urls {
			key, err := kvWorkerKey(u)
			if err != nil {
				return err
			}
			if seen[key] {
				continue // the same worker given twice: the registry adds it once
			}
			seen[key] = true
			e, err := c.endpointsFor(u)
			if err != nil {
				return err
			}
			for _, ep := range []string{e.Endpoint, e.Replay} {
				if ep == "" {
					continue
				}
				if prev, ok := owner[ep]; ok {
					return fmt.Errorf("workers %s and %s cannot share the KV endpoint %s: map each to its own with --kv-events-endpoint", prev, key, ep)
				}
				owner[ep] = key
			}
		}
	}
	return nil
}

// kvResyncLogEvery bounds the resync lines one worker logs: a peer that
// breaks the sequence on purpose floods the counter, not the log.
const kvResyncLogEvery = 10 * time.Second

// kvState is the registry's subscriptions; nil when KVEvents is off. subs,
// owner and stopped are under Registry.mu.
type kvState struct {
	cfg       KVEventsConfig
	subs      map[*Worker]*kvSub
	owner     map[string]*Worker // endpoint (PUB or replay) → the worker subscribed to it
	stopped   bool
	listeners atomic.Pointer[kvListeners]
}

// kvListeners are the consumers, replaced whole when one registers.
type kvListeners struct {
	batch  []func(*Worker, kvevents.Message)
	resync []func(*Worker, kvevents.Resync)
}

type kvSub struct {
	eps KVEndpoints
	sub *kvevents.Subscriber
}

func newKVState(c *KVEventsConfig) (*kvState, error) {
	if c == nil {
		return nil, nil
	}
	cfg, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	kv := &kvState{cfg: cfg, subs: map[*Worker]*kvSub{}, owner: map[string]*Worker{}}
	kv.listeners.Store(&kvListeners{})
	return kv, nil
}

// OnKVEvents registers f to get every KV-event batch of every worker's
// engine, in the engine's sequence order per worker, on that worker's
// subscriber goroutine (one per worker: f runs concurrently for different
// workers, never for one). f must not call Remove or StopKVEvents. Batches
// that arrive before f registers are not given to it: register before
// adding workers. No batch of a worker reaches f after that worker's
// OnRemove listeners started. Nothing happens without Config.KVEvents.
func (r *Registry) OnKVEvents(f func(*Worker, kvevents.Message)) {
	r.updateKVListeners(func(l *kvListeners) { l.batch = append(l.batch, f) })
}

// OnKVResync registers f to hear that a worker's batches stopped being its
// engine's whole history (kvevents.Resync: a gap replay could not fill, a
// restarted engine): what was built from them may be wrong. It runs as
// OnKVEvents' consumers do, before the batch after the break.
func (r *Registry) OnKVResync(f func(*Worker, kvevents.Resync)) {
	r.updateKVListeners(func(l *kvListeners) { l.resync = append(l.resync, f) })
}

func (r *Registry) updateKVListeners(add func(*kvListeners)) {
	if r.kv == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.kv.listeners.Load()
	l := &kvListeners{batch: slices.Clone(old.batch), resync: slices.Clone(old.resync)}
	add(l)
	r.kv.listeners.Store(l)
}

// subscribeKV starts following the engines of the workers just added;
// under r.mu. It never waits for an engine: connecting is in the
// background, with backoff. A worker without a usable endpoint, or whose
// endpoint another worker already follows, is logged and left without.
func (r *Registry) subscribeKV(added []*Worker) {
	kv := r.kv
	if kv == nil || kv.stopped {
		return
	}
	for _, w := range added {
		eps, err := kv.cfg.endpointsFor(w.url)
		if err != nil {
			r.cfg.Logger.Error("KV events: not subscribing", "worker", w.url, "err", err)
			continue
		}
		clash := ""
		for _, ep := range []string{eps.Endpoint, eps.Replay} {
			if o := kv.owner[ep]; ep != "" && o != nil {
				clash = fmt.Sprintf("%s is %s's", ep, o.url)
			}
		}
		if clash != "" {
			r.cfg.Logger.Error("KV events: not subscribing: workers cannot share a KV endpoint; map each to its own with --kv-events-endpoint",
				"worker", w.url, "endpoint", clash)
			continue
		}
		var lastLog time.Time
		sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
			Endpoint:       eps.Endpoint,
			ReplayEndpoint: eps.Replay,
			Topic:          kv.cfg.Topic,
			Limits:         kv.cfg.Limits,
			MinBackoff:     kv.cfg.MinBackoff,
			MaxBackoff:     kv.cfg.MaxBackoff,
			OnBatch: func(m kvevents.Message) {
				for _, f := range kv.listeners.Load().batch {
					f(w, m)
				}
			},
			OnResync: func(x kvevents.Resync) {
				if now := time.Now(); now.Sub(lastLog) >= kvResyncLogEvery {
					lastLog = now // on the subscriber's one goroutine
					r.cfg.Logger.Warn("KV events: history broken; consumers resync", "worker", w.url, "reason", x.Reason.String(),
						"want_seq", x.Want, "got_seq", x.Got, "detail", x.Detail)
				}
				for _, f := range kv.listeners.Load().resync {
					f(w, x)
				}
			},
		})
		if err != nil {
			r.cfg.Logger.Error("KV events: not subscribing", "worker", w.url, "err", err)
			continue
		}
		kv.subs[w] = &kvSub{eps: eps, sub: sub}
		for _, ep := range []string{eps.Endpoint, eps.Replay} {
			if ep != "" {
				kv.owner[ep] = w
			}
		}
		r.cfg.Logger.Info("KV events: subscribing", "worker", w.url, "endpoint", eps.Endpoint, "replay", eps.Replay)
	}
}

// unsubscribeKV takes the subscriptions of gone out of the registry, under
// r.mu, and returns them for closing outside it.
func (r *Registry) unsubscribeKV(gone []*Worker) []*kvevents.Subscriber {
	if r.kv == nil {
		return nil
	}
	var out []*kvevents.Subscriber
	for _, w := range gone {
		s := r.kv.subs[w]
		if s == nil {
			continue
		}
		delete(r.kv.subs, w)
		for _, ep := range []string{s.eps.Endpoint, s.eps.Replay} {
			if ep != "" && r.kv.owner[ep] == w {
				delete(r.kv.owner, ep)
			}
		}
		out = append(out, s.sub)
	}
	return out
}

// StopKVEvents closes every subscription and starts none after (shutdown);
// it returns once their goroutines have ended. Safe to call more than once,
// and without Config.KVEvents.
func (r *Registry) StopKVEvents() {
	if r.kv == nil {
		return
	}
	r.mu.Lock()
	r.kv.stopped = true
	var ws []*Worker
	for w := range r.kv.subs {
		ws = append(ws, w)
	}
	subs := r.unsubscribeKV(ws)
	r.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
}

// KVEventsEndpoints returns where the registry follows w's engine, and
// false when it does not (KV events off, w removed, or no usable endpoint).
func (r *Registry) KVEventsEndpoints(w *Worker) (KVEndpoints, bool) {
	if r.kv == nil {
		return KVEndpoints{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.kv.subs[w]
	if s == nil {
		return KVEndpoints{}, false
	}
	return s.eps, true
}

// UnusedKVMappings returns the mapped worker URLs (canonical) that name no
// registered worker: a typo, or a worker not added yet.
func (r *Registry) UnusedKVMappings() []string {
	if r.kv == nil {
		return nil
	}
	used := map[string]bool{}
	for _, w := range r.Workers() {
		if k, err := kvWorkerKey(w.url); err == nil {
			used[k] = true
			base, _, _ := strings.Cut(k, "@")
			used[base] = true
		}
	}
	var out []string
	for k := range r.kv.cfg.Endpoints {
		if !used[k] {
			out = append(out, k)
		}
	}
	sortStrings(out)
	return out
}

// writeKVMetrics writes the subscriptions' counters, one series per
// followed worker, in the order of ws.
func (r *Registry) writeKVMetrics(w io.Writer, ws []*Worker, labels []string) {
	cs := make([]*kvevents.Counters, len(ws))
	r.mu.Lock()
	for i, wk := range ws {
		if s := r.kv.subs[wk]; s != nil {
			cs[i] = s.sub.Counters()
		}
	}
	r.mu.Unlock()
	for _, f := range []struct {
		name string
		get  func(*kvevents.Counters) uint64
	}{
		{"vllm_router_kv_events_batches_total", func(c *kvevents.Counters) uint64 { return c.Batches.Load() }},
		{"vllm_router_kv_events_gaps_total", func(c *kvevents.Counters) uint64 { return c.Gaps.Load() }},
		{"vllm_router_kv_events_replays_total", func(c *kvevents.Counters) uint64 { return c.Replays.Load() }},
		{"vllm_router_kv_events_resyncs_total", func(c *kvevents.Counters) uint64 { return c.Resyncs.Load() }},
		{"vllm_router_kv_events_decode_errors_total", func(c *kvevents.Counters) uint64 { return c.DecodeErrors.Load() }},
		{"vllm_router_kv_events_connects_total", func(c *kvevents.Counters) uint64 { return c.Connects.Load() }},
	} {
		for i, c := range cs {
			if c != nil {
				metrics.WriteCounterUint64(w, f.name+labels[i], f.get(c))
			}
		}
	}
}
