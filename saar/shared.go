package saar

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/puzpuzpuz/xsync/v3"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/promtext"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/sessionshard"
	"github.com/warmroute/warmroute/sharedstate"
)

// SharedState is the store through which router replicas share the model
// step's hard locks and session memory (docs/design.md §8.3,
// Options.Shared): *sharedstate.Store in production, a map in the tests.
// Lock writes return once the store acknowledged them; memory writes are
// asynchronous. The store calls OnInvalidate's callback when a key this
// replica read or wrote changed, and OnReconnect's after an outage.
type SharedState interface {
	GetLock(ctx context.Context, kind sharedstate.Kind, id []byte) (sharedstate.Lock, bool, error)
	PutLocks(ctx context.Context, ws []sharedstate.LockWrite, ttl time.Duration) error
	DeleteLock(ctx context.Context, kind sharedstate.Kind, id []byte) error
	GetMemory(ctx context.Context, logical, session []byte) ([]byte, bool, error)
	PutMemory(logical, session, record []byte, ttl time.Duration) bool
	OnInvalidate(fn func(kind sharedstate.Kind, model, key string))
	OnReconnect(fn func())
}

var _ SharedState = (*sharedstate.Store)(nil)

// sharedOrNil returns st, or nil for an interface over a nil
// *sharedstate.Store: a caller that passes its store, nil without Redis,
// gets local state only, not a router calling a store that is not there.
func sharedOrNil(st SharedState) SharedState {
	if s, ok := st.(*sharedstate.Store); ok && s == nil {
		return nil
	}
	return st
}

// shared is the model step's link to the store of several replicas
// (docs/design.md §8.3, Options.Shared): hard locks are written
// synchronously by the proxy (ShareLocks) and read on a local miss; the
// session memory is written asynchronously after each change and read on a
// local miss or after an invalidation.
type shared struct {
	st     SharedState
	memTTL time.Duration
	idTTL  time.Duration
	// stale marks the sessions (memHash → when) whose memory key Redis
	// invalidated while a local entry existed: the next turn reads the
	// record again, and the newer of the two wins (loadMemory). A hash
	// collision only costs one more read.
	stale *xsync.MapOf[uint64, int64]
	// resync is when Redis came back after an outage (unix ns): an entry
	// not touched since may have missed invalidations and is read again.
	resync atomic.Int64

	found       map[sharedstate.Kind]*metrics.Counter // locks found in Redis after a local miss
	unreachable map[string]*metrics.Counter           // turns decided with a redis_down reason, by lock kind
	writeFails  *metrics.Counter                      // lock writes Redis did not acknowledge (kept for replay)
	memLoads    *metrics.Counter                      // memory records adopted from Redis
}

// lockSourceShared is the Inputs.ToolOwnerSource or StateSource of an
// owner read from the shared store.
const lockSourceShared = "shared"

// newShared links r to st (r.sh), then registers its store callbacks.
func newShared(r *Router, st SharedState, set *metrics.Set) {
	sh := &shared{
		st:          st,
		memTTL:      r.opt.Memory.TTL,
		idTTL:       r.opt.IndexTTL,
		stale:       xsync.NewMapOf[uint64, int64](),
		found:       map[sharedstate.Kind]*metrics.Counter{},
		unreachable: map[string]*metrics.Counter{},
		writeFails:  set.GetOrCreateCounter(`vllm_router_saar_shared_lock_write_failures_total`),
		memLoads:    set.GetOrCreateCounter(`vllm_router_saar_shared_memory_loads_total`),
	}
	if sh.memTTL <= 0 {
		sh.memTTL = sessionshard.MemoryDefaultTTL
	}
	for k, name := range map[sharedstate.Kind]string{sharedstate.KindToolCall: "tool_call", sharedstate.KindResponse: "response", sharedstate.KindReasoning: "reasoning"} {
		sh.found[k] = set.GetOrCreateCounter(`vllm_router_saar_shared_locks_found_total{` + promtext.Label("index", name) + `}`)
	}
	for _, k := range []string{LockToolLoop, LockProviderState} {
		sh.unreachable[k] = set.GetOrCreateCounter(`vllm_router_saar_lock_unreachable_total{` + promtext.Label("kind", k) + `}`)
	}
	r.sh = sh
	st.OnInvalidate(r.invalidated)
	st.OnReconnect(func() { sh.resync.Store(r.now().UnixNano()) })
}

// SharesLocks reports whether the router has a shared store: the proxy then
// calls ShareLocks before the last byte of every response that created a
// lock (docs/design.md §8.3).
func (r *Router) SharesLocks() bool { return r.sh != nil }

