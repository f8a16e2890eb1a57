package sessionshard

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/warmroute/warmroute/internal/bytesconv"
)

// Router memory of SAAR (docs/design.md §5): per (session key, logical model)
// — see MemoryKey — what the model
// step needs to decide the next turn — last physical model and worker,
// matched decision, phase, counters, last access, end of the last response,
// the tool-call ids and Responses API ids each model issued, and the cache
// evidence (prompt and cached tokens seen). It is router state, never
// application memory: no message text is stored.
//
// Layout: an xsync.MapOf from the (copied) session key to a *MemoryEntry.
// A lookup takes no map lock and allocates nothing; each entry carries its
// own small mutex, held by the SAAR router for the few microseconds of one
// decision, so that two turns of one session are decided one after the
// other while different sessions never contend.
//
// Bounds: entries idle for longer than MemoryOptions.TTL are reported
// absent and dropped (lazily on lookup, eagerly by Sweep); the number of
// entries is capped by MemoryOptions.Capacity with LRU eviction in batches
// of an eighth of the capacity on insert; per entry the tool-call
// ids and response ids are kept in fixed-size rings.

// Defaults of MemoryOptions.
const (
	MemoryDefaultTTL            = time.Hour
	MemoryDefaultCapacity       = 1 << 17
	MemoryDefaultMaxToolIDs     = 64
	MemoryDefaultMaxResponseIDs = 32
)

// MemoryOptions configures a Memory; the zero value gives the defaults.
type MemoryOptions struct {
	TTL            time.Duration // idle time after which an entry is dropped; 0: 1h
	Capacity       int           // maximum entries; 0: 131072
	MaxToolIDs     int           // tool-call ids remembered per session; 0: 64
	MaxResponseIDs int           // response ids remembered per session; 0: 32
}

// MemoryState is the plain-value part of a session's router memory. It is
// copied by value into replay records (the "memory before" of a turn), so
// it holds no pointers to shared state. Times are unix nanoseconds.
type MemoryState struct {
	Model        string `json:"model,omitempty"`          // last physical model chosen
	Worker       string `json:"worker,omitempty"`         // worker that last served Model ("" until observed)
	Decision     string `json:"decision,omitempty"`       // decision matched on the last turn
	Phase        string `json:"phase,omitempty"`          // user_turn | tool_loop | provider_state
	Lock         string `json:"lock,omitempty"`           // model the last turn was hard-locked to ("" if none)
	Turns        int    `json:"turns,omitempty"`          // turns selected in this session
	Switches     int    `json:"switches,omitempty"`       // model changes in this session
	TurnsOnModel int    `json:"turns_on_model,omitempty"` // consecutive turns on Model
	LastAccess   int64  `json:"last_access,omitempty"`    // last selection
	LastEnd      int64  `json:"last_end,omitempty"`       // end of the last observed response (0: none yet)

	LastHistoryChars     int   `json:"last_history_chars,omitempty"`     // history characters of the last turn
	LastPromptTokens     int   `json:"last_prompt_tokens,omitempty"`     // prompt_tokens of the last response
	LastCompletionTokens int   `json:"last_completion_tokens,omitempty"` // completion_tokens of the last response
	PromptTokensSeen     int64 `json:"prompt_tokens_seen,omitempty"`     // sum of prompt_tokens (current model)
	CachedTokensSeen     int64 `json:"cached_tokens_seen,omitempty"`     // sum of cached_tokens (current model)

	Demand    float64 `json:"demand,omitempty"`     // policy v2: EWMA of the turns' complexity (the session's demand)
	DemandVar float64 `json:"demand_var,omitempty"` // policy v2: its exponentially weighted variance
}

type memoryToolID struct {
	id    string
	model string
}

type memoryResponse struct {
	id     string
	model  string
	worker string
}

