package saar

import (
	"sync"

	"github.com/warmroute/warmroute/internal/bytesconv"
)

// idIndex is a bounded map from an id (tool-call id, response id) to the
// model and worker that issued it (docs/design.md §5). It is global to a
// Router so that locks hold even for clients that send no session id, and
// so that GET|DELETE /v1/responses/{id} can be routed. Sharded by FNV-1a of
// the id. Bounds, per index: an id is absent once older than the TTL
// (lazily on lookup, eagerly as the oldest ids are dropped); past the
// count or the byte budget (id bytes + idEntryOverhead each) the oldest ids
// go first. Lookups take a shard read lock and allocate nothing.
type idIndex struct {
	shards [idShards]idShard
	ttl    int64 // ns; ≤ 0: none
}

const (
	idShards = 16
	// idEntryOverhead estimates the bytes one id costs besides its own:
	// map slot, string header, owner, queue slot.
	idEntryOverhead = 96
)

type owner struct {
	model  string
	worker string
	at     int64 // when it was (last) stored, unix ns
}

type idQueued struct {
	key string
	at  int64
}

type idShard struct {
	mu       sync.RWMutex
	m        map[string]owner
	q        []idQueued // FIFO of insertions; an item whose at differs from the map's is stale
	head     int
	bytes    int
	max      int
	maxBytes int
	evicted  uint64 // ids dropped before their TTL (count or byte bound)
	_        [24]byte
}

func newIDIndex(capacity, maxBytes int, ttlNs int64) *idIndex {
	per, perBytes := max(1, capacity/idShards), max(1, maxBytes/idShards)
	x := &idIndex{ttl: ttlNs}
	for i := range x.shards {
		x.shards[i].m = make(map[string]owner)
		x.shards[i].max, x.shards[i].maxBytes = per, perBytes
	}
	return x
}

func (x *idIndex) shard(id []byte) *idShard {
	h := uint32(2166136261)
	for _, c := range id {
		h ^= uint32(c)
		h *= 16777619
	}
	return &x.shards[h%idShards]
}

func (x *idIndex) expired(o owner, now int64) bool { return x.ttl > 0 && now-o.at > x.ttl }

// put stores id → o at now; id is copied. An id larger than a shard's byte
// budget is not stored.
func (x *idIndex) put(id []byte, o owner, now int64) {
	if len(id) == 0 {
		return
	}
	s := x.shard(id)
	cost := len(id) + idEntryOverhead
	if cost > s.maxBytes {
		return
	}
	o.at = now
	s.mu.Lock()
	prev, had := s.m[bytesconv.B2S(id)]
	k := string(id) // a copy, also on overwrite: the stored key may be replaced
	s.m[k] = o
	if !had {
		s.bytes += cost
	}
	if !had || prev.at != now { // the same id stored twice at one instant needs one queue item
		s.q = append(s.q, idQueued{key: k, at: now})
	}
	x.trim(s, now)
	s.mu.Unlock()
}

// trim drops expired ids and the oldest ids past the bounds; it compacts
// the queue when stale items dominate. Caller holds s.mu.
func (x *idIndex) trim(s *idShard, now int64) {
	for s.head < len(s.q) {
		it := s.q[s.head]
		o, ok := s.m[it.key]
		live := ok && o.at == it.at
		over := len(s.m) > s.max || s.bytes > s.maxBytes
		if live && !over && !x.expired(o, now) {
			break
		}
		if live {
			if !x.expired(o, now) {
				s.evicted++
			}
			delete(s.m, it.key)
			s.bytes -= len(it.key) + idEntryOverhead
		}
		s.q[s.head] = idQueued{}
		s.head++
	}
	if s.head > 64 && s.head*2 > len(s.q) || len(s.q)-s.head > 2*len(s.m)+64 {
		n := 0
		for _, it := range s.q[s.head:] {
			if o, ok := s.m[it.key]; ok && o.at == it.at {
				s.q[n] = it
				n++
			}
		}
		clear(s.q[n:])
		s.q, s.head = s.q[:n], 0
	}
}

// get returns the owner of id if stored and not older than the TTL; id is
// read only during the call.
func (x *idIndex) get(id []byte, now int64) (owner, bool) {
	if len(id) == 0 {
		return owner{}, false
	}
	s := x.shard(id)
	s.mu.RLock()
	o, ok := s.m[bytesconv.B2S(id)]
	s.mu.RUnlock()
	if ok && x.expired(o, now) {
		return owner{}, false
	}
	return o, ok
}

// del forgets id.
func (x *idIndex) del(id []byte) {
	s := x.shard(id)
	s.mu.Lock()
	if _, ok := s.m[bytesconv.B2S(id)]; ok {
		delete(s.m, bytesconv.B2S(id))
		s.bytes -= len(id) + idEntryOverhead
	}
	s.mu.Unlock()
}

// sweep drops expired ids from every shard.
func (x *idIndex) sweep(now int64) {
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.Lock()
		x.trim(s, now)
		s.mu.Unlock()
	}
}

// stats returns the ids held, their estimated bytes and the ids evicted
// before their TTL.
func (x *idIndex) stats() (ids, bytes int, evicted uint64) {
	for i := range x.shards {
		s := &x.shards[i]
		s.mu.RLock()
		ids, bytes, evicted = ids+len(s.m), bytes+s.bytes, evicted+s.evicted
		s.mu.RUnlock()
	}
	return
}
