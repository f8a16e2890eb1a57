package fastproxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/reqview"
)

func decodeJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}

// The prefill leg is the client's request made prefill-only, as vLLM's
// disaggregated proxy makes it; the decode leg is the client's request
// with the prefill answer's params in place of any the client sent.
func TestLegBodies(t *testing.T) {
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":300,"temperature":0.5,"kv_transfer_params":{"remote_host":"evil"}}`)
	p, err := prefillBody(nil, chat, reqview.Chat)
	if err != nil {
		t.Fatal(err)
	}
	m := decodeJSON(t, p)
	kv, _ := m["kv_transfer_params"].(map[string]any)
	if m["max_tokens"] != 1.0 || m["max_completion_tokens"] != 1.0 || m["stream"] != false || m["stream_options"] != nil ||
		m["temperature"] != 0.5 || kv["do_remote_decode"] != true || kv["do_remote_prefill"] != false || kv["remote_host"] != nil {
		t.Fatalf("chat prefill leg: %s", p)
	}
	if _, ok := m["stream_options"]; ok {
		t.Fatalf("stream_options kept: %s", p)
	}

	resp, err := prefillBody(nil, []byte(`{"model":"m","input":"hi","max_output_tokens":50,"stream":true}`), reqview.Responses)
	if err != nil {
		t.Fatal(err)
	}
	if m := decodeJSON(t, resp); m["max_output_tokens"] != 1.0 || m["max_tokens"] != nil || m["stream"] != false {
		t.Fatalf("responses prefill leg: %s", resp)
	}
	comp, _ := prefillBody(nil, []byte(`{"model":"m","prompt":"hi"}`), reqview.Completions)
	if m := decodeJSON(t, comp); m["max_tokens"] != 1.0 || m["max_completion_tokens"] != nil {
		t.Fatalf("completions prefill leg: %s", comp)
	}

	answer := []byte(`{"id":"x","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"e1","remote_block_ids":[1,2],"remote_host":"10.0.0.1","remote_port":5600}}`)
	params := transferParams(answer)
	d, err := decodeBody(nil, chat, params)
	if err != nil {
		t.Fatal(err)
	}
	m = decodeJSON(t, d)
	kv, _ = m["kv_transfer_params"].(map[string]any)
	if kv["remote_host"] != "10.0.0.1" || kv["remote_engine_id"] != "e1" || m["stream"] != true || m["max_completion_tokens"] != 300.0 {
		t.Fatalf("decode leg: %s", d)
	}
	if transferParams([]byte(`{"id":"x"}`)) != nil || transferParams([]byte(`{"kv_transfer_params":null}`)) != nil ||
		transferParams([]byte(`not json`)) != nil {
		t.Fatal("params found where there are none")
	}
	w, _ := withoutTransferParams(chat)
	if _, ok := decodeJSON(t, w)["kv_transfer_params"]; ok {
		t.Fatalf("client params kept: %s", w)
	}
	escaped := []byte(`{"model":"m","kv\u005ftransfer_params":{"remote_host":"evil"},"prompt":"caf\u00e9"}`)
	if w, _ := withoutTransferParams(escaped); bytes.Contains(w, []byte("evil")) || !json.Valid(w) {
		t.Fatalf("an escaped key kept: %s", w)
	}
	for _, bad := range []string{`[1]`, `"s"`, `{`} {
		if _, err := prefillBody(nil, []byte(bad), reqview.Chat); err == nil {
			t.Errorf("prefillBody(%s) accepted", bad)
		}
	}
}

func FuzzLegBodies(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[],"stream":true}`), []byte(`{"kv_transfer_params":{"a":1}}`))
	f.Add([]byte(`{"max_completion_tokens":3,"kv_transfer_params":5}`), []byte(`{}`))
	f.Fuzz(func(t *testing.T, body, answer []byte) {
		// Any bytes: no panic. A valid body (the view validated it): valid legs.
		valid := json.Valid(body)
		p, err := prefillBody(nil, body, reqview.Chat)
		if valid && err == nil && !json.Valid(p) {
			t.Fatalf("prefill leg of %q is not JSON: %q", body, p)
		}
		if params := transferParams(answer); params != nil {
			if !json.Valid(params) {
				t.Fatalf("params %q of %q are not JSON", params, answer)
			}
			if d, err := decodeBody(nil, body, params); valid && err == nil && !json.Valid(d) {
				t.Fatalf("decode leg of %q, %q is not JSON: %q", body, params, d)
			}
		}
	})
}

// BenchmarkLegBodies is the router's own work on a disaggregated request's
// bodies: the prefill leg's, the prefill answer's params, the decode leg's,
// for a long agent history.
func BenchmarkLegBodies(b *testing.B) {
	for _, size := range []int{1 << 10, 16 << 10, 64 << 10} {
		body := []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"` +
			strings.Repeat("x", size) + `"}],"max_tokens":256}`)
		answer := []byte(`{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"a"}}],"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e","remote_block_ids":[1,2,3,4,5,6,7,8],"remote_host":"10.0.0.1","remote_port":5600,"tp_size":1}}`)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var p, d []byte
			for i := 0; i < b.N; i++ {
				var err error
				if p, err = prefillBody(p[:0], body, reqview.Chat); err != nil {
					b.Fatal(err)
				}
				if d, err = decodeBody(d[:0], body, transferParams(answer)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
