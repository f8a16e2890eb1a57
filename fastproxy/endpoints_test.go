package fastproxy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// TestModelsKeepWhatWorkersSay: GET /v1/models carries what the workers'
// /v1/models said (root, parent, created, max_model_len), the largest
// context where workers disagree, and an adapter loaded at run time through
// the router's fleet call (docs/design.md §8.4).
func TestModelsKeepWhatWorkersSay(t *testing.T) {
	small, large := fastSim(), fastSim()
	small.MaxModelLen, large.MaxModelLen = 4096, 131072
	_, u1 := startSims(t, 1, small)
	_, u2 := startSims(t, 1, large)
	r := startRouter(t, append(u1, u2...), "cache_aware", nil)
	admin := r.adminURL(t)
	if resp, body := do(t, "POST", admin+"/v1/load_lora_adapter", `{"lora_name":"support-bot","lora_path":"/adapters/support"}`, nil); resp.StatusCode != 200 {
		t.Fatalf("load: %d %s", resp.StatusCode, body)
	}
	// A worker whose models were given (config) is never asked: its model
	// keeps the minimal entry.
	if _, err := r.reg.Add(context.Background(), startEcho(t, nil, nil, 0).url, []string{"fixed"}); err != nil {
		t.Fatal(err)
	}
	resp, body := do(t, "GET", r.url+"/v1/models", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("models: %d %s", resp.StatusCode, body)
	}
	var list struct {
		Object string                       `json:"object"`
		Data   []map[string]json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil || list.Object != "list" {
		t.Fatalf("models: %v %s", err, body)
	}
	byID := map[string]map[string]json.RawMessage{}
	for _, m := range list.Data {
		var id string
		json.Unmarshal(m["id"], &id) //nolint:errcheck
		byID[id] = m
	}
	field := func(model, name string) string {
		t.Helper()
		m, ok := byID[model]
		if !ok {
			t.Fatalf("model %q not listed: %s", model, body)
		}
		v, ok := m[name]
		if !ok {
			t.Fatalf("model %q has no %q: %s", model, name, body)
		}
		return string(v)
	}
	for _, c := range []struct{ model, name, want string }{
		{"m", "object", `"model"`},
		{"m", "root", `"m"`},
		{"m", "parent", `null`},
		{"m", "max_model_len", `131072`}, // the largest: a long prompt has a worker
		{"m", "owned_by", `"simworker"`},
		{"support-bot", "root", `"/adapters/support"`},
		{"support-bot", "parent", `"m"`},
		{"support-bot", "max_model_len", `131072`}, // its parent's
	} {
		if got := field(c.model, c.name); got != c.want {
			t.Errorf("%s.%s = %s, want %s", c.model, c.name, got, c.want)
		}
	}
	if m := byID["fixed"]; len(m) != 4 || string(m["owned_by"]) != `"vllm"` {
		t.Errorf("a configured model without discovery: %v, want id, object, created, owned_by", m)
	}
	for _, m := range []string{"m", "support-bot"} {
		if got := field(m, "created"); got == "0" {
			t.Errorf("%s.created = 0, want the worker's", m)
		}
	}
}

// TestLongPromptGoesToAWorkerItFits: a prompt longer than one worker's
// max_model_len is never sent there while another worker fits it, nor is a
// short prompt with a completion limit past that context; short prompts
// may go anywhere; with only the small worker the request is still sent
// and the client gets the worker's own 400 (docs/design.md §8.4).
func TestLongPromptGoesToAWorkerItFits(t *testing.T) {
	small, large := fastSim(), fastSim()
	small.MaxModelLen, large.MaxModelLen = 4096, 131072
	small.TimeScale, large.TimeScale = 0, 0 // no simulated time: a 6000-token completion at once
	_, us := startSims(t, 1, small)
	_, ul := startSims(t, 1, large)
	long := func(i int) string {
		return chatBody("m", fmt.Sprintf("conversation %d: %s", i, strings.Repeat("lorem ipsum dolor sit amet ", 1500)), false)
	}
	// cache_aware estimates from the history key, round_robin (which reads
	// only the model) from the body length.
	for _, policy := range []string{"cache_aware", "round_robin"} {
		r := startRouter(t, append(us, ul...), policy, nil)
		for i := 0; i < 12; i++ {
			body := long(i)
			if i%3 == 2 {
				body = strings.Replace(chatBody("m", fmt.Sprintf("short question %d", i), false), `"model"`, `"max_tokens":6000,"model"`, 1)
			}
			resp, b := do(t, "POST", r.url+chatPath, body, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("%s: request %d: %d %s", policy, i, resp.StatusCode, b)
			}
			if w := resp.Header.Get("x-vllm-router-worker"); w != ul[0] {
				t.Fatalf("%s: request %d (%d bytes) went to %s, not the worker it fits (%s)", policy, i, len(body), w, ul[0])
			}
		}
		seen := map[string]int{}
		for i := 0; i < 8; i++ {
			resp, b := do(t, "POST", r.url+chatPath, chatBody("m", fmt.Sprintf("hello %d", i), false), nil)
			if resp.StatusCode != 200 {
				t.Fatalf("%s: short %d: %d %s", policy, i, resp.StatusCode, b)
			}
			seen[resp.Header.Get("x-vllm-router-worker")]++
		}
		if policy == "round_robin" && seen[us[0]] == 0 {
			t.Errorf("no short prompt went to the small worker: %v", seen)
		}
	}

	only := startRouter(t, us, "cache_aware", nil)
	resp, b := do(t, "POST", only.url+chatPath, long(99), nil)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "maximum context length") {
		t.Fatalf("only the small worker: %d %s, want its 400", resp.StatusCode, b)
	}
	if w := resp.Header.Get("x-vllm-router-worker"); w != us[0] {
		t.Fatalf("the request did not reach the worker: %q", w)
	}
}

