package fastproxy

import (
	"errors"

	"github.com/bytedance/sonic/ast"

	"github.com/warmroute/warmroute/reqview"
)

// The bodies of a disaggregated request's legs, as vLLM's disaggregated
// proxy builds them for its NIXL connector (docs/design.md §9).

// prefillParams asks a prefill worker to keep the prompt's KV blocks for a
// decode worker to pull.
const prefillParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

var errNotObject = errors.New("the request body is not a JSON object")

// prefillBody is the prefill leg of the request body: one output token
// (max_tokens, and max_completion_tokens when set; max_output_tokens on
// the Responses API), not streamed, no stream_options, and prefillParams
// as its kv_transfer_params; everything else as the client sent it.
func prefillBody(body []byte, kind reqview.Kind) ([]byte, error) {
	root, err := object(body)
	if err != nil {
		return nil, err
	}
	one := ast.NewNumber("1")
	limits := []string{"max_tokens"}
	if kind == reqview.Responses {
		limits[0] = "max_output_tokens"
	} else if root.Get("max_completion_tokens").Exists() {
		limits = append(limits, "max_completion_tokens")
	}
	for _, k := range limits {
		if _, err := root.Set(k, one); err != nil {
			return nil, err
		}
	}
	if _, err := root.Set("stream", ast.NewBool(false)); err != nil {
		return nil, err
	}
	if _, err := root.Unset("stream_options"); err != nil {
		return nil, err
	}
	if _, err := root.Set("kv_transfer_params", ast.NewRaw(prefillParams)); err != nil {
		return nil, err
	}
	return root.MarshalJSON()
}

// decodeBody is the decode leg of the request body: the client's request
// with params, the prefill answer's kv_transfer_params, in place of any
// the client sent.
func decodeBody(body, params []byte) ([]byte, error) {
	root, err := object(body)
	if err != nil {
		return nil, err
	}
	if _, err := root.Set("kv_transfer_params", ast.NewRaw(string(params))); err != nil {
		return nil, err
	}
	return root.MarshalJSON()
}

// withoutTransferParams is body without its kv_transfer_params.
func withoutTransferParams(body []byte) ([]byte, error) {
	root, err := object(body)
	if err != nil {
		return nil, err
	}
	if _, err := root.Unset("kv_transfer_params"); err != nil {
		return nil, err
	}
	return root.MarshalJSON()
}

// transferParams is the kv_transfer_params object of a prefill answer
// (aliasing it), or nil when it has none.
func transferParams(answer []byte) []byte {
	n, err := ast.NewSearcher(string(answer)).GetByPath("kv_transfer_params")
	if err != nil || n.TypeSafe() != ast.V_OBJECT {
		return nil
	}
	raw, err := n.Raw()
	if err != nil {
		return nil
	}
	return []byte(raw)
}

// object parses body, which must be a JSON object.
func object(body []byte) (*ast.Node, error) {
	root, err := ast.NewSearcher(string(body)).GetByPath()
	if err != nil || root.TypeSafe() != ast.V_OBJECT {
		return nil, errNotObject
	}
	return &root, nil
}
