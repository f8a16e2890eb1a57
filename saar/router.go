package saar

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/bytedance/sonic"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/sessionshard"
	"github.com/warmroute/warmroute/sharedstate"
)

// Options configure a Router. The zero value is usable.
type Options struct {
	// Now is the clock; nil means time.Now. The policy matrix and the tests
	// inject a simulated clock.
	Now func() time.Time
	// Replay, when set, receives every record as one JSON line, in queue
	// order (a session's records in turn order), from one goroutine: Select
	// only queues the record. A full queue drops the record (Stats.
	// ReplayDropped, vllm_router_saar_replay_dropped_total); a write error
	// is counted (Stats.ReplayWriteErrors) and otherwise ignored. Call
	// Router.Close at shutdown to write what is queued; Close does not
	// close Replay.
	Replay io.Writer
	// ReplayQueue is the number of records that may wait for the Replay
	// writer; 0 means DefaultReplayQueue (4096).
	ReplayQueue int
	// RingSize is the number of records kept in memory for Records
	// (/v1/router_replay); 0 means DefaultRingSize (4096), negative
	// disables the ring.
	RingSize int
	// RingBytes bounds the ring's estimated memory; the oldest records go
	// first. 0 means DefaultRingBytes (8 MiB).
	RingBytes int
	// RingTextBytes caps the latest user text of a ring record (the Replay
	// log keeps it up to MaxTextBytes); 0 means DefaultRingTextBytes
	// (1024), negative keeps no text. Other client-influenced strings of a
	// ring record are cut to RingFieldBytes. A cut record has Clipped set
	// and may not replay exactly.
	RingTextBytes int
	// Metrics is the set the router's counters are registered in; nil
	// means a new set (see Router.WriteMetrics).
	Metrics *metrics.Set
	// MaxTextBytes caps the latest user text kept in the inputs (and thus
	// what the signals see, so that a record replays exactly); 0 means 8192.
	MaxTextBytes int
	// IndexCapacity bounds each global id index (tool-call ids, response
	// ids, reasoning artifact ids) in ids; 0 means 1<<16.
	IndexCapacity int
	// IndexBytes bounds each global id index in estimated bytes (id bytes
	// plus about 96 per id); 0 means 8 MiB. Past either bound the oldest
	// ids go first.
	IndexBytes int
	// IndexTTL is how long an id of a global index is known after it was
	// last stored; 0 means one hour (the session memory's TTL).
	IndexTTL time.Duration
	// Memory configures the router memory.
	Memory sessionshard.MemoryOptions
	// Policy selects the policy version, the mode and the ablations (policy
	// matrix). The zero value is full SAAR under PolicyVersion.
	Policy Policy
	// ReplayPrefix prefixes replay ids (for example an instance id); the
	// default is "saar-".
	ReplayPrefix string
	// Shared, when set, shares the hard locks and the session memory with
	// the other replicas through Redis (docs/design.md §8.3): an id or a
	// session this replica does not know is looked up there before a turn
	// is decided, memory changes are written asynchronously, and the proxy
	// writes each response's locks with ShareLocks. nil (or a nil
	// *sharedstate.Store): local state only, at no cost.
	Shared SharedState
}

// Turn is what the front end tells the model step about one request. Every
// []byte field may alias a request buffer: it is read only during Select
// and never retained (what is stored is copied).
type Turn struct {
	Logical            []byte   // requested model, a logical model name
	Session            []byte   // session key ("" none: no memory, global indexes only)
	LatestUserText     []byte   // text of the latest user message
	HistoryChars       int      // characters of the whole history key
	HasTools           bool     // tools offered
	ToolResultIDs      [][]byte // tool_call_ids of trailing role:tool messages / function_call_output items
	ToolResults        int      // trailing tool results, with or without an id (at least len(ToolResultIDs))
	PreviousResponseID []byte   // Responses API previous_response_id
	OpaqueReasoning    bool     // encrypted or signed reasoning state in the history
	// ReasoningID names the history's last opaque reasoning artifact
	// (reqview.View.ReasoningID; zero: none): a hard lock to the model and
	// worker that produced it, when known (docs/design.md §5).
	ReasoningID     reqview.ReasoningID
	ReasoningEffort []byte // reasoning_effort (or reasoning.effort)
	Header          func(name string) []byte
}

