package fastproxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

// pdRouter is a router in PD mode (docs/design.md §9, "Disaggregated
// fleets") over loopback, in front of prefill and decode workers.
type pdRouter struct {
	*testRouter
	decode route.Policy
}

func startPD(t *testing.T, prefill, decode []string, prefillPolicy, decodePolicy string, mod func(*fastproxy.Config, *loadview.Config)) *pdRouter {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	lc := loadview.Config{HealthTimeout: time.Second, Logger: quiet}
	fc := fastproxy.Config{RetryMaxRetries: 3, RetryBackoff: time.Millisecond, RequestTimeout: 10 * time.Second, Logger: quiet}
	if mod != nil {
		mod(&fc, &lc)
	}
	tr := &testRouter{reg: loadview.NewRegistry(lc)}
	var err error
	if tr.policy, err = route.New(prefillPolicy, tr.reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()}); err != nil {
		t.Fatal(err)
	}
	dp, err := route.New(decodePolicy, tr.reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()})
	if err != nil {
		t.Fatal(err)
	}
	add := func(urls []string, role loadview.Role) {
		for _, u := range urls {
			if _, err := tr.reg.AddRole(context.Background(), u, nil, role); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(prefill, loadview.Prefill)
	add(decode, loadview.Decode)
	fc.Registry, fc.Policy = tr.reg, tr.policy
	if fc.PD == nil {
		fc.PD = &fastproxy.PDConfig{}
	}
	fc.PD.DecodePolicy = dp
	tr.serve(t, fc)
	return &pdRouter{testRouter: tr, decode: dp}
}

// faultySims starts n fast simulated workers injecting faults into every
// request (simworker.Config.DefaultFaults).
func faultySims(t *testing.T, n int, faults string) ([]*simworker.Worker, []string) {
	c := fastSim()
	c.DefaultFaults = faults
	return startSims(t, n, c)
}

// longText is a prompt of many full KV blocks (the simulated worker holds
// and transfers whole blocks only).
func longText(seed string) string {
	return strings.Repeat(seed+" reads the logs and plans the next step of the task. ", 24)
}

func sumStats(ws []*simworker.Worker, f func(simworker.Stats) uint64) uint64 {
	var n uint64
	for _, w := range ws {
		n += f(w.Stats())
	}
	return n
}

func transferred(s simworker.Stats) uint64 { return s.KVTransferredTokens }
func requests(s simworker.Stats) uint64    { return s.Requests }

// heldNone waits until no prefill worker holds blocks for a decode leg:
// every prefill was pulled.
func heldNone(t *testing.T, ps []*simworker.Worker) {
	t.Helper()
	testwait.Until(t, "every held block pulled", func() bool {
		for _, w := range ps {
			if w.Stats().KVHeldBlocks != 0 {
				return false
			}
		}
		return true
	}, nil)
}

// Chat, completions and responses, streamed and not, go through 2 prefill
// and 2 decode workers in two legs: the decode worker pulls the prompt's
// blocks from the prefill worker the response names, the answer is whole,
// and nothing is recomputed.
func TestPDLegsOnEveryRoute(t *testing.T) {
	ps, pu := startSims(t, 2, fastSim())
	ds, du := startSims(t, 2, fastSim())
	tr := startPD(t, pu, du, "cache_aware", "cache_aware", nil)
	cases := []struct{ path, body, end string }{
		{"/v1/chat/completions", chatBody("m", longText("chat"), false), `"finish_reason"`},
		{"/v1/chat/completions", chatBody("m", longText("chat-stream"), true), "[DONE]"},
		{"/v1/completions", `{"model":"m","prompt":"` + longText("completion") + `","max_tokens":8}`, `"text"`},
		{"/v1/completions", `{"model":"m","prompt":"` + longText("completion-stream") + `","stream":true}`, "[DONE]"},
		{"/v1/responses", `{"model":"m","input":"` + longText("responses") + `"}`, `"output"`},
		{"/v1/responses", `{"model":"m","input":"` + longText("responses-stream") + `","stream":true}`, "response.completed"},
	}
	for i, c := range cases {
		before := sumStats(ds, transferred)
		resp, body := do(t, "POST", tr.url+c.path, c.body, map[string]string{"X-Session-ID": "s" + string(rune('a'+i))})
		if resp.StatusCode != 200 || !bytes.Contains(body, []byte(c.end)) {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, body)
		}
		p, d := resp.Header.Get("X-Vllm-Router-Prefill-Worker"), resp.Header.Get("X-Vllm-Router-Decode-Worker")
		if !slices.Contains(pu, p) || !slices.Contains(du, d) || resp.Header.Get("X-Vllm-Router-Worker") != p ||
			resp.Header.Get("X-Vllm-Router-Decode-Decision") == "" {
			t.Fatalf("%s: prefill %q decode %q headers %v", c.path, p, d, resp.Header)
		}
		if bytes.Contains(body, []byte("kv_transfer_params")) && !strings.Contains(c.path, "responses") {
			t.Errorf("%s: the client sees kv_transfer_params: %s", c.path, body)
		}
		if got := sumStats(ds, transferred); got <= before {
			t.Errorf("%s: the decode worker pulled nothing (%d → %d tokens)", c.path, before, got)
		}
	}
	heldNone(t, ps)
	if n := sumStats(ds, func(s simworker.Stats) uint64 { return s.KVFailedTransfers }); n != 0 {
		t.Errorf("%d decode legs recomputed", n)
	}
	if got := tr.counter(`vllm_router_pd_requests_total{outcome="decoded"}`); got != uint64(len(cases)) {
		t.Errorf("decoded %d, want %d", got, len(cases))
	}
	waitIdle(t, tr.reg)
}

