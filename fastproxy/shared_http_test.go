package fastproxy_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bytedance/sonic"

	"github.com/warmroute/warmroute/examples"
	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/sharedstate"
)

// replicaFleet is two routers sharing one Redis (docs/design.md §8.3) in
// front of the same workers: the demo models on strict simulated workers,
// or one upstream double serving every model.
type replicaFleet struct {
	redis  *redistest.Server
	rep    [2]*testRouter
	models [2]*saar.Router
	stores [2]*sharedstate.Store
}

// startReplicas starts the two routers; upstream "" means two strict
// simulated workers per demo model (see startSAAR).
func startReplicas(t *testing.T, upstream string) *replicaFleet {
	t.Helper()
	return startReplicasOn(t, func(model string) []string {
		if upstream != "" {
			return []string{upstream}
		}
		sc := fastSim()
		sc.Models, sc.StrictToolIDs = []string{model}, true
		_, urls := startSims(t, 2, sc)
		return urls
	})
}

// startReplicasOn starts the two routers over the demo models, each served
// by the workers workers(model) returns (a URL may serve several models).
func startReplicasOn(t *testing.T, workers func(model string) []string) *replicaFleet {
	t.Helper()
	cfg, err := saar.ParseConfig(examples.Demo)
	if err != nil {
		t.Fatal(err)
	}
	served := map[string][]string{} // URL → models, in config order
	var urls []string
	for i := range cfg.Models {
		m := &cfg.Models[i]
		m.Workers = workers(m.Name)
		for _, u := range m.Workers {
			if served[u] == nil {
				urls = append(urls, u)
			}
			served[u] = append(served[u], m.Name)
		}
	}
	f := &replicaFleet{redis: redistest.Start(t, redistest.Options{})}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range f.rep {
		st, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: f.redis.URL(), Logger: quiet,
			// generous bounds: -race on shared cores
			ReadTimeout: 2 * time.Second, LockTimeout: 2 * time.Second, PingTimeout: 2 * time.Second, HealthInterval: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		f.stores[i] = st
		f.models[i] = saar.NewRouter(cfg, saar.Options{Shared: st})
		f.rep[i] = startRouter(t, nil, "cache_aware", func(c *fastproxy.Config, _ *loadview.Config) { c.Models, c.Shared = f.models[i], st })
		for _, u := range urls {
			if _, err := f.rep[i].reg.Add(context.Background(), u, served[u]); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

func toolResultTurn(user, id, text string) string {
	return `{"model":"auto",` + tools + `,"messages":[` + user +
		`,{"role":"assistant","tool_calls":[{"id":"` + id + `","type":"function","function":{"name":"lookup","arguments":"{}"}}]}` +
		`,{"role":"tool","tool_call_id":"` + id + `","content":"` + text + `"}]}`
}

// streamUntilDone posts a streaming turn to url and calls atDone, with the
// selected model and the tool-call id streamed, as soon as the client has
// read the line holding [DONE], before the rest of the response.
func streamUntilDone(t *testing.T, url, body string, hdr map[string]string, atDone func(model, id string)) {
	t.Helper()
	streamUntil(t, url, body, hdr, "[DONE]", func(h http.Header, seen string) {
		id := ""
		if m := toolCallID.FindStringSubmatch(seen); m != nil {
			id = m[1]
		}
		atDone(h.Get("x-vsr-selected-model"), id)
	})
}

// streamUntil posts a streaming request to url and calls atEnd, with the
// response headers and the text read so far, as soon as the client has read
// a line holding marker, before the rest of the response.
func streamUntil(t *testing.T, url, body string, hdr map[string]string, marker string, atEnd func(h http.Header, seen string)) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	var seen strings.Builder
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		seen.WriteString(line)
		if strings.Contains(line, marker) {
			atEnd(resp.Header, seen.String())
			io.Copy(io.Discard, br) //nolint:errcheck
			return
		}
		if err != nil {
			t.Fatalf("stream ended without %s (%v)", marker, err)
		}
	}
}

// A tool call streamed through replica A, in one chunk with its [DONE]:
// the lock is in Redis when the client reads [DONE], and the tool result
// sent to replica B at that moment goes to the same model.
func TestReplicasLockReadableAtDone(t *testing.T) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_one_chunk","type":"function","function":{"name":"lookup","arguments":"{}"}}]}}]}` +
		"\n\ndata: [DONE]\n\n")
	// The worker holds the stream open after [DONE]: only the wait before
	// the chunk that ends it keeps the lock ahead of the client.
	up := startEcho(t, []byte(`{"id":"chatcmpl-2","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`), [][]byte{chunk}, 100*time.Millisecond)
	f := startReplicas(t, up.url)
	user := `{"role":"user","content":"find my booking"}`
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := 0; i < 5; i++ {
		id := "call_one_chunk"
		if err := f.stores[0].DeleteLock(context.Background(), sharedstate.KindToolCall, []byte(id)); err != nil {
			t.Fatal(err)
		}
		// A reader that never cached the key: it answers what Redis holds.
		probe, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: f.redis.URL(), Logger: quiet, ReadTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		streamUntilDone(t, f.rep[0].url+"/v1/chat/completions", `{"model":"auto","stream":true,`+tools+`,"messages":[`+user+`]}`,
			map[string]string{"X-Session-ID": "done-" + string(rune('a'+i)), "x-warmroute-complexity": "0"}, func(model, got string) {
				if got != id {
					t.Fatalf("streamed id %q", got)
				}
				// Nothing waited for: the lock must already be in Redis.
				l, ok, err := probe.GetLock(context.Background(), sharedstate.KindToolCall, []byte(id))
				if err != nil || !ok || l.Model != model {
					t.Fatalf("at [DONE], B reads the lock as %+v %v %v; want model %s", l, ok, err, model)
				}
				resp, body := do(t, "POST", f.rep[1].url+"/v1/chat/completions", toolResultTurn(user, id, "prove the theorem step by step"),
					map[string]string{"x-warmroute-complexity": "1"})
				if resp.StatusCode != 200 || resp.Header.Get("x-vsr-selected-model") != model || resp.Header.Get("x-vsr-session-action") != "hard_lock" {
					t.Fatalf("tool result on B: %d %s %s (want %s hard_lock): %s", resp.StatusCode,
						resp.Header.Get("x-vsr-selected-model"), resp.Header.Get("x-vsr-session-action"), model, body)
				}
			})
		probe.Close()
	}
	// One write per response that created locks; none for a response that
	// created none (a chat completion id is no lock).
	if n := lockWrites(t, f.stores[0]); n != 5 {
		t.Fatalf("A wrote locks %d times for 5 responses with one tool call each", n)
	}
	if resp, body := do(t, "POST", f.rep[0].url+"/v1/chat/completions", chatBody("auto", "hello", false), nil); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if n := lockWrites(t, f.stores[0]); n != 5 {
		t.Fatalf("a response without tool calls wrote locks (%d writes)", n)
	}
}