// MemoryEntry is one session's router memory. Fields of State and the id
// rings are guarded by the entry's mutex: call Lock/Unlock around any read
// or write. The entry is never copied.
type MemoryEntry struct {
	mu         sync.Mutex
	lastAccess atomic.Int64 // unix ns, readable without mu (sweep, eviction)

	// State is guarded by the entry mutex.
	State MemoryState

	toolIDs   []memoryToolID
	toolNext  int
	responses []memoryResponse
	respNext  int
	maxTools  int
	maxResps  int
}

// Lock locks the entry.
func (e *MemoryEntry) Lock() { e.mu.Lock() }

// Unlock unlocks the entry.
func (e *MemoryEntry) Unlock() { e.mu.Unlock() }

// Touch records an access at now (unix ns). Caller holds the lock.
func (e *MemoryEntry) Touch(now int64) {
	e.State.LastAccess = now
	if now > e.lastAccess.Load() {
		e.lastAccess.Store(now)
	}
}

// AddToolCallID remembers that model issued the tool call id. id is copied.
// The oldest id is forgotten past MaxToolIDs. Caller holds the lock.
func (e *MemoryEntry) AddToolCallID(id []byte, model string) {
	if len(id) == 0 {
		return
	}
	v := memoryToolID{id: string(id), model: model}
	if len(e.toolIDs) < e.maxTools {
		e.toolIDs = append(e.toolIDs, v)
		return
	}
	e.toolIDs[e.toolNext] = v
	e.toolNext = (e.toolNext + 1) % len(e.toolIDs)
}

// ToolCallOwner returns the model that issued the tool call id. id is read
// only during the call. Caller holds the lock.
func (e *MemoryEntry) ToolCallOwner(id []byte) (string, bool) {
	for i := range e.toolIDs {
		if e.toolIDs[i].id == bytesconv.B2S(id) {
			return e.toolIDs[i].model, true
		}
	}
	return "", false
}

// AddResponse remembers that model on worker created the response id. id
// is copied. Caller holds the lock.
func (e *MemoryEntry) AddResponse(id []byte, model, worker string) {
	if len(id) == 0 {
		return
	}
	v := memoryResponse{id: string(id), model: model, worker: worker}
	if len(e.responses) < e.maxResps {
		e.responses = append(e.responses, v)
		return
	}
	e.responses[e.respNext] = v
	e.respNext = (e.respNext + 1) % len(e.responses)
}

// ResponseOwner returns the model and worker that created the response id.
// id is read only during the call. Caller holds the lock.
func (e *MemoryEntry) ResponseOwner(id []byte) (model, worker string, ok bool) {
	for i := range e.responses {
		if e.responses[i].id == bytesconv.B2S(id) {
			return e.responses[i].model, e.responses[i].worker, true
		}
	}
	return "", "", false
}

// ToolCallIDs returns how many tool-call ids the entry remembers. Caller
// holds the lock.
func (e *MemoryEntry) ToolCallIDs() int { return len(e.toolIDs) }

// MemoryKey appends the memory key of (logical model, session) to dst: the
// logical model name, a NUL byte, the session key. A session that uses two
// logical models keeps two memories (their candidates, decisions and locks
// differ). Logical model names come from the configuration and hold no
// NUL, so the first NUL splits the key and distinct pairs give distinct
// keys whatever bytes the session key holds.
func MemoryKey(dst, logical, session []byte) []byte {
	dst = append(dst, logical...)
	dst = append(dst, 0)
	return append(dst, session...)
}

// Memory is the sharded router memory of SAAR. All methods are safe for
// concurrent use. Keys passed as []byte may alias a request buffer: they
// are read only during the call and copied when stored.
type Memory struct {
	m        *xsync.MapOf[string, *MemoryEntry]
	opts     MemoryOptions
	evicting atomic.Bool // one capacity eviction at a time
}