// ShareLocks writes the hard locks one response created — its tool-call
// ids (→ model), for the Responses API its response id, and its opaque
// reasoning artifacts (→ model and worker) — to the shared store in one
// round trip, and returns once Redis
// acknowledged them (docs/design.md §8.3). The caller forwards the
// response's last byte only afterwards. On failure (Redis down, timeout)
// the store keeps the locks for replay; the error is counted and returned,
// and the response completes anyway. The ids are read only during the
// call. Without a shared store it does nothing.
func (r *Router) ShareLocks(ctx context.Context, model, worker string, toolCallIDs [][]byte, responseID []byte, reasoningIDs []reqview.ReasoningID) error {
	if r.sh == nil {
		return nil
	}
	ws := make([]sharedstate.LockWrite, 0, len(toolCallIDs)+1+len(reasoningIDs))
	l := sharedstate.Lock{Model: model, Worker: worker}
	for _, id := range toolCallIDs {
		if len(id) > 0 {
			ws = append(ws, sharedstate.LockWrite{Kind: sharedstate.KindToolCall, ID: id, Lock: l})
		}
	}
	if len(responseID) > 0 {
		ws = append(ws, sharedstate.LockWrite{Kind: sharedstate.KindResponse, ID: responseID, Lock: l})
	}
	for _, id := range reasoningIDs {
		ws = append(ws, sharedstate.LockWrite{Kind: sharedstate.KindReasoning, ID: reasoningKey(nil, id), Lock: l})
	}
	err := r.sh.st.PutLocks(ctx, ws, r.sh.idTTL)
	if err != nil {
		r.sh.writeFails.Inc()
	}
	return err
}

// sharedLock asks the store for the owner of an id this replica does not
// know, caching a found owner in the local index x. unreachable: Redis
// could not answer (the turn then takes an explicit redis_down reason).
func (r *Router) sharedLock(kind sharedstate.Kind, x *idIndex, id []byte, now int64) (o owner, ok, unreachable bool) {
	sc := getScratch()
	l, ok, err := r.sh.st.GetLock(context.Background(), kind, sc.copy(id))
	sc.release()
	if err != nil {
		return owner{}, false, true
	}
	if !ok || l.Model == "" {
		return owner{}, false, false
	}
	o = owner{model: l.Model, worker: l.Worker}
	x.put(id, o, now)
	r.sh.found[kind].Inc()
	return o, true, false
}

// LookupResponse is ResponseOwner for GET|DELETE /v1/responses/{id}, asking
// the shared store when this replica does not know the id; unreachable:
// the store could not answer, so the id may exist on another replica.
func (r *Router) LookupResponse(id []byte) (model, worker string, ok, unreachable bool) {
	now := r.now().UnixNano()
	if o, ok := r.resps.get(id, now); ok || r.sh == nil {
		return o.model, o.worker, ok, false
	}
	o, ok, unreachable := r.sharedLock(sharedstate.KindResponse, r.resps, id, now)
	return o.model, o.worker, ok, unreachable
}

// loadMemory brings a session's local memory entry (locked by the caller)
// up to date from the shared store: on a local miss (created), after Redis
// invalidated the key, or when the entry predates a reconnection (its
// invalidations may have been lost). The record replaces the local state
// only when it is newer (LastAccess): this replica's own write also
// invalidates its key, and a record read before that write lands is older
// than the local state, which then stays.
func (r *Router) loadMemory(e *sessionshard.MemoryEntry, logical, session []byte, created bool) {
	sh := r.sh
	h := memHash(logical, session)
	_, marked := sh.stale.Load(h) // lock-free; most turns find no mark
	if marked {
		sh.stale.Delete(h)
	}
	if !created && !marked && e.State.LastAccess >= sh.resync.Load() {
		return
	}
	sc := getScratch()
	b, ok, err := sh.st.GetMemory(context.Background(), sc.copy(logical), sc.copy(session))
	sc.release()
	if err != nil || !ok {
		return
	}
	rec, err := sharedstate.DecodeMemoryRecord(b)
	if err != nil || rec.Model == "" || rec.LastAccess <= e.State.LastAccess {
		return
	}
	e.State = stateOf(&rec)
	sh.memLoads.Inc()
}

// publishMemory queues the session's memory record (docs/design.md §8.3:
// asynchronous; Redis keeps the record with the latest LastAccess, also
// when replicas replay records kept during an outage). Caller holds the
// entry lock.
func (r *Router) publishMemory(logical, session []byte, st *sessionshard.MemoryState) {
	rec := recordOf(st)
	sc := getScratch()
	r.sh.st.PutMemory(sc.copy(logical), sc.copy(session), sc.encode(&rec), r.sh.memTTL)
	sc.release()
}