// lockWrites is the number of acknowledged lock writes of a store.
func lockWrites(t *testing.T, st *sharedstate.Store) int {
	t.Helper()
	var b strings.Builder
	st.Metrics().WritePrometheus(&b)
	for _, line := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "warmroute_redis_lock_write_seconds_count "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(line)
			}
			return n
		}
	}
	return 0
}

// The whole path on strict workers: a tool call and a Responses API
// response created through A, continued through B (a foreign id or an
// unknown previous_response_id would be a 400 there).
func TestReplicasShareLocks(t *testing.T) {
	f := startReplicas(t, "")
	user := `{"role":"user","content":"find my booking"}`
	streamUntilDone(t, f.rep[0].url+"/v1/chat/completions", `{"model":"auto","stream":true,`+tools+`,"messages":[`+user+`]}`,
		map[string]string{"X-Session-ID": "agent-r", "x-warmroute-complexity": "0"}, func(model, id string) {
			if id == "" {
				t.Fatal("no tool call streamed")
			}
			resp, body := do(t, "POST", f.rep[1].url+"/v1/chat/completions", toolResultTurn(user, id, "prove the theorem step by step"),
				map[string]string{"X-Session-ID": "agent-r", "x-warmroute-complexity": "1"})
			if resp.StatusCode != 200 || resp.Header.Get("x-vsr-selected-model") != model || resp.Header.Get("x-vsr-session-action") != "hard_lock" {
				t.Fatalf("tool result on B: %d %s %s (want %s): %s", resp.StatusCode,
					resp.Header.Get("x-vsr-selected-model"), resp.Header.Get("x-vsr-session-action"), model, body)
			}
		})

	resp, body := do(t, "POST", f.rep[0].url+"/v1/responses", `{"model":"auto","input":"hello there"}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("responses on A: %d %s", resp.StatusCode, body)
	}
	model, worker := resp.Header.Get("x-vsr-selected-model"), resp.Header.Get("x-vllm-router-worker")
	node, _ := sonic.Get(body, "id")
	id, _ := node.String()
	resp, body = do(t, "POST", f.rep[1].url+"/v1/responses", `{"model":"auto","previous_response_id":"`+id+`","input":"prove it rigorously"}`,
		map[string]string{"x-warmroute-complexity": "1"})
	if resp.StatusCode != 200 || resp.Header.Get("x-vsr-selected-model") != model || resp.Header.Get("x-vllm-router-worker") != worker {
		t.Fatalf("previous_response_id on B: %d %s on %s (want %s on %s): %s", resp.StatusCode,
			resp.Header.Get("x-vsr-selected-model"), resp.Header.Get("x-vllm-router-worker"), model, worker, body)
	}
	if resp, body := do(t, "GET", f.rep[1].url+"/v1/responses/"+id, "", nil); resp.StatusCode != 200 || resp.Header.Get("x-vllm-router-worker") != worker {
		t.Fatalf("GET /v1/responses/{id} on B: %d on %s: %s", resp.StatusCode, resp.Header.Get("x-vllm-router-worker"), body)
	}

	// Streamed: the response id is in the first event; continued through B
	// as soon as the client reads response.completed.
	streamUntil(t, f.rep[0].url+"/v1/responses", `{"model":"auto","stream":true,"input":"hello again"}`, nil, "response.completed",
		func(h http.Header, seen string) {
			m := responseID.FindStringSubmatch(seen)
			if m == nil {
				t.Fatalf("no response id streamed: %s", seen)
			}
			resp, body := do(t, "POST", f.rep[1].url+"/v1/responses", `{"model":"auto","previous_response_id":"`+m[1]+`","input":"prove it rigorously"}`,
				map[string]string{"x-warmroute-complexity": "1"})
			if resp.StatusCode != 200 || resp.Header.Get("x-vsr-selected-model") != h.Get("x-vsr-selected-model") ||
				resp.Header.Get("x-vllm-router-worker") != h.Get("x-vllm-router-worker") {
				t.Fatalf("streamed previous_response_id on B: %d %s on %s (want %s on %s): %s", resp.StatusCode, resp.Header.Get("x-vsr-selected-model"),
					resp.Header.Get("x-vllm-router-worker"), h.Get("x-vsr-selected-model"), h.Get("x-vllm-router-worker"), body)
			}
		})
}

var responseID = regexp.MustCompile(`"id":"(resp_[^"]+)"`)

