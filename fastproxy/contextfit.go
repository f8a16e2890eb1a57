package fastproxy

import (
	"bytes"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/reqview"
)

// Context fit (docs/design.md §8.4): a prompt is not sent to a worker whose
// max_model_len it cannot fit while another healthy candidate fits it. When
// none fits, the candidates are left as they are and the worker answers its
// own 400, which the client sees.
//
// A request needs prompt + max(max_tokens, 1) tokens (vLLM refuses a prompt
// of max_model_len tokens or more, and a prompt and explicit completion
// limit over it). The prompt is estimated from the routing key: its length
// over the key characters per token the policy learned on that worker in
// that model (route.TokenRates), else over fitCharsPerToken. Without a key (a policy that reads only the model, or a
// body with no text) the body length stands for the key: the JSON around
// the text only makes the estimate larger. Generate's key is its token ids,
// counted exactly.

// fitCharsPerToken is the characters per token assumed before the policy
// learned one: below the policy's prior of 4 (English
// prose) because code, JSON and non-Latin text run nearer 3 and 1–2, and an
// overestimate only sends a prompt to a larger worker, while an
// underestimate earns the client a 400.
const fitCharsPerToken = 3.0

// fitContext narrows st.req.Workers to the candidates whose context fits the
// request, when some do not and a healthy one does; Subset then keeps
// affinity outside them from counting. Allocation-free once st's scratch
// has grown to the fleet; one atomic load when no worker reports a
// context the request could exceed even at one character per token.
func (ws *workerStep) fitContext(st *reqState, body []byte) {
	lo := ws.reg.MinModelLen()
	if lo == 0 {
		return
	}
	key := st.req.Prefix
	if len(key) == 0 {
		key = body
	}
	completion := max(st.view.MaxTokens, 1)
	if len(key)+completion <= lo {
		return // fits everywhere: a token is at least one character
	}
	model := st.req.Model
	if model == "" {
		if ms := ws.reg.Models(); len(ms) == 1 {
			model = ms[0] // the model a worker serves a request that names none
		}
	}
	tokens := -1 // estimated per worker
	if st.kind == reqview.Generate && len(st.req.Prefix) > 0 {
		tokens = bytes.Count(st.req.Prefix, []byte{','})
	}
	fit := st.fit[:0]
	if cap(fit) == 0 {
		fit = st.fitBuf[:0]
	}
	out, healthy := false, false
	for _, w := range st.req.Workers {
		if ws.fits(w, model, len(key), tokens, completion) {
			fit = append(fit, w)
			healthy = healthy || w.Healthy()
		} else {
			out = true
		}
	}
	st.fit = fit
	if out && healthy {
		st.req.Workers, st.req.Subset = fit, true
	}
}

// fits reports whether a request of keyLen key characters (or tokens
// prompt tokens, when known) and completion tokens fits w's context for
// model; an unknown context fits.
func (ws *workerStep) fits(w *loadview.Worker, model string, keyLen, tokens, completion int) bool {
	l := w.MaxModelLen(model)
	if l == 0 {
		return true
	}
	if tokens < 0 {
		cpt := fitCharsPerToken
		if ws.rates != nil {
			if c, ok := ws.rates.CharsPerToken(model, w.ID()); ok {
				cpt = c
			}
		}
		tokens = int(float64(keyLen) / cpt)
	}
	return tokens+completion <= l
}
