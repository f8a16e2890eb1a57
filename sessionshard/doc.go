// Package sessionshard holds the router's per-session state, keyed by the
// session key that the front end extracts from a request (see docs/design.md §4).
//
// Sessions is the exact-match sticky-routing map of one model: session key
// to the worker that served it, with a last-access time, a TTL and a
// capacity. Lookups (Get) take no locks and allocate nothing; they are on
// the hot path of every request that carries a session key.
//
// Key lifetime: every method that takes a key []byte may be passed a slice
// that aliases a request buffer (fasthttp); the slice is read only during
// the call and never retained. Keys that must be stored are copied.
//
// Concurrency: every exported method of every type in this package is safe
// for concurrent use by multiple goroutines.
package sessionshard
