package simworker

import (
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
)

// pdText returns n prompt bytes without spaces or periods, so that no
// completions prompt built from it ends with filler tokens (a resume).
func pdText(n int) string { return strings.Repeat("0123456789abcdef", n/16+1)[:n] }

// pdPromptBytes is a prompt of 15 whole blocks (240 tokens at 16 tokens of
// 4 bytes): the chat and responses templates add 22 bytes to the content.
const pdPromptBytes = 15 * 64

// pdEndpoint is one endpoint's request, built for a prefill or a decode leg.
type pdEndpoint struct {
	name, path string
	body       func(stream bool, maxTokens int) msg
	id         func(answer map[string]any) string
}

var pdEndpoints = []pdEndpoint{
	{"chat", "/v1/chat/completions", func(stream bool, n int) msg {
		return msg{"messages": []any{user(pdText(pdPromptBytes - 22))}, "max_tokens": n, "max_completion_tokens": n, "stream": stream}
	}, func(a map[string]any) string { s, _ := a["id"].(string); return s }},
	{"completions", "/v1/completions", func(stream bool, n int) msg {
		return msg{"prompt": pdText(pdPromptBytes), "max_tokens": n, "stream": stream}
	}, func(a map[string]any) string { s, _ := a["id"].(string); return s }},
	{"responses", "/v1/responses", func(stream bool, n int) msg {
		return msg{"input": pdText(pdPromptBytes - 22), "max_output_tokens": n, "stream": stream}
	}, func(a map[string]any) string { s, _ := a["id"].(string); return s }},
}

