package fastproxy

import "github.com/valyala/fasthttp"

// rewriteBody sets the body the worker gets: the original with model (when
// not empty) written over its model name and, with strip, its "priority"
// member removed (vLLM refuses a priority it does not schedule by,
// --forward-priority). Every other byte is forwarded as sent. The first
// rewrite swaps the original body out of the request into st.body, where
// the view's aliases stay valid until releaseState; a later one (a
// failover) rewrites from it again.
func (st *reqState) rewriteBody(ctx *fasthttp.RequestCtx, model string, strip bool) {
	v := st.view
	orig, buf := ctx.Request.Body(), st.body[:0]
	if st.spliced {
		orig, buf = st.body, nil
	}
	ms, me := -1, -1 // the model's span, quotes included
	if model != "" && v.ModelStart >= 0 {
		ms, me = v.ModelStart, v.ModelEnd
	}
	ps, pe := -1, -1 // the priority member's, with its comma
	if strip && v.PriorityStart >= 0 {
		ps, pe = v.PriorityCut(orig)
	}
	if ms < 0 && ps < 0 {
		return
	}
	nb, at := buf, 0
	if ps >= 0 && (ms < 0 || ps < ms) {
		nb, at = append(nb, orig[at:ps]...), pe
	}
	if ms >= 0 {
		nb = appendJSONString(append(nb, orig[at:ms]...), model)
		at = me
	}
	if ps >= 0 && ms >= 0 && ps > ms {
		nb, at = append(nb, orig[at:ps]...), pe
	}
	nb = append(nb, orig[at:]...)
	if st.spliced {
		ctx.Request.SetBody(nb)
		return
	}
	st.body, st.spliced = ctx.Request.SwapBody(nb), true
}
