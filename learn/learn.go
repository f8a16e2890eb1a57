// Package learn is the router's learning room (docs/design.md §2): every
// answer a worker gives, whole or streamed, passes one Observer, which
// feeds whichever learners its request has — the model step (saar: hard
// locks, session memory, the Responses API's state) and the worker step's
// policy when it is a route.Learner (the cache-aware estimate) — and holds
// the answer's last byte until what the answer taught, and the binding its
// selection queued, are visible to every replica (docs/design.md §8.3).
//
// An Observer owns copies of everything it keeps, since a stream outlives
// its request's buffers, and is pooled: whoever holds it last (the request,
// or the relay a stream was handed to) calls Release.
package learn

import (
	"bytes"
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/sharedstate"
)

// Config configures a Room.
type Config struct {
	Policy route.Policy // learns from every answer it routed when it is a route.Learner
	// DecodePolicy chooses the decode legs of a disaggregated fleet
	// (docs/design.md §9); it learns from them when it is a route.Learner.
	DecodePolicy route.Policy
	Models       *saar.Router       // the model step; nil: none
	Shared       *sharedstate.Store // the store replicas share; nil: none
	// Metrics receives vllm_router_lock_write_wait_seconds when Models
	// shares its hard locks with other replicas.
	Metrics *metrics.Set
}

// Room hands each request the Observer of its answer. Safe for concurrent use.
type Room struct {
	policy   route.Learner      // nil: the policy learns nothing
	decode   route.Learner      // nil: no decode policy, or one that learns nothing
	models   *saar.Router       // nil: no model step
	shared   *sharedstate.Store // nil: no shared store
	lockWait *metrics.Histogram // time answers waited for their lock writes; nil: locks are local
	pool     sync.Pool          // *Observer
}

// New returns a Room for cfg's learners.
func New(cfg Config) *Room {
	r := &Room{models: cfg.Models, shared: cfg.Shared}
	r.policy, _ = cfg.Policy.(route.Learner)
	r.decode, _ = cfg.DecodePolicy.(route.Learner)
	if cfg.Models != nil && cfg.Models.SharesLocks() && cfg.Metrics != nil {
		r.lockWait = cfg.Metrics.GetOrCreateHistogram("vllm_router_lock_write_wait_seconds")
	}
	r.pool.New = func() any { return new(Observer) }
	return r
}

// Turn is what the room needs to know of a request to learn from its answer.
type Turn struct {
	Session []byte // the session key; empty when none (copied)
	Model   string // the physical model the request goes to (copied)
	// ModelStep: the model step learns from this answer (a logical model,
	// or a Responses API request when models are configured).
	ModelStep bool
	Lock      string // the model the turn's hard lock names (saar.Selection.LockModel)
	Responses bool   // a Responses API request: its response id is a lock
	Chosen    bool   // the model step chose the model, and published the session's memory record
}

// Observer returns the observer of t's answer, or nil when nobody learns
// from it (no model step, a policy that does not learn).
func (r *Room) Observer(t Turn) *Observer {
	if !t.ModelStep && r.policy == nil && r.decode == nil {
		return nil
	}
	o := r.pool.Get().(*Observer)
	o.room, o.policy = r, r.policy
	if t.ModelStep {
		o.models = r.models
		o.session = append(o.session[:0], t.Session...)
		o.model = strings.Clone(t.Model)
		o.lock = t.Lock
		if o.share = r.lockWait != nil; o.share {
			o.shareResp = t.Responses
		}
	}
	if o.shared = r.shared; o.shared != nil {
		o.memQueued = t.ModelStep && t.Chosen && len(t.Session) > 0
	}
	return o
}

// Observer learns from one answer. Not safe for concurrent use: the
// request, then the relay it hands a stream to, use it in turn.
type Observer struct {
	room    *Room
	models  *saar.Router // nil: the model step learns nothing from this answer
	session []byte
	model   string
	lock    string
	sse     reqview.SSEScanner
	learned reqview.Learned
	noted   int // tool-call ids of a stream already indexed
	notedR  int // reasoning artifact ids of a stream already indexed

	// Hard locks shared with other replicas (docs/design.md §8.3), when the
	// model step shares them: written as soon as the answer shows them and
	// acknowledged before its last byte is forwarded.
	share     bool       // write this answer's locks
	shareResp bool       // its response id is a lock (Responses API: previous_response_id)
	sharedIDs int        // tool-call ids already written (or being written)
	sharedRs  int        // reasoning artifact ids already written (or being written)
	sharedID  bool       // the response id is written (or being written)
	lw        *lockWrite // the latest write in flight; nil: none

	// The binding the selection queued for the shared store
	// (route.Choice.Published) and the session memory the model step
	// queued (memQueued): flushed from the send on, in the background, and
	// acknowledged before the last byte like a lock.
	shared    *sharedstate.Store
	memQueued bool
	fw        *lockWrite // the flush in flight; nil: none

	policy route.Learner // nil: the policy learns nothing
	served route.Served  // what Done tells the policy
	choice route.Choice  // the selection of the attempt that was sent
	stream bool
	load   int64     // the worker's requests in flight at send, this one excluded
	sent   time.Time // when the request went upstream
	first  time.Time // first answer byte: headers of a buffered answer, first body bytes of a stream
}

