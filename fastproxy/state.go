package fastproxy

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/admission"
	"github.com/warmroute/warmroute/connwatch"
	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/learn"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/upstream"
)

// reqState is one request's pooled scratch, carried through the stages:
// each fills its part and the later ones read it.
type reqState struct {
	// The view stage.
	view    *reqview.View // nil once dropped (viewReader.drop)
	kind    reqview.Kind  // endpoint family of an inference request
	model   []byte        // the JSON-unescaped model name, when it had escapes
	scratch []byte        // the session key when it had to be unescaped or hashed
	req     route.Request // the routing request: model, session key, prefix key; the worker step adds the candidates

	// The model step.
	sel     saar.Selection   // its choice (logical models)
	body    []byte           // the original body after a model splice; reused as the next splice buffer
	spliced bool             // the request's body holds a spliced model name; the original is in body
	pin     *loadview.Worker // a worker the request must go to first (provider state)
	noRetry bool             // only the pinned worker may serve

	// The worker step.
	fit    []*loadview.Worker // the candidates whose context fits (contextfit.go); keeps its capacity
	fitBuf [8]*loadview.Worker

	// Forward.
	early     bool                // the view may go back to its pool once the first choice is made
	tried     [8]*loadview.Worker // backing array of the workers tried; a longer list spills to the heap
	ranked    bool                // an attempt set the data-parallel rank header on the request
	cancel    upstream.Canceler   // cancels a buffered upstream exchange when the client leaves
	onGone    func()              // cancel.Cancel, bound once per pooled state
	watch     connwatch.Conn      // the client's registration when its connection keeps none (see do)
	legs      bool                // a disaggregated fleet splits it in a prefill and a decode leg (pd.go)
	pdBody    []byte              // the client's body while the decode legs send another
	pdParams  []byte              // the prefill answer's kv_transfer_params
	pdTried   [4]*loadview.Worker // backing array of the decode workers tried
	prefilled *loadview.Worker    // the prefill worker of the decode legs: it served no answer, a continuation may go there

	// Admit.
	ticket   admission.Ticket
	tenant   string                  // the client key's name; "" without client keys
	limited  *tenant                 // the tenant, when it has a token limit its stream charges
	prepare  func(*admission.Ticket) // prepareTicket, bound once per pooled state
	ctx      *fasthttp.RequestCtx    // the request, while admission may call prepare
	srv      *Server
	watching *connwatch.Conn // the client's registration while its request waits
	waitedMS int64           // time waited in the queue, for its response header

	// Learn.
	obs *learn.Observer // learns from the answer; nil when nobody does, or once a relay took it

	// Traces: the request's spans; nil when it is not traced (trace.go).
	trace *reqTrace
}

// modelName is the request's model name, JSON-unescaped (clients that escape
// "/" send "org\/name"); it aliases the body or st.model.
func (st *reqState) modelName() string {
	m := st.view.Model
	if bytes.IndexByte(m, '\\') >= 0 {
		m = bodyKey(m, &st.model)
	}
	return bytesconv.B2S(m)
}

// getState returns a pooled request state holding a pooled View.
func (s *Server) getState() *reqState {
	st := s.states.Get().(*reqState)
	st.view = s.view.get()
	return st
}

// releaseState returns st, its View and its observer (unless a relay took
// it) to their pools, keeping the buffers that did not grow too large.
func (s *Server) releaseState(st *reqState) {
	s.view.drop(st)
	st.early = false
	st.req = route.Request{}
	st.tried = [8]*loadview.Worker{}
	clear(st.fit[:cap(st.fit)])
	st.fit = st.fit[:0]
	if cap(st.fit) > 1024 {
		st.fit = nil
	}
	st.sel = saar.Selection{}
	st.ticket, st.tenant, st.waitedMS, st.limited = admission.Ticket{}, "", 0, nil
	st.obs.Release()
	st.pin, st.noRetry, st.obs, st.spliced, st.legs = nil, false, nil, false, false
	st.pdTried, st.prefilled = [4]*loadview.Worker{}, nil
	st.trace = nil
	if cap(st.pdBody) > 1<<20 {
		st.pdBody = nil
	}
	if cap(st.pdParams) > 1<<16 {
		st.pdParams = nil
	}
	if cap(st.model) > 4096 {
		st.model = nil
	}
	if cap(st.scratch) > 4096 {
		st.scratch = nil
	}
	if cap(st.body) > 1<<20 {
		st.body = nil
	}
	s.states.Put(st)
}
