// Package kvevents is vLLM's KV-cache event stream, both ends: the wire
// format of the batches an engine publishes when its KV cache stores, evicts
// or clears blocks, a Publisher that speaks it (the simulated worker, tests)
// and a Subscriber that follows one engine's stream in sequence order,
// filling gaps from the engine's replay socket and saying when it cannot.
// It is the transport under "the tree follows the engine: evictions from its
// KV events" (docs/design.md §9, the row for KV caches smaller than the
// working set); mapping block chains onto the router's tree is not here.
//
// The wire. Each message is three ZMQ frames: the topic, the sequence number
// as 8 big-endian bytes, and one msgpack-encoded batch. A batch is
// [ts, events] or [ts, events, data_parallel_rank] (a map with those keys is
// read too). An event is a tagged union: newer engines send a map with the
// tag under "type" and fields by name, older ones a positional array whose
// first element is the tag; both are read, unknown tags and unknown fields are
// skipped, and every length is bounded (Limits) before anything is allocated.
// Replay is a ROUTER socket: a client sends [empty, start sequence] and gets
// [empty, sequence, batch] for every buffered batch from start on, then
// [empty, 8 bytes of 0xff, empty].
package kvevents

// BlockHash names a KV block as the engine reports it. vLLM sends a block
// hash as an integer, or as the raw hash bytes when integer hashes are turned
// off; bytes are read as vLLM itself turns them into an integer: the
// big-endian value of the bytes modulo 2^64 (the last eight bytes), so both
// forms of one engine's hashes name a block alike. A negative integer (older
// engines hashed with Python's hash()) is kept as its two's complement.
type BlockHash uint64

// Batch is one published message: the events of one engine step.
type Batch struct {
	// TS is the engine's wall clock when the batch was made, in seconds.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank of the engine that published it, -1
	// when the batch does not say.
	DPRank int
}

// Event is one of BlockStored, BlockRemoved and AllBlocksCleared.
type Event interface{ isEvent() }

// BlockStored says a chain of full blocks entered the cache (medium), each
// block's hash in BlockHashes, the chain hanging off ParentBlockHash when
// HasParent, TokenIDs the tokens of all the blocks in order.
type BlockStored struct {
	BlockHashes     []BlockHash
	ParentBlockHash BlockHash
	HasParent       bool
	TokenIDs        []uint32
	BlockSize       int
	// LoRAID is the adapter's number, -1 when none; LoRAName its name.
	LoRAID   int
	LoRAName string
	// Medium is where the blocks live ("GPU", "CPU", ...), "" when unsaid.
	Medium string
	// GroupIdx is the KV cache group of a hybrid model, -1 when unsaid.
	GroupIdx int
}

// BlockRemoved says the blocks left the cache (medium).
type BlockRemoved struct {
	BlockHashes []BlockHash
	Medium      string
	GroupIdx    int
}

// AllBlocksCleared says the engine dropped its whole prefix cache.
type AllBlocksCleared struct{}

func (BlockStored) isEvent()      {}
func (BlockRemoved) isEvent()     {}
func (AllBlocksCleared) isEvent() {}

// The tags of the tagged union, as vLLM names its classes.
const (
	tagStored  = "BlockStored"
	tagRemoved = "BlockRemoved"
	tagCleared = "AllBlocksCleared"
)

// Limits bound what one message may make the decoder allocate. A message
// over any of them is rejected whole, before the allocation. The zero value
// of a field means its default.
type Limits struct {
	// MaxPayloadBytes bounds a batch's encoded size, and with it every ZMQ
	// frame a peer may send.
	MaxPayloadBytes int
	// MaxEvents bounds the events of one batch.
	MaxEvents int
	// MaxHashes bounds the block hashes of one event.
	MaxHashes int
	// MaxTokens bounds the token ids of one event.
	MaxTokens int
}

// Defaults: far above what one engine step of a large model stores (a
// 32k-token prefill stores 2,048 blocks: about 150 KB encoded).
const (
	DefaultMaxPayloadBytes = 4 << 20
	DefaultMaxEvents       = 1 << 16
	DefaultMaxHashes       = 1 << 16
	DefaultMaxTokens       = 1 << 20

	// maxString bounds a tag, a medium or an adapter name.
	maxString = 1024
	// maxHashBytes bounds a block hash sent as bytes (vLLM's are 32).
	maxHashBytes = 64
)

func (l Limits) withDefaults() Limits {
	if l.MaxPayloadBytes <= 0 {
		l.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if l.MaxEvents <= 0 {
		l.MaxEvents = DefaultMaxEvents
	}
	if l.MaxHashes <= 0 {
		l.MaxHashes = DefaultMaxHashes
	}
	if l.MaxTokens <= 0 {
		l.MaxTokens = DefaultMaxTokens
	}
	return l
}
