package reqview

import "bytes"

// Span is where a value lies in a streamed event's payload p: p[Start:End].
// The zero Span is a value that is absent.
type Span struct{ Start, End int }

// Has reports whether the value is present.
func (s Span) Has() bool { return s.End > 0 }

// StreamEvent is what continuing a cut stream on another worker needs of
// one event's JSON payload (docs/design.md §8.2): the text it delivers,
// whether it delivers something a continuation cannot carry on, and the
// places a continuation's event has rewritten so that the client sees one
// answer. It indexes the payload it was scanned from.
type StreamEvent struct {
	Type Span // "type": an Anthropic event's type, string content

	// An OpenAI chunk (chat or completions).
	ID, Created, Model, Fingerprint Span // the top-level values, raw JSON
	Choices                         int  // elements of "choices"
	Role                            Span // choices[0].delta's "role" member, its key to its value's end

	// Both.
	Text     Span // the text delivered: choices[0].delta.content or choices[0].text, or an Anthropic delta's text; raw string content, escapes kept
	Usage    Span // the top-level "usage" object (an OpenAI chunk, an Anthropic message_delta), or message_start's message.usage
	Index    Span // an Anthropic event's content-block "index"
	Finished bool // a choice's finish_reason is set
	// Opaque: the event delivers what a continuation cannot carry on — a
	// tool call, reasoning, logprobs, a choice other than the first, an
	// Anthropic block or delta that is not text.
	Opaque bool

	bad int // where the walk met an invalid key (markBad)
}

// ScanStreamEvent fills e from the JSON payload p of one streamed event and
// reports whether p is a JSON object it could walk. It allocates nothing.
func ScanStreamEvent(e *StreamEvent, p []byte) bool {
	*e = StreamEvent{}
	var it objIter
	i := skipWS(p, 0)
	it.init(p, i, &e.bad, 0)
	for it.next() {
		v := it.val
		switch string(it.name()) {
		case "type":
			e.Type = strSpan(p, v)
		case "id":
			e.ID = valueSpan(p, v)
		case "created":
			e.Created = valueSpan(p, v)
		case "model":
			e.Model = valueSpan(p, v)
		case "system_fingerprint":
			e.Fingerprint = valueSpan(p, v)
		case "index":
			e.Index = valueSpan(p, v)
		case "usage":
			if isByte(p, v, '{') {
				e.Usage = valueSpan(p, v)
			}
		case "choices":
			if isByte(p, v, '[') {
				it.i = e.choices(p, v)
				continue
			}
		case "delta":
			if isByte(p, v, '{') {
				it.i = e.anthropicBlock(p, v, "text_delta")
				continue
			}
		case "content_block":
			if isByte(p, v, '{') {
				it.i = e.anthropicBlock(p, v, "text")
				continue
			}
		case "message":
			if isByte(p, v, '{') {
				it.i = e.message(p, v)
				continue
			}
		}
		it.skip()
	}
	return it.i >= 0 && e.bad == 0
}

// valueSpan is the span of the value at i.
func valueSpan(p []byte, i int) Span {
	end := skipValue(p, i, 0)
	if end < 0 {
		return Span{}
	}
	return Span{i, end}
}

// strSpan is the span of the content of the string at i.
func strSpan(p []byte, i int) Span {
	_, end, ok := strAt(p, i)
	if !ok {
		return Span{}
	}
	return Span{i + 1, end - 1}
}

// choices walks an OpenAI chunk's choices.
func (e *StreamEvent) choices(p []byte, i int) int {
	var a arrIter
	a.init(p, i, 1)
	for a.next() {
		e.Choices++
		if p[a.val] != '{' {
			a.skip()
			continue
		}
		first := e.Choices == 1
		var c objIter
		c.init(p, a.val, &e.bad, 2)
		for c.next() {
			v := c.val
			switch string(c.name()) {
			case "index":
				if !bytes.Equal(p[v:max(skipValue(p, v, 0), v)], []byte("0")) {
					e.Opaque = true
				}
			case "text":
				if first {
					e.Text = strSpan(p, v)
				}
			case "logprobs":
				if !isByte(p, v, 'n') {
					e.Opaque = true
				}
			case "finish_reason":
				if !isByte(p, v, 'n') {
					e.Finished = true
				}
			case "delta":
				if isByte(p, v, '{') {
					c.i = e.delta(p, v, first)
					continue
				}
			}
			c.skip()
		}
		a.i = c.i
	}
	if e.Choices > 1 {
		e.Opaque = true
	}
	return a.i
}

// delta walks a chat chunk's choices[].delta.
func (e *StreamEvent) delta(p []byte, i int, first bool) int {
	var d objIter
	d.init(p, i, &e.bad, 3)
	for d.next() {
		v := d.val
		switch string(d.name()) {
		case "role":
			if first {
				if k := bytes.LastIndex(p[:v], []byte(`"role"`)); k >= 0 {
					e.Role = Span{k, max(skipValue(p, v, 0), v)}
				}
			}
		case "content":
			if first {
				e.Text = strSpan(p, v)
			}
		case "tool_calls", "function_call":
			if !isByte(p, v, 'n') && !(isByte(p, v, '[') && isByte(p, skipWS(p, v+1), ']')) {
				e.Opaque = true // a call, not null or []
			}
		case "reasoning_content", "reasoning":
			if s := strSpan(p, v); s.End > s.Start {
				e.Opaque = true
			}
		}
		d.skip()
	}
	return d.i
}

// anthropicBlock walks an Anthropic delta or content block: text ones
// (typ) carry text, any other kind is opaque.
func (e *StreamEvent) anthropicBlock(p []byte, i int, typ string) int {
	var b objIter
	b.init(p, i, &e.bad, 2)
	for b.next() {
		v := b.val
		switch string(b.name()) {
		case "type":
			if s := strSpan(p, v); string(p[s.Start:s.End]) != typ {
				e.Opaque = true
			}
		case "text":
			e.Text = strSpan(p, v)
		case "stop_reason":
			if !isByte(p, v, 'n') {
				e.Finished = true
			}
		}
		b.skip()
	}
	return b.i
}

// message walks an Anthropic message_start's message for its usage.
func (e *StreamEvent) message(p []byte, i int) int {
	var m objIter
	m.init(p, i, &e.bad, 2)
	for m.next() {
		if string(m.name()) == "usage" && isByte(p, m.val, '{') {
			e.Usage = valueSpan(p, m.val)
		}
		m.skip()
	}
	return m.i
}

// UsageTokens reads the input and output token counts of the event's
// usage object (OpenAI's prompt_tokens and completion_tokens, Anthropic's
// input_tokens and output_tokens) in p, the payload it was scanned from; -1
// for a count that is absent.
func (e *StreamEvent) UsageTokens(p []byte) (input, output int) {
	input, output = -1, -1
	if !e.Usage.Has() {
		return input, output
	}
	var it objIter
	it.init(p, e.Usage.Start, &e.bad, 0)
	for it.next() {
		switch string(it.name()) {
		case "prompt_tokens", "input_tokens":
			if n, ok := parseUint(p, it.val); ok {
				input = n
			}
		case "completion_tokens", "output_tokens":
			if n, ok := parseUint(p, it.val); ok {
				output = n
			}
		}
		it.skip()
	}
	return input, output
}
