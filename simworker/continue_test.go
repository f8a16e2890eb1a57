package simworker

import (
	"io"
	"strconv"
	"strings"
	"testing"
	"time"
)

// answer is a streamed answer as a client reads it.
type answer struct {
	chunks                     []string // the text of each content chunk
	finish                     string   // finish_reason, or the Anthropic stop_reason
	prompt, completion, cached int      // usage (prompt: all prompt tokens, cached ones included)
	done                       bool     // the terminator came: [DONE] or message_stop
	err                        error
}

func (a answer) text() string { return strings.Join(a.chunks, "") }

// streamAnswer posts req, streamed with usage, to path and reads the answer.
func streamAnswer(t *testing.T, url, path string, req msg, fault string) answer {
	t.Helper()
	req["stream"] = true
	if path != messagesPath {
		req["stream_options"] = msg{"include_usage": true}
	}
	var hdr []string
	if fault != "" {
		hdr = []string{FaultHeader, fault}
	}
	resp, err := send(url+path, req, hdr...)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("%s %v: status %d %s", path, req, resp.StatusCode, b)
	}
	evs, err := readSSE(resp, time.Now())
	a := answer{err: err}
	for _, e := range evs {
		if e.data == "[DONE]" {
			a.done = true
			continue
		}
		m := decodeJSON(t, []byte(e.data))
		switch path {
		case messagesPath:
			switch e.event {
			case "content_block_delta":
				a.chunks = append(a.chunks, path2s(m, "delta", "text"))
			case "message_delta":
				a.finish = path2s(m, "delta", "stop_reason")
				a.cached = num(pathOf(m, "usage", "cache_read_input_tokens"))
				a.prompt = num(pathOf(m, "usage", "input_tokens")) + a.cached
				a.completion = num(pathOf(m, "usage", "output_tokens"))
			case "message_stop":
				a.done = true
			}
		default:
			c := path2s(m, "choices", 0, "delta", "content")
			if path == "/v1/completions" {
				c = path2s(m, "choices", 0, "text")
			}
			if c != "" {
				a.chunks = append(a.chunks, c)
			}
			if f := path2s(m, "choices", 0, "finish_reason"); f != "" {
				a.finish = f
			}
			if u := pathOf(m, "usage"); u != nil {
				a.prompt, a.completion = num(pathOf(u, "prompt_tokens")), num(pathOf(u, "completion_tokens"))
				a.cached = num(pathOf(u, "prompt_tokens_details", "cached_tokens"))
			}
		}
	}
	return a
}

func pathOf(v any, p ...any) any { return path(v, p...) }

func path2s(v any, p ...any) string { s, _ := path(v, p...).(string); return s }

// continuation is one endpoint's way to ask for the rest of an answer.
type continuation struct {
	path string
	// request is the uninterrupted request (limit 0: none), or with
	// delivered != nil its continuation after those chunks, limit reduced
	// by their number.
	request func(limit int, delivered []string) msg
}

func continuations() []continuation {
	system := strings.Repeat("Answer briefly and cite sources. ", 6)
	limitKey := func(r msg, key string, limit int) msg {
		if limit > 0 {
			r[key] = limit
		}
		return r
	}
	return []continuation{
		{"/v1/chat/completions", func(limit int, delivered []string) msg {
			msgs := []any{msg{"role": "system", "content": system}, user("How do routers pick a worker?")}
			r := msg{"model": "sim-model"}
			if delivered != nil {
				limit -= len(delivered)
				var content any = strings.Join(delivered, "")
				if len(delivered)%2 == 1 { // a list of text parts, split at a token
					content = []any{msg{"type": "text", "text": delivered[0]}, msg{"type": "text", "text": strings.Join(delivered[1:], "")}}
				}
				msgs = append(msgs, msg{"role": "assistant", "content": content})
				r["continue_final_message"], r["add_generation_prompt"] = true, false
			}
			r["messages"] = msgs
			key := "max_tokens"
			if limit%2 == 0 {
				key = "max_completion_tokens"
			}
			return limitKey(r, key, limit)
		}},
		{"/v1/completions", func(limit int, delivered []string) msg {
			p := system + "Q: How do routers pick a worker?\nA:"
			if delivered != nil {
				limit -= len(delivered)
				p += strings.Join(delivered, "")
			}
			return limitKey(msg{"model": "sim-model", "prompt": p}, "max_tokens", limit)
		}},
		{messagesPath, func(limit int, delivered []string) msg {
			msgs := []any{user("How do routers pick a worker?")}
			if delivered != nil {
				limit -= len(delivered)
				var content any = strings.Join(delivered, "")
				if len(delivered)%2 == 1 {
					content = []any{msg{"type": "text", "text": delivered[0]}, msg{"type": "text", "text": strings.Join(delivered[1:], "")}}
				}
				msgs = append(msgs, msg{"role": "assistant", "content": content})
			}
			return msg{"model": "sim-model", "system": system, "messages": msgs, "max_tokens": limit}
		}},
	}
}

