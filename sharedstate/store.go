package sharedstate

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/rueidis"
)

// ErrDown is returned, without touching the network, while the store
// considers Redis unreachable (docs/design.md §8.3: keep serving on local
// state). Lock writes refused with ErrDown are kept and replayed on recovery.
var ErrDown = errors.New("sharedstate: redis unavailable")

// Defaults of Config.
const (
	DefaultPrefix         = "wr"
	DefaultSchemaVersion  = 1
	DefaultLockTimeout    = 250 * time.Millisecond
	DefaultReadTimeout    = 100 * time.Millisecond
	DefaultAsyncTimeout   = 500 * time.Millisecond
	DefaultHealthInterval = 250 * time.Millisecond
	DefaultPingTimeout    = 200 * time.Millisecond
	DefaultDialTimeout    = 500 * time.Millisecond
	DefaultQueueSize      = 16384
	DefaultPendingLocks   = 65536
	DefaultPendingAsync   = 65536
	DefaultCacheTTL       = time.Hour
	maxBatch              = 512
)

// Config configures Open. Only URL is required.
type Config struct {
	// URL: redis://[user:password@]host:port[/db] or rediss:// for TLS
	// (the router's --redis-url), parsed by rueidis.ParseURL.
	URL string
	// TLSConfig, if set, replaces the TLS settings the URL implies (a
	// private CA, client certificates).
	TLSConfig *tls.Config
	// Prefix and SchemaVersion start every key: "{Prefix}:v{SchemaVersion}:".
	// Replicas of two releases with different versions share one Redis
	// without reading each other's keys. Defaults "wr" and 1.
	Prefix        string
	SchemaVersion int

	Logger  *slog.Logger // nil: slog.Default()
	Metrics *metrics.Set // nil: a private set (see Store.Metrics)

	LockTimeout    time.Duration // bound on a lock write (PutLock): default 250ms
	ReadTimeout    time.Duration // bound on a lookup that reaches Redis: default 100ms
	AsyncTimeout   time.Duration // bound on one batch of async writes: default 500ms
	HealthInterval time.Duration // ping period: default 250ms
	PingTimeout    time.Duration // default 200ms
	DialTimeout    time.Duration // default 500ms
	CacheTTL       time.Duration // longest a value stays in the local cache: default 1h

	QueueSize    int // async writes waiting for the writer; past it they are dropped (counted)
	PendingLocks int // lock writes kept while Redis is down, replayed on recovery
	PendingAsync int // binding and memory writes kept while down, replayed on recovery
}

// Store is the Redis implementation of the shared state of docs/design.md
// §8.3: session bindings, the model step's memory and the hard locks. Reads
// go through rueidis client-side caching (server-assisted invalidation,
// RESP3 CLIENT TRACKING); binding and memory writes are asynchronous and
// batched; lock writes are synchronous. Safe for concurrent use.
type Store struct {
	cfg Config
	ns  string
	log *slog.Logger
	opt rueidis.ClientOption

	client    atomic.Pointer[clientBox]
	up        atomic.Bool
	closed    atomic.Bool
	slowPings atomic.Int32 // consecutive ping timeouts

	queue chan asyncOp
	kick  chan struct{}
	quit  chan struct{}
	wg    sync.WaitGroup

	mu           sync.Mutex // guards everything below
	state        int        // 0 unknown, 1 up, 2 down
	pendingLocks []asyncOp
	pendingAsync []asyncOp
	onInval      []func(Kind, string, string)
	onReconnect  []func()

	set        *metrics.Set
	errs       *metrics.Counter
	timeouts   *metrics.Counter
	dropped    *metrics.Counter
	pendDrop   *metrics.Counter
	replayed   *metrics.Counter
	invals     *metrics.Counter
	unavail    *metrics.Counter
	downs      *metrics.Counter
	lockWrite  *metrics.Histogram
	cacheHits  *metrics.Counter
	cacheMiss  *metrics.Counter
	asyncBatch *metrics.Counter
	older      [2]*metrics.Counter // refused as older: bindings, memory records
}

type clientBox struct{ c rueidis.Client }

// asyncOp is one queued write (val != nil), delete (del) or a Flush marker
// (done != nil).
type asyncOp struct {
	key   string
	val   string
	del   bool
	ttlMs int64
	expMs int64 // a binding's expiry, unix ms: its version (bindingLua)
	kind  Kind
	done  chan error
}