// Health tells Select which models and workers can serve. A nil func means
// "all up". ModelUp reports whether the model has at least one healthy
// worker.
//
// Pool, when set, tells each physical model's pool as the router's queue
// sees it (PoolState, without Model): whether a request sent there now
// would wait, how long, and its prefill speed; the overflow rule reads it
// (overflow.go). nil: no pool is saturated (no overflow).
type Health struct {
	ModelUp  func(model string) bool
	WorkerUp func(worker string) bool
	Pool     func(model string) PoolState
}

// Selection is the model step's answer. Strings are immutable and may be
// kept.
type Selection struct {
	Model        string // physical model to serve the turn ("" when Logical is not a logical model)
	Decision     string // matched decision
	Phase        string // user_turn | tool_loop | provider_state
	Action       string // first | stay | switch | hard_lock | reset_idle | reset_drift | lock_broken
	Reason       string // short constant text (see Reason* constants)
	PinnedWorker string // worker the turn must go to (provider-state lock), "" free choice
	ReplayID     string // id of the replay record
	LockKind     string // tool_loop | provider_state when Action is hard_lock or lock_broken
	LockModel    string // model the turn is hard-locked to ("" none, or the lock was broken)
	OverflowFrom string // the model chosen before the turn overflowed to Model (Action overflow; "" none)
}

// Observed is what a response taught. []byte fields are read only during
// Observe.
type Observed struct {
	ResponseID       []byte                // Responses API id created by the response
	ToolCallIDs      [][]byte              // tool-call ids issued by the response
	ReasoningIDs     []reqview.ReasoningID // opaque reasoning artifacts the response carried
	PromptTokens     int                   // usage.prompt_tokens
	CachedTokens     int                   // usage.prompt_tokens_details.cached_tokens
	CompletionTokens int                   // usage.completion_tokens
	// Lock is the Selection.LockModel of the turn being observed: when set
	// and model differs, the call counts a continuity violation (served
	// model ≠ the lock's model without an explicit break).
	Lock string
	// Logical is the logical model of the turn (Turn.Logical): memory is
	// per (session, logical model). When empty, Observe teaches the memory
	// of the config's only logical model, or else of the logical model
	// whose memory of the session most recently selected model.
	Logical []byte
}

// Stats are the Router's own counters (the same events as the metrics,
// per Router).
type Stats struct {
	Selections           uint64
	Switches             uint64
	HardLocks            uint64
	LockBreaks           uint64
	LockConflicts        uint64 // tool results of two models in one request (ReasonToolLoopConflict)
	WorkerFailovers      uint64
	ContinuityViolations uint64
	ReplayWriteErrors    uint64 // records the Replay writer failed to encode or write
	ReplayDropped        uint64 // records not queued for the Replay writer (queue full, or after Close)
	LockUnreachable      uint64 // turns whose lock owner the shared store could not be asked for (Reason*Down)
	Overflows            uint64 // turns moved off a saturated pool (ActionOverflow)
}

// Router is the SAAR model step. All methods are safe for concurrent use.
// Two turns of one session are decided one after the other (the session's
// memory entry is locked during Select and Observe); different sessions
// never contend except on the global id indexes and the replay ring (both
// sharded, short critical sections) and the Replay queue (a non-blocking
// channel send).
type Router struct {
	cfg   atomic.Pointer[Config] // swapped whole by SetConfig (reload); a turn reads it once
	opt   Options
	now   func() time.Time
	mem   *sessionshard.Memory
	tools *idIndex
	resps *idIndex
	reas  *idIndex // reasoning artifact ids (hex, reasoningKey) → model and worker
	met   *routerMetrics

	seq atomic.Uint64

	ring *ring      // nil: disabled
	log  *replayLog // nil: no Replay writer
	sh   *shared    // nil: no shared store (Options.Shared)

	stSelections, stSwitches, stHardLocks, stLockBreaks, stConflicts, stFailovers, stViolations, stWriteErrs, stDropped, stUnreachable, stOverflows atomic.Uint64
}