// prefillLeg is what the proxy sends a prefill worker.
func prefillLeg(body msg) msg {
	body["kv_transfer_params"] = msg{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	return body
}

// prefill sends ep's prefill leg to url and returns the answer's
// kv_transfer_params (checked against w) and the answer.
func prefill(t *testing.T, w *Worker, url string, ep pdEndpoint, hdr ...string) (map[string]any, map[string]any) {
	t.Helper()
	code, b := post(t, url+ep.path, prefillLeg(ep.body(false, 1)), hdr...)
	if code != 200 {
		t.Fatalf("%s prefill: %d %s", ep.name, code, b)
	}
	a := decodeJSON(t, b)
	p, _ := a["kv_transfer_params"].(map[string]any)
	host, port, _ := net.SplitHostPort(strings.TrimPrefix(url, "http://"))
	ids, _ := p["remote_block_ids"].([]any)
	if p == nil || p["do_remote_prefill"] != true || p["do_remote_decode"] != false || p["remote_engine_id"] != w.EngineID() ||
		p["remote_host"] != host || strconv.Itoa(num(p["remote_port"])) != port || p["remote_request_id"] != ep.id(a) ||
		num(p["tp_size"]) != 1 || len(ids) != pdPromptBytes/64 {
		t.Fatalf("%s prefill answer's kv_transfer_params: %s", ep.name, b)
	}
	return p, a
}

// decode sends ep's decode leg (params from the prefill answer) to url and
// returns the answer's usage: prompt tokens and cached tokens.
func decode(t *testing.T, url string, ep pdEndpoint, params map[string]any, hdr ...string) (prompt, cached int) {
	t.Helper()
	body := ep.body(false, 4)
	body["kv_transfer_params"] = params
	code, b := post(t, url+ep.path, body, hdr...)
	if code != 200 {
		t.Fatalf("%s decode: %d %s", ep.name, code, b)
	}
	a := decodeJSON(t, b)
	if a["kv_transfer_params"] != nil {
		t.Fatalf("%s decode answer carries kv_transfer_params: %s", ep.name, b)
	}
	if ep.name == "responses" {
		return num(path(a, "usage", "input_tokens")), num(path(a, "usage", "input_tokens_details", "cached_tokens"))
	}
	if num(path(a, "usage", "completion_tokens")) != 4 {
		t.Fatalf("%s decode: %s", ep.name, b)
	}
	return num(path(a, "usage", "prompt_tokens")), num(path(a, "usage", "prompt_tokens_details", "cached_tokens"))
}

func TestPDPrefillHoldsDecodePulls(t *testing.T) {
	for _, ep := range pdEndpoints {
		t.Run(ep.name, func(t *testing.T) {
			p, purl := startWorker(t, Config{TimeScale: 0.01})
			d, durl := startWorker(t, Config{TimeScale: 0.01})
			params, a := prefill(t, p, purl, ep)
			if ep.name != "responses" && path(a, "choices", 0, "finish_reason") != "length" {
				t.Fatalf("prefill answer: %v", a)
			}
			// The prompt's 15 blocks stay held: not evictable, counted in the
			// KV usage, until the decode worker pulls them.
			if st := p.Stats(); st.KVHeldBlocks != 15 || st.CacheBlocksHeld != 15 {
				t.Fatalf("prefill worker holds %d blocks for transfer, %d in all: want 15", st.KVHeldBlocks, st.CacheBlocksHeld)
			}
			p.ResetCache()
			if st := p.Stats(); st.CacheBlocksUsed != 15 {
				t.Fatalf("a cache reset left %d blocks, want the 15 held", st.CacheBlocksUsed)
			}

			prompt, cached := decode(t, durl, ep, params)
			if prompt != 240 || cached != 240 {
				t.Fatalf("decode usage: %d prompt, %d cached tokens: want 240 and 240 (all transferred)", prompt, cached)
			}
			if st := p.Stats(); st.KVHeldBlocks != 0 || st.CacheBlocksHeld != 0 || st.CacheBlocksUsed != 15 {
				t.Fatalf("prefill worker after the pull: %+v: want the blocks freed, still cached", st)
			}
			st := d.Stats()
			if st.KVTransferredTokens != 240 || st.KVFailedTransfers != 0 || st.PrefixHits != 0 || st.PromptTokens != 240 {
				t.Fatalf("decode worker: %+v", st)
			}
			_, text := get(t, "GET", durl+"/metrics")
			src := `vllm:prompt_tokens_by_source_total{model_name="sim-model",source=`
			if metricValue(t, text, src+`"external_kv_transfer"}`) != 240 || metricValue(t, text, src+`"local_compute"}`) != 0 ||
				metricValue(t, text, src+`"local_cache_hit"}`) != 0 || metricValue(t, text, `vllm:nixl_num_failed_transfers_total`) != 0 {
				t.Fatalf("decode worker metrics:\n%s", text)
			}
			// The transferred blocks entered the decode worker's own cache.
			prompt, cached = decode(t, durl, ep, nil)
			if prompt != 240 || cached != 240 {
				t.Fatalf("repeat on the decode worker: %d prompt, %d cached tokens: want all cached", prompt, cached)
			}

			// A second pull of the same params fails: the worker recomputes
			// the prompt (cold: nothing cached) and counts the failure.
			d2, d2url := startWorker(t, Config{TimeScale: 0.01})
			if _, cached := decode(t, d2url, ep, params); cached != 0 {
				t.Fatalf("decode with pulled params: %d cached tokens, want 0 (recomputed)", cached)
			}
			if st := d2.Stats(); st.KVFailedTransfers != 1 || st.KVTransferredTokens != 0 {
				t.Fatalf("decode worker after a stale pull: %+v", st)
			}
			_, text = get(t, "GET", d2url+"/metrics")
			if v := metricValue(t, text, `vllm:nixl_num_failed_transfers_total{model_name="sim-model"}`); v != 1 {
				t.Fatalf("vllm:nixl_num_failed_transfers_total = %v, want 1", v)
			}
		})
	}
}

func TestPDStreamedDecode(t *testing.T) {
	p, purl := startWorker(t, Config{TimeScale: 0.01})
	d, durl := startWorker(t, Config{TimeScale: 0.01})
	ep := pdEndpoints[0]
	params, _ := prefill(t, p, purl, ep)
	body := ep.body(true, 5)
	body["kv_transfer_params"] = params
	body["stream_options"] = msg{"include_usage": true}
	resp, err := send(durl+ep.path, body)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readSSE(resp, time.Now())
	if err != nil || !done(evs) || len(evs) != 5+3 {
		t.Fatalf("stream: %d events, err %v: %v", len(evs), err, evs)
	}
	u := decodeJSON(t, []byte(evs[len(evs)-2].data))
	if num(path(u, "usage", "prompt_tokens_details", "cached_tokens")) != 240 || d.Stats().KVTransferredTokens != 240 || p.Stats().KVHeldBlocks != 0 {
		t.Fatalf("usage chunk %s; decode %+v", evs[len(evs)-2].data, d.Stats())
	}
}

func TestPDWarmDecodeTransfersOnlyMissing(t *testing.T) {
	p, purl := startWorker(t, Config{TimeScale: 0.01})
	d, durl := startWorker(t, Config{TimeScale: 0.01})
	ep := pdEndpoints[1] // completions: the prompt is the text
	// The decode worker caches the prompt's first 5 blocks.
	if code, b := post(t, durl+ep.path, msg{"prompt": pdText(5 * 64), "max_tokens": 1}); code != 200 {
		t.Fatalf("warm-up: %d %s", code, b)
	}
	base := d.Stats()
	params, _ := prefill(t, p, purl, ep)
	if _, cached := decode(t, durl, ep, params); cached != 240 {
		t.Fatalf("decode: %d cached tokens, want 240 (80 local + 160 transferred)", cached)
	}
	st := d.Stats()
	if hits, xfer := st.PrefixHits-base.PrefixHits, st.KVTransferredTokens; hits != 80 || xfer != 160 {
		t.Fatalf("decode: %d tokens hit locally, %d transferred: want 80 and 160", hits, xfer)
	}
	if p.Stats().KVHeldBlocks != 0 {
		t.Fatal("the prefill worker still holds the blocks")
	}

	// All blocks local: the pull only frees the prefill's hold.
	params, _ = prefill(t, p, purl, ep)
	if _, cached := decode(t, durl, ep, params); cached != 240 || d.Stats().KVTransferredTokens != 160 || p.Stats().KVHeldBlocks != 0 {
		t.Fatalf("decode with everything cached: %d cached tokens, %+v", cached, d.Stats())
	}

	// Both legs on one worker (kv_both): the blocks are local.
	params, _ = prefill(t, d, durl, ep)
	if _, cached := decode(t, durl, ep, params); cached != 240 || d.Stats().KVHeldBlocks != 0 || d.Stats().KVFailedTransfers != 0 {
		t.Fatalf("both legs on one worker: %d cached tokens, %+v", cached, d.Stats())
	}
}

func TestPDHoldExpires(t *testing.T) {
	p, purl := startWorker(t, Config{TimeScale: 0.01, KVHoldTimeout: 50 * time.Millisecond})
	d, durl := startWorker(t, Config{TimeScale: 0.01})
	ep := pdEndpoints[0]
	params, _ := prefill(t, p, purl, ep)
	testwait.Until(t, "the hold to expire", func() bool { return p.Stats().KVHeldBlocks == 0 })
	if st := p.Stats(); st.KVExpiredHolds != 1 || st.CacheBlocksHeld != 0 || st.CacheBlocksUsed != 15 {
		t.Fatalf("prefill worker after the timeout: %+v", st)
	}
	_, text := get(t, "GET", purl+"/metrics")
	if v := metricValue(t, text, `vllm:nixl_num_kv_expired_reqs_total{model_name="sim-model"}`); v != 1 {
		t.Fatalf("vllm:nixl_num_kv_expired_reqs_total = %v", v)
	}
	if _, cached := decode(t, durl, ep, params); cached != 0 || d.Stats().KVFailedTransfers != 1 {
		t.Fatalf("decode of expired params: %d cached tokens, %+v", cached, d.Stats())
	}

	// Sleeping discards the KV cache, holds included.
	p2, p2url := startWorker(t, Config{TimeScale: 0.01})
	prefill(t, p2, p2url, ep)
	if code, _ := post(t, p2url+"/sleep", nil); code != 200 || p2.Stats().KVHeldBlocks != 0 {
		t.Fatalf("sleep: %d, %+v", code, p2.Stats())
	}
}

func TestPDStaleParamsRecompute(t *testing.T) {
	p, purl := startWorker(t, Config{TimeScale: 0.01})
	d, durl := startWorker(t, Config{TimeScale: 0.01})
	ep := pdEndpoints[0]
	params, _ := prefill(t, p, purl, ep)

	// Another engine's id: nothing pulled, the hold stays.
	wrong := map[string]any{}
	for k, v := range params {
		wrong[k] = v
	}
	wrong["remote_engine_id"] = "sim-other"
	if _, cached := decode(t, durl, ep, wrong); cached != 0 || p.Stats().KVHeldBlocks != 15 {
		t.Fatalf("wrong engine id: %d cached, prefill %+v", cached, p.Stats())
	}
	// The prefill worker gone: a cold decode worker recomputes.
	p.Close()
	d2, d2url := startWorker(t, Config{TimeScale: 0.01})
	if _, cached := decode(t, d2url, ep, params); cached != 0 {
		t.Fatalf("dead prefill worker: %d cached tokens", cached)
	}
	if st, st2 := d.Stats(), d2.Stats(); st.KVFailedTransfers != 1 || st2.KVFailedTransfers != 1 || st.KVTransferredTokens+st2.KVTransferredTokens != 0 {
		t.Fatalf("decode workers: %+v, %+v", st, st2)
	}
	// Params that name no blocks (a prompt shorter than a block) are no
	// transfer: the prompt prefills here, no failure counted.
	if _, cached := decode(t, durl, ep, map[string]any{"do_remote_prefill": true, "remote_block_ids": []any{}}); cached != 240 ||
		d.Stats().KVFailedTransfers != 1 {
		t.Fatalf("no blocks: %d cached tokens, %+v", cached, d.Stats())
	}
}

func TestPDWholeRequestsUnchanged(t *testing.T) {
	w, url := startWorker(t, Config{TimeScale: 0.01})
	for _, ep := range pdEndpoints {
		// No params, a streamed prefill leg, or one without a completion
		// limit: served whole, nothing held, no params answered.
		for i, body := range []msg{ep.body(false, 1), prefillLeg(ep.body(false, 0))} {
			if i == 1 {
				delete(body, "max_tokens")
				delete(body, "max_completion_tokens")
				delete(body, "max_output_tokens")
			}
			code, b := post(t, url+ep.path, body)
			if code != 200 || strings.Contains(string(b), "kv_transfer_params") {
				t.Fatalf("%s whole request %d: %d %s", ep.name, i, code, b)
			}
		}
		resp, err := send(url+ep.path, prefillLeg(ep.body(true, 1)))
		if err != nil {
			t.Fatal(err)
		}
		evs, err := readSSE(resp, time.Now())
		if err != nil || len(evs) == 0 {
			t.Fatalf("%s streamed prefill leg: %v %v", ep.name, evs, err)
		}
		for _, e := range evs {
			if strings.Contains(e.data, "kv_transfer_params") {
				t.Fatalf("%s streamed prefill leg: %s", ep.name, e.data)
			}
		}
	}
	if st := w.Stats(); st.KVHeldBlocks != 0 || st.CacheBlocksHeld != 0 {
		t.Fatalf("%+v", st)
	}
	// The legacy model serves both legs whole.
	l, lurl := startWorker(t, Config{TimeScale: 0.01, LatencyModel: LatencyLegacy})
	code, b := post(t, lurl+pdEndpoints[0].path, prefillLeg(pdEndpoints[0].body(false, 1)))
	if code != 200 || strings.Contains(string(b), "kv_transfer_params") || l.Stats().KVHeldBlocks != 0 {
		t.Fatalf("legacy prefill leg: %d %s", code, b)
	}
}

func TestPDFaults(t *testing.T) {
	p, purl := startWorker(t, Config{TimeScale: 0.01})
	d, durl := startWorker(t, Config{TimeScale: 0.01})
	ep := pdEndpoints[0]
	// Prefill leg: an error or a dropped connection holds nothing.
	if code, _ := post(t, purl+ep.path, prefillLeg(ep.body(false, 1)), FaultHeader, "error"); code != 500 {
		t.Fatalf("error fault: %d", code)
	}
	if _, err := send(purl+ep.path, prefillLeg(ep.body(false, 1)), FaultHeader, "drop"); err == nil {
		t.Fatal("drop fault: an answer")
	}
	if p.Stats().KVHeldBlocks != 0 {
		t.Fatalf("faulted prefill legs hold blocks: %+v", p.Stats())
	}
	// A slow prefill leg holds as usual.
	params, _ := prefill(t, p, purl, ep, FaultHeader, "slow=5")

	// Decode leg: an error answers before the pull (the hold stays); a
	// stream cut after 2 chunks comes after it.
	body := ep.body(false, 4)
	body["kv_transfer_params"] = params
	if code, _ := post(t, durl+ep.path, body, FaultHeader, "error"); code != 500 || p.Stats().KVHeldBlocks != 15 {
		t.Fatalf("decode error fault: %d, prefill %+v", code, p.Stats())
	}
	body["stream"] = true
	resp, err := send(durl+ep.path, body, FaultHeader, "cut=2")
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := readSSE(resp, time.Now()); !errors.Is(err, io.ErrUnexpectedEOF) || len(evs) != 2 {
		t.Fatalf("decode cut=2: %d events, %v", len(evs), err)
	}
	if d.Stats().KVTransferredTokens != 240 || p.Stats().KVHeldBlocks != 0 {
		t.Fatalf("decode cut=2: decode %+v, prefill %+v", d.Stats(), p.Stats())
	}

	// Config.DefaultFaults on a decode worker.
	d2, d2url := startWorker(t, Config{TimeScale: 0.01, DefaultFaults: "cut=1"})
	params, _ = prefill(t, p, purl, ep)
	body["kv_transfer_params"] = params
	resp, err = send(d2url+ep.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if evs, err := readSSE(resp, time.Now()); !errors.Is(err, io.ErrUnexpectedEOF) || len(evs) != 1 || d2.Stats().KVTransferredTokens != 240 {
		t.Fatalf("default cut=1: %d events, %v, %+v", len(evs), err, d2.Stats())
	}
}

// The transfer costs KVTransferLatency + KVTransferPerToken × tokens,
// scaled, instead of the prefill; a failed pull costs the prefill.
func TestPDTransferTime(t *testing.T) {
	// 960 tokens (60 blocks). On the decode workers the prefill costs
	// 960 × 20 ms = 19.2 s, the transfer 500 ms + 960 × 1 ms = 1.46 s, both
	// scaled by 0.05: 960 ms and 73 ms (no step or decode cost).
	const transfer, prefillCost = 73 * time.Millisecond, 960 * time.Millisecond
	cfg := Config{TimeScale: 0.05, PerToken: 20 * time.Millisecond, KVTransferLatency: 500 * time.Millisecond,
		KVTransferPerToken: time.Millisecond, StepBase: -1, DecodePerSeq: -1}
	p, purl := startWorker(t, Config{TimeScale: 0.01})
	d, durl := startWorker(t, cfg)
	d2, d2url := startWorker(t, cfg)
	ep := pdEndpoint{"completions", "/v1/completions", func(stream bool, n int) msg {
		return msg{"prompt": pdText(960 * 4), "max_tokens": n, "stream": stream}
	}, nil}
	code, out := post(t, purl+ep.path, prefillLeg(ep.body(false, 1)))
	params, _ := decodeJSON(t, out)["kv_transfer_params"].(map[string]any)
	if code != 200 || p.Stats().KVHeldBlocks != 60 {
		t.Fatalf("prefill: %d %s", code, out)
	}
	timed := func(url string) (time.Duration, int) {
		t.Helper()
		start := time.Now()
		_, cached := decode(t, url, ep, params)
		return time.Since(start), cached
	}
	took, cached := timed(durl)
	if cached != 960 || d.Stats().KVTransferredTokens != 960 {
		t.Fatalf("decode: %d cached, %+v", cached, d.Stats())
	}
	if took < transfer || took >= prefillCost/2 {
		t.Fatalf("decode with the transfer took %v: want at least %v, well under the prefill's %v", took, transfer, prefillCost)
	}
	// The same params again: the pull fails, the prompt prefills.
	took, cached = timed(d2url)
	if cached != 0 || d2.Stats().KVFailedTransfers != 1 || took < prefillCost {
		t.Fatalf("recompute took %v, %d cached: want at least %v", took, cached, prefillCost)
	}
}