// Open returns a Store for cfg.URL. It fails only on a malformed
// configuration: an unreachable Redis at start is an outage like any other
// (Up false, local state serves, the store connects when Redis answers).
func Open(ctx context.Context, cfg Config) (*Store, error) {
	opt, err := rueidis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("sharedstate: --redis-url: %w", err)
	}
	if cfg.TLSConfig != nil {
		opt.TLSConfig = cfg.TLSConfig
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	defi := func(d *int, v int) {
		if *d <= 0 {
			*d = v
		}
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	defi(&cfg.SchemaVersion, DefaultSchemaVersion)
	def(&cfg.LockTimeout, DefaultLockTimeout)
	def(&cfg.ReadTimeout, DefaultReadTimeout)
	def(&cfg.AsyncTimeout, DefaultAsyncTimeout)
	def(&cfg.HealthInterval, DefaultHealthInterval)
	def(&cfg.PingTimeout, DefaultPingTimeout)
	def(&cfg.DialTimeout, DefaultDialTimeout)
	def(&cfg.CacheTTL, DefaultCacheTTL)
	defi(&cfg.QueueSize, DefaultQueueSize)
	defi(&cfg.PendingLocks, DefaultPendingLocks)
	defi(&cfg.PendingAsync, DefaultPendingAsync)
	s := &Store{
		cfg:   cfg,
		ns:    keyPrefix(cfg.Prefix, cfg.SchemaVersion),
		log:   cfg.Logger,
		queue: make(chan asyncOp, cfg.QueueSize),
		kick:  make(chan struct{}, 1),
		quit:  make(chan struct{}),
		set:   cfg.Metrics,
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.set == nil {
		s.set = metrics.NewSet()
	}
	s.initMetrics()

	opt.Dialer = net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: time.Second}
	opt.ConnWriteTimeout = 2 * time.Second // a hung (not closed) Redis is noticed
	opt.DisableRetry = true                // fail fast; the store keeps and replays lock writes itself
	opt.ClientName = "warmroute"
	opt.OnInvalidations = s.invalidated
	s.opt = opt

	s.check(ctx) // connect now when Redis is there; never an error
	s.wg.Add(2)
	go s.healthLoop()
	go s.writer()
	return s, nil
}

func (s *Store) initMetrics() {
	s.set.GetOrCreateGauge("warmroute_redis_up", func() float64 {
		if s.up.Load() {
			return 1
		}
		return 0
	})
	s.set.GetOrCreateGauge("warmroute_redis_pending_writes", func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(len(s.pendingLocks) + len(s.pendingAsync))
	})
	s.set.GetOrCreateGauge("warmroute_redis_async_queue", func() float64 { return float64(len(s.queue)) })
	s.errs = s.set.GetOrCreateCounter("warmroute_redis_errors_total")
	s.timeouts = s.set.GetOrCreateCounter("warmroute_redis_timeouts_total")
	s.downs = s.set.GetOrCreateCounter("warmroute_redis_outages_total")
	s.dropped = s.set.GetOrCreateCounter("warmroute_redis_async_dropped_total")
	s.pendDrop = s.set.GetOrCreateCounter("warmroute_redis_pending_dropped_total")
	s.replayed = s.set.GetOrCreateCounter("warmroute_redis_replayed_writes_total")
	s.invals = s.set.GetOrCreateCounter("warmroute_redis_invalidations_total")
	s.unavail = s.set.GetOrCreateCounter("warmroute_redis_unavailable_reads_total")
	s.lockWrite = s.set.GetOrCreateHistogram("warmroute_redis_lock_write_seconds")
	s.cacheHits = s.set.GetOrCreateCounter(`warmroute_redis_reads_total{cache="hit"}`)
	s.cacheMiss = s.set.GetOrCreateCounter(`warmroute_redis_reads_total{cache="miss"}`)
	s.asyncBatch = s.set.GetOrCreateCounter("warmroute_redis_async_batches_total")
	s.older[0] = s.set.GetOrCreateCounter(`warmroute_redis_older_writes_total{kind="binding"}`)
	s.older[1] = s.set.GetOrCreateCounter(`warmroute_redis_older_writes_total{kind="memory"}`)
}