// NewRouter returns a Router over cfg (shared, read-only). With
// opt.Replay set it starts the replay writer goroutine: call Close at
// shutdown.
func NewRouter(cfg *Config, opt Options) *Router {
	if opt.RingSize == 0 {
		opt.RingSize = DefaultRingSize
	}
	if opt.RingBytes <= 0 {
		opt.RingBytes = DefaultRingBytes
	}
	if opt.RingTextBytes == 0 {
		opt.RingTextBytes = DefaultRingTextBytes
	}
	if opt.ReplayQueue <= 0 {
		opt.ReplayQueue = DefaultReplayQueue
	}
	if opt.Metrics == nil {
		opt.Metrics = metrics.NewSet()
	}
	if opt.MaxTextBytes <= 0 {
		opt.MaxTextBytes = 8192
	}
	if opt.IndexCapacity <= 0 {
		opt.IndexCapacity = 1 << 16
	}
	if opt.IndexBytes <= 0 {
		opt.IndexBytes = DefaultIndexBytes
	}
	if opt.IndexTTL <= 0 {
		opt.IndexTTL = sessionshard.MemoryDefaultTTL
	}
	if opt.Policy.Version == 0 {
		opt.Policy.Version = PolicyVersion
	}
	if opt.ReplayPrefix == "" {
		opt.ReplayPrefix = "saar-"
	}
	r := &Router{
		opt:   opt,
		now:   opt.Now,
		mem:   sessionshard.NewMemory(opt.Memory),
		tools: newIDIndex(opt.IndexCapacity, opt.IndexBytes, int64(opt.IndexTTL)),
		resps: newIDIndex(opt.IndexCapacity, opt.IndexBytes, int64(opt.IndexTTL)),
		reas:  newIDIndex(opt.IndexCapacity, opt.IndexBytes, int64(opt.IndexTTL)),
		met:   newRouterMetrics(cfg, opt.Metrics),
	}
	r.cfg.Store(cfg)
	r.met.indexGauges(r.tools, r.resps, r.reas)
	if r.now == nil {
		r.now = time.Now
	}
	r.opt.Shared = sharedOrNil(opt.Shared)
	if r.opt.Shared != nil {
		newShared(r, r.opt.Shared, opt.Metrics)
	}
	if opt.RingSize > 0 {
		r.ring = newRing(opt.RingSize, opt.RingBytes, opt.RingTextBytes)
	}
	if opt.Replay != nil {
		r.log = newReplayLog(opt.Replay, opt.ReplayQueue,
			func() { r.stDropped.Add(1); r.met.dropped.Inc() },
			func(n int) { r.stWriteErrs.Add(uint64(n)); r.met.writeErrs.Add(n) })
	}
	return r
}

// Close writes the records queued for the Replay writer and stops it; call
// it at shutdown, after the server stops serving and before Replay is
// closed. Later records are dropped (counted). It is safe to call more than
// once, and a no-op without Options.Replay.
func (r *Router) Close() {
	if r.log != nil {
		r.log.close()
	}
}

// Config returns the router's current configuration.
func (r *Router) Config() *Config { return r.cfg.Load() }

// SetConfig replaces the configuration (a reload, docs/design.md §8,
// "Reload and audit"): turns decided after it use cfg; a turn in flight
// finishes under the config it started with. The session memory, the id
// indexes and the locks are kept: a session whose model cfg no longer
// has moves on its next turn, and a lock to such a model breaks
// explicitly (lock_broken), as for a model with no healthy worker.
func (r *Router) SetConfig(cfg *Config) {
	r.met.setModels(cfg)
	r.cfg.Store(cfg)
}

// Memory returns the router memory (for sweeping and inspection).
func (r *Router) Memory() *sessionshard.Memory { return r.mem }

// IsLogical reports whether model is a logical model.
func (r *Router) IsLogical(model string) bool { return r.cfg.Load().IsLogical(model) }

// IsLogicalBytes is IsLogical for a name that aliases a request buffer
// (read only during the call; no allocation).
func (r *Router) IsLogicalBytes(model []byte) bool { return r.cfg.Load().logical(model) != nil }

// LogicalModels returns the logical model names in config order.
func (r *Router) LogicalModels() []string {
	cfg := r.cfg.Load()
	out := make([]string, len(cfg.Logical))
	for i := range cfg.Logical {
		out[i] = cfg.Logical[i].Name
	}
	return out
}

// Stats returns the router's counters.
func (r *Router) Stats() Stats {
	return Stats{
		Selections:           r.stSelections.Load(),
		Switches:             r.stSwitches.Load(),
		HardLocks:            r.stHardLocks.Load(),
		LockBreaks:           r.stLockBreaks.Load(),
		LockConflicts:        r.stConflicts.Load(),
		WorkerFailovers:      r.stFailovers.Load(),
		ContinuityViolations: r.stViolations.Load(),
		ReplayWriteErrors:    r.stWriteErrs.Load(),
		ReplayDropped:        r.stDropped.Load(),
		LockUnreachable:      r.stUnreachable.Load(),
		Overflows:            r.stOverflows.Load(),
	}
}