// Release returns o to its room's pool; o may be nil. o must not be used after.
func (o *Observer) Release() {
	if o == nil {
		return
	}
	r := o.room
	o.learned.Reset()
	o.sse.Reset()
	session := o.session[:0]
	if cap(session) > 4096 {
		session = nil
	}
	*o = Observer{session: session, sse: o.sse, learned: o.learned}
	r.pool.Put(o)
}

// Sending records, before an attempt, what the policy learns besides the
// answer: the choice, the worker's load across replicas (what the estimate
// reads, docs/design.md §4 and §8.3) and the clock; and starts flushing
// the binding the choice published and the memory record the model step
// published, so that the session's next turn, on any replica, reads both.
func (o *Observer) Sending(ch route.Choice, stream bool) {
	o.choice, o.stream = ch, stream
	o.load = ch.Worker.FleetLoad()
	o.sent, o.first = time.Now(), time.Time{}
	if o.shared != nil && (ch.Published() || o.memQueued) {
		o.startFlush()
	}
}

// Answer learns from a whole answer of w — a JSON body, or an event stream
// that arrived in one piece (sse) — and returns once what it taught is
// shared: the body may then be written to the client.
func (o *Observer) Answer(body []byte, sse bool, w *loadview.Worker) {
	if sse {
		o.streamed(body, w)
	} else {
		o.scan(body)
	}
	o.Done(w)
	if o.share {
		o.shareLocks(w)
		o.waitLocks(o.lw)
	}
	o.waitFlush()
}

// Chunk learns from the bytes p of a streamed answer of w as they pass, and
// returns once p may be forwarded: a lock is acknowledged before any later
// byte of the answer, and every lock and the binding before the chunk that
// ends it (last: the stream ends with p, or with an error after it).
func (o *Observer) Chunk(p []byte, last bool, w *loadview.Worker) {
	prev := o.lw // lock writes started by earlier chunks
	if len(p) > 0 {
		o.streamed(p, w)
	}
	if (o.lw != nil || o.fw != nil) && (last || streamEnds(p)) {
		o.waitLocks(o.lw)
		o.waitFlush()
		return
	}
	o.waitLocks(prev)
}

// Done records what the answer of w taught: the model step's locks and
// memory, and the policy's estimate when w is the worker it chose. A
// stream calls it when it ended complete.
func (o *Observer) Done(w *loadview.Worker) {
	l := &o.learned
	if o.models != nil {
		o.models.Observe(o.session, o.model, w.URL(), saar.Observed{
			ResponseID:       l.ResponseID,
			ToolCallIDs:      l.ToolCallIDs,
			ReasoningIDs:     l.ReasoningIDs,
			PromptTokens:     l.PromptTokens,
			CachedTokens:     l.CachedTokens,
			CompletionTokens: l.CompletionTokens,
			Lock:             o.lock,
		})
	}
	if o.policy == nil || o.choice.Worker != w {
		return
	}
	o.teach()
}

// Prefilled learns from the answer of a disaggregated request's prefill
// leg, body, given by w (docs/design.md §9, "Disaggregated fleets"): the
// policy that chose w hears it as an answer it routed, whose time to first
// byte is the prefill's. The model step waits for the decode leg's answer,
// and the room's decode policy, when it learns, learns from that
// one: Sending then names its choice.
func (o *Observer) Prefilled(body []byte, w *loadview.Worker) {
	if o.policy != nil && o.choice.Worker == w {
		_ = reqview.ScanUsage(&o.learned, body)
		o.teach()
		o.learned.Reset()
	}
	o.policy = o.room.decode
}

// Whole undoes Prefilled for a request its prefill worker then serves
// whole (no decode worker took it): the policy that chose that worker
// learns from the answer.
func (o *Observer) Whole() { o.policy = o.room.policy }

// teach tells the policy what the answer of its choice taught: the times,
// and the token counts of the answer's usage.
func (o *Observer) teach() {
	l := &o.learned
	now := time.Now()
	first := o.first
	if first.IsZero() {
		first = now
	}
	// An absent cached_tokens (vLLM omits prompt_tokens_details without
	// --enable-prompt-tokens-details) is unknown, never "nothing cached".
	// sv lives in o: a pointer passed through the interface would escape.
	sv := &o.served
	*sv = route.Served{TTFB: first.Sub(o.sent), Elapsed: now.Sub(o.sent), Stream: o.stream, Load: o.load,
		PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1}
	if l.HasUsage {
		if l.PromptTokens > 0 {
			sv.PromptTokens = l.PromptTokens
		}
		if l.CachedKnown {
			sv.CachedTokens = l.CachedTokens
		}
		sv.CompletionTokens = l.CompletionTokens
	}
	o.policy.Observe(o.choice, sv)
}