// invalidated is the store's OnInvalidate callback: another replica (or
// this one) changed a key this replica read or wrote. A memory key is
// marked stale when a local entry exists; a lock that is gone from Redis
// (deleted, expired) is forgotten locally.
func (r *Router) invalidated(kind sharedstate.Kind, model, key string) {
	switch kind {
	case sharedstate.KindMemory:
		var kb [320]byte
		now := r.now().UnixNano()
		if r.mem.Get(sessionshard.MemoryKey(kb[:0], bytesconv.S2B(model), bytesconv.S2B(key)), now) != nil {
			r.sh.stale.Store(memHash(bytesconv.S2B(model), bytesconv.S2B(key)), now)
		}
	case sharedstate.KindResponse:
		r.resps.del(bytesconv.S2B(key))
	case sharedstate.KindToolCall:
		r.tools.del(bytesconv.S2B(key))
	case sharedstate.KindReasoning:
		r.reas.del(bytesconv.S2B(key))
	}
}

// sweepStale drops the marks older than the memory TTL: their entries
// have expired since.
func (sh *shared) sweepStale(now int64) {
	sh.stale.Range(func(h uint64, at int64) bool {
		if now-at > int64(sh.memTTL) {
			sh.stale.Delete(h)
		}
		return true
	})
}

// memHash is the 64-bit FNV-1a of a memory key (sessionshard.MemoryKey);
// computed in place, so a request's bytes never escape.
func memHash(logical, session []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, b := range [2][]byte{logical, session} {
		for _, c := range b {
			h = (h ^ uint64(c)) * 1099511628211
		}
		h *= 1099511628211 // a NUL byte after each part (h ^ 0 = h)
	}
	return h
}

// countUnreachable counts a turn decided with a redis_down reason
// (Stats.LockUnreachable, vllm_router_saar_lock_unreachable_total).
func (r *Router) countUnreachable(reason string) {
	if !strings.Contains(reason, reasonRedisDown) {
		return
	}
	kind := LockProviderState
	if strings.HasPrefix(reason, LockToolLoop) {
		kind = LockToolLoop
	}
	r.stUnreachable.Add(1)
	r.sh.unreachable[kind].Inc()
}

func recordOf(s *sessionshard.MemoryState) sharedstate.MemoryRecord {
	return sharedstate.MemoryRecord{
		Model: s.Model, Worker: s.Worker, Decision: s.Decision, Phase: s.Phase, Lock: s.Lock,
		Turns: int64(s.Turns), Switches: int64(s.Switches), TurnsOnModel: int64(s.TurnsOnModel),
		LastAccess: s.LastAccess, LastEnd: s.LastEnd,
		LastHistoryChars: int64(s.LastHistoryChars), LastPromptTokens: int64(s.LastPromptTokens),
		LastCompletionTokens: int64(s.LastCompletionTokens),
		PromptTokensSeen:     s.PromptTokensSeen, CachedTokensSeen: s.CachedTokensSeen,
		Demand: s.Demand, DemandVar: s.DemandVar,
	}
}

func stateOf(r *sharedstate.MemoryRecord) sessionshard.MemoryState {
	return sessionshard.MemoryState{
		Model: r.Model, Worker: r.Worker, Decision: r.Decision, Phase: r.Phase, Lock: r.Lock,
		Turns: int(r.Turns), Switches: int(r.Switches), TurnsOnModel: int(r.TurnsOnModel),
		LastAccess: r.LastAccess, LastEnd: r.LastEnd,
		LastHistoryChars: int(r.LastHistoryChars), LastPromptTokens: int(r.LastPromptTokens),
		LastCompletionTokens: int(r.LastCompletionTokens),
		PromptTokensSeen:     r.PromptTokensSeen, CachedTokensSeen: r.CachedTokensSeen,
		Demand: r.Demand, DemandVar: r.DemandVar,
	}
}

// scratch is a pooled buffer for the arguments of a call to the shared
// store. The store reads them only during the call, but escape analysis
// does not see through the SharedState interface: what is passed to it
// would move to the heap, the caller's stack buffers and every request
// slice that reaches it with them. So the calls pass copies in a scratch.
type scratch struct{ b []byte }

var scratchPool = sync.Pool{New: func() any { return &scratch{b: make([]byte, 0, 512)} }}

// maxScratch is the largest buffer kept in the pool.
const maxScratch = 64 << 10

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

// copy appends p to the scratch and returns its copy.
func (s *scratch) copy(p []byte) []byte {
	n := len(s.b)
	s.b = append(s.b, p...)
	return s.b[n:len(s.b):len(s.b)]
}

// encode appends rec's encoding to the scratch and returns it.
func (s *scratch) encode(rec *sharedstate.MemoryRecord) []byte {
	n := len(s.b)
	s.b = rec.AppendEncode(s.b)
	return s.b[n:len(s.b):len(s.b)]
}

// release returns the scratch to the pool, once the store call returned.
func (s *scratch) release() {
	if cap(s.b) > maxScratch {
		return
	}
	s.b = s.b[:0]
	scratchPool.Put(s)
}