// DefaultIndexBytes is the default byte budget of each global id index.
const DefaultIndexBytes = 8 << 20

var efforts = [...]string{"minimal", "none", "low", "medium", "high", "xhigh"}

// historyTokens (docs/design.md §5): the previous turn's reported prompt_tokens plus
// the new text (characters added since, / 4), or characters / 4 where no
// usage was reported.
func historyTokens(chars int, m *sessionshard.MemoryState) int {
	if m.LastPromptTokens > 0 {
		extra := chars - m.LastHistoryChars
		if extra < 0 {
			extra = 0
		}
		return m.LastPromptTokens + extra/4
	}
	return chars / 4
}

// Select chooses the physical model of one turn of a logical model, teaches
// the session memory at once (so that the next turn of the session, even
// one sent while this one is in flight, sees the choice), counts metrics
// and emits the replay record. A Turn whose Logical is not a logical model
// gets a zero Selection.
func (r *Router) Select(t *Turn, h Health) Selection {
	cfg := r.cfg.Load()
	lg := cfg.logical(t.Logical)
	if lg == nil {
		return Selection{}
	}
	now := r.now().UnixNano()
	var in Inputs
	r.readTurn(&in, cfg, lg, t)

	// The session's memory entry stays locked until the turn is decided and
	// remembered: two turns of one session are decided one after the other.
	var e *sessionshard.MemoryEntry
	var before sessionshard.MemoryState
	if len(t.Session) > 0 {
		var created bool
		e, created = r.sessionEntry(t, now)
		e.Lock()
		defer e.Unlock()
		if r.sh != nil {
			r.loadMemory(e, t.Logical, t.Session, created)
		}
		before = e.State
	}
	var mem *sessionshard.MemoryState
	if before.Model != "" {
		mem = &before
	}
	in.HistoryTokens = historyTokens(t.HistoryChars, &before)
	r.findLocks(&in, t, e, now)
	markDown(&in, cfg, h, t, before.Worker)
	markPools(&in, cfg, h)

	out := Decide(cfg, r.opt.Policy, &in, mem, now)

	if e != nil {
		r.remember(e, t, &out, now)
	}
	seq := r.seq.Add(1)
	sel := r.selection(&out, seq)
	r.count(&sel, &out, &in, mem)
	r.record(&sel, cfg.Revision, seq, t, &in, mem, &out, now)
	return sel
}

// readTurn fills what the inputs take from the Turn as it is: the logical
// model, the latest user text (unescaped, so that signals match what the
// user wrote, and capped at MaxTextBytes), the history's size, tools,
// reasoning effort and the headers the config's signals read.
func (r *Router) readTurn(in *Inputs, cfg *Config, lg *Logical, t *Turn) {
	in.Logical = lg.Name
	in.HistoryChars = t.HistoryChars
	in.HasTools = t.HasTools
	in.ToolResults = max(len(t.ToolResultIDs), t.ToolResults)
	in.OpaqueReasoning = t.OpaqueReasoning
	text := unescape(t.LatestUserText)
	if len(text) > r.opt.MaxTextBytes {
		text, in.TextTruncated = text[:r.opt.MaxTextBytes], true
	}
	in.Text = string(text)
	in.ReasoningEffort = effortName(t.ReasoningEffort)
	if t.Header != nil {
		for _, name := range cfg.headers {
			if v := t.Header(name); len(v) > 0 {
				in.Headers = append(in.Headers, HeaderValue{Name: name, Value: string(v)})
			}
		}
	}
}

// effortName is the recorded reasoning_effort: a known level, "other" for
// any other value, "" when none was sent.
func effortName(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	for _, e := range efforts {
		if e == bytesconv.B2S(b) {
			return e
		}
	}
	return "other"
}

// sessionEntry returns the memory entry of the turn's session, and whether
// it was created by this call.
func (r *Router) sessionEntry(t *Turn, now int64) (*sessionshard.MemoryEntry, bool) {
	var kb [320]byte
	return r.mem.GetOrCreate(sessionshard.MemoryKey(kb[:0], t.Logical, t.Session), now)
}

// findLocks resolves the owners of the turn's lock evidence — tool-call
// ids, previous_response_id, the last opaque reasoning artifact — from the
// session's memory e (nil: none), the global indexes and, with a shared
// store, the other replicas (docs/design.md §8.3).
func (r *Router) findLocks(in *Inputs, t *Turn, e *sessionshard.MemoryEntry, now int64) {
	r.toolOwners(in, t, e, now)
	r.responseOwner(in, t, e, now)
	r.reasoningOwner(in, t, now)
}