// decisions sums the router's routing-decision counters.
func (tr *testRouter) decisions(t *testing.T) float64 {
	t.Helper()
	var b strings.Builder
	tr.srv.Metrics().WritePrometheus(&b)
	sum := 0.0
	for _, line := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(line, "vllm_router_cache_aware_decisions_total{") {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v) //nolint:errcheck
			sum += v
		}
	}
	return sum
}

// TestRouterOwnHealthAndMetrics: /health/ready and /metrics on the
// inference port are the router's own: no worker receives them and no
// routing decision is counted; /metrics there is an admin surface
// (docs/design.md §3).
func TestRouterOwnHealthAndMetrics(t *testing.T) {
	ups := []*echoUpstream{startEcho(t, []byte(`{"choices":[]}`), nil, 0), startEcho(t, []byte(`{"choices":[]}`), nil, 0)}
	open := startRouter(t, []string{ups[0].url, ups[1].url}, "round_robin", nil)
	keyed := startRouter(t, []string{ups[0].url, ups[1].url}, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) { c.AdminAPIKey = "adm" })
	before := open.decisions(t) + keyed.decisions(t)
	for _, c := range []struct {
		r      *testRouter
		path   string
		hdr    map[string]string
		status int
		has    string
	}{
		{open, "/health/ready", nil, 200, `"ready":true`},
		{keyed, "/health/ready", nil, 200, `"ready":true`},
		{open, "/metrics", nil, 404, ""}, // no admin key configured: not there
		{keyed, "/metrics", nil, 401, ""},
		{keyed, "/metrics", map[string]string{"Authorization": "Bearer wrong"}, 401, ""},
		{keyed, "/metrics", map[string]string{"Authorization": "Bearer adm"}, 200, "vllm_router_requests_total"},
	} {
		resp, body := do(t, "GET", c.r.url+c.path, "", c.hdr)
		if resp.StatusCode != c.status || !strings.Contains(string(body), c.has) {
			t.Errorf("GET %s (%v): %d %.200s, want %d with %q", c.path, c.hdr, resp.StatusCode, body, c.status, c.has)
		}
		if d := resp.Header.Get("x-vllm-router-decision"); d != "" {
			t.Errorf("GET %s: decision header %q", c.path, d)
		}
	}
	for i, u := range ups {
		if n := len(u.got); n != 0 {
			t.Errorf("worker %d received %d requests", i, n)
		}
	}
	if after := open.decisions(t) + keyed.decisions(t); after != before {
		t.Errorf("routing decisions moved from %v to %v", before, after)
	}
	// The readiness of a router without a healthy worker is 503.
	down := startRouter(t, []string{deadURL(t)}, "round_robin", nil)
	down.reg.SetHealthy(down.reg.Workers()[0], false)
	if resp, body := do(t, "GET", down.url+"/health/ready", "", nil); resp.StatusCode != 503 {
		t.Errorf("no healthy worker: /health/ready %d %s, want 503", resp.StatusCode, body)
	}
}

