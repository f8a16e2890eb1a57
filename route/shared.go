package route

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/sharedstate"
)

// SharedBindings is the session → worker store that router replicas share
// (docs/design.md §8.3): *sharedstate.Store in production, a map in the
// tests. Lookups are served from a local copy that the store keeps coherent;
// publishes are asynchronous. Workers are named by URL (ids are per
// process).
type SharedBindings interface {
	LookupBinding(ctx context.Context, model, session []byte) (workerURL string, ok bool, err error)
	PublishBindingAt(model, session []byte, workerURL string, at int64, ttl time.Duration) bool
	OnInvalidate(fn func(kind sharedstate.Kind, model, key string))
	OnReconnect(fn func())
}

var _ SharedBindings = (*sharedstate.Store)(nil)

// sharedCounters count the shared store's use by the worker step
// (writeSharedMetrics).
type sharedCounters struct {
	hit, miss, down, stale, published, dropped, invalidated, cleared atomic.Uint64
}

// The conversation key of a session-less request (docs/design.md §8.3,
// "Session-less conversations"). A turn's history key extends the previous
// turn's by what the model answered (an assistant message, tool calls)
// and what the client added (user text, tool results). Every placement of
// a session-less request publishes its own key's fingerprint → worker; the
// next turn, on any replica, cuts its key before the last run of model
// output, which gives back the previous turn's key exactly, and looks that
// fingerprint up. Two conversations share a binding only while their
// histories are identical, that is while they share their cache.
const (
	convTag     = "\x00c:"   // leads a conversation key: no session key carries a NUL
	fpWindow    = 1 << 10    // bytes of the head and of the tail of a key that the fingerprint reads (~3 µs a turn)
	convKeySize = 3 + 16     // convTag + 128 bits of SHA-256
	tagAssist   = byte(5)    // reqview: assistant message
	sepCall     = byte(0x1d) // reqview: a tool call (Responses function_call items have no role tag)
)

// isHistory reports whether k is a reqview history key (chat, Responses),
// which starts with a tag byte, rather than a /v1/completions prompt, which
// has no turns to chain.
func isHistory(k []byte) bool { return len(k) > 0 && k[0] >= 0x01 && k[0] <= 0x08 }

// convKey is a conversation key on the stack.
type convKey [convKeySize]byte

// fingerprint returns the conversation key of history key k: SHA-256 of
// its length, its first and its last fpWindow bytes. Constant cost whatever
// the history's length; a different conversation of the same length that
// agrees on both windows (not something histories do) would only share a
// worker.
func fingerprint(k []byte) convKey {
	var buf [8 + 2*fpWindow]byte
	binary.LittleEndian.PutUint64(buf[:8], uint64(len(k)))
	n := 8 + copy(buf[8:], k[:min(len(k), fpWindow)])
	if len(k) > fpWindow {
		n += copy(buf[n:], k[max(fpWindow, len(k)-fpWindow):])
	}
	sum := sha256.Sum256(buf[:n])
	var ck convKey
	copy(ck[:], convTag)
	copy(ck[3:], sum[:16])
	return ck
}

// parentLen returns the length of the previous turn's history key inside
// k: where the last run of model output (assistant messages, tool calls)
// starts, found by walking back over the reqview tags (docs: reqview
// package, "History key"). 0 when k holds no model output (a first turn).
func parentLen(k []byte) int {
	start, inRun := 0, false
	for i := len(k) - 1; i >= 0; i-- {
		b := k[i]
		if b > 0x08 && b != sepCall {
			continue // text, arguments, raw tool JSON; 0x1c and 0x1e separate pieces inside an element
		}
		switch {
		case b == tagAssist || b == sepCall:
			start, inRun = i, true
		case inRun:
			return start
		}
	}
	return 0 // the run reaches the start: no earlier turn in k
}

// sharedSession looks a local session miss up in the shared store and
// adopts the binding when its worker may serve the request; nil otherwise
// (absent, Redis down, worker unknown here or unhealthy).
func (c *CacheAware) sharedSession(st *modelState, req *Request) *loadview.Worker {
	w := c.lookup(st, req, req.Session)
	if w != nil {
		st.sessions.Set(req.Session, w.ID())
	}
	return w
}

// sharedConversation returns the worker that served the previous turn of
// a session-less request, from the shared store, unless this replica's own
// tree already holds that whole turn on an eligible worker (matched: what
// matchPrefix found), that is unless this replica served it: then it is
// decided by the tree as on one replica. A turn whose previous turn ran on
// another replica is bound like a session: moving it would cost the re-
// prefill that a session hit avoids, and this replica's tree, taught by a
// fraction of the traffic, places less well than the one that served it
// (make bench-replicas shows the difference: bench/results/replicas.md).
func (c *CacheAware) sharedConversation(st *modelState, req *Request, matched int) *loadview.Worker {
	if !isHistory(req.Prefix) {
		return nil
	}
	p := parentLen(req.Prefix)
	if p == 0 || matched >= p {
		return nil
	}
	ck := fingerprint(req.Prefix[:p])
	return c.lookup(st, req, ck[:])
}