// toolOwners finds the model that issued the turn's tool-call ids. The
// last resolvable id's owner is the evidence; an id owned by another model
// is a conflict (ToolOwnerConflict).
func (r *Router) toolOwners(in *Inputs, t *Turn, e *sessionshard.MemoryEntry, now int64) {
	if len(t.ToolResultIDs) > 0 {
		in.ToolResultID = clip(t.ToolResultIDs[0])
	}
	for _, id := range t.ToolResultIDs {
		m, src, ok := r.toolOwner(in, e, id, now)
		if !ok {
			continue
		}
		if in.ToolOwner != "" && in.ToolOwner != m {
			in.ToolOwnerConflict = in.ToolOwner
		}
		in.ToolOwner, in.ToolOwnerSource = m, src
	}
	if in.ToolOwnerConflict == in.ToolOwner {
		in.ToolOwnerConflict = ""
	}
}

// toolOwner is the model that issued one tool-call id, and where it was
// found: the session's own memory first, since tool-call ids are not unique
// across backends (call_0, functions.name:0) and the global index, keyed
// by id alone, only answers for a session that does not know the id; then
// the shared store, as another replica may have served the call (a store
// that cannot answer marks ToolOwnerUnreachable).
func (r *Router) toolOwner(in *Inputs, e *sessionshard.MemoryEntry, id []byte, now int64) (model, src string, ok bool) {
	if e != nil {
		if m, ok := e.ToolCallOwner(id); ok {
			return m, lockSourceSession, true
		}
	}
	if o, ok := r.tools.get(id, now); ok {
		return o.model, lockSourceIndex, true
	}
	if r.sh == nil {
		return "", "", false
	}
	o, ok, down := r.sharedLock(sharedstate.KindToolCall, r.tools, id, now)
	in.ToolOwnerUnreachable = in.ToolOwnerUnreachable || down
	return o.model, lockSourceShared, ok
}

// responseOwner finds the model and worker that created the turn's
// previous_response_id: the global index, the session's memory, then the
// shared store (created on another replica).
func (r *Router) responseOwner(in *Inputs, t *Turn, e *sessionshard.MemoryEntry, now int64) {
	if len(t.PreviousResponseID) == 0 {
		return
	}
	in.PreviousResponseID = clip(t.PreviousResponseID)
	o, ok := r.resps.get(t.PreviousResponseID, now)
	src := lockSourceIndex
	if !ok && e != nil {
		o.model, o.worker, ok = e.ResponseOwner(t.PreviousResponseID)
		src = lockSourceSession
	}
	if !ok && r.sh != nil {
		o, ok, in.StateOwnerUnreachable = r.sharedLock(sharedstate.KindResponse, r.resps, t.PreviousResponseID, now)
		src = lockSourceShared
	}
	if ok {
		in.StateModel, in.StateWorker, in.StateSource = o.model, o.worker, src
	}
}

// reasoningOwner finds the model and worker that produced the history's
// last opaque reasoning artifact: the global index, then the shared store
// (produced on another replica). A previous_response_id's owner holds the
// state already: then the artifact is only recorded.
func (r *Router) reasoningOwner(in *Inputs, t *Turn, now int64) {
	if t.ReasoningID.IsZero() {
		return
	}
	var kb [2 * len(reqview.ReasoningID{})]byte
	key := reasoningKey(kb[:0], t.ReasoningID)
	in.OpaqueReasoning, in.ReasoningID = true, string(key)
	if in.StateModel != "" {
		return
	}
	o, ok := r.reas.get(key, now)
	src := lockSourceIndex
	if !ok && r.sh != nil {
		o, ok, in.ReasoningOwnerUnreachable = r.sharedLock(sharedstate.KindReasoning, r.reas, key, now)
		src = lockSourceShared
	}
	if ok {
		in.ReasoningModel, in.ReasoningWorker, in.ReasoningSource = o.model, o.worker, src
	}
}