// TestContinuationReproducesTheAnswer: for every k, the first k chunks of
// an answer (a stream cut after k) followed by the continuation of a
// request that carries them give the uninterrupted answer: same text, same
// finish reason; the continuation's prompt counts k more tokens and its
// completion the n-k it generated.
func TestContinuationReproducesTheAnswer(t *testing.T) {
	const natural = 9 // Config.MaxTokens: the length without a limit
	for _, c := range continuations() {
		limits := []int{0, 6, 13}
		if c.path == messagesPath {
			limits = []int{6, 40} // max_tokens is required; 40 lets the answer end by itself
		}
		for _, limit := range limits {
			t.Run(c.path+"/limit="+strconv.Itoa(limit), func(t *testing.T) {
				_, url := startWorker(t, Config{MaxTokens: natural})
				full := streamAnswer(t, url, c.path, c.request(limit, nil), "")
				n, finish := natural, "stop"
				switch {
				case c.path == messagesPath && limit < natural:
					n, finish = limit, "max_tokens"
				case c.path == messagesPath:
					finish = "end_turn"
				case limit > 0:
					n, finish = limit, "length"
				}
				if len(full.chunks) != n || full.finish != finish || !full.done || full.err != nil || full.prompt == 0 || full.completion != n {
					t.Fatalf("uninterrupted: %+v, want %d chunks, finish %q", full, n, finish)
				}
				for k := 0; k <= n; k++ {
					if k == n && limit > 0 {
						break // a limit of 0 is not a request anyone sends
					}
					cut := streamAnswer(t, url, c.path, c.request(limit, nil), "cut="+strconv.Itoa(k))
					if len(cut.chunks) != k || cut.done {
						t.Fatalf("cut=%d: %d chunks, done %v", k, len(cut.chunks), cut.done)
					}
					if cut.chunks == nil {
						cut.chunks = []string{}
					}
					got := streamAnswer(t, url, c.path, c.request(limit, cut.chunks), "")
					if cut.text()+got.text() != full.text() {
						t.Fatalf("k=%d: %q + %q, want %q", k, cut.text(), got.text(), full.text())
					}
					if got.finish != full.finish || !got.done || got.err != nil {
						t.Fatalf("k=%d: finish %q done %v err %v, want %q", k, got.finish, got.done, got.err, full.finish)
					}
					if got.prompt != full.prompt+k || got.completion != n-k {
						t.Fatalf("k=%d: usage prompt %d completion %d, want %d and %d", k, got.prompt, got.completion, full.prompt+k, n-k)
					}
					if got.cached < 16 || got.cached > got.prompt {
						t.Fatalf("k=%d: cached %d of %d: the prompt's blocks before the answer were computed before", k, got.cached, got.prompt)
					}
				}
			})
		}
	}
}