// TestGenerateTokensFollowTheirPrefix: /inference/v1/generate is routed as
// inference: without any session id, under cache_aware, a request whose
// token_ids extend the previous one's goes to the same worker, however the
// array is spelled; it names no model and the fleet's one model is used
// (docs/design.md §8.4).
func TestGenerateTokensFollowTheirPrefix(t *testing.T) {
	const answer = `{"choices":[{"index":0,"token_ids":[7,8],"finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":2,"total_tokens":4}}`
	var ups []*echoUpstream
	var urls []string
	for i := 0; i < 4; i++ {
		ups = append(ups, startEcho(t, []byte(answer), nil, 0))
		urls = append(urls, ups[i].url)
	}
	r := startRouter(t, urls, "cache_aware", nil)
	drain := func() {
		for _, u := range ups {
			for len(u.got) > 0 {
				<-u.got
				<-u.gotHdr
			}
		}
	}
	for conv := 0; conv < 3; conv++ {
		ids := make([]string, 0, 400)
		for i := 0; i < 200; i++ {
			ids = append(ids, fmt.Sprint(1000*conv+i))
		}
		first := ""
		for turn := 0; turn < 5; turn++ {
			sep := ","
			if turn%2 == 1 {
				sep = " , " // another spelling of the same array
			}
			body := `{"token_ids":[` + strings.Join(ids, sep) + `],"sampling_params":{"max_tokens":2,"temperature":0}}`
			resp, b := do(t, "POST", r.url+"/inference/v1/generate", body, nil)
			drain()
			if resp.StatusCode != 200 || string(b) != answer {
				t.Fatalf("conversation %d turn %d: %d %s", conv, turn, resp.StatusCode, b)
			}
			w, d := resp.Header.Get("x-vllm-router-worker"), resp.Header.Get("x-vllm-router-decision")
			if turn == 0 {
				first = w
			} else if w != first || d == route.LowMatchMinLoad || d == route.NoTreeRandom {
				t.Fatalf("conversation %d turn %d went to %s (%s), the first turn to %s", conv, turn, w, d, first)
			}
			ids = append(ids, "7", "8", fmt.Sprint(50000+turn)) // the answer and the next input
		}
	}
	if n := r.counter(`vllm_router_requests_total{route="/inference/v1/generate",status="200"}`); n != 15 {
		t.Errorf("generate requests counted %d, want 15", n)
	}
}

// TestMessagesErrorsAreAnthropicShaped: errors the router makes on POST
// /v1/messages have Anthropic's shape and the router's status; a worker's
// error passes through unchanged, and chat errors keep the OpenAI shape
// (docs/design.md §8.4).
func TestMessagesErrorsAreAnthropicShaped(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "cache_aware", func(c *fastproxy.Config, _ *loadview.Config) { c.ClientAPIKeys = []string{"client"} })
	down := startRouter(t, []string{deadURL(t)}, "cache_aware", nil)
	down.reg.SetHealthy(down.reg.Workers()[0], false)
	key := map[string]string{"Authorization": "Bearer client"}
	msg := func(model string) string {
		return `{"model":"` + model + `","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	}
	for _, c := range []struct {
		name, url, method, body string
		hdr                     map[string]string
		status                  int
		typ                     string
	}{
		{"bad body", r.url, "POST", `{"model":"m","messages":[`, key, 400, "invalid_request_error"},
		{"unknown model", r.url, "POST", msg("absent"), key, 404, "not_found_error"},
		{"no client key", r.url, "POST", msg("m"), nil, 401, "authentication_error"},
		{"wrong method", r.url, "GET", "", key, 405, "invalid_request_error"},
		{"no healthy worker", down.url, "POST", msg("m"), nil, 503, "overloaded_error"},
	} {
		resp, body := do(t, c.method, c.url+"/v1/messages", c.body, c.hdr)
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != c.status || e.Type != "error" ||
			e.Error.Type != c.typ || e.Error.Message == "" {
			t.Errorf("%s: %d %s, want %d with an Anthropic %s", c.name, resp.StatusCode, body, c.status, c.typ)
		}
	}
	// Chat keeps the OpenAI shape.
	resp, body := do(t, "POST", r.url+chatPath, chatBody("absent", "hi", false), key)
	var oe struct {
		Error struct {
			Type, Code string
		} `json:"error"`
	}
	if json.Unmarshal(body, &oe) != nil || resp.StatusCode != 404 || oe.Error.Code != "model_not_found" {
		t.Errorf("chat, unknown model: %d %s", resp.StatusCode, body)
	}
	// A worker's own error passes through as it made it.
	const workerErr = `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long"}}`
	e := startEcho(t, []byte(workerErr), nil, 0)
	e.status = 400
	w := startRouter(t, []string{e.url}, "cache_aware", nil)
	resp, body = do(t, "POST", w.url+"/v1/messages", msg("m"), nil)
	if resp.StatusCode != 400 || string(body) != workerErr {
		t.Errorf("worker error: %d %s", resp.StatusCode, body)
	}
}