// The prefill choice is the cache-aware worker step: a session's next turn
// goes to the prefill worker that holds its history, which answers it
// from its cache, and the prefill leg taught the policy (its cached tokens).
func TestPDPrefillSideIsCacheAware(t *testing.T) {
	ps, pu := startSims(t, 2, fastSim())
	_, du := startSims(t, 2, fastSim())
	tr := startPD(t, pu, du, "cache_aware", "cache_aware", nil)
	history := longText("first turn")
	resp, _ := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", history, false), nil)
	first := resp.Header.Get("X-Vllm-Router-Prefill-Worker")
	hitsBefore := sumStats(ps, func(s simworker.Stats) uint64 { return s.PrefixHits })
	next := `{"model":"m","messages":[{"role":"user","content":"` + history + `"},{"role":"assistant","content":"ok"},{"role":"user","content":"go on"}]}`
	resp, body := do(t, "POST", tr.url+"/v1/chat/completions", next, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Vllm-Router-Prefill-Worker") != first {
		t.Fatalf("second turn: %d on %q, first on %q: %s", resp.StatusCode, resp.Header.Get("X-Vllm-Router-Prefill-Worker"), first, body)
	}
	if hits := sumStats(ps, func(s simworker.Stats) uint64 { return s.PrefixHits }) - hitsBefore; hits < 200 {
		t.Errorf("the second prefill found %d tokens cached", hits)
	}
}

// A prefill worker that fails the request is the prefill worker's
// failure: another prefill worker serves it, then a decode worker.
func TestPDPrefillFailsOver(t *testing.T) {
	badW, badU := faultySims(t, 1, "error")
	_, goodU := startSims(t, 1, fastSim())
	ds, du := startSims(t, 1, fastSim())
	tr := startPD(t, []string{badU[0], goodU[0]}, du, "round_robin", "round_robin", nil)
	for i := 0; i < 3; i++ {
		resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", longText("x"), false), nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-Vllm-Router-Prefill-Worker") != goodU[0] {
			t.Fatalf("%d via %q: %s", resp.StatusCode, resp.Header.Get("X-Vllm-Router-Prefill-Worker"), body)
		}
	}
	if badW[0].Stats().Errors == 0 || ds[0].Stats().KVTransferredTokens == 0 {
		t.Fatalf("the failing prefill worker was never tried (%+v) or nothing was pulled", badW[0].Stats())
	}
}

