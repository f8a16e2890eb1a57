package fastproxy

import (
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
)

// viewReader is the first stage: it parses what the routing needs of a
// request body into its View — as deep as the policy declares
// (route.Policy.Reads), in full for the model step — validating all of it
// either way (docs/design.md §2), and fills the routing request's identity:
// model, session key (identity.go) and prefix key.
type viewReader struct {
	depth  route.Depth
	models *saar.Router       // nil: no model step
	reg    *loadview.Registry // the engine's own model, for a request that names none
	pool   sync.Pool          // *reqview.View, apart from the states: see drop
}

// get returns a pooled View.
func (r *viewReader) get() *reqview.View { return r.pool.Get().(*reqview.View) }

// read parses ctx's body into st.view and fills st.req's model, session and
// prefix keys. It answers 400 itself, and returns false, when the body is
// not a valid JSON object.
func (r *viewReader) read(ctx *fasthttp.RequestCtx, st *reqState, kind reqview.Kind) bool {
	if err := r.parse(st, ctx.PostBody(), kind); err != nil {
		badRequest(ctx, "request body is not a valid JSON object: "+err.Error())
		return false
	}
	st.kind = kind
	st.req = route.Request{
		Model:   st.modelName(),
		Session: sessionKey(&ctx.Request.Header, st.view, &st.scratch),
		Prefix:  routingKey(st.view, kind),
	}
	if kind == reqview.Generate && st.req.Model == "" {
		// The model is optional on /inference/v1/generate: the engine's own.
		if ms := r.reg.Models(); len(ms) == 1 {
			st.req.Model = ms[0]
		}
	}
	return true
}

// parse reads what the policy needs of body: a policy that needs only the
// model reads only the model, one that needs the session fields reads
// those. The model step needs the whole view, so a logical model (or a
// Responses request when models are configured) is parsed in full.
func (r *viewReader) parse(st *reqState, body []byte, kind reqview.Kind) error {
	v := st.view
	var err error
	switch r.depth {
	case route.ReadsHistory:
		return reqview.Parse(v, body, kind)
	case route.ReadsSession:
		err = reqview.Parse(v, body, sessionKind(kind))
	default:
		err = reqview.ParseModel(v, body)
	}
	if err != nil || r.models == nil {
		return err
	}
	if kind == reqview.Responses || r.models.IsLogical(st.modelName()) {
		v.Reset()
		return reqview.Parse(v, body, kind)
	}
	return nil
}

// drop returns st's View to its pool. Forward drops it as soon as the
// first choice is made when nothing later reads it (st.early): a View's
// buffers (the history key: about the body's size) then go to the next
// request while still in cache, instead of waiting out the upstream
// exchange while other requests' Views push them out. The key is gone with
// it; a retry parses the body again (restore).
func (r *viewReader) drop(st *reqState) {
	if st.view == nil {
		return
	}
	st.view.Reset()
	r.pool.Put(st.view)
	st.view, st.req.Prefix = nil, nil
}

// restore parses the request body again into a fresh View after drop, for
// a retry's selection. The body is the one parsed first (only a request
// without a model step drops its View, and only the model step changes the
// body), so it parses as it did then.
func (r *viewReader) restore(ctx *fasthttp.RequestCtx, st *reqState) {
	st.view = r.get()
	if r.parse(st, ctx.PostBody(), st.kind) == nil {
		st.req.Prefix = routingKey(st.view, st.kind)
	}
}

// routingKey is the key of kind's request in the prefix tree.
func routingKey(v *reqview.View, kind reqview.Kind) []byte {
	if kind == reqview.Completions {
		return v.Prompt
	}
	return v.History
}

// sessionKind is the kind a policy that needs only the session fields
// parses as: Other, except Messages, whose metadata.user_id only its own
// kind reads.
func sessionKind(kind reqview.Kind) reqview.Kind {
	if kind == reqview.Messages {
		return kind
	}
	return reqview.Other
}