// Redis down: responses still complete (no 5xx because of Redis), a tool
// result whose lock only Redis could tell gets the explicit redis_down
// reason, counted; once Redis is back the buffered lock is replayed and the
// same tool result goes to the model that issued the call.
func TestReplicasRedisDown(t *testing.T) {
	f := startReplicas(t, "")
	f.redis.Stop()
	testwait.Until(t, "both stores see Redis down", func() bool { return !f.stores[0].Up() && !f.stores[1].Up() })

	user := `{"role":"user","content":"find my booking"}`
	var model, id string
	streamUntilDone(t, f.rep[0].url+"/v1/chat/completions", `{"model":"auto","stream":true,`+tools+`,"messages":[`+user+`]}`,
		map[string]string{"X-Session-ID": "agent-d", "x-warmroute-complexity": "0"}, func(m, i string) { model, id = m, i })
	if id == "" {
		t.Fatal("no tool call streamed")
	}
	if n := f.models[0].Metrics().GetOrCreateCounter(`vllm_router_saar_shared_lock_write_failures_total`).Get(); n != 1 {
		t.Fatalf("A counted %d failed lock writes, want 1", n)
	}

	turn := toolResultTurn(user, id, "prove the theorem step by step")
	resp, body := do(t, "POST", f.rep[1].url+"/v1/chat/completions", turn, map[string]string{"X-Session-ID": "agent-d", "x-warmroute-complexity": "1"})
	if resp.StatusCode >= 500 {
		t.Fatalf("Redis down made a %d: %s", resp.StatusCode, body)
	}
	rec, ok := f.models[1].Record(resp.Header.Get("x-vsr-replay-id"))
	if !ok || rec.Outcome.Reason != saar.ReasonToolLoopNoOwnerDown || !rec.Inputs.ToolOwnerUnreachable {
		t.Fatalf("the turn does not carry the redis_down reason: %+v", rec.Outcome)
	}
	if n := f.models[1].Metrics().GetOrCreateCounter(`vllm_router_saar_lock_unreachable_total{kind="tool_loop"}`).Get(); n != 1 {
		t.Fatalf("B counted %d unreachable locks, want 1", n)
	}

	// A response id only Redis could place is not a 404 while it is down.
	if resp, body := do(t, "GET", f.rep[1].url+"/v1/responses/resp_elsewhere", "", nil); resp.StatusCode != 503 ||
		!strings.Contains(string(body), "shared_state_unavailable") {
		t.Fatalf("GET /v1/responses/{id} with Redis down: %d %s", resp.StatusCode, body)
	}

	f.redis.Start()
	testwait.Until(t, "A replays its buffered lock", func() bool { return f.stores[0].Up() })
	testwait.Until(t, "B reconnects", func() bool { return f.stores[1].Up() })
	resp, body = do(t, "POST", f.rep[1].url+"/v1/chat/completions", turn, map[string]string{"X-Session-ID": "agent-d", "x-warmroute-complexity": "1"})
	if resp.StatusCode != 200 || resp.Header.Get("x-vsr-selected-model") != model || resp.Header.Get("x-vsr-session-action") != "hard_lock" {
		t.Fatalf("after recovery: %d %s %s (want %s hard_lock): %s", resp.StatusCode,
			resp.Header.Get("x-vsr-selected-model"), resp.Header.Get("x-vsr-session-action"), model, body)
	}
}