// markDown records the models with no healthy worker, and which of the
// workers the turn may be pinned to are down: the previous response's,
// the reasoning artifact's, and, for provider state, the session's last
// worker (lastWorker).
func markDown(in *Inputs, cfg *Config, h Health, t *Turn, lastWorker string) {
	if h.ModelUp != nil {
		for i := range cfg.Models {
			if !h.ModelUp(cfg.Models[i].Name) {
				in.ModelsDown = append(in.ModelsDown, cfg.Models[i].Name)
			}
		}
	}
	if h.WorkerUp == nil {
		return
	}
	if w := in.StateWorker; w != "" && !h.WorkerUp(w) {
		in.WorkersDown = append(in.WorkersDown, w)
	}
	if w := in.ReasoningWorker; w != "" && !h.WorkerUp(w) {
		in.WorkersDown = append(in.WorkersDown, w)
	}
	if w := lastWorker; w != "" && w != in.StateWorker && w != in.ReasoningWorker &&
		(len(t.PreviousResponseID) > 0 || t.OpaqueReasoning) && !h.WorkerUp(w) {
		in.WorkersDown = append(in.WorkersDown, w)
	}
}

// markPools records every model's pool (Health.Pool) when one of them is
// saturated, for the overflow rule; while none is it records nothing and
// allocates nothing.
func markPools(in *Inputs, cfg *Config, h Health) {
	if h.Pool == nil {
		return
	}
	i := 0
	for ; i < len(cfg.Models) && !h.Pool(cfg.Models[i].Name).Saturated; i++ {
	}
	if i == len(cfg.Models) {
		return
	}
	in.Pools = make([]PoolState, len(cfg.Models))
	for i := range cfg.Models {
		in.Pools[i] = h.Pool(cfg.Models[i].Name)
		in.Pools[i].Model = cfg.Models[i].Name
	}
}

// remember teaches the session's memory (entry e, locked) the turn's
// outcome: a switch starts the counts of the new model afresh; a pinned
// worker is the session's worker; an overflowed turn is a detour, and the
// session stays on the model chosen for it (Overflow.From). With a shared
// store the memory is published.
func (r *Router) remember(e *sessionshard.MemoryEntry, t *Turn, out *Outcome, now int64) {
	st := &e.State
	st.Turns++
	model := out.Model
	if out.Overflow != nil {
		model = out.Overflow.From
	}
	if st.Model != "" && st.Model != model {
		st.Switches++
		st.TurnsOnModel = 1
		st.Worker = ""
		st.PromptTokensSeen, st.CachedTokensSeen = 0, 0
	} else {
		st.TurnsOnModel++
	}
	if out.PinnedWorker != "" {
		st.Worker = out.PinnedWorker
	}
	st.Model, st.Decision, st.Phase, st.Lock = model, out.Decision, out.Phase, out.LockModel
	st.Demand, st.DemandVar = out.Demand, out.DemandVar
	st.LastHistoryChars = t.HistoryChars
	e.Touch(now)
	if r.sh != nil {
		r.publishMemory(t.Logical, t.Session, st)
	}
}

// selection is the answer to the front end: the outcome and the replay id
// of record seq.
func (r *Router) selection(out *Outcome, seq uint64) Selection {
	var from string
	if out.Overflow != nil {
		from = out.Overflow.From
	}
	return Selection{
		OverflowFrom: from,
		Model:        out.Model,
		Decision:     out.Decision,
		Phase:        out.Phase,
		Action:       out.Action,
		Reason:       out.Reason,
		PinnedWorker: out.PinnedWorker,
		ReplayID:     r.opt.ReplayPrefix + strconv.FormatUint(seq, 10),
		LockKind:     out.LockKind,
		LockModel:    out.LockModel,
	}
}

// record emits the turn's replay record, when the ring or the Replay log
// keeps records: the inputs, a copy of the memory before the turn (mem,
// nil: none) and the outcome.
func (r *Router) record(sel *Selection, revision string, seq uint64, t *Turn, in *Inputs, mem *sessionshard.MemoryState, out *Outcome, now int64) {
	if r.ring == nil && r.log == nil {
		return
	}
	rec := &Record{
		ID:      sel.ReplayID,
		Seq:     seq,
		Time:    now,
		Session: string(t.Session),
		Policy:  r.opt.Policy,
		Config:  revision,
		Inputs:  *in,
		Outcome: *out,
	}
	if mem != nil {
		m := *mem
		rec.Memory = &m
	}
	r.emit(rec)
}

