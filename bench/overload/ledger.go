package main

import (
	"fmt"
	"sort"
	"sync"

	"github.com/warmroute/warmroute/simworker"
)

// outcome is what became of one request. Every request the client sends
// gets exactly one.
type outcome uint8

const (
	outServed  outcome = iota // 200, a complete stream ([DONE], usage, content)
	outBusy                   // 429 router_busy: over --max-concurrent-requests
	outFull                   // 429 with any other code (queue_full, the bytes bound)
	outTimeout                // 503 queue_timeout
	outGone                   // the client gave up waiting for its first token (its patience)
	outCut                    // still in flight when the run ended: the harness hung up
	outOther                  // any other status, a transport error, a malformed stream
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"served", "429 router_busy", "429 queue_full", "503 queue_timeout", "client gone", "cut at run end", "other error"}

// csvNames are the outcomes as CSV column names.
var csvNames = [numOutcomes]string{"served", "busy_429", "full_429", "timeout_503", "client_gone", "cut", "other_error"}

func (o outcome) String() string { return outcomeNames[o] }

// rejected reports whether the router turned the request away itself (no
// worker may have seen it).
func (o outcome) rejected() bool { return o == outBusy || o == outFull || o == outTimeout }

// record is one request as the client saw it.
type record struct {
	session, turn int // arrival index, turn index
	tenant, class int
	sent          float64 // simulated seconds from the run's start to the send
	out           outcome
	ttft, e2e     float64               // simulated seconds (served requests)
	prompt        int                   // usage.prompt_tokens
	cached        int                   // usage.prompt_tokens_details.cached_tokens
	queueMS       float64               // x-vllm-router-queue-ms, real milliseconds; -1: absent
	detail        string                // other errors: what went wrong
	retryAfter    bool                  // a 429 or 503 carried Retry-After
	echoedID      string                // the response's x-request-id
	engine        *simworker.FirstToken // how its worker's engine reached its first token; nil: none reported
	continued     int                   // continuations of its answer the workers received (a preempted stream's)
}

// entry is one request id's line in the ledger.
type entry struct {
	rec        record
	recorded   int // outcomes written: must end at 1
	dispatches int // times a worker received it: at most 1
	continued  int // continuations of its answer a worker received (continue_final_message)
	engine     *simworker.FirstToken
}

// ledger holds every request of a run by its x-request-id, from both ends:
// the client writes the send and the outcome, the workers each receipt.
type ledger struct {
	mu    sync.Mutex
	reqs  map[string]*entry
	order []string // ids in send order
	stray []string // ids a worker received that the client never sent
}

func newLedger() *ledger { return &ledger{reqs: map[string]*entry{}} }

// send registers id before the request goes out; a reused id is a harness
// bug and panics.
func (l *ledger) send(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.reqs[id]; dup {
		panic("overload: request id sent twice: " + id)
	}
	l.reqs[id] = &entry{}
	l.order = append(l.order, id)
}

// record writes the outcome of id.
func (l *ledger) record(id string, r record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.reqs[id]
	if !ok {
		l.stray = append(l.stray, "outcome for unsent "+id)
		return
	}
	e.recorded++
	if e.recorded == 1 {
		e.rec = r
	}
}

// dispatched counts a worker's receipt of id: the request, or a
// continuation of its answer (the router's, after a preemption or a cut).
func (l *ledger) dispatched(id string, continuation bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.reqs[id]
	if !ok {
		l.stray = append(l.stray, "worker received unsent "+fmt.Sprintf("%q", id))
		return
	}
	if continuation {
		e.continued++
		return
	}
	e.dispatches++
}

// firstToken keeps how a worker's engine reached id's first token
// (simworker.Config.OnFirstToken); ids the client never sent are counted
// by dispatched.
func (l *ledger) firstToken(id string, ft simworker.FirstToken) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.reqs[id]; ok {
		e.engine = &ft
	}
}

// records returns every request's record in send order, with its engine
// report.
func (l *ledger) records() []record {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]record, 0, len(l.order))
	for _, id := range l.order {
		e := l.reqs[id]
		r := e.rec
		r.engine, r.continued = e.engine, e.continued
		out = append(out, r)
	}
	return out
}

// maxViolations bounds the violations a check lists (the count is exact).
const maxViolations = 8

// check returns what breaks "every request has exactly one outcome; none is
// lost or answered twice", from both ends: each id recorded once; a served
// request reached exactly one worker, a rejected one none, no request more
// than one (a continuation of its answer, which carries
// continue_final_message, is counted apart: only a served request that
// reached a worker has one); the answer carried the request's own id; every 429 and 503 had
// Retry-After; the workers received nothing the client did not send, and
// workerRequests (the workers' own count) equals the receipts. total is the
// number of violations; list names the first maxViolations.
func (l *ledger) check(workerRequests uint64) (total int, list []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	add := func(s string) {
		total++
		if len(list) < maxViolations {
			list = append(list, s)
		}
	}
	var receipts uint64
	for _, id := range l.order {
		e := l.reqs[id]
		receipts += uint64(e.dispatches + e.continued)
		r := &e.rec
		switch {
		case e.recorded == 0:
			add(id + ": no outcome (lost)")
			continue
		case e.recorded > 1:
			add(fmt.Sprintf("%s: %d outcomes (answered twice)", id, e.recorded))
		}
		switch {
		case e.dispatches > 1:
			add(fmt.Sprintf("%s: reached a worker %d times", id, e.dispatches))
		case r.out == outServed && e.dispatches != 1:
			add(id + ": served, yet no worker received it")
		case r.out.rejected() && e.dispatches != 0:
			add(fmt.Sprintf("%s: %s, yet a worker received it", id, r.out))
		case e.continued > 0 && (r.out != outServed && r.out != outGone && r.out != outCut || e.dispatches != 1):
			add(fmt.Sprintf("%s: %s, %d continuations after %d receipts", id, r.out, e.continued, e.dispatches))
		}
		if r.echoedID != "" && r.echoedID != id {
			add(fmt.Sprintf("%s: answered with x-request-id %s", id, r.echoedID))
		}
		if r.out == outServed && r.echoedID == "" {
			add(id + ": served without an x-request-id")
		}
		if r.out.rejected() && !r.retryAfter {
			add(fmt.Sprintf("%s: %s without Retry-After", id, r.out))
		}
	}
	sort.Strings(l.stray)
	for _, s := range l.stray {
		add(s)
	}
	if receipts != workerRequests {
		add(fmt.Sprintf("the workers counted %d inference requests, the ledger %d receipts", workerRequests, receipts))
	}
	return total, list
}
