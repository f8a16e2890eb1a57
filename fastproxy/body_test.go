package fastproxy

import (
	"encoding/json"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/reqview"
)

// rewritten is the body rewriteBody gives the worker for body, a header
// priority hdr ("" none), model and forward.
func rewritten(t testing.TB, body, hdr, model string, forward bool) (string, bool) {
	var v reqview.View
	if reqview.Parse(&v, []byte(body), reqview.Chat) != nil {
		return "", false
	}
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.SetBodyString(body)
	if hdr != "" {
		ctx.Request.Header.Set(hdrPriority, hdr)
	}
	st := &reqState{view: &v}
	st.rewriteBody(ctx, model, forward)
	st.rewriteBody(ctx, model, forward) // a failover rewrites from the original again
	return string(ctx.Request.Body()), true
}

// The body the worker gets: the model spliced in, and the priority dropped,
// kept, replaced or added, every other byte as sent.
func TestRewriteBody(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		body, hdr, model string
		forward          bool
		want             string
	}{
		{`{"model":"auto","priority":3,` + msgs + `}`, "", "m1", false, `{"model":"m1",` + msgs + `}`},
		{`{"priority":3,"model":"auto",` + msgs + `}`, "7", "m1", false, `{"model":"m1",` + msgs + `}`},
		{`{"model":"auto","priority":3,` + msgs + `}`, "", "m1", true, `{"model":"m1","priority":3,` + msgs + `}`},
		{`{"model":"auto","priority":3,` + msgs + `}`, "-2", "m1", true, `{"model":"m1","priority":-2,` + msgs + `}`},
		{`{"priority": 3 ,"model":"auto",` + msgs + `}`, "12", "m1", true, `{"priority":12 ,"model":"m1",` + msgs + `}`},
		{`{"model":"auto",` + msgs + "}\n", "7", "m1", true, `{"model":"m1",` + msgs + `,"priority":7}` + "\n"},
		{`{"model":"auto",` + msgs + `}`, "7", "", true, `{"model":"auto",` + msgs + `,"priority":7}`},
		{`{"model":"auto",` + msgs + `}`, "0", "", true, `{"model":"auto",` + msgs + `}`},
		{`{"model":"auto",` + msgs + `}`, "x", "", true, `{"model":"auto",` + msgs + `}`},
	} {
		got, ok := rewritten(t, c.body, c.hdr, c.model, c.forward)
		if !ok || got != c.want {
			t.Errorf("%s (header %q, model %q, forward %v):\n got %s\nwant %s", c.body, c.hdr, c.model, c.forward, got, c.want)
		}
	}
}

// Whatever the body, a rewritten valid one stays valid JSON, names the
// model and carries, as a JSON parser reads it, the priority the router
// orders by with --forward-priority, and none without.
func FuzzRewriteBody(f *testing.F) {
	f.Add(`{"model":"a","messages":[]}`, "7", "m", true)
	f.Add(`{"model":"a","priority":2,"messages":[]}`, "", "m", false)
	f.Add(`{"priority":2}`, "-1", "", true)
	f.Add(`{}`, "5", "", true)
	f.Fuzz(func(t *testing.T, body, hdr, model string, forward bool) {
		if !json.Valid([]byte(body)) || len(model) > 64 || !utf8.ValidString(model) { // models are configured names
			return
		}
		got, ok := rewritten(t, body, hdr, model, forward)
		if !ok {
			return
		}
		var v reqview.View
		_ = reqview.Parse(&v, []byte(body), reqview.Chat)
		var out struct {
			Model    json.RawMessage
			Priority json.RawMessage
		}
		if err := json.Unmarshal([]byte(got), &out); err != nil {
			t.Fatalf("%s → %s: %v", body, got, err)
		}
		var m string
		if model != "" && v.ModelStart >= 0 && (json.Unmarshal(out.Model, &m) != nil || m != model) {
			t.Fatalf("%s → %s: model not %q", body, got, model)
		}
		n, err := strconv.Atoi(hdr)
		switch {
		case !forward && v.PriorityStart >= 0 && out.Priority != nil:
			t.Fatalf("%s → %s: priority kept", body, got)
		case forward && hdr != "" && err == nil:
			want := min(max(n, -reqview.MaxPriority), reqview.MaxPriority)
			if p, _ := strconv.Atoi(string(out.Priority)); (out.Priority != nil || want != 0) && p != want {
				t.Fatalf("%s → %s: priority %s, want %d", body, got, out.Priority, want)
			}
		}
	})
}