// streamed learns from streamed bytes, indexing new tool-call ids at once.
func (o *Observer) streamed(p []byte, w *loadview.Worker) {
	if o.first.IsZero() {
		o.first = time.Now()
	}
	o.sse.Write(p, &o.learned)
	if o.models == nil {
		return
	}
	if ids := o.learned.ToolCallIDs; len(ids) > o.noted {
		o.models.NoteToolCalls(o.model, w.URL(), ids[o.noted:])
		o.noted = len(ids)
	}
	if ids := o.learned.ReasoningIDs; len(ids) > o.notedR {
		o.models.NoteReasoning(o.model, w.URL(), ids[o.notedR:])
		o.notedR = len(ids)
	}
	if o.share {
		o.shareLocks(w)
	}
}

// scan learns from a whole JSON body. Only the model step reads its ids
// (docs/design.md §5: locks, shared ones included); the policy alone needs
// the token counts, which ScanUsage reads without walking the choices'
// tool calls.
func (o *Observer) scan(body []byte) {
	if o.models == nil {
		_ = reqview.ScanUsage(&o.learned, body)
		return
	}
	_ = reqview.ScanResponse(&o.learned, body)
}

// streamEnds reports whether chunk holds the end of an SSE stream: chat
// and completions "[DONE]", the Responses API's final events.
func streamEnds(chunk []byte) bool {
	return bytes.Contains(chunk, []byte("[DONE]")) || bytes.Contains(chunk, []byte(`"response.completed"`)) ||
		bytes.Contains(chunk, []byte(`"response.incomplete"`)) || bytes.Contains(chunk, []byte(`"response.failed"`))
}

// lockWrite is one write to the shared store in flight; done closes when
// it and every write started before it have returned. Not pooled: it
// outlives the observer when the client leaves.
type lockWrite struct {
	done chan struct{}
	err  error
}

// shareLocks starts writing the locks the answer has shown since the last
// call (tool-call ids; the response id of a Responses API answer; opaque
// reasoning artifacts, docs/design.md §5) to the shared store, in the
// background, chained after the write in flight. An answer that shows no
// lock starts nothing.
func (o *Observer) shareLocks(w *loadview.Worker) {
	l := &o.learned
	var ids [][]byte
	if len(l.ToolCallIDs) > o.sharedIDs {
		ids = make([][]byte, 0, len(l.ToolCallIDs)-o.sharedIDs)
		for _, id := range l.ToolCallIDs[o.sharedIDs:] {
			ids = append(ids, bytes.Clone(id))
		}
		o.sharedIDs = len(l.ToolCallIDs)
	}
	var rid []byte
	if o.shareResp && !o.sharedID && len(l.ResponseID) > 0 {
		rid, o.sharedID = bytes.Clone(l.ResponseID), true
	}
	var rs []reqview.ReasoningID
	if len(l.ReasoningIDs) > o.sharedRs {
		rs = slices.Clone(l.ReasoningIDs[o.sharedRs:])
		o.sharedRs = len(l.ReasoningIDs)
	}
	if ids == nil && rid == nil && rs == nil {
		return
	}
	prev, lw := o.lw, &lockWrite{done: make(chan struct{})}
	o.lw = lw
	models, model, url := o.models, o.model, w.URL()
	go func() {
		lw.err = models.ShareLocks(context.Background(), model, url, ids, rid, rs)
		if prev != nil {
			<-prev.done
			lw.err = cmp.Or(lw.err, prev.err)
		}
		close(lw.done)
	}()
}

// waitLocks returns once lw (and the writes before it) returned: the
// answer's bytes that follow may now reach the client. The time waited is
// what the lock write added to the answer.
func (o *Observer) waitLocks(lw *lockWrite) {
	if lw == nil {
		return
	}
	t0 := time.Now()
	<-lw.done
	if h := o.room.lockWait; h != nil {
		h.UpdateDuration(t0)
	}
	if o.lw == lw {
		o.lw = nil
	}
}

// startFlush starts waiting, in the background, for the shared store to
// acknowledge every binding queued so far, this selection's included
// (docs/design.md §8.3): it overlaps with the worker's answer.
func (o *Observer) startFlush() {
	fw, st := &lockWrite{done: make(chan struct{})}, o.shared
	o.fw = fw
	go func() {
		fw.err = st.Flush(context.Background()) // bounded by the store (AsyncTimeout; at once while Redis is down)
		close(fw.done)
	}()
}

// waitFlush returns once the binding's flush, if any, returned: the
// answer's last byte may now reach the client. A failed flush (Redis down)
// kept the binding for replay; the answer completes anyway.
func (o *Observer) waitFlush() {
	if o.fw != nil {
		<-o.fw.done
		o.fw = nil
	}
}