// TestContinueFinalMessageRules: vLLM's 400s, the open final message in
// the prompt, and a final message that is no prefix of an answer, which
// the worker continues as any other (from the first output token).
func TestContinueFinalMessageRules(t *testing.T) {
	_, url := startWorker(t, Config{MaxTokens: 5})
	convo := []any{user("hi"), msg{"role": "assistant", "content": " The simulated"}}
	for _, c := range []struct {
		req  msg
		want string
	}{
		{msg{"messages": convo, "continue_final_message": true, "add_generation_prompt": true}, "Cannot set both"},
		{msg{"messages": convo, "continue_final_message": true}, "add_generation_prompt defaults to true"},
		{msg{"messages": []any{user("hi")}, "continue_final_message": true, "add_generation_prompt": false}, "final message to be an assistant message"},
	} {
		code, b := post(t, url+"/v1/chat/completions", c.req)
		if code != 400 || path2s(decodeJSON(t, b), "error", "type") != "BadRequestError" || !strings.Contains(string(b), c.want) {
			t.Fatalf("%v: %d %s, want 400 %q", c.req, code, b, c.want)
		}
	}

	chat := func(req msg) (text string, prompt int) {
		t.Helper()
		code, b := post(t, url+"/v1/chat/completions", req)
		m := decodeJSON(t, b)
		if code != 200 {
			t.Fatalf("%v: %d %s", req, code, b)
		}
		return path2s(m, "choices", 0, "message", "content"), num(path(m, "usage", "prompt_tokens"))
	}
	// add_generation_prompt false alone closes the last message, no new turn.
	_, closed := chat(msg{"messages": []any{user("hi")}, "add_generation_prompt": false})
	if want := (len("<|user|>hi\n") + 3) / 4; closed != want {
		t.Fatalf("add_generation_prompt false: prompt %d tokens, want %d", closed, want)
	}
	// Buffered: the continuation alone, its prompt the open message.
	text, prompt := chat(msg{"messages": convo, "continue_final_message": true, "add_generation_prompt": false})
	if base := (len("<|user|>hi\n<|assistant|>") + 3) / 4; text != fillerRun(2, 3) || prompt != base+2 {
		t.Fatalf("continued: %q, prompt %d; want %q, %d", text, prompt, fillerRun(2, 3), base+2)
	}
	// Not a prefix of the answer (other text, or a token cut in two): a
	// continuation like any other, counted by its characters.
	for _, prefill := range []string{"Sure,", " The simul", " simulated"} {
		text, prompt := chat(msg{"messages": []any{user("hi"), msg{"role": "assistant", "content": prefill}},
			"continue_final_message": true, "add_generation_prompt": false})
		if want := (len("<|user|>hi\n<|assistant|>"+prefill) + 3) / 4; text != fillerText(5) || prompt != want {
			t.Fatalf("prefill %q: %q, prompt %d; want %q, %d", prefill, text, prompt, fillerText(5), want)
		}
	}
}

// TestContinueWholeAnswer: a continuation after the whole answer (k = n,
// no limit) generates nothing and ends as the answer did, in both latency
// models.
func TestContinueWholeAnswer(t *testing.T) {
	for _, model := range []string{LatencyEngine, LatencyLegacy} {
		_, url := startWorker(t, Config{LatencyModel: model, MaxTokens: 4})
		req := msg{"messages": []any{user("hi"), msg{"role": "assistant", "content": fillerText(4)}},
			"continue_final_message": true, "add_generation_prompt": false}
		a := streamAnswer(t, url, "/v1/chat/completions", req, "")
		if len(a.chunks) != 0 || a.finish != "stop" || !a.done || a.completion != 0 {
			t.Fatalf("%s: %+v", model, a)
		}
	}
}

func TestFillerRuns(t *testing.T) {
	for k := range 40 {
		s := fillerText(k)
		if fillerLen(k) != len(s) || fillerPrefix([]byte(s)) != k || fillerSuffix([]byte("Q: "+s)) != k {
			t.Fatalf("k=%d: len %d prefix %d suffix %d", k, fillerLen(k), fillerPrefix([]byte(s)), fillerSuffix([]byte("Q: "+s)))
		}
		if k > 0 && fillerRun(k, 3) != fillerText(k + 3)[len(s):] {
			t.Fatalf("fillerRun(%d, 3) = %q", k, fillerRun(k, 3))
		}
	}
	for s, want := range map[string]int{"": 0, "Hello.": 0, "x The": 1, fillerText(17)[4:]: 0, fillerText(3) + "x": 0} {
		if got := fillerSuffix([]byte(s)); got != want {
			t.Fatalf("fillerSuffix(%q) = %d, want %d", s, got, want)
		}
	}
	if fillerPrefix([]byte(" The simul")) != -1 || fillerPrefix([]byte("x")) != -1 {
		t.Fatal("fillerPrefix matched a partial token")
	}
}