// Metrics returns the set the store's metrics live in (Config.Metrics or
// its own): warmroute_redis_up, _errors_total, _timeouts_total,
// _outages_total, _async_dropped_total, _pending_writes,
// _pending_dropped_total, _replayed_writes_total, _invalidations_total,
// _unavailable_reads_total, _lock_write_seconds, _reads_total{cache},
// _older_writes_total{kind} (binding and memory writes Redis refused
// because it held a newer value).
func (s *Store) Metrics() *metrics.Set { return s.set }

// Up reports whether Redis answered the last ping and every write kept
// during the last outage has been replayed.
func (s *Store) Up() bool { return s.up.Load() }

// OnInvalidate registers fn, called when a binding, memory or lock key this
// replica read or wrote was changed, expired or deleted in Redis (by any
// replica, this one included): the caller drops its local copy of (kind,
// model, key) and reads it again through LookupBinding or GetMemory on the
// next miss. model is "" for locks. fn runs on the connection's reader and
// must be fast (a map delete). Register before traffic.
func (s *Store) OnInvalidate(fn func(kind Kind, model, key string)) {
	s.mu.Lock()
	s.onInval = append(s.onInval, fn)
	s.mu.Unlock()
}

// OnReconnect registers fn, called (on the health goroutine) each time
// Redis is reachable again after an outage, once the writes kept during the
// outage have been replayed. Invalidations sent while the connection was
// down are lost, so the caller should treat its local copies as untracked
// (see doc.go, integration).
func (s *Store) OnReconnect(fn func()) {
	s.mu.Lock()
	s.onReconnect = append(s.onReconnect, fn)
	s.mu.Unlock()
}

func (s *Store) invalidated(msgs []rueidis.RedisMessage) {
	if msgs == nil { // connection closed or FLUSHALL: handled by OnReconnect
		return
	}
	s.mu.Lock()
	fns := s.onInval
	s.mu.Unlock()
	for i := range msgs {
		k, err := msgs[i].ToString()
		if err != nil {
			continue
		}
		kind, model, rest, ok := parseKey(s.ns, k)
		if !ok {
			continue
		}
		s.invals.Inc()
		for _, fn := range fns {
			fn(kind, model, rest)
		}
	}
}

func (s *Store) cl() rueidis.Client {
	if b := s.client.Load(); b != nil {
		return b.c
	}
	return nil
}

// --- health -------------------------------------------------------------

func (s *Store) healthLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		case <-s.kick:
		}
		s.check(context.Background())
	}
}

// check pings Redis (connecting first if needed); on success after an
// outage it replays the kept writes, then marks the store up.
func (s *Store) check(ctx context.Context) {
	c := s.cl()
	if c == nil {
		o := s.opt
		nc, err := rueidis.NewClient(o)
		if err != nil {
			s.setDown(err)
			return
		}
		s.client.Store(&clientBox{nc})
		c = nc
		s.checkEviction(ctx, c)
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.PingTimeout)
	err := c.Do(pctx, c.B().Ping().Build()).Error()
	cancel()
	if err != nil {
		// One slow ping under load is not an outage; two in a row are.
		if errors.Is(err, context.DeadlineExceeded) && s.slowPings.Add(1) < 2 {
			s.timeouts.Inc()
			return
		}
		s.setDown(err)
		return
	}
	s.slowPings.Store(0)
	if s.up.Load() {
		return
	}
	if err := s.replay(ctx, c); err != nil {
		s.setDown(err)
		return
	}
}

// checkEviction warns when Redis may evict keys: locks must never be evicted
// (docs/design.md §8.3), so the instance must run maxmemory-policy
// noeviction. Managed Redis often refuses CONFIG; that is logged too.
func (s *Store) checkEviction(ctx context.Context, c rueidis.Client) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.PingTimeout)
	defer cancel()
	r := c.Do(cctx, c.B().ConfigGet().Parameter("maxmemory-policy").Build())
	m, err := r.AsStrMap()
	if err != nil {
		s.log.Warn("redis: cannot verify maxmemory-policy; locks need noeviction", "err", err)
		return
	}
	if p := m["maxmemory-policy"]; p != "noeviction" {
		s.log.Warn("redis: maxmemory-policy evicts keys; hard locks may be lost, set noeviction", "policy", p)
	}
}

func (s *Store) setDown(err error) {
	s.up.Store(false)
	s.mu.Lock()
	prev := s.state
	s.state = 2
	s.mu.Unlock()
	if prev != 2 {
		s.downs.Inc()
		if prev == 0 {
			s.log.Error("redis unreachable at start: serving on local state", "err", err)
		} else {
			s.log.Error("redis down: serving on local state", "err", err)
		}
	}
}

