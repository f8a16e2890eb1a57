package fastproxy_test

import (
	"context"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/examples"
	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/simworker"
)

// saarFleet is the demo config over simulated workers that reject foreign
// tool-call ids and unknown previous_response_ids, so a continuity break
// fails the request instead of passing silently.
type saarFleet struct {
	*testRouter
	sims   map[string][]*simworker.Worker // by model
	models *saar.Router
}

func startSAAR(t *testing.T) *saarFleet {
	t.Helper()
	return startSAARWith(t, "cache_aware")
}

// startSAARWith is startSAAR with another worker policy: policies that read
// only the model of a body still give the model step the whole view.
func startSAARWith(t *testing.T, policy string) *saarFleet {
	t.Helper()
	cfg, err := saar.ParseConfig(examples.Demo)
	if err != nil {
		t.Fatal(err)
	}
	f := &saarFleet{sims: map[string][]*simworker.Worker{}}
	for i := range cfg.Models {
		m := &cfg.Models[i]
		sc := fastSim()
		sc.Models, sc.StrictToolIDs = []string{m.Name}, true
		ws, urls := startSims(t, 2, sc)
		m.Workers = urls
		f.sims[m.Name] = ws
	}
	models := saar.NewRouter(cfg, saar.Options{})
	f.models = models
	f.testRouter = startRouter(t, nil, policy, func(c *fastproxy.Config, _ *loadview.Config) { c.Models = models })
	for _, m := range cfg.Models {
		for _, u := range m.Workers {
			if _, err := f.reg.Add(context.Background(), u, []string{m.Name}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

var toolCallID = regexp.MustCompile(`"id":"(call_[^"]+)"`)

const tools = `"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{}}}}]`

func TestToolLoopLockedAcrossDecisionsFromStreamedIDs(t *testing.T) {
	for _, policy := range []string{"cache_aware", route.RoundRobin, route.ConsistentHash} {
		t.Run(policy, func(t *testing.T) { testToolLoopLocked(t, startSAARWith(t, policy)) })
	}
}

func testToolLoopLocked(t *testing.T, f *saarFleet) {
	user := `{"role":"user","content":"find my booking"}`
	resp, body := do(t, "POST", f.url+"/v1/chat/completions",
		`{"model":"auto","stream":true,`+tools+`,"messages":[`+user+`]}`,
		map[string]string{"X-Session-ID": "agent-1", "x-warmroute-complexity": "0"})
	if resp.StatusCode != 200 {
		t.Fatalf("turn 1: %d %s", resp.StatusCode, body)
	}
	model := resp.Header.Get("x-vsr-selected-model")
	m := toolCallID.FindSubmatch(body)
	if model == "" || m == nil {
		t.Fatalf("turn 1: model %q, no tool call in the stream: %s", model, body)
	}
	// Turn 2 returns the tool result. Its text and complexity now point at
	// the reasoning decision, whose candidates may not include the model
	// that issued the call: the lock must hold anyway.
	turn2 := `{"model":"auto",` + tools + `,"messages":[` + user +
		`,{"role":"assistant","tool_calls":[{"id":"` + string(m[1]) + `","type":"function","function":{"name":"lookup","arguments":"{}"}}]}` +
		`,{"role":"tool","tool_call_id":"` + string(m[1]) + `","content":"prove the theorem step by step"}]}`
	resp, body = do(t, "POST", f.url+"/v1/chat/completions", turn2,
		map[string]string{"X-Session-ID": "agent-1", "x-warmroute-complexity": "1"})
	if resp.StatusCode != 200 {
		t.Fatalf("turn 2 (tool result) failed, the strict worker saw a foreign id: %d %s", resp.StatusCode, body)
	}
	f2 := func(h, want string) {
		t.Helper()
		if got := resp.Header.Get(h); got != want {
			t.Errorf("%s = %q, want %q", h, got, want)
		}
	}
	f2("x-vsr-selected-model", model)
	f2("x-vsr-session-phase", "tool_loop")
	f2("x-vsr-session-action", "hard_lock")

	// The replay endpoint has the record the header names.
	id := resp.Header.Get("x-vsr-replay-id")
	_, rec := do(t, "GET", f.adminURL(t)+"/v1/router_replay?session=agent-1&limit=10", "", nil)
	if !strings.Contains(string(rec), `"id":"`+id+`"`) {
		t.Fatalf("replay record %s missing: %s", id, rec)
	}
}

func TestProviderStatePinsModelAndWorker(t *testing.T) {
	f := startSAAR(t)
	resp, body := do(t, "POST", f.url+"/v1/responses", `{"model":"auto","input":"hello there"}`, map[string]string{"X-Session-ID": "r1"})
	if resp.StatusCode != 200 {
		t.Fatalf("responses: %d %s", resp.StatusCode, body)
	}
	worker := resp.Header.Get("x-vllm-router-worker")
	rid, err := sonic.Get(body, "id")
	if err != nil {
		t.Fatal(err)
	}
	id, _ := rid.String()
	for i := 0; i < 4; i++ { // a different worker would answer previous_response_not_found
		resp, body = do(t, "POST", f.url+"/v1/responses", `{"model":"auto","previous_response_id":"`+id+`","input":"prove it rigorously"}`,
			map[string]string{"x-warmroute-complexity": "1"})
		if resp.StatusCode != 200 || resp.Header.Get("x-vllm-router-worker") != worker ||
			resp.Header.Get("x-vsr-session-phase") != "provider_state" || resp.Header.Get("x-vllm-router-decision") != route.PinnedWorker {
			t.Fatalf("follow-up %d: %d on %s (%s, %s): %s", i, resp.StatusCode, resp.Header.Get("x-vllm-router-worker"),
				resp.Header.Get("x-vsr-session-phase"), resp.Header.Get("x-vllm-router-decision"), body)
		}
	}
	for _, step := range []struct {
		method string
		status int
	}{{"GET", 200}, {"DELETE", 200}, {"GET", 404}} {
		resp, body := do(t, step.method, f.url+"/v1/responses/"+id, "", nil)
		if resp.StatusCode != step.status {
			t.Fatalf("%s /v1/responses/%s: %d, want %d: %s", step.method, id, resp.StatusCode, step.status, body)
		}
	}
}

func TestLockBrokenExplicitlyWhenModelDown(t *testing.T) {
	f := startSAAR(t)
	resp, body := do(t, "POST", f.url+"/v1/chat/completions", `{"model":"auto",`+tools+`,"messages":[{"role":"user","content":"check"}]}`,
		map[string]string{"X-Session-ID": "agent-2"})
	model := resp.Header.Get("x-vsr-selected-model")
	m := toolCallID.FindSubmatch(body)
	if m == nil {
		t.Fatalf("no tool call: %s", body)
	}
	for _, w := range f.reg.Workers() {
		if w.Models()[0] == model {
			f.reg.SetHealthy(w, false)
		}
	}
	turn2 := `{"model":"auto",` + tools + `,"messages":[{"role":"user","content":"check"}` +
		`,{"role":"assistant","tool_calls":[{"id":"` + string(m[1]) + `","type":"function","function":{"name":"lookup","arguments":"{}"}}]}` +
		`,{"role":"tool","tool_call_id":"` + string(m[1]) + `","content":"done"}]}`
	resp, _ = do(t, "POST", f.url+"/v1/chat/completions", turn2, map[string]string{"X-Session-ID": "agent-2"})
	if a := resp.Header.Get("x-vsr-session-action"); a != "lock_broken" || resp.Header.Get("x-vsr-selected-model") == model {
		t.Fatalf("locked model down: action %q model %q (was %q)", a, resp.Header.Get("x-vsr-selected-model"), model)
	}
}

// panicPolicy is a policy that fails in the worst way.
type panicPolicy struct{}

func (panicPolicy) Name() string                       { return "panic" }
func (panicPolicy) Reads() route.Depth                 { return route.ReadsModel }
func (panicPolicy) Select(*route.Request) route.Choice { panic("boom") }

func TestPanicIsAnswered500(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	reg := loadview.NewRegistry(loadview.Config{})
	reg.Add(context.Background(), urls[0], nil) //nolint:errcheck
	srv, err := fastproxy.New(fastproxy.Config{Registry: reg, Policy: panicPolicy{}})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)                         //nolint:errcheck
	defer srv.Shutdown(context.Background()) //nolint:errcheck
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	req.SetRequestURI("http://" + ln.Addr().String() + "/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.SetBodyString(chatBody("m", "hi", false))
	if err := fasthttp.Do(req, resp); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode() != 500 || !strings.Contains(string(resp.Body()), `"code":"internal_error"`) {
		t.Fatalf("panic answered %d %s", resp.StatusCode(), resp.Body())
	}
}

func TestProviderStateNeverFailsOverSilently(t *testing.T) {
	f := startSAAR(t)
	resp, body := do(t, "POST", f.url+"/v1/responses", `{"model":"auto","input":"hello"}`, map[string]string{"X-Session-ID": "pin"})
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	worker := resp.Header.Get("x-vllm-router-worker")
	node, _ := sonic.Get(body, "id")
	id, _ := node.String()
	var owner *simworker.Worker
	for _, ws := range f.sims { // the owner answers 503 while still marked healthy
		for _, w := range ws {
			if "http://"+w.Name() == worker {
				owner = w
				w.SetUnavailable(true)
			}
		}
	}
	before := owner.Stats().Requests
	resp, body = do(t, "POST", f.url+"/v1/responses", `{"model":"auto","previous_response_id":"`+id+`","input":"more"}`, nil)
	// The owner's back pressure is passed on (the router's own 503, which
	// names no worker), and no other worker served the turn.
	if resp.StatusCode != 503 || !strings.Contains(string(body), `"code":"upstream_unavailable"`) || owner.Stats().Requests != before+1 {
		t.Fatalf("pinned turn answered %d (owner %s asked %d times): %s", resp.StatusCode, worker, owner.Stats().Requests-before, body)
	}
}

func TestLearnedModelDoesNotAliasTheBody(t *testing.T) {
	f := startSAAR(t)
	// A physical-model Responses call on a kept-alive connection, then
	// another request reusing the connection's buffers.
	resp, body := do(t, "POST", f.url+"/v1/responses", `{"model":"sim-small","input":"hello"}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	node, _ := sonic.Get(body, "id")
	id, _ := node.String()
	do(t, "POST", f.url+"/v1/chat/completions", `{"model":"XXXXXXXXX","messages":[]}`, nil)
	if model, _, ok := f.models.ResponseOwner([]byte(id)); !ok || model != "sim-small" {
		t.Fatalf("response owner's model became %q after the connection's buffer was reused", model)
	}
	if resp, body := do(t, "GET", f.url+"/v1/responses/"+id, "", nil); resp.StatusCode != 200 ||
		resp.Header.Get("x-vllm-router-worker") == "" {
		t.Fatalf("GET after buffer reuse: %d %s", resp.StatusCode, body)
	}
	// Sub-resources of a response go to its owner too.
	resp2, _ := do(t, "GET", f.url+"/v1/responses/"+id+"/input_items", "", nil)
	if resp2.Header.Get("x-vllm-router-worker") != resp.Header.Get("x-vllm-router-worker") {
		t.Fatalf("input_items went to %q, owner %q", resp2.Header.Get("x-vllm-router-worker"), resp.Header.Get("x-vllm-router-worker"))
	}
	if resp3, _ := do(t, "PUT", f.url+"/v1/responses/"+id+"/cancel", "", nil); resp3.StatusCode != 405 {
		t.Fatalf("PUT on a sub-resource: %d", resp3.StatusCode)
	}
}

func TestModelFailoverWhenEveryWorkerFails(t *testing.T) {
	f := startSAAR(t)
	resp, _ := do(t, "POST", f.url+"/v1/chat/completions", `{"model":"auto","messages":[{"role":"user","content":"hello"}]}`,
		map[string]string{"X-Session-ID": "fo", "x-warmroute-complexity": "0"})
	first := resp.Header.Get("x-vsr-selected-model")
	for _, w := range f.sims[first] { // down, but still marked healthy
		w.SetUnavailable(true)
	}
	before := f.counter("vllm_router_model_failovers_total")
	decisions := snapshotDecisions(f.testRouter)
	resp, body := do(t, "POST", f.url+"/v1/chat/completions", `{"model":"auto","messages":[{"role":"user","content":"hello again"}]}`,
		map[string]string{"X-Session-ID": "fo", "x-warmroute-complexity": "0"})
	if resp.StatusCode != 200 || resp.Header.Get("x-vsr-selected-model") == first {
		t.Fatalf("every %s worker failed: %d from %s: %s", first, resp.StatusCode, resp.Header.Get("x-vsr-selected-model"), body)
	}
	if d := f.counter("vllm_router_model_failovers_total") - before; d != 1 {
		t.Fatalf("model failovers counted %d", d)
	}
	moved := 0
	for l, n := range snapshotDecisions(f.testRouter) {
		moved += int(n - decisions[l])
	}
	if moved != 1 {
		t.Fatalf("one request counted %d decisions", moved)
	}
}
