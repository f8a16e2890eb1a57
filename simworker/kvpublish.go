package simworker

import (
	crand "crypto/rand"
	"encoding/binary"
	"hash/maphash"
	"sync"
	"time"

	"github.com/warmroute/warmroute/kvevents"
)

// KV-cache events, as vLLM publishes them with --kv-events-config
// (docs/design.md §6): the cache logs its changes under its own lock as it
// makes them (kvLog); once per engine step (once per admission in the
// legacy model, once per reset) the log becomes one batch, encoded and
// queued outside that lock. The names and token ids published are opaque,
// as vLLM's are to a router: block hashes are the cache's chained hashes
// mixed with a random seed of this worker's (vLLM seeds its hashes at
// random unless PYTHONHASHSEED is fixed), token ids a hash of each token's
// text under a random seed of this process (one tokenizer for the workers
// of a process, as for one model's fleet), so nothing outside the worker
// computes either from a prompt. Without Config.KVEventsEndpoint none of
// this exists: the logs are nil and nothing is published.

// kvVocab is the vocabulary token ids are drawn from (Llama 3's size).
const kvVocab = 128256

// kvMedium is where the simulated blocks live.
const kvMedium = "GPU"

// kvPublisher is a worker's event publisher.
type kvPublisher struct {
	pub         *kvevents.Publisher
	seed        uint64 // mixed into every published block hash
	blockTokens int
	blockBytes  int
	charsPer    int

	// turn orders the batches as the cache changed: a cache takes it
	// before releasing its own lock and publishes after (publishUnlock).
	turn sync.Mutex
}

func newKVPublisher(cfg *Config) (*kvPublisher, error) {
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{
		Endpoint:       cfg.KVEventsEndpoint,
		ReplayEndpoint: cfg.KVEventsReplayEndpoint,
		BufferSteps:    cfg.KVEventsBufferSteps,
		DPRank:         -1, // no data-parallel ranks modelled
	})
	if err != nil {
		return nil, err
	}
	var b [8]byte
	_, _ = crand.Read(b[:])
	return &kvPublisher{
		pub:         pub,
		seed:        binary.LittleEndian.Uint64(b[:]),
		blockTokens: cfg.BlockTokens,
		blockBytes:  cfg.BlockTokens * cfg.CharsPerToken,
		charsPer:    cfg.CharsPerToken,
	}, nil
}

// KVEventsAddr is the KV events PUB endpoint as bound, its port resolved;
// "" when Config.KVEventsEndpoint is empty or could not be bound (then
// Serve and Start return the error).
func (w *Worker) KVEventsAddr() string {
	if w.kv == nil {
		return ""
	}
	return w.kv.pub.Addr()
}

// KVEventsReplayAddr is the KV events replay endpoint as bound; "" without.
func (w *Worker) KVEventsReplayAddr() string {
	if w.kv == nil {
		return ""
	}
	return w.kv.pub.ReplayAddr()
}

// hash is the published name of the block the cache names k: a bijective
// mix of k and the worker's seed, so distinct blocks keep distinct names.
func (k *kvPublisher) hash(x uint64) kvevents.BlockHash {
	z := x ^ k.seed
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return kvevents.BlockHash(z ^ (z >> 31))
}

func (k *kvPublisher) hashes(keys []uint64) []kvevents.BlockHash {
	out := make([]kvevents.BlockHash, len(keys))
	for i, x := range keys {
		out[i] = k.hash(x)
	}
	return out
}

// tokens are the token ids of text, CharsPerToken bytes a token.
func (k *kvPublisher) tokens(text []byte) []uint32 {
	out := make([]uint32, 0, (len(text)+k.charsPer-1)/k.charsPer)
	for off := 0; off < len(text); off += k.charsPer {
		out = append(out, uint32(maphash.Bytes(hashSeed, text[off:min(off+k.charsPer, len(text))])%kvVocab))
	}
	return out
}

// publishUnlock releases a cache's lock (unlock) and publishes ops as one
// batch, in turn with every other batch of this worker.
func (k *kvPublisher) publishUnlock(ops []kvOp, unlock func()) {
	if len(ops) == 0 {
		unlock()
		return
	}
	k.turn.Lock()
	unlock()
	defer k.turn.Unlock()
	evs := make([]kvevents.Event, 0, len(ops))
	for i := range ops {
		op := &ops[i]
		switch op.kind {
		case opStored:
			ev := kvevents.BlockStored{
				BlockHashes: k.hashes(op.keys[op.from:op.to]),
				TokenIDs:    k.tokens(op.prompt[op.from*k.blockBytes : op.to*k.blockBytes]),
				BlockSize:   k.blockTokens,
				LoRAID:      -1,
				Medium:      kvMedium,
				GroupIdx:    -1,
			}
			if op.from > 0 {
				ev.ParentBlockHash, ev.HasParent = k.hash(op.keys[op.from-1]), true
			}
			if op.lora != nil {
				ev.LoRAID, ev.LoRAName = op.lora.id, op.lora.name
			}
			evs = append(evs, ev)
		case opRemoved:
			evs = append(evs, kvevents.BlockRemoved{BlockHashes: k.hashes(op.keys), Medium: kvMedium, GroupIdx: -1})
		case opCleared:
			evs = append(evs, kvevents.AllBlocksCleared{})
		}
	}
	// An error here is a closed publisher: the worker is closing.
	_, _ = k.pub.Publish(kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs, DPRank: -1})
}

// kvOpKind is what a kvOp records.
type kvOpKind uint8

const (
	opStored kvOpKind = iota
	opRemoved
	opCleared
)

// kvOp is one change of a cache, recorded under its lock and made an event
// outside it: for opStored the blocks keys[from:to] of the chain keys
// entered the cache (their parent keys[from-1] when from > 0; prompt the
// text keys names, lora its adapter or nil); for opRemoved the blocks keys
// left it, in the order they were evicted; opCleared, everything did.
type kvOp struct {
	kind     kvOpKind
	keys     []uint64
	from, to int
	prompt   []byte
	lora     *adapter
}

// kvLog is a cache's changes since it last published. Adjacent changes of
// one kind merge: consecutive blocks of one chain into one BlockStored,
// consecutive evictions into one BlockRemoved. Its size is bounded by the
// work between two publications (a step's prefill, an admission).
type kvLog struct{ ops []kvOp }

// stored records that chain[i] entered the cache.
func (l *kvLog) stored(chain []uint64, i int, j *job) {
	if n := len(l.ops); n > 0 {
		last := &l.ops[n-1]
		if last.kind == opStored && last.to == i && &last.keys[0] == &chain[0] {
			last.to++
			return
		}
	}
	l.ops = append(l.ops, kvOp{kind: opStored, keys: chain, from: i, to: i + 1, prompt: j.prompt, lora: j.lora})
}

// removed records that the block named k left the cache.
func (l *kvLog) removed(k uint64) {
	if n := len(l.ops); n > 0 && l.ops[n-1].kind == opRemoved {
		l.ops[n-1].keys = append(l.ops[n-1].keys, k)
		return
	}
	l.ops = append(l.ops, kvOp{kind: opRemoved, keys: []uint64{k}})
}

// cleared records that every block left the cache.
func (l *kvLog) cleared() { l.ops = append(l.ops, kvOp{kind: opCleared}) }

// take returns the changes logged and empties the log.
func (l *kvLog) take() []kvOp {
	ops := l.ops
	l.ops = nil
	return ops
}
