package resume

import (
	"errors"
	"strconv"

	"github.com/bytedance/sonic/ast"
)

// errNot is why a request's answer cannot be continued, whatever was delivered.
type errNot string

func (e errNot) Error() string { return string(e) }

// Body returns the request that continues the answer a follows: original,
// the request the first attempt sent, with the text delivered so far
// (docs/design.md §8.2):
//   - chat: one more assistant message holding it, continue_final_message
//     true and add_generation_prompt false (vLLM continues that message);
//     a request that already continued its final assistant message gets
//     the text appended to it;
//   - completions: the prompt followed by it;
//   - messages: a final assistant turn holding it (Anthropic continues it),
//     appended to the request's own final assistant turn if it has one.
//
// max_tokens and max_completion_tokens shrink by the tokens delivered;
// kv_transfer_params goes; everything else is kept. A request whose answer no continuation can
// reproduce (several choices, logprobs, a grammar or schema the output
// follows, a prompt of token ids) returns an error saying why.
func (a *Answer) Body(original []byte) ([]byte, error) {
	root, err := ast.NewSearcher(string(original)).GetByPath()
	if err != nil {
		return nil, errNot("the request is not JSON")
	}
	if err := constrained(&root); err != nil {
		return nil, err
	}
	text, tokens := a.Delivered()
	if err := shrink(&root, tokens); err != nil {
		return nil, err
	}
	// kv_transfer_params named KV blocks for the worker that was cut (a
	// disaggregated decode leg, docs/design.md §9): the continuation's
	// worker prefills on its own.
	if _, err := root.Unset("kv_transfer_params"); err != nil {
		return nil, err
	}
	switch a.api {
	case Completions:
		err = a.continuePrompt(&root, text)
	default:
		err = a.continueMessages(&root, text)
	}
	if err != nil {
		return nil, err
	}
	return root.MarshalJSON()
}

// constrained reports a request whose output no continuation reproduces.
func constrained(root *ast.Node) error {
	if n := root.Get("n"); n.Exists() {
		if v, err := n.Int64(); err != nil || v > 1 {
			return errNot("it asked for several choices (n)")
		}
	}
	for _, key := range [...]string{"logprobs", "top_logprobs", "echo"} {
		if v := root.Get(key); v.Exists() && v.TypeSafe() != ast.V_NULL && v.TypeSafe() != ast.V_FALSE {
			if i, err := v.Int64(); err != nil || i != 0 {
				return errNot("it asked for " + key)
			}
		}
	}
	for _, key := range [...]string{"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"} {
		if v := root.Get(key); v.Exists() && v.TypeSafe() != ast.V_NULL {
			return errNot("its output follows a constraint (" + key + ")")
		}
	}
	if rf := root.Get("response_format"); rf.Exists() && rf.TypeSafe() == ast.V_OBJECT {
		if t, _ := rf.Get("type").String(); t != "" && t != "text" {
			return errNot("its output follows a constraint (response_format)")
		}
	}
	return nil
}

// shrink lowers the request's output bounds by the tokens delivered.
func shrink(root *ast.Node, tokens int) error {
	for _, key := range [...]string{"max_tokens", "max_completion_tokens"} {
		v := root.Get(key)
		if !v.Exists() || v.TypeSafe() == ast.V_NULL {
			continue
		}
		n, err := v.Int64()
		if err != nil {
			return errNot("its " + key + " is not an integer")
		}
		left := n - int64(tokens)
		if left < 1 {
			return errNot("its " + key + " was reached")
		}
		if _, err := root.Set(key, ast.NewNumber(strconv.FormatInt(left, 10))); err != nil {
			return err
		}
	}
	return nil
}

// continuePrompt appends the delivered text to a completions prompt.
func (a *Answer) continuePrompt(root *ast.Node, text []byte) error {
	p := root.Get("prompt")
	if p.TypeSafe() == ast.V_ARRAY {
		if n, _ := length(p); n != 1 {
			return errNot("its prompt is not one text")
		}
		p = p.Index(0)
	}
	raw, err := p.Raw()
	if err != nil || p.TypeSafe() != ast.V_STRING {
		return errNot("its prompt is not one text")
	}
	return setRaw(p, raw[:len(raw)-1]+string(text)+`"`)
}

// continueMessages appends the delivered text to the final assistant
// message, or a new one.
func (a *Answer) continueMessages(root *ast.Node, text []byte) error {
	msgs := root.Get("messages")
	n, err := length(msgs)
	if err != nil || msgs.TypeSafe() != ast.V_ARRAY || n == 0 {
		return errNot("it has no messages")
	}
	last := msgs.Index(n - 1)
	role, _ := last.Get("role").String()
	continues := a.api == Messages
	if a.api == Chat {
		cf := root.Get("continue_final_message")
		continues = cf.Exists() && cf.TypeSafe() == ast.V_TRUE
		if _, err := root.Set("continue_final_message", ast.NewBool(true)); err != nil {
			return err
		}
		if _, err := root.Set("add_generation_prompt", ast.NewBool(false)); err != nil {
			return err
		}
	}
	if role == "assistant" && continues {
		return appendText(last, text)
	}
	return msgs.Add(ast.NewRaw(`{"role":"assistant","content":"` + string(text) + `"}`))
}

// appendText appends text to an assistant message's content: a string, or
// a list of parts whose last is text.
func appendText(msg *ast.Node, text []byte) error {
	c := msg.Get("content")
	if c.TypeSafe() == ast.V_ARRAY {
		n, _ := length(c)
		if n == 0 {
			return errNot("its final assistant message is empty")
		}
		part := c.Index(n - 1)
		if t, _ := part.Get("type").String(); t != "text" {
			return errNot("its final assistant message does not end with text")
		}
		c = part.Get("text")
	}
	raw, err := c.Raw()
	if err != nil || c.TypeSafe() != ast.V_STRING {
		return errNot("its final assistant message does not end with text")
	}
	return setRaw(c, raw[:len(raw)-1]+string(text)+`"`)
}

// length is the number of elements of a lazily parsed array.
func length(n *ast.Node) (int, error) {
	if err := n.Load(); err != nil {
		return 0, err
	}
	return n.Len()
}

// setRaw replaces the value n points at by the JSON raw.
func setRaw(n *ast.Node, raw string) error {
	if n == nil || !n.Exists() {
		return errors.New("resume: no value to set")
	}
	*n = ast.NewRaw(raw)
	return nil
}

// Not reports whether err says the request cannot be continued (rather than
// a failure to build it).
func Not(err error) bool {
	var e errNot
	return errors.As(err, &e)
}
