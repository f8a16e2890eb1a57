package saar

import "sync"

// idIndex is a bounded map from an id (tool-call id, response id) to the
// model and worker that issued it. It is global to a Router so that locks
// hold even for clients that send no session id, and so that
// GET|DELETE /v1/responses/{id} can be routed. Sharded by FNV-1a of the
// id; each shard forgets its oldest id (FIFO) past its capacity.
// Lookups take a shard read lock and allocate nothing.
type idIndex struct {
	shards [idShards]idShard
}

const idShards = 16

type owner struct {
	model  string
	worker string
}

type idShard struct {
	mu   sync.RWMutex
	m    map[string]owner
	ring []string
	next int
	max  int
	_    [40]byte // keep shards on separate cache lines
}

func newIDIndex(capacity int) *idIndex {
	per := capacity / idShards
	if per < 1 {
		per = 1
	}
	x := &idIndex{}
	for i := range x.shards {
		x.shards[i].m = make(map[string]owner)
		x.shards[i].max = per
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

// put stores id → o; id is copied.
func (x *idIndex) put(id []byte, o owner) {
	if len(id) == 0 {
		return
	}
	s := x.shard(id)
	s.mu.Lock()
	if _, ok := s.m[b2s(id)]; ok {
		s.m[string(id)] = o // not b2s: an overwrite may replace the stored key
		s.mu.Unlock()
		return
	}
	k := string(id)
	if len(s.ring) < s.max {
		s.ring = append(s.ring, k)
	} else {
		delete(s.m, s.ring[s.next])
		s.ring[s.next] = k
		s.next = (s.next + 1) % s.max
	}
	s.m[k] = o
	s.mu.Unlock()
}

// get returns the owner of id; id is read only during the call.
func (x *idIndex) get(id []byte) (owner, bool) {
	if len(id) == 0 {
		return owner{}, false
	}
	s := x.shard(id)
	s.mu.RLock()
	o, ok := s.m[string(id)]
	s.mu.RUnlock()
	return o, ok
}

// del forgets id (its ring slot is reused later).
func (x *idIndex) del(id []byte) {
	s := x.shard(id)
	s.mu.Lock()
	delete(s.m, string(id))
	s.mu.Unlock()
}