// markFailed records a failed command. Every error is counted. A transport
// error (refused, reset, closed) marks the store down at once so that later
// calls fail fast. A timeout asks the health loop to probe: one slow answer
// under load must not take the store down, a hung Redis fails the ping.
func (s *Store) markFailed(err error) {
	s.errs.Inc()
	if _, ok := rueidis.IsRedisErr(err); ok {
		return
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		s.timeouts.Inc()
	} else {
		s.setDown(err)
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// replay writes the kept writes, locks first, then marks the store up and
// fires the reconnect hooks. Kept writes are taken under mu and the store is
// marked up under mu only when none are left, so a write that raced with the
// recovery is either replayed or written directly, never stranded.
func (s *Store) replay(ctx context.Context, c rueidis.Client) error {
	n := 0
	for {
		s.mu.Lock()
		var batch []asyncOp
		src := &s.pendingLocks
		if len(*src) == 0 {
			src = &s.pendingAsync
		}
		if len(*src) == 0 {
			s.up.Store(true)
			prev := s.state
			s.state = 1
			hooks := s.onReconnect
			s.mu.Unlock()
			if prev == 2 {
				s.log.Info("redis up again: shared state resumed", "replayed", n)
				for _, fn := range hooks {
					fn()
				}
			} else {
				s.log.Info("redis connected", "addr", s.opt.InitAddress)
			}
			return nil
		}
		k := min(len(*src), maxBatch)
		batch = append(batch, (*src)[:k]...)
		*src = (*src)[k:]
		s.mu.Unlock()
		if err := s.exec(ctx, c, batch, s.cfg.AsyncTimeout); err != nil {
			s.mu.Lock()
			if batch[0].kind.isLock() {
				s.pendingLocks = append(batch, s.pendingLocks...)
			} else {
				s.pendingAsync = append(batch, s.pendingAsync...)
			}
			s.mu.Unlock()
			return err
		}
		n += len(batch)
		s.replayed.Add(len(batch))
	}
}

// keep stores ops to be replayed on recovery, dropping the oldest past the
// bound (counted). It reports false if the store was up (the caller writes
// directly instead).
func (s *Store) keep(ops []asyncOp, onlyIfDown bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if onlyIfDown && s.up.Load() {
		return false
	}
	for _, o := range ops {
		dst, lim := &s.pendingAsync, s.cfg.PendingAsync
		if o.kind.isLock() {
			dst, lim = &s.pendingLocks, s.cfg.PendingLocks
		}
		if len(*dst) >= lim {
			*dst = (*dst)[1:]
			s.pendDrop.Inc()
		}
		*dst = append(*dst, o)
	}
	return true
}

// cmd is o's command: DEL, SET for a lock, a script for a binding or a
// memory record (newer.go; EVALSHA, or EVAL when Redis lacks the script).
func (s *Store) cmd(c rueidis.Client, o asyncOp, eval bool) rueidis.Completed {
	switch {
	case o.del:
		return c.B().Del().Key(o.key).Build()
	case o.versioned():
		return o.script(c, eval)
	}
	return c.B().Set().Key(o.key).Value(o.val).PxMilliseconds(o.ttlMs).Build()
}

// exec writes ops in one pipeline; the first failure is returned. When
// Redis does not know a script (restarted, SCRIPT FLUSH), the whole
// pipeline is sent again with EVAL, which loads it: every op is
// idempotent (a script writes ties), and sending all of them again keeps
// their order.
func (s *Store) exec(ctx context.Context, c rueidis.Client, ops []asyncOp, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmds := make(rueidis.Commands, 0, len(ops))
	for _, eval := range [2]bool{false, true} {
		cmds = cmds[:0]
		for _, o := range ops {
			cmds = append(cmds, s.cmd(c, o, eval))
		}
		noScript, older := false, [2]int{}
		for i, r := range c.DoMulti(ctx, cmds...) {
			err := r.Error()
			if re, ok := rueidis.IsRedisErr(err); ok && re.IsNoScript() && !eval {
				noScript = true
				continue
			}
			if err != nil {
				s.markFailed(err)
				return err
			}
			if !ops[i].versioned() {
				continue
			}
			if n, _ := r.AsInt64(); n == 0 { // refused: Redis holds a newer value
				k := 0
				if ops[i].kind == KindMemory {
					k = 1
				}
				older[k]++
			}
		}
		if !noScript {
			s.older[0].Add(older[0])
			s.older[1].Add(older[1])
			return nil
		}
	}
	return nil
}

// --- async writes (bindings, memory) -------------------------------------

func ttlMs(ttl time.Duration) int64 { return max(1, ttl.Milliseconds()) }

func (s *Store) enqueue(o asyncOp) bool {
	if s.closed.Load() {
		return false
	}
	select {
	case s.queue <- o:
		return true
	default:
		s.dropped.Inc()
		return false
	}
}

// PublishBinding queues session → workerURL for model with ttl (the local
// session TTL) and returns at once; false if the queue was full (counted in
// warmroute_redis_async_dropped_total) or the key is too long. Bindings
// only affect cache efficiency, so they are written asynchronously in
// batches (docs/design.md §8.3); Flush waits for them. Workers are named by
// URL (worker ids are per process). The binding is versioned with the
// current time: see PublishBindingAt.
func (s *Store) PublishBinding(model, session []byte, workerURL string, ttl time.Duration) bool {
	return s.PublishBindingAt(model, session, workerURL, time.Now().UnixNano(), ttl)
}

// PublishBindingAt is PublishBinding for a binding made or last used at at
// (unix ns): it expires at at+ttl, and Redis keeps the binding that expires
// last, whatever order the writes of several replicas, or their replay
// after an outage, reach it in. A republication that only extends the TTL
// should pass the session's last use, not the current time, so that it
// does not beat a later rebinding made on another replica.
func (s *Store) PublishBindingAt(model, session []byte, workerURL string, at int64, ttl time.Duration) bool {
	if len(model) > MaxModelLen || len(session) > MaxKeyLen {
		return false
	}
	return s.enqueue(asyncOp{key: string(scopedKey(nil, s.ns, KindBinding, model, session)),
		val: workerURL, expMs: at/int64(time.Millisecond) + ttlMs(ttl), kind: KindBinding})
}

// PutMemory queues the model step's memory record (MemoryRecord.AppendEncode)
// of (logical model, session) with ttl, asynchronously like PublishBinding.
// Redis keeps the record with the latest LastAccess (its version), whatever
// order the writes reach it in; ties are written.
func (s *Store) PutMemory(logical, session, record []byte, ttl time.Duration) bool {
	if len(logical) > MaxModelLen || len(session) > MaxKeyLen {
		return false
	}
	return s.enqueue(asyncOp{key: string(scopedKey(nil, s.ns, KindMemory, logical, session)),
		val: string(record), ttlMs: ttlMs(ttl), kind: KindMemory})
}

// Flush returns once every async write queued before the call is
// acknowledged by Redis (nil), kept for replay because Redis is down
// (ErrDown), or ctx ends. The proxy calls it with the lock write before the
// last byte of a response, so a replica killed after a response completed
// loses no binding.
func (s *Store) Flush(ctx context.Context) error {
	if s.closed.Load() {
		return ErrDown
	}
	done := make(chan error, 1)
	select {
	case s.queue <- asyncOp{done: done}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) writer() {
	defer s.wg.Done()
	batch := make([]asyncOp, 0, maxBatch)
	for {
		select {
		case o := <-s.queue:
			batch = append(batch[:0], o)
		drain:
			for len(batch) < maxBatch {
				select {
				case o := <-s.queue:
					batch = append(batch, o)
				default:
					break drain
				}
			}
			s.writeBatch(batch)
			clear(batch)
		case <-s.quit:
			for {
				select {
				case o := <-s.queue:
					s.writeBatch([]asyncOp{o})
				default:
					return
				}
			}
		}
	}
}

// writeBatch writes one batch of async ops in one round trip, then reads
// the written keys through the cache so that this replica is told when
// another one changes them (tracking starts at a cached read). A value that
// differs from what was written (another replica wrote in between) is
// reported through OnInvalidate.
func (s *Store) writeBatch(batch []asyncOp) {
	writes := make([]asyncOp, 0, len(batch))
	var marks []chan error
	for _, o := range batch {
		if o.done != nil {
			marks = append(marks, o.done)
		} else {
			writes = append(writes, o)
		}
	}
	var err error
	if len(writes) > 0 {
		c := s.cl()
		if !s.up.Load() || c == nil {
			err = ErrDown
		} else if err = s.exec(context.Background(), c, writes, s.cfg.AsyncTimeout); err == nil {
			s.asyncBatch.Inc()
		}
		if err != nil {
			if s.keep(writes, false); !errors.Is(err, ErrDown) {
				err = fmt.Errorf("%w: %v", ErrDown, err)
			}
		}
	}
	if err == nil && len(writes) == 0 && !s.up.Load() {
		err = ErrDown // the writes before this Flush went in an earlier batch, and were kept
	}
	for _, d := range marks {
		d <- err
	}
	if err == nil && len(writes) > 0 {
		s.track(writes)
	}
}

func (s *Store) track(writes []asyncOp) {
	c := s.cl()
	last := make(map[string]int, len(writes))
	for i, o := range writes {
		last[o.key] = i
	}
	reads := make([]rueidis.CacheableTTL, 0, len(last))
	keys := make([]int, 0, len(last))
	for i, o := range writes {
		if last[o.key] == i {
			reads = append(reads, rueidis.CT(c.B().Get().Key(o.key).Cache(), s.cfg.CacheTTL))
			keys = append(keys, i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.AsyncTimeout)
	defer cancel()
	s.mu.Lock()
	fns := s.onInval
	s.mu.Unlock()
	for j, r := range c.DoMultiCache(ctx, reads...) {
		o := writes[keys[j]]
		v, err := r.ToString()
		if err != nil && !rueidis.IsRedisNil(err) {
			s.markFailed(err)
			return
		}
		if v != o.val { // another replica's newer value, or none (async writes never delete)
			if kind, model, rest, ok := parseKey(s.ns, o.key); ok {
				for _, fn := range fns {
					fn(kind, model, rest)
				}
			}
		}
	}
}

// --- reads ---------------------------------------------------------------

// get reads key through the local cache. A miss served from the cache is
// read again from Redis when fresh is set: the invalidation that would
// correct it may still be in flight, and a lock miss must be exact.
func (s *Store) get(ctx context.Context, key string, fresh bool) (string, bool, error) {
	c := s.cl()
	if c == nil || !s.up.Load() {
		s.unavail.Inc()
		return "", false, ErrDown
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	defer cancel()
	r := c.DoCache(ctx, c.B().Get().Key(key).Cache(), s.cfg.CacheTTL)
	hit := r.IsCacheHit()
	v, err := r.ToString()
	if fresh && hit && rueidis.IsRedisNil(err) {
		hit = false
		v, err = c.Do(ctx, c.B().Get().Key(key).Build()).ToString()
	}
	if hit {
		s.cacheHits.Inc()
	} else {
		s.cacheMiss.Inc()
	}
	if rueidis.IsRedisNil(err) {
		return "", false, nil
	}
	if err != nil {
		s.markFailed(err)
		return "", false, err
	}
	return v, true, nil
}

// LookupBinding returns the worker URL bound to session for model, for a
// session that missed the local map. Served from the local cache when this
// replica read the key before and no replica changed it since; else one
// GET. While Redis is down it returns ErrDown at once (counted in
// warmroute_redis_unavailable_reads_total): the caller routes on local
// state.
func (s *Store) LookupBinding(ctx context.Context, model, session []byte) (string, bool, error) {
	if len(model) > MaxModelLen || len(session) > MaxKeyLen {
		return "", false, ErrKeyTooLong
	}
	var buf [320]byte
	return s.get(ctx, string(scopedKey(buf[:0], s.ns, KindBinding, model, session)), false)
}

// GetMemory returns the memory record of (logical model, session).
func (s *Store) GetMemory(ctx context.Context, logical, session []byte) ([]byte, bool, error) {
	if len(logical) > MaxModelLen || len(session) > MaxKeyLen {
		return nil, false, ErrKeyTooLong
	}
	v, ok, err := s.get(ctx, string(scopedKey(nil, s.ns, KindMemory, logical, session)), false)
	if !ok {
		return nil, false, err
	}
	return []byte(v), true, nil
}

// --- locks ---------------------------------------------------------------

// LockWrite is one hard lock of a response: the id of its kind and owner.
type LockWrite struct {
	Kind Kind
	ID   []byte
	Lock Lock
}

// PutLock writes the hard lock id → l with ttl (the local index's IndexTTL)
// and returns once Redis acknowledged it (docs/design.md §8.3: before the
// last byte of the response that created it is forwarded). While Redis is
// down, or when the write fails, the lock is kept and replayed on recovery
// and an error is returned (ErrDown, or the failure): the caller keeps its
// local lock and serves on.
func (s *Store) PutLock(ctx context.Context, kind Kind, id []byte, l Lock, ttl time.Duration) error {
	return s.PutLocks(ctx, []LockWrite{{Kind: kind, ID: id, Lock: l}}, ttl)
}

// PutLocks writes every lock a response created (its tool_call ids, its
// response id, its reasoning artifacts) in one round trip and one AOF fsync,
// acknowledged like PutLock.
func (s *Store) PutLocks(ctx context.Context, ws []LockWrite, ttl time.Duration) error {
	if len(ws) == 0 {
		return nil
	}
	ops := make([]asyncOp, 0, len(ws))
	var val []byte
	for _, w := range ws {
		if !w.Kind.isLock() {
			return fmt.Errorf("sharedstate: %v is not a lock kind", w.Kind)
		}
		if len(w.ID) > MaxKeyLen {
			return ErrKeyTooLong
		}
		val = encodeLock(val[:0], w.Lock)
		ops = append(ops, asyncOp{key: string(lockKey(nil, s.ns, w.Kind, w.ID)), val: string(val), ttlMs: ttlMs(ttl), kind: w.Kind})
	}
	c := s.cl()
	if c == nil || !s.up.Load() {
		if s.keep(ops, true) {
			return ErrDown
		}
		if c = s.cl(); c == nil {
			s.keep(ops, false)
			return ErrDown
		}
	}
	t0 := time.Now()
	if err := s.exec(ctx, c, ops, s.cfg.LockTimeout); err != nil {
		s.keep(ops, false)
		return err
	}
	s.lockWrite.UpdateDuration(t0)
	return nil
}

// GetLock returns the owner of a hard lock. A lock seen before is served
// from the local cache; a miss always asks Redis (a lock written by another
// replica is never missed because of a late invalidation). While Redis is
// down it returns ErrDown at once: the caller must then decide the turn
// with an explicit, counted action (see doc.go).
func (s *Store) GetLock(ctx context.Context, kind Kind, id []byte) (Lock, bool, error) {
	if len(id) > MaxKeyLen {
		return Lock{}, false, ErrKeyTooLong
	}
	var buf [256]byte
	v, ok, err := s.get(ctx, string(lockKey(buf[:0], s.ns, kind, id)), true)
	if !ok {
		return Lock{}, false, err
	}
	l, err := decodeLock([]byte(v))
	if err != nil {
		return Lock{}, false, err
	}
	return l, true, nil
}

// DeleteLock removes a lock (DELETE /v1/responses/{id}); synchronous. The
// copies other replicas cached go when the invalidation reaches them.
func (s *Store) DeleteLock(ctx context.Context, kind Kind, id []byte) error {
	c := s.cl()
	if c == nil || !s.up.Load() {
		return ErrDown
	}
	return s.exec(ctx, c, []asyncOp{{key: string(lockKey(nil, s.ns, kind, id)), del: true, kind: kind}}, s.cfg.LockTimeout)
}

// Close stops the background goroutines, writes what is queued if Redis is
// up, and closes the connection.
func (s *Store) Close() {
	if s.closed.Swap(true) {
		return
	}
	close(s.quit)
	s.wg.Wait()
	if c := s.cl(); c != nil {
		c.Close()
	}
}

// Namespace returns the key prefix of this store, "{Prefix}:v{SchemaVersion}:".
func (s *Store) Namespace() string { return s.ns }

// Script runs script (an atomic Lua script, EVALSHA then EVAL) on keys
// with args and returns its array of integers, bounded by the read
// timeout. While Redis is down it returns ErrDown at once, without
// touching the network; a failure is counted and handled like any
// command's (warmroute_redis_errors_total, the store marked down on a
// transport error). For callers that keep a counter of their own in the
// store (package tenantlimit); keys should start with Namespace.
func (s *Store) Script(ctx context.Context, script *rueidis.Lua, keys, args []string) ([]int64, error) {
	c := s.cl()
	if c == nil || !s.up.Load() {
		s.unavail.Inc()
		return nil, ErrDown
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	defer cancel()
	v, err := script.Exec(ctx, c, keys, args).AsIntSlice()
	if err != nil {
		s.markFailed(err)
		return nil, err
	}
	return v, nil
}