// A decode leg that fails before its first byte goes to another decode
// worker with the same kv_transfer_params while the prefill worker holds
// the blocks: one prefill per request, and the second decode worker pulls.
func TestPDDecodeRetriesWithTheSameParams(t *testing.T) {
	ps, pu := startSims(t, 1, fastSim())
	badW, badU := faultySims(t, 1, "error")
	goodW, goodU := startSims(t, 1, fastSim())
	tr := startPD(t, pu, []string{badU[0], goodU[0]}, "round_robin", "round_robin", nil)
	const n = 4
	for i := 0; i < n; i++ {
		resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", longText("y"), true), nil)
		if resp.StatusCode != 200 || !bytes.Contains(body, []byte("[DONE]")) || resp.Header.Get("X-Vllm-Router-Decode-Worker") != goodU[0] {
			t.Fatalf("%d via %q: %s", resp.StatusCode, resp.Header.Get("X-Vllm-Router-Decode-Worker"), body)
		}
	}
	if got := ps[0].Stats().Requests; got != n {
		t.Errorf("%d prefill legs for %d requests: a failed decode leg was prefilled again", got, n)
	}
	retries := tr.counter("vllm_router_pd_decode_retries_total")
	if retries == 0 || retries != badW[0].Stats().Errors {
		t.Errorf("decode retries %d, failed decode legs %d", retries, badW[0].Stats().Errors)
	}
	if goodW[0].Stats().KVFailedTransfers != 0 {
		t.Error("the second decode worker could not pull the blocks")
	}
	heldNone(t, ps)
	waitIdle(t, tr.reg)
}

// Past the hold the prefill worker may have freed the blocks: a failed
// decode leg is not sent again with the same params, the request is
// prefilled again on another entry worker.
func TestPDPrefillsAgainPastTheHold(t *testing.T) {
	ps, pu := startSims(t, 2, fastSim())
	badW, badU := faultySims(t, 1, "error")
	_, goodU := startSims(t, 1, fastSim())
	tr := startPD(t, pu, []string{badU[0], goodU[0]}, "round_robin", "round_robin", func(c *fastproxy.Config, _ *loadview.Config) {
		c.PD = &fastproxy.PDConfig{KVHold: time.Nanosecond}
	})
	const n = 4
	for i := 0; i < n; i++ {
		resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", longText("z"), false), nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%d: %s", resp.StatusCode, body)
		}
	}
	failedLegs := badW[0].Stats().Errors
	if failedLegs == 0 {
		t.Fatal("the failing decode worker was never chosen")
	}
	if got := sumStats(ps, requests); got != n+failedLegs {
		t.Errorf("%d prefill legs for %d requests and %d failed decode legs", got, n, failedLegs)
	}
	if r, f := tr.counter("vllm_router_pd_decode_retries_total"), tr.counter(`vllm_router_pd_requests_total{outcome="failed"}`); r != 0 || f != failedLegs {
		t.Errorf("retries with the same params %d (want 0), exchanges failed %d (want %d)", r, f, failedLegs)
	}
}

// When no decode worker is left to try, the prefill worker, whose cache
// holds the prompt, serves the request whole: decode workers that died
// before the router noticed, or that all push back. Two decode workers
// failing it with the same status is the request's fault.
func TestPDNoDecodeWorkerLeft(t *testing.T) {
	ps, pu := startSims(t, 1, fastSim())
	ds, du := startSims(t, 2, fastSim())
	tr := startPD(t, pu, du, "round_robin", "round_robin", nil)
	for _, d := range ds {
		d.Close() // dead, still healthy in the registry
	}
	for i, stream := range []bool{false, true} {
		resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", longText("dead"), stream), nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-Vllm-Router-Worker") != pu[0] || resp.Header.Get("X-Vllm-Router-Decode-Worker") != "" {
			t.Fatalf("decode workers dead: %d %v %s", resp.StatusCode, resp.Header, body)
		}
		if got := tr.counter(`vllm_router_pd_requests_total{outcome="whole"}`); got != uint64(i+1) {
			t.Fatalf("whole %d, want %d", got, i+1)
		}
	}
	if got := ps[0].Stats().Requests; got != 4 {
		t.Errorf("the prefill worker served %d requests, want 2 prefill legs and 2 whole", got)
	}

	_, bu := faultySims(t, 2, "unavailable")
	tr = startPD(t, pu, bu, "round_robin", "round_robin", nil)
	if resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", longText("busy"), false), nil); resp.StatusCode != 200 ||
		resp.Header.Get("X-Vllm-Router-Decode-Worker") != "" {
		t.Fatalf("every decode worker busy: %d %s", resp.StatusCode, body)
	}

	_, eu := faultySims(t, 2, "error")
	tr = startPD(t, pu, eu, "round_robin", "round_robin", nil)
	resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", longText("q"), false), nil)
	if resp.StatusCode != 500 || !bytes.Contains(body, []byte("request_failed_upstream")) {
		t.Fatalf("two decode workers, one status: %d %s", resp.StatusCode, body)
	}
	waitIdle(t, tr.reg)
}