// TestLockWriteLatency measures what the synchronous lock write adds to a
// streamed response that issues one tool call (docs/design.md §8.3): the
// mean time the relay waited for Redis (vllm_router_lock_write_wait_seconds)
// and the mean end-to-end time against a router without a shared store,
// for a tool call and [DONE] in one chunk (nothing to overlap with) and for
// a tool call followed by four chunks 5 ms apart.
//
//	WARMROUTE_LOCKLAT=1 go test -run TestLockWriteLatency -v ./fastproxy/
func TestLockWriteLatency(t *testing.T) {
	if os.Getenv("WARMROUTE_LOCKLAT") == "" {
		t.Skip("set WARMROUTE_LOCKLAT=1 to measure")
	}
	call := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_lat","type":"function","function":{"name":"lookup","arguments":""}}]}}]}` + "\n\n")
	arg := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}` + "\n\n")
	done := []byte("data: [DONE]\n\n")
	const n = 200
	body := `{"model":"auto","stream":true,` + tools + `,"messages":[{"role":"user","content":"find my booking"}]}`
	for _, c := range []struct {
		name   string
		chunks [][]byte
		gap    time.Duration
	}{{"one_chunk", [][]byte{append(append([]byte{}, call...), done...)}, 0}, {"five_chunks_5ms", [][]byte{call, arg, arg, arg, done}, 5 * time.Millisecond}} {
		up := startEcho(t, nil, c.chunks, c.gap)
		stop := make(chan struct{})
		t.Cleanup(func() { close(stop) })
		go func() { // the double records every request; 600 of them here
			for {
				select {
				case <-up.got:
				case <-up.gotHdr:
				case <-stop:
					return
				}
			}
		}()
		shared := startReplicas(t, up.url)
		run := func(url string) time.Duration {
			t0 := time.Now()
			for i := 0; i < n; i++ {
				resp, b := do(t, "POST", url+"/v1/chat/completions", body, map[string]string{"X-Session-ID": "lat-" + strconv.Itoa(i%16)})
				if resp.StatusCode != 200 || !strings.Contains(string(b), "[DONE]") {
					t.Fatalf("%d %s", resp.StatusCode, b)
				}
			}
			return time.Since(t0) / n
		}
		localRouter := startRouter(t, nil, "cache_aware", func(fc *fastproxy.Config, _ *loadview.Config) {
			fc.Models = saar.NewRouter(shared.models[1].Config(), saar.Options{})
		})
		if _, err := localRouter.reg.Add(context.Background(), up.url, []string{"sim-small", "sim-medium", "sim-large"}); err != nil {
			t.Fatal(err)
		}
		run(localRouter.url) // warm-up
		base := run(localRouter.url)
		with := run(shared.rep[0].url)
		var sb strings.Builder
		shared.rep[0].srv.WriteMetrics(&sb)
		sum, cnt := 0.0, 0.0
		for _, line := range strings.Split(sb.String(), "\n") {
			if v, ok := strings.CutPrefix(line, "vllm_router_lock_write_wait_seconds_sum "); ok {
				sum, _ = strconv.ParseFloat(v, 64)
			}
			if v, ok := strings.CutPrefix(line, "vllm_router_lock_write_wait_seconds_count "); ok {
				cnt, _ = strconv.ParseFloat(v, 64)
			}
		}
		t.Logf("%s: %d responses: end to end %v without a shared store, %v with (+%v); relay waited %.3f ms per lock write (%v writes), lock writes %d",
			c.name, n, base, with, with-base, 1e3*sum/max(cnt, 1), cnt, lockWrites(t, shared.stores[0]))
	}
}

// A session placed through replica A, its next turn sent to replica B as
// soon as the client has read A's [DONE] (or A's whole non-streamed body):
// B finds the binding in Redis and sends the turn to the same worker as a
// session hit, because A forwarded the last byte only after the store's
// Flush acknowledged the binding (route.Choice.Published, docs/design.md
// §8.3). A backlog of other bindings ahead of it in A's write queue (a busy
// replica) keeps the binding out of Redis for longer than the exchange
// takes, so without the flush B misses it.
func TestReplicasBindingReadableAtDone(t *testing.T) {
	_, urls := startSims(t, 4, fastSim())
	r := redistest.Start(t, redistest.Options{})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var reps [2]*testRouter
	var stores [2]*sharedstate.Store
	for i := range reps {
		st, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: r.URL(), Logger: quiet,
			ReadTimeout: 2 * time.Second, AsyncTimeout: 5 * time.Second, PingTimeout: 2 * time.Second}) // -race on shared cores
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		stores[i] = st
		ca := route.DefaultCacheAwareConfig()
		ca.Shared = st
		reps[i] = startRouterCA(t, urls, "cache_aware", ca, func(c *fastproxy.Config, _ *loadview.Config) { c.Shared = st })
	}
	for i, stream := range []bool{true, false, true, false} {
		for j := 0; j < 8000; j++ { // the backlog
			stores[0].PublishBinding([]byte("m"), []byte("other-"+strconv.Itoa(i)+"-"+strconv.Itoa(j)), urls[j%len(urls)], time.Minute)
		}
		session := map[string]string{"X-Session-ID": "bind-" + strconv.Itoa(i)}
		next := func(h http.Header) {
			resp, body := do(t, "POST", reps[1].url+"/v1/chat/completions", chatBody("m", "and then?", false), session)
			if resp.StatusCode != 200 || resp.Header.Get("x-vllm-router-decision") != route.SessionIDMatch ||
				resp.Header.Get("x-vllm-router-worker") != h.Get("x-vllm-router-worker") {
				t.Fatalf("turn %d (stream %v) on B: %d %s on %s, want %s on %s: %s", i, stream, resp.StatusCode,
					resp.Header.Get("x-vllm-router-decision"), resp.Header.Get("x-vllm-router-worker"),
					route.SessionIDMatch, h.Get("x-vllm-router-worker"), body)
			}
		}
		if stream {
			streamUntil(t, reps[0].url+"/v1/chat/completions", chatBody("m", "hello", true), session, "[DONE]",
				func(h http.Header, _ string) { next(h) })
			continue
		}
		resp, body := do(t, "POST", reps[0].url+"/v1/chat/completions", chatBody("m", "hello", false), session)
		if resp.StatusCode != 200 {
			t.Fatalf("A: %d %s", resp.StatusCode, body)
		}
		next(resp.Header)
	}
}

// The model step's memory of a session is readable on replica B as soon as
// the client has read A's [DONE]: a tool result whose id no replica knows
// (a structural lock, docs/design.md §5) goes on B to the model A chose for
// the turn before, though that turn was a session hit that published no
// binding. A backlog ahead of the memory record in A's write queue keeps
// it out of Redis for longer than the exchange takes, so without the flush
// B reads the previous turn's record and locks to its model.
func TestReplicasMemoryReadableAtDone(t *testing.T) {
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"ok"}}]}` + "\n\ndata: [DONE]\n\n")
	up := startEcho(t, []byte(`{"id":"chatcmpl-2","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`), [][]byte{chunk}, 100*time.Millisecond)
	f := startReplicas(t, up.url)
	session := "mem-1"
	user := `{"role":"user","content":"find my booking"}`
	first := ""
	streamUntil(t, f.rep[0].url+"/v1/chat/completions", `{"model":"auto","stream":true,`+tools+`,"messages":[`+user+`]}`,
		map[string]string{"X-Session-ID": session, "x-warmroute-complexity": "0"}, "[DONE]", func(h http.Header, _ string) { first = h.Get("x-vsr-selected-model") })
	for j := 0; j < 8000; j++ { // the backlog
		f.stores[0].PublishBinding([]byte("m"), []byte("other-"+strconv.Itoa(j)), up.url, time.Minute)
	}
	second := `{"model":"auto","stream":true,` + tools + `,"messages":[` + user + `,{"role":"assistant","content":"ok"},{"role":"user","content":"prove the fare rule step by step"}]}`
	streamUntil(t, f.rep[0].url+"/v1/chat/completions", second, map[string]string{"X-Session-ID": session, "x-warmroute-complexity": "1"}, "[DONE]",
		func(h http.Header, _ string) {
			model := h.Get("x-vsr-selected-model")
			if model == first {
				t.Fatalf("the second turn stayed on %s: the test needs a switch", model)
			}
			resp, body := do(t, "POST", f.rep[1].url+"/v1/chat/completions", toolResultTurn(user, "call_nobody_issued", "found it"),
				map[string]string{"X-Session-ID": session, "x-warmroute-complexity": "0"})
			if resp.StatusCode != 200 || resp.Header.Get("x-vsr-selected-model") != model || resp.Header.Get("x-vsr-session-action") != "hard_lock" {
				t.Fatalf("tool result on B: %d %s %s, want %s hard_lock (the first turn's model: %s): %s", resp.StatusCode,
					resp.Header.Get("x-vsr-selected-model"), resp.Header.Get("x-vsr-session-action"), model, first, body)
			}
		})
}