// NewMemory returns an empty Memory.
func NewMemory(o MemoryOptions) *Memory {
	if o.TTL <= 0 {
		o.TTL = MemoryDefaultTTL
	}
	if o.Capacity <= 0 {
		o.Capacity = MemoryDefaultCapacity
	}
	if o.MaxToolIDs <= 0 {
		o.MaxToolIDs = MemoryDefaultMaxToolIDs
	}
	if o.MaxResponseIDs <= 0 {
		o.MaxResponseIDs = MemoryDefaultMaxResponseIDs
	}
	return &Memory{m: xsync.NewMapOf[string, *MemoryEntry](), opts: o}
}

func (m *Memory) expired(e *MemoryEntry, now int64) bool {
	return now-e.lastAccess.Load() > int64(m.opts.TTL)
}

// Get returns the live entry of key, or nil when absent or expired (an
// expired entry is dropped). It takes no locks and allocates nothing.
func (m *Memory) Get(key []byte, now int64) *MemoryEntry {
	e, ok := m.m.Load(bytesconv.B2S(key))
	if !ok {
		return nil
	}
	if m.expired(e, now) {
		m.deleteIf(string(key), e) // a copy: Compute may store its key
		return nil
	}
	return e
}

// GetOrCreate returns the live entry of key, creating it (and evicting one
// old entry when at capacity) when absent or expired. created reports a new
// entry. The new entry's last access is now.
func (m *Memory) GetOrCreate(key []byte, now int64) (e *MemoryEntry, created bool) {
	if e = m.Get(key, now); e != nil {
		return e, false
	}
	// At capacity: evict, or wait for the eviction running elsewhere (once
	// per capacity/8 inserts), so the overshoot stays bounded by the
	// number of concurrent inserters.
	for m.m.Size() >= m.opts.Capacity && !m.evictBatch(now) {
		runtime.Gosched()
	}
	ne := &MemoryEntry{maxTools: m.opts.MaxToolIDs, maxResps: m.opts.MaxResponseIDs}
	ne.lastAccess.Store(now)
	e, _ = m.m.Compute(string(key), func(old *MemoryEntry, loaded bool) (*MemoryEntry, bool) {
		if loaded && !m.expired(old, now) {
			return old, false
		}
		return ne, false
	})
	return e, e == ne
}

// evictBatch drops, in one pass, the expired entries and the least
// recently accessed ones beyond capacity plus an eighth of it, so that the
// next capacity/8 inserts evict nothing: amortised O(1) per insert, true
// LRU order (a sample taken by Range would always see the same buckets).
// One goroutine at a time: it reports false when another one is evicting.
func (m *Memory) evictBatch(now int64) bool {
	if !m.evicting.CompareAndSwap(false, true) {
		return false
	}
	defer m.evicting.Store(false)
	stamps := make([]int64, 0, m.m.Size())
	m.m.Range(func(_ string, e *MemoryEntry) bool {
		stamps = append(stamps, e.lastAccess.Load())
		return true
	})
	drop := len(stamps) - m.opts.Capacity + max(1, m.opts.Capacity/8)
	if drop <= 0 {
		return true
	}
	slices.Sort(stamps)
	cutoff := stamps[min(drop, len(stamps))-1]
	m.m.Range(func(k string, e *MemoryEntry) bool {
		if m.expired(e, now) || e.lastAccess.Load() <= cutoff {
			m.deleteIf(k, e)
		}
		return true
	})
	return true
}

func (m *Memory) deleteIf(k string, e *MemoryEntry) {
	m.m.Compute(k, func(old *MemoryEntry, loaded bool) (*MemoryEntry, bool) {
		return old, !loaded || old == e
	})
}

// Delete drops the entry of key.
func (m *Memory) Delete(key []byte) { m.m.Delete(bytesconv.B2S(key)) }

// Sweep drops every expired entry and returns how many it dropped.
func (m *Memory) Sweep(now int64) int {
	dropped := 0
	m.m.Range(func(k string, e *MemoryEntry) bool {
		if m.expired(e, now) {
			m.deleteIf(k, e)
			dropped++
		}
		return true
	})
	return dropped
}

// Len returns the number of entries held (expired ones not yet dropped
// included).
func (m *Memory) Len() int { return m.m.Size() }