// sharedFirst decides the first request of a model state that this
// replica has not routed before (it just started, or restarted for a
// rolling upgrade) from the shared store, when the store binds its session
// or conversation; nil otherwise.
func (c *CacheAware) sharedFirst(st *modelState, req *Request) (*loadview.Worker, string) {
	switch {
	case c.shared == nil:
	case len(req.Session) > 0:
		if w := c.sharedSession(st, req); w != nil {
			return w, SessionIDMatch
		}
	default:
		if w := c.sharedConversation(st, req, 0); w != nil {
			return w, ConversationMatch
		}
	}
	return nil, ""
}

// lookup resolves key's shared binding to a worker that may serve req.
func (c *CacheAware) lookup(st *modelState, req *Request, key []byte) *loadview.Worker {
	url, ok, err := c.shared.LookupBinding(context.Background(), st.name, key)
	switch {
	case err != nil:
		c.sharedStats.down.Add(1) // Redis down (or slow): route on local state, §8.3
		return nil
	case !ok:
		c.sharedStats.miss.Add(1)
		return nil
	}
	w := c.reg.ByURL(url)
	if w == nil || !w.Healthy() || ((req.Subset || st.fallback) && !contains(req.Workers, w)) {
		c.sharedStats.stale.Add(1)
		return nil
	}
	c.sharedStats.hit.Add(1)
	return w
}

// DefaultConversationTTL is CacheAwareConfig.ConversationTTL's default: a
// key per session-less turn, kept long enough for an agent's or a person's
// next turn, not an hour (at 1,000 turns/s about 120 MB in Redis).
const DefaultConversationTTL = 10 * time.Minute

// publish queues key → w, made or last used at at (unix ns), for ttl
// (asynchronous, §8.3). The store keeps the binding that expires last, so
// a refresh passes the session's last use: it must not beat a rebinding
// another replica made since.
func (c *CacheAware) publish(st *modelState, key []byte, w *loadview.Worker, at int64, ttl time.Duration) bool {
	if c.shared.PublishBindingAt(st.name, key, w.URL(), at, ttl) {
		c.sharedStats.published.Add(1)
		return true
	}
	c.sharedStats.dropped.Add(1)
	return false
}

// publishConversation publishes the fingerprint of a session-less
// request's key → w, for the conversation's next turn on any replica.
func (c *CacheAware) publishConversation(st *modelState, req *Request, w *loadview.Worker) bool {
	if !isHistory(req.Prefix) {
		return false
	}
	ck := fingerprint(req.Prefix)
	return c.publish(st, ck[:], w, req.now, c.cfg.ConversationTTL)
}

// invalidated drops the local copy of a binding that another replica (or
// this one) changed in the store: the next turn reads it again.
func (c *CacheAware) invalidated(kind sharedstate.Kind, model, key string) {
	if kind != sharedstate.KindBinding {
		return
	}
	st, ok := c.models.Load(model)
	if !ok && model == FallbackModel {
		st = c.fallback.Load()
	}
	if st == nil {
		return
	}
	c.sharedStats.invalidated.Add(1)
	st.sessions.Delete([]byte(key))
}

// untrack runs when the store reconnects after an outage: invalidations
// sent meanwhile are lost, and bindings made on several replicas during the
// outage were replayed, last writer winning. The local session maps are
// dropped, so every session reads its binding again on its next turn and
// all replicas agree on it; the tree stays.
func (c *CacheAware) untrack() {
	n := 0
	c.each(func(_ string, st *modelState) {
		n += st.sessions.Sweep(func(uint32) bool { return false })
	})
	c.sharedStats.cleared.Add(uint64(n))
}

// refresh republishes the sessions accessed since the previous refresh, so
// that a binding in the store lives as long as the local session it
// mirrors (both TTLs count from the last turn, within one sweep interval).
// Sweep calls it.
func (c *CacheAware) refresh() {
	now := c.now()
	since := c.refreshedAt.Swap(now)
	if since == 0 {
		return
	}
	c.each(func(_ string, st *modelState) {
		st.sessions.Range(func(key string, id uint32, last int64) bool {
			if last > since {
				if w := c.reg.ByID(id); w != nil {
					c.publish(st, []byte(key), w, last, c.cfg.SessionTTL)
				}
			}
			return true
		})
	})
}