// count counts the turn in the Router's stats and metrics: selections,
// conflicts, hard locks, failovers, lock breaks, switches, overflows (a
// switch from the chosen model, reason queue_overflow; the session's own
// switch, if any, is to the chosen model), and turns whose lock owner the
// shared store could not be asked for.
func (r *Router) count(sel *Selection, out *Outcome, in *Inputs, mem *sessionshard.MemoryState) {
	r.stSelections.Add(1)
	r.met.selection(sel.Model, sel.Action)
	if out.Conflict {
		r.stConflicts.Add(1)
		r.met.conflict(LockToolLoop)
	}
	switch sel.Action {
	case ActionHardLock:
		r.stHardLocks.Add(1)
		r.met.hardLock(out.LockKind)
		if out.Failover {
			r.stFailovers.Add(1)
			r.met.failovers.Inc()
		}
	case ActionLockBroken:
		r.stLockBreaks.Add(1)
		r.met.lockBreak(out.LockKind)
	}
	model, reason := sel.Model, sel.Reason
	if o := out.Overflow; o != nil {
		r.stOverflows.Add(1)
		r.met.switched(o.From, sel.Model, ReasonQueueOverflow)
		model, reason = o.From, o.Reason
	}
	if mem != nil && mem.Model != "" && mem.Model != model {
		r.stSwitches.Add(1)
		r.met.switched(mem.Model, model, reason)
	}
	if in.ToolOwnerUnreachable || in.StateOwnerUnreachable || in.ReasoningOwnerUnreachable {
		r.countUnreachable(sel.Reason)
	}
}

// emit hands rec (not modified afterwards) to the ring and the Replay
// queue; neither blocks on I/O.
func (r *Router) emit(rec *Record) {
	if r.ring != nil {
		r.ring.put(r.ring.forRing(rec))
	}
	if r.log != nil {
		r.log.enqueue(rec)
	}
}

// Observe records what the response of a turn taught: the worker that
// served model, the tool-call ids it issued and the response id it created
// (into the session's memory and the global indexes), the usage (cache
// evidence) and the end time (idle is measured from it). Call it once per
// proxied response of a logical model, after the response ends. session
// and the []byte fields of l are read only during the call.
//
// If l.Lock (the turn's Selection.LockModel) names another model than the
// one that served, the call counts a continuity violation.
//
// Observe works without a session key too: the global id indexes still
// learn the tool-call ids and the response id.
func (r *Router) Observe(session []byte, model, worker string, l Observed) {
	now := r.now().UnixNano()
	o := owner{model: model, worker: worker}
	for _, id := range l.ToolCallIDs {
		r.tools.put(id, o, now)
	}
	r.noteReasoning(o, l.ReasoningIDs, now)
	r.resps.put(l.ResponseID, o, now)
	if l.Lock != "" && l.Lock != model {
		r.stViolations.Add(1)
		r.met.violations.Inc()
	}
	// A model the config does not know (a client's name for a physical
	// model outside the config) teaches the id indexes only: it must not
	// become a session's model, nor a metric label.
	cfg := r.cfg.Load()
	if len(session) == 0 || cfg.Model(model) == nil {
		return
	}
	var kb [320]byte
	var e *sessionshard.MemoryEntry
	logical, created := l.Logical, false
	switch {
	case len(l.Logical) > 0:
	case len(cfg.Logical) == 1:
		logical = bytesconv.S2B(cfg.Logical[0].Name)
	default:
		e, logical = r.memoryOf(cfg, session, model, now)
	}
	if e == nil && len(logical) > 0 {
		e, created = r.mem.GetOrCreate(sessionshard.MemoryKey(kb[:0], logical, session), now)
	}
	if e == nil {
		return
	}
	e.Lock()
	defer e.Unlock()
	if r.sh != nil && created {
		r.loadMemory(e, logical, session, true)
	}
	st := &e.State
	if st.Model == "" {
		st.Model = model
	}
	if st.Model == model {
		st.Worker = worker
		st.PromptTokensSeen += int64(l.PromptTokens)
		st.CachedTokensSeen += int64(l.CachedTokens)
	}
	st.LastEnd = now
	st.LastPromptTokens = l.PromptTokens
	st.LastCompletionTokens = l.CompletionTokens
	for _, id := range l.ToolCallIDs {
		e.AddToolCallID(id, model)
	}
	e.AddResponse(l.ResponseID, model, worker)
	e.Touch(now)
	if r.sh != nil {
		r.publishMemory(logical, session, st)
	}
}

