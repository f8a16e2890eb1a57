package simworker

import (
	"encoding/binary"
	"hash/maphash"
	"sync"
)

// prefixCache models vLLM's automatic prefix caching: the prompt is cut into
// blocks of blockBytes, block i is named by a hash chained over blocks 0..i
// (so a block hit implies the whole prefix before it), only full blocks are
// cached, and blocks are evicted least recently used once capacity blocks are
// held.
//
// Blocks of one prompt are touched from the last to the first, so the first
// block is the most recently used: eviction eats a prompt from its tail, as
// vLLM's free-block queue does, and a surviving block's prefix survives too.
//
// All methods are safe for concurrent use; one mutex guards the LRU list.
type prefixCache struct {
	mu       sync.Mutex
	capacity int
	index    map[uint64]int32 // block hash → node
	nodes    []lruNode        // nodes[0] is the sentinel: next = most recent, prev = least recent
	free     []int32

	kv      *kvPublisher // KV events (kvpublish.go); nil: none
	evicted []uint64     // with kv: the blocks lookupInsert evicted, in order
}

type lruNode struct {
	key        uint64
	prev, next int32
}

var hashSeed = maphash.MakeSeed()

func newPrefixCache(capacity int) *prefixCache {
	c := &prefixCache{
		capacity: capacity,
		index:    make(map[uint64]int32, min(capacity, 1<<16)),
		nodes:    make([]lruNode, 1, min(capacity, 1<<16)+1),
	}
	return c
}

// blockHashes appends to dst the chained hashes of the full blocks of prompt
// (blockBytes each), starting the chain from salt (the model name's hash, so
// that models served by one worker never share blocks).
func blockHashes(dst []uint64, salt uint64, prompt []byte, blockBytes int) []uint64 {
	var h maphash.Hash
	h.SetSeed(hashSeed)
	var prev [8]byte
	binary.LittleEndian.PutUint64(prev[:], salt)
	for off := 0; off+blockBytes <= len(prompt); off += blockBytes {
		h.Reset()
		h.Write(prev[:])
		h.Write(prompt[off : off+blockBytes])
		s := h.Sum64()
		dst = append(dst, s)
		binary.LittleEndian.PutUint64(prev[:], s)
	}
	return dst
}

// lookupInsert returns how many leading blocks of the chain were cached, then
// inserts (or refreshes) every block of the chain, for job j.
func (c *prefixCache) lookupInsert(chain []uint64, j *job) (cached int) {
	c.mu.Lock()
	for _, k := range chain {
		if _, ok := c.index[k]; !ok {
			break
		}
		cached++
	}
	if c.kv != nil {
		c.publishInsert(chain, j)
		return cached
	}
	for i := len(chain) - 1; i >= 0; i-- {
		c.touch(chain[i])
	}
	c.mu.Unlock()
	return cached
}

// publishInsert is lookupInsert's insertion with KV events, c.mu held (and
// released). The cache inserts a chain from its tail, and a chain longer
// than the free room evicts blocks it touched itself or is about to touch,
// so what it publishes is the admission's net change, as one batch: the
// blocks it evicted that are gone after it, in eviction order, then the
// chain's blocks that were absent before and are present after, in chain
// order (each run hanging off the block before it).
func (c *prefixCache) publishInsert(chain []uint64, j *job) {
	was := make([]bool, len(chain))
	for i, k := range chain {
		_, was[i] = c.index[k]
	}
	c.evicted = c.evicted[:0]
	for i := len(chain) - 1; i >= 0; i-- {
		c.touch(chain[i])
	}
	var log kvLog
	if len(c.evicted) > 0 {
		inChain := make(map[uint64]int, len(chain))
		for i, k := range chain {
			inChain[k] = i
		}
		gone := make(map[uint64]struct{}, len(c.evicted))
		for _, k := range c.evicted {
			if _, ok := c.index[k]; ok {
				continue // evicted, then touched again
			}
			if i, ok := inChain[k]; ok && !was[i] {
				continue // inserted and evicted by this admission
			}
			if _, ok := gone[k]; !ok {
				gone[k] = struct{}{}
				log.removed(k)
			}
		}
	}
	var keys []uint64
	for i, k := range chain {
		if _, ok := c.index[k]; ok && !was[i] {
			if keys == nil {
				keys = append([]uint64(nil), chain...) // chain is the caller's buffer
			}
			log.stored(keys, i, j)
		}
	}
	c.kv.publishUnlock(log.ops, c.mu.Unlock)
}

// contains reports how many leading blocks of the chain are cached, without
// touching them.
func (c *prefixCache) contains(chain []uint64) (cached int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range chain {
		if _, ok := c.index[k]; !ok {
			break
		}
		cached++
	}
	return cached
}

// used returns the number of blocks held.
func (c *prefixCache) used() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.index)
}

// reset drops every block: AllBlocksCleared, with KV events.
func (c *prefixCache) reset() {
	c.mu.Lock()
	clear(c.index)
	c.nodes = c.nodes[:1]
	c.nodes[0] = lruNode{}
	c.free = c.free[:0]
	if c.kv == nil {
		c.mu.Unlock()
		return
	}
	c.kv.publishUnlock([]kvOp{{kind: opCleared}}, c.mu.Unlock)
}

// touch makes k the most recently used block, inserting it (and evicting the
// least recently used block at capacity) when absent. c.mu must be held.
func (c *prefixCache) touch(k uint64) {
	if i, ok := c.index[k]; ok {
		c.unlink(i)
		c.pushFront(i)
		return
	}
	if c.capacity <= 0 {
		return
	}
	if len(c.index) >= c.capacity {
		lru := c.nodes[0].prev
		c.unlink(lru)
		delete(c.index, c.nodes[lru].key)
		c.free = append(c.free, lru)
		if c.kv != nil {
			c.evicted = append(c.evicted, c.nodes[lru].key)
		}
	}
	var i int32
	if n := len(c.free); n > 0 {
		i = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		c.nodes = append(c.nodes, lruNode{})
		i = int32(len(c.nodes) - 1)
	}
	c.nodes[i].key = k
	c.index[k] = i
	c.pushFront(i)
}

func (c *prefixCache) unlink(i int32) {
	n := &c.nodes[i]
	c.nodes[n.prev].next = n.next
	c.nodes[n.next].prev = n.prev
}

func (c *prefixCache) pushFront(i int32) {
	head := c.nodes[0].next
	c.nodes[i].prev = 0
	c.nodes[i].next = head
	c.nodes[head].prev = i
	c.nodes[0].next = i
}
