// Package route holds the worker-selection policies, free of HTTP: given the
// workers that may serve a model and the request's identity (an exact session
// key and a prefix key), choose one worker and label the decision.
package route

import (
	"github.com/warmroute/warmroute/loadview"
)

// Decision labels. Exactly one is attached to every routed request.
const (
	SessionIDMatch       = "session_id_match"
	FullHistoryMatch     = "full_history_match"
	FullHistoryLowMatch  = "full_history_low_match"
	EmptyHistoryMinLoad  = "empty_history_min_load"
	StaleTenantFallback  = "stale_tenant_fallback"
	CacheAffinity        = "cache_affinity"
	LowMatchMinLoad      = "low_match_min_load"
	LoadBalance          = "load_balance"
	NoTreeRandom         = "no_tree_random"
	FirstHealthyFallback = "first_healthy_fallback"
	PinnedWorker         = "pinned_worker" // a provider-state lock named the worker (SAAR)
	// ConversationMatch: no session key; the shared store (§8.3) names the
	// worker that served this conversation's previous turn on another
	// replica. Decided as a session hit (only the load gate overrides).
	ConversationMatch = "conversation_match"

	// The other policies' names, each also their one decision label.
	RoundRobin     = "round_robin"
	Random         = "random"
	PowerOfTwo     = "power_of_two"
	ConsistentHash = "consistent_hash"
	LeastLoaded    = "least_loaded"
)

// CacheAwareLabels lists the labels the cache-aware policy can emit, for
// pre-registering counters.
var CacheAwareLabels = []string{SessionIDMatch, FullHistoryMatch, FullHistoryLowMatch,
	EmptyHistoryMinLoad, StaleTenantFallback, CacheAffinity, LowMatchMinLoad, LoadBalance,
	NoTreeRandom, FirstHealthyFallback, ConversationMatch}

// Request is one selection's input. Session and Prefix alias request buffers:
// valid only during Select; policies copy what they keep.
type Request struct {
	Model   string             // physical model; keys per-model state (may alias a request buffer)
	Workers []*loadview.Worker // workers that may serve Model, healthy or not
	Session []byte             // exact-match session key; empty when none
	Prefix  []byte             // serialized chat history or prompt; empty when none
	Subset  bool               // Workers excludes some servers of Model (a retry): affinity outside it does not count

	now int64 // the clock, read once per selection by the cache-aware policy
}

// Choice is a selection: the worker (nil when no worker is healthy) and the
// decision label. The cache-aware policy also records, for Observe, what the
// worker held of the key when it was chosen.
type Choice struct {
	Worker   *loadview.Worker
	Decision string

	st     *modelState // the cache-aware state that taught it; nil otherwise
	keyLen int         // len(Request.Prefix)
	held   int         // characters of the key Worker held before this selection
	heldAt int64       // access stamp of that hold (0: none)
	pub    bool        // a binding was queued for the shared store
}

// Published reports whether the selection queued a binding for the shared
// store (docs/design.md §8.3): a placement or rebinding of a session, or
// any session-less turn. The write is asynchronous; a proxy that waits for
// the store's Flush before the response's last byte guarantees that the
// session's next turn finds the binding on every replica.
func (c Choice) Published() bool { return c.pub }

// Held is the worker's estimate of its cache for this request, as the
// cache-aware policy read it: the characters of the request's key it held
// before the selection, of keyLen (0, 0 for other policies).
func (c Choice) Held() (held, keyLen int) { return c.held, c.keyLen }

// MinLoad returns the healthy worker of ws with the fewest requests in flight
// fleet-wide (Worker.FleetLoad: this replica's, plus the other replicas'
// when the worker reports its load, docs/design.md §8.3); ties are broken
// uniformly at random (reservoir sampling), never always to the first
// worker. nil when none is healthy.
func MinLoad(ws []*loadview.Worker, rnd func() uint64) *loadview.Worker {
	var best *loadview.Worker
	var bestLoad int64
	ties := uint64(0)
	for _, w := range ws {
		if !w.Healthy() {
			continue
		}
		l := w.FleetLoad()
		switch {
		case best == nil || l < bestLoad:
			best, bestLoad, ties = w, l, 1
		case l == bestLoad:
			ties++
			if rnd()%ties == 0 {
				best = w
			}
		}
	}
	return best
}

// RandomHealthy returns a uniformly random healthy worker, or nil.
func RandomHealthy(ws []*loadview.Worker, rnd func() uint64) *loadview.Worker {
	if len(ws) == 0 {
		return nil
	}
	// Fast path: probe a few random slots before the reservoir scan.
	for range 4 {
		if w := ws[rnd()%uint64(len(ws))]; w.Healthy() {
			return w
		}
	}
	var pick *loadview.Worker
	n := uint64(0)
	for _, w := range ws {
		if w.Healthy() {
			n++
			if rnd()%n == 0 {
				pick = w
			}
		}
	}
	return pick
}