// memoryOf finds, for an Observe without Observed.Logical, the memory of
// the session that most recently selected model among the logical models
// of the config, and that logical model; nil when none did.
func (r *Router) memoryOf(cfg *Config, session []byte, model string, now int64) (*sessionshard.MemoryEntry, []byte) {
	var kb [320]byte
	var best *sessionshard.MemoryEntry
	var logical []byte
	var at int64
	for i := range cfg.Logical {
		e := r.mem.Get(sessionshard.MemoryKey(kb[:0], bytesconv.S2B(cfg.Logical[i].Name), session), now)
		if e == nil {
			continue
		}
		e.Lock()
		ok, t := e.State.Model == model, e.State.LastAccess
		e.Unlock()
		if ok && (best == nil || t > at) {
			best, at, logical = e, t, bytesconv.S2B(cfg.Logical[i].Name)
		}
	}
	return best, logical
}

// NoteToolCalls indexes tool-call ids as soon as a stream shows them, before
// the response ends and Observe runs: an agent with a local tool may send
// the result back before the stream is closed on the router's side.
func (r *Router) NoteToolCalls(model, worker string, ids [][]byte) {
	now := r.now().UnixNano()
	for _, id := range ids {
		r.tools.put(id, owner{model: model, worker: worker}, now)
	}
}

// NoteReasoning indexes the opaque reasoning artifacts of a stream as soon
// as it shows them (see NoteToolCalls).
func (r *Router) NoteReasoning(model, worker string, ids []reqview.ReasoningID) {
	r.noteReasoning(owner{model: model, worker: worker}, ids, r.now().UnixNano())
}

func (r *Router) noteReasoning(o owner, ids []reqview.ReasoningID, now int64) {
	for _, id := range ids {
		var kb [2 * len(reqview.ReasoningID{})]byte
		r.reas.put(reasoningKey(kb[:0], id), o, now)
	}
}

// reasoningKey appends the key of a reasoning artifact id in the index and
// the shared store: its lower-case hex.
func reasoningKey(dst []byte, id reqview.ReasoningID) []byte { return hex.AppendEncode(dst, id[:]) }

// ResponseOwner returns the model and worker that created the Responses
// API id (for GET|DELETE /v1/responses/{id}). id is read only during the
// call; no allocation.
func (r *Router) ResponseOwner(id []byte) (model, worker string, ok bool) {
	o, ok := r.resps.get(id, r.now().UnixNano())
	return o.model, o.worker, ok
}

// ForgetResponse drops a response id from the global index (after a
// successful DELETE /v1/responses/{id}), and from the shared store when
// there is one (best effort: the lock expires there anyway).
func (r *Router) ForgetResponse(id []byte) {
	r.resps.del(id)
	if r.sh != nil {
		sc := getScratch()
		_ = r.sh.st.DeleteLock(context.Background(), sharedstate.KindResponse, sc.copy(id))
		sc.release()
	}
}

// ToolCallOwner returns the model that issued the tool-call id.
func (r *Router) ToolCallOwner(id []byte) (model string, ok bool) {
	o, ok := r.tools.get(id, r.now().UnixNano())
	return o.model, ok
}

// Sweep drops expired session memory and expired ids of the global
// indexes; call it periodically (for example with the eviction interval).
// It returns the number of memory entries dropped.
func (r *Router) Sweep() int {
	now := r.now().UnixNano()
	r.tools.sweep(now)
	r.resps.sweep(now)
	r.reas.sweep(now)
	n := r.mem.Sweep(now)
	if r.sh != nil {
		r.sh.sweepStale(now)
	}
	return n
}

// Records returns up to limit of the most recent records, oldest first;
// session "" means every session, limit ≤ 0 means all kept. Ring records
// are cut (see Options.RingTextBytes); a session key is matched on its
// first RingFieldBytes bytes.
func (r *Router) Records(session string, limit int) []Record {
	if r.ring == nil {
		return nil
	}
	return r.ring.records(session, limit)
}

// Record returns the record of a replay id, if still in the ring.
func (r *Router) Record(id string) (Record, bool) {
	if r.ring == nil {
		return Record{}, false
	}
	return r.ring.record(r.opt.ReplayPrefix, id)
}

// maxIDBytes bounds the client-supplied ids kept in replay records: Decide
// only tests whether they are present.
const maxIDBytes = 256

// clip copies id, cut to maxIDBytes.
func clip(id []byte) string { return string(id[:min(len(id), maxIDBytes)]) }

// unescape decodes raw JSON string content (the request view keeps text as
// sent); text without a backslash is returned as is.
func unescape(raw []byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw
	}
	var s string
	if sonic.Unmarshal(append(append([]byte{'"'}, raw...), '"'), &s) != nil {
		return raw
	}
	return []byte(s)
}
