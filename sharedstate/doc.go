// Package sharedstate is the Redis store for several router replicas
// (docs/design.md §8.3). It holds session → worker bindings, the model
// step's memory and every hard lock (tool_call_id → model,
// previous_response_id → model and worker, reasoning artifact → model and worker).
// It is the second implementation of the sessionshard/saar stores. The
// local stores stay the hot path: a session hit never calls this package.
//
// # Key schema
//
// Every key starts with "{Prefix}:v{SchemaVersion}:" (default "wr:v1:").
// Replicas of two releases whose SchemaVersion differs can share one Redis
// during a rolling upgrade without reading each other's keys.
//
//	wr:v1:b:{len(model)}:{model}:{session}   binding: worker URL        (async, newest wins, TTL = session TTL from its use)
//	wr:v1:m:{len(logical)}:{logical}:{session} memory: MemoryRecord     (async, newest wins, TTL = memory TTL)
//	wr:v1:t:{tool_call_id}                   lock: Lock{Model}          (sync,  TTL = IndexTTL)
//	wr:v1:r:{response_id}                    lock: Lock{Model, Worker}  (sync)
//	wr:v1:s:{reasoning id, hex}              lock: Lock{Model, Worker}  (sync)
//
// The model name is length-prefixed because names may hold ':'. Lock ids
// are global, as in the local id index (§5). Values other than a binding's
// URL start with a format byte, so a later release can read older values.
// Every command touches one key, so a Redis Cluster works without hash tags.
//
// # Consistency model
//
// Lock writes are synchronous. PutLocks returns only after Redis has
// acknowledged the write, and the proxy calls it before it forwards the last
// byte (or [DONE]) of the response that created the lock. Any later request,
// on any replica, then finds the lock.
//
// GetLock reads through the client-side cache. A lock found before is
// served locally: a lock never changes, and its cached copy expires with the
// key. A miss always goes to Redis, because an invalidation may still be in
// flight.
//
// Bindings and memory records are written asynchronously. They are queued
// and batched, one round trip per batch, and usually reach Redis within a
// millisecond. Flush waits for them, so a response completed after Flush
// loses nothing when its replica dies.
//
// The newest write wins, not the last. A memory record carries its
// LastAccess as a version at a fixed offset (MemoryRecord, tag 95); a
// binding's version is its expiry, the time it was made or last used plus
// its TTL (PublishBindingAt), so its value stays a bare URL. Each such write
// is a Lua script (EVALSHA in the same pipeline; the whole batch again with
// EVAL when Redis answers NOSCRIPT) that writes only when the stored value
// is not newer; a tie is written. The order in which writes reach Redis no
// longer matters: late batches, and the replay of two replicas' kept writes
// after an outage, in whatever order they reconnect. Refused writes are
// counted (warmroute_redis_older_writes_total); the writer's read-back sees
// the newer value and reports it through OnInvalidate. Versions are replica
// wall clocks: they must agree to well under the time between two turns of
// a session (and a binding's TTL runs on Redis's clock).
//
// Reads (LookupBinding, GetMemory) are served from a local copy that Redis
// keeps coherent (RESP3 CLIENT TRACKING, OPTIN, via rueidis DoCache). After
// each async write the store reads the key back through the cache, so it
// tracks every key it wrote or read. When any replica, this one included,
// changes, deletes or lets expire such a key, Redis sends an invalidation
// and the OnInvalidate callbacks run. The caller drops its local copy and
// reads it again on its next miss. A replica's local copy of a binding is
// therefore stale for at most the delivery time of one invalidation
// (sub-millisecond on a LAN). A stale binding only costs cache efficiency.
//
// The hard locks are what correctness depends on, and they never rely on a
// cached miss.
//
// # Faults
//
// Open fails only on a malformed URL. If Redis is unreachable at start or
// later, the store is Down:
//   - reads return ErrDown at once, without a network wait;
//   - lock writes return ErrDown and are kept in a bounded buffer
//     (PendingLocks, oldest dropped and counted);
//   - async writes are kept in a second buffer (PendingAsync).
//
// The first failed command marks the store Down. A ping every
// HealthInterval brings it back. On recovery the store replays the kept
// writes, locks first, and marks itself Up. Then it runs the OnReconnect
// hooks: invalidations sent while the connection was down are lost, so the
// caller must treat its local copies as untracked.
//
// Each transition writes one log line and moves warmroute_redis_up and
// warmroute_redis_outages_total. Errors, timeouts, drops and replays are
// counted too (see Store.Metrics).
//
// While Redis is Down, a turn whose lock no local copy knows must be decided
// by the caller with an explicit, counted action, never a silent switch.
// GetLock returns ErrDown and counts the read in
// warmroute_redis_unavailable_reads_total. The caller then chooses, for
// example saar's owner_unknown action with the reason redis_down.
//
// # Rolling upgrade
//
// Versions changed neither the key schema (SchemaVersion stays 1, so a
// release with versions and one before share every key, the hard locks
// included) nor a value a release before reads: memoryFormat stays 1, the
// version being a tagged field that releases before skip, and a binding
// stays a bare URL. A release before writes with SET, over any version; a
// release with versions writes over a memory record without one, and
// compares a binding by its expiry, which a release before sets from the
// write's arrival. During the upgrade the two releases therefore order
// their writes as before (last writer wins); once every replica runs the
// new release, the newest wins.
//
// # Persistence
//
// Run Redis with these settings (the tests start it this way):
//
//	appendonly yes
//	appendfsync always
//	maxmemory-policy noeviction
//
// With appendfsync always, Redis has written and fsynced the AOF before it
// acknowledges a write. A Redis crash or restart, or a host crash, therefore
// loses no acknowledged lock. With everysec, a host crash can lose up to one
// second of acknowledged writes, and a process crash can lose them while an
// fsync is postponed. Redis 7.0 has no WAITAOF to get per-write durability
// on top of everysec.
//
// With always, a lock write waits for its fsync; concurrent writers share
// fsyncs (BenchmarkPutLock, BenchmarkPutLockParallel; bench/results/README.md).
// It is paid once per response that creates locks, next to a response that
// takes seconds.
//
// Locks have a TTL and volatile-* policies evict keys with a TTL, so only
// noeviction keeps locks safe. Open checks CONFIG GET maxmemory-policy and
// logs a warning if the policy evicts or cannot be read. Size maxmemory for
// the lock rate × IndexTTL. At the limit, writes fail with an error reply:
// they are counted, and the caller serves on from local state.
package sharedstate