// With no healthy decode worker the prefill worker serves the request
// whole; the prefill worker's own error for the request reaches the
// client; embeddings go whole to a prefill worker.
func TestPDWholeRequests(t *testing.T) {
	small := fastSim()
	small.MaxModelLen = 64
	ps, pu := startSims(t, 1, small)
	tr := startPD(t, pu, []string{deadURL(t)}, "round_robin", "round_robin", nil)
	resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Vllm-Router-Decode-Worker") != "" || ps[0].Stats().KVHeldBlocks != 0 {
		t.Fatalf("no decode worker: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if tr.counter(`vllm_router_pd_requests_total{outcome="whole"}`) != 1 {
		t.Error("the whole request was not counted")
	}

	_, du := startSims(t, 1, fastSim())
	tr = startPD(t, pu, du, "round_robin", "round_robin", nil)
	resp, body = do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", longText("too long"), false), nil)
	if resp.StatusCode != 400 || resp.Header.Get("X-Vllm-Router-Prefill-Worker") != pu[0] || resp.Header.Get("X-Vllm-Router-Decode-Worker") != "" {
		t.Fatalf("a prompt over the context: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if tr.counter(`vllm_router_pd_requests_total{outcome="prefill_error"}`) != 1 {
		t.Error("the prefill error was not counted")
	}
	resp, body = do(t, "POST", tr.url+"/v1/embeddings", `{"model":"m","input":"hi"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Vllm-Router-Worker") != pu[0] || resp.Header.Get("X-Vllm-Router-Decode-Worker") != "" {
		t.Fatalf("embeddings: %d %v %s", resp.StatusCode, resp.Header, body)
	}
}

// A client's own kv_transfer_params never reaches a worker: a decode
// worker told to pull from elsewhere would recompute (or worse, connect
// where the client says).
func TestPDClientTransferParamsRemoved(t *testing.T) {
	ps, pu := startSims(t, 1, fastSim())
	ds, du := startSims(t, 1, fastSim())
	tr := startPD(t, pu, du, "round_robin", "round_robin", nil)
	evil := `"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"x","remote_block_ids":[1],"remote_host":"127.0.0.1","remote_port":1,"remote_request_id":"x"}`
	body := `{"model":"m",` + evil + `,"messages":[{"role":"user","content":"` + longText("evil") + `"}]}`
	resp, out := do(t, "POST", tr.url+"/v1/chat/completions", body, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	// Sent whole (no decode worker is healthy), with the key escaped as a
	// JSON parser reads it the same.
	escaped := strings.Replace(evil, "kv_transfer_params", `kv\u005ftransfer_params`, 1)
	whole := startPD(t, pu, []string{deadURL(t)}, "round_robin", "round_robin", nil)
	resp, out = do(t, "POST", whole.url+"/v1/chat/completions", `{"model":"m",`+escaped+`,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 200 || ps[0].Stats().KVFailedTransfers != 0 {
		t.Fatalf("whole, escaped key: %d %s; the prefill worker tried to pull %d times", resp.StatusCode, out, ps[0].Stats().KVFailedTransfers)
	}
	if st := ds[0].Stats(); st.KVFailedTransfers != 0 || st.KVTransferredTokens == 0 {
		t.Fatalf("the client's params reached the decode worker: %+v", st)
	}
}

// A decode worker whose pull finds the blocks gone recomputes them, and
// the router counts it from the worker's vllm:nixl_num_failed_transfers.
func TestPDRecomputeIsCounted(t *testing.T) {
	quick := fastSim()
	quick.KVHoldTimeout = time.Nanosecond // freed before any decode leg pulls
	_, pu := startSims(t, 1, quick)
	ds, du := startSims(t, 1, fastSim())
	tr := startPD(t, pu, du, "round_robin", "round_robin", func(_ *fastproxy.Config, l *loadview.Config) {
		l.LoadScrapeInterval = time.Hour // the metrics carry the scraped series; the test scrapes itself
	})
	testwait.Until(t, "a decode leg recomputed", func() bool {
		resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", longText("gone"), false), nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		return ds[0].Stats().KVFailedTransfers > 0
	}, nil)
	tr.reg.ScrapeLoadOnce(context.Background())
	d := tr.reg.ByURL(du[0])
	if got, want := d.KVLoadFailures(), ds[0].Stats().KVFailedTransfers; got != want {
		t.Fatalf("the router counts %d failed KV loads, the worker %d", got, want)
	}
	admin := tr.adminURL(t)
	_, m := do(t, "GET", admin+"/metrics", "", nil)
	if !bytes.Contains(m, []byte(`vllm_router_worker_kv_load_failures_total{worker="`+du[0]+`"}`)) {
		t.Fatalf("metrics lack the failed KV loads:\n%s", m)
	}
}

// A decode stream its worker cuts after the first byte is continued as
// any stream: the client sees one whole answer, the continuation going
// whole (without the stale params) to the entry side, which holds the
// prefix.
func TestPDCutDecodeStreamContinues(t *testing.T) {
	ps, pu := startSims(t, 1, fastSim())
	ds, du := faultySims(t, 1, "cut=3")
	tr := startPD(t, pu, du, "round_robin", "round_robin", nil)
	whole := chatBody("m", longText("cut"), true)
	texts, _ := streamTexts(t, "/v1/chat/completions", whole, tr.url)
	_, ref := startSims(t, 1, fastSim())
	want, _ := streamTexts(t, "/v1/chat/completions", whole, ref[0])
	if len(texts) != 1 || len(want) != 1 || texts[0] != want[0] {
		t.Fatalf("continued answer %q, uninterrupted %q", texts, want)
	}
	if tr.counter(`vllm_router_stream_resumes_total{outcome="resumed"}`) != 1 || ds[0].Stats().KVTransferredTokens == 0 {
		t.Fatal("the cut decode stream was not continued")
	}
	if st := ps[0].Stats(); st.Requests != 2 || st.KVExpiredHolds != 0 {
		t.Fatalf("the prefill worker served %d requests (the prefill leg and the continuation): %+v", st.Requests, st)
	}
	waitIdle(t, tr.reg)
}

// A prefill worker whose answer carries no kv_transfer_params (an engine
// without the connector, llm-d-inference-sim's /v1/responses): the decode
// leg goes with empty params, and the decode worker prefills on its own.
func TestPDPrefillAnswerWithoutParams(t *testing.T) {
	sim := simworker.New(fastSim())
	t.Cleanup(func() { sim.Close() })
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		sim.Handler(ctx)
		var m map[string]any
		if json.Unmarshal(ctx.Response.Body(), &m) == nil && m["kv_transfer_params"] != nil {
			delete(m, "kv_transfer_params")
			b, _ := json.Marshal(m)
			ctx.Response.SetBody(b)
		}
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)                     //nolint:errcheck
	t.Cleanup(func() { srv.Shutdown() }) //nolint:errcheck
	ds, du := startSims(t, 1, fastSim())
	tr := startPD(t, []string{"http://" + ln.Addr().String()}, du, "round_robin", "round_robin", nil)
	resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", longText("no params"), false), nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Vllm-Router-Decode-Worker") != du[0] {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if st := ds[0].Stats(); st.KVTransferredTokens != 0 || st.KVFailedTransfers != 0 || st.PrefixQueries == 0 {
		t.Fatalf("the decode worker should have prefilled on its own: %+v", st)
	}
}
