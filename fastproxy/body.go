package fastproxy

import (
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/reqview"
)

// rewriteBody sets the body the worker gets: the original with model (when
// not empty) written over its model name and the request's priority
// carried as priorityEdit says. Every other byte is forwarded as sent. The
// first rewrite swaps the original body out of the request into st.body,
// where the view's aliases stay valid until releaseState; a later one (a
// failover) rewrites from it again. Nothing is copied when nothing changes.
func (st *reqState) rewriteBody(ctx *fasthttp.RequestCtx, model string, forwardPriority bool) {
	v := st.view
	orig, buf := ctx.Request.Body(), st.body[:0]
	if st.spliced {
		orig, buf = st.body, nil
	}
	ms, me := -1, -1 // the model's span, quotes included
	if model != "" && v.ModelStart >= 0 {
		ms, me = v.ModelStart, v.ModelEnd
	}
	pe := st.priorityEdit(ctx, orig, forwardPriority)
	if ms < 0 && pe.start < 0 {
		return
	}
	nb, at := buf, 0
	if pe.start >= 0 && (ms < 0 || pe.start < ms) {
		nb, at = pe.append(append(nb, orig[at:pe.start]...)), pe.end
	}
	if ms >= 0 {
		nb = appendJSONString(append(nb, orig[at:ms]...), model)
		at = me
	}
	if pe.start >= 0 && ms >= 0 && pe.start > ms {
		nb, at = pe.append(append(nb, orig[at:pe.start]...)), pe.end
	}
	nb = append(nb, orig[at:]...)
	if st.spliced {
		ctx.Request.SetBody(nb)
		return
	}
	st.body, st.spliced = ctx.Request.SwapBody(nb), true
}

// priorityEdit is how the body the worker gets carries the request's
// priority: bytes [start, end) of the body give way to the member
// "priority":value (after a comma with lead), or to nothing with drop.
// start -1: the body goes as sent.
type priorityEdit struct {
	start, end int
	drop, lead bool
	value      int
}

// priorityEdit is what body, the request's, must change for its priority
// (docs/design.md §9, "Order of release"). Without forward its "priority" member
// goes (vLLM refuses a priority it does not schedule by). With it, the
// worker gets the priority the router ordered the request by: an
// X-Request-Priority that differs from the body replaces the member's
// value, or is added as the last member (a JSON parser keeps the last of
// a repeated key, so it wins over a member the view could not read).
func (st *reqState) priorityEdit(ctx *fasthttp.RequestCtx, body []byte, forward bool) priorityEdit {
	v := st.view
	if !forward {
		if v.PriorityStart < 0 {
			return priorityEdit{start: -1}
		}
		s, e := v.PriorityCut(body)
		return priorityEdit{start: s, end: e, drop: true}
	}
	if len(ctx.Request.Header.Peek(hdrPriority)) == 0 {
		return priorityEdit{start: -1}
	}
	p := st.priority(ctx)
	switch {
	case v.PriorityStart >= 0 && p != v.Priority:
		return priorityEdit{start: v.PriorityStart, end: v.PriorityEnd, value: p}
	case v.PriorityStart >= 0 || p == 0: // as the body says, or vLLM's default
		return priorityEdit{start: -1}
	}
	at, lead, ok := reqview.PriorityAppend(body)
	if !ok {
		return priorityEdit{start: -1}
	}
	return priorityEdit{start: at, end: at, value: p, lead: lead}
}

// append appends the edit's replacement to dst.
func (e *priorityEdit) append(dst []byte) []byte {
	if e.drop {
		return dst
	}
	if e.lead {
		dst = append(dst, ',')
	}
	return strconv.AppendInt(append(dst, `"priority":`...), int64(e.value), 10)
}
