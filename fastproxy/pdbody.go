package fastproxy

import (
	"encoding/json"
	"errors"
	"sync"

	"github.com/warmroute/warmroute/reqview"
)

// The bodies of a disaggregated request's legs, as vLLM's disaggregated
// proxy builds them for its NIXL connector (docs/design.md §9). Each is
// the client's body with some top-level members left out and the router's
// appended last: the engines' JSON parsers keep the last of duplicate
// keys, so even a key the client escaped differently cannot override ours.
// They are spliced from the body's bytes (reqview.Members), never parsed
// into a tree: a long agent history costs a copy.

// prefillParams asks a prefill worker to keep the prompt's KV blocks for a
// decode worker to pull.
const prefillParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

var errNotObject = errors.New("the request body is not a JSON object")

// prefillBody appends to dst the prefill leg of the request body: one
// output token (max_tokens, and max_completion_tokens when set;
// max_output_tokens on the Responses API), not streamed, no
// stream_options, and prefillParams as its kv_transfer_params; everything
// else as the client sent it.
func prefillBody(dst, body []byte, kind reqview.Kind) ([]byte, error) {
	completion := false // max_completion_tokens was set
	out, err := spliced(dst, body, func(key []byte) bool {
		switch string(key) {
		case "stream", "stream_options", "kv_transfer_params":
			return true
		case "max_completion_tokens":
			completion = kind != reqview.Responses
			return completion
		case "max_tokens":
			return kind != reqview.Responses
		case "max_output_tokens":
			return kind == reqview.Responses
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	if kind == reqview.Responses {
		out = append(out, `"max_output_tokens":1,`...)
	} else {
		out = append(out, `"max_tokens":1,`...)
		if completion {
			out = append(out, `"max_completion_tokens":1,`...)
		}
	}
	out = append(out, `"stream":false,"kv_transfer_params":`...)
	out = append(out, prefillParams...)
	return append(out, '}'), nil
}

// decodeBody appends to dst the decode leg of the request body: the
// client's request with params, the prefill answer's kv_transfer_params,
// in place of any the client sent.
func decodeBody(dst, body, params []byte) ([]byte, error) {
	out, err := spliced(dst, body, isTransferParams)
	if err != nil {
		return nil, err
	}
	out = append(out, `"kv_transfer_params":`...)
	out = append(out, params...)
	return append(out, '}'), nil
}

// withoutTransferParams is body without its kv_transfer_params, or body
// itself when it has none.
func withoutTransferParams(body []byte) ([]byte, error) {
	found := false
	if !reqview.Members(body, func(key []byte, _, _, _ int) bool {
		found = isTransferParams(key)
		return !found
	}) {
		return nil, errNotObject
	}
	if !found {
		return body, nil
	}
	out, err := spliced(nil, body, isTransferParams)
	if err != nil {
		return nil, err
	}
	if n := len(out); out[n-1] == ',' {
		out = out[:n-1]
	}
	return append(out, '}'), nil
}

// legBufs are the buffers the legs' bodies are built in: each goes back
// once its leg is sent (the decode leg's body is copied into the request).
var legBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxLegBuf bounds a buffer kept in legBufs.
const maxLegBuf = 1 << 20

func putLegBuf(b *[]byte) {
	if cap(*b) <= maxLegBuf {
		*b = (*b)[:0]
		legBufs.Put(b)
	}
}

func isTransferParams(key []byte) bool { return string(key) == "kv_transfer_params" }

// spliced appends to dst the object body without the members whose key
// drop selects: "{" and each kept member followed by a comma, for the
// caller to append its own members and the closing brace.
func spliced(dst, body []byte, drop func(key []byte) bool) ([]byte, error) {
	out := append(dst, '{')
	ok := reqview.Members(body, func(key []byte, from, _, end int) bool {
		if !drop(key) {
			out = append(out, body[from:end]...)
			out = append(out, ',')
		}
		return true
	})
	if !ok {
		return nil, errNotObject
	}
	return out, nil
}

// transferParams is the kv_transfer_params object of a prefill answer
// (aliasing it), or nil when it has none or it is not valid JSON: a
// worker's bytes go into the decode leg only checked.
func transferParams(answer []byte) []byte {
	var params []byte
	reqview.Members(answer, func(key []byte, _, start, end int) bool {
		if !isTransferParams(key) {
			return true
		}
		if answer[start] == '{' && json.Valid(answer[start:end]) {
			params = answer[start:end]
		}
		return false
	})
	return params
}
