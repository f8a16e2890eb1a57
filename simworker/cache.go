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
// inserts (or refreshes) every block of the chain.
func (c *prefixCache) lookupInsert(chain []uint64) (cached int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range chain {
		if _, ok := c.index[k]; !ok {
			break
		}
		cached++
	}
	for i := len(chain) - 1; i >= 0; i-- {
		c.touch(chain[i])
	}
	return cached
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

// reset drops every block.
func (c *prefixCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.index)
	c.nodes = c.nodes[:1]
	c.nodes[0] = lruNode{}
	c.free = c.free[:0]
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
