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
		if s := e.topValue(it.name()); s != nil { // a value kept whole
			*s = take(&it, valueSpan(p, v))
			continue
		}
		switch string(it.name()) {
		case "type":
			e.Type = take(&it, strSpan(p, v))
			continue
		case "usage":
			if isByte(p, v, '{') {
				e.Usage = take(&it, valueSpan(p, v))
				continue
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
		pass(&it)
	}
	return it.i >= 0 && e.bad == 0
}

// topValue is where the event keeps the value of its top-level key, nil
// for a key whose value it reads otherwise or not at all.
func (e *StreamEvent) topValue(key []byte) *Span {
	switch string(key) {
	case "id":
		return &e.ID
	case "created":
		return &e.Created
	case "model":
		return &e.Model
	case "system_fingerprint":
		return &e.Fingerprint
	case "index":
		return &e.Index
	}
	return nil
}

// valueSpan is the span of the value at i.
func valueSpan(p []byte, i int) Span {
	if isByte(p, i, '"') {
		return quoted(strSpan(p, i))
	}
	end := skipValue(p, i, 0)
	if end < 0 {
		return Span{}
	}
	return Span{i, end}
}

// quoted widens a string's content span to its quotes.
func quoted(s Span) Span {
	if !s.Has() {
		return s
	}
	return Span{s.Start - 1, s.End + 1}
}

// strSpan is the span of the content of the string at i (its escapes not
// validated: the router forwards it as it is).
func strSpan(p []byte, i int) Span {
	if !isByte(p, i, '"') {
		return Span{}
	}
	e := plainEnd8(p, i+1)
	if e < 0 {
		e = plainEnd(p, plainFrom(p, i+1))
	}
	if e >= len(p) || p[e] != '"' { // an escape, a control byte or the end
		if e = contentEnd(p, i+1); e < 0 {
			return Span{}
		}
	}
	return Span{i + 1, e}
}

// pass moves the walk past the current value, a string the fast way.
func pass(it *objIter) {
	if isByte(it.b, it.val, '"') {
		take(it, strSpan(it.b, it.val))
		return
	}
	it.skip()
}

// take moves the walk past the value at s (the span of a value, or of a
// string's content) and returns s; a value it could not delimit ends the
// walk as malformed.
func take(it *objIter, s Span) Span {
	switch {
	case !s.Has():
		it.skip()
	case isByte(it.b, s.End, '"'):
		it.i = s.End + 1
	default:
		it.i = s.End
	}
	return s
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
				if !isByte(p, v, '0') || isByte(p, v+1, '.') || isByte(p, v+1, 'e') {
					e.Opaque = true
				}
			case "text":
				if t := strSpan(p, v); first {
					e.Text = take(&c, t)
					continue
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
			pass(&c)
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
					s := take(&d, quoted(strSpan(p, v)))
					e.Role = Span{k, max(s.End, v)}
					continue
				}
			}
		case "content":
			if first {
				e.Text = take(&d, strSpan(p, v))
				continue
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
		pass(&d)
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
			if s := take(&b, strSpan(p, v)); string(p[s.Start:s.End]) != typ {
				e.Opaque = true
			}
			continue
		case "text":
			e.Text = take(&b, strSpan(p, v))
			continue
		case "stop_reason":
			if !isByte(p, v, 'n') {
				e.Finished = true
			}
		}
		pass(&b)
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
		pass(&m)
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
		pass(&it)
	}
	return input, output
}

// UsageCached reads the cached prompt tokens of the event's usage object
// (OpenAI's prompt_tokens_details.cached_tokens, as vLLM reports them) in
// p; -1 when absent.
func (e *StreamEvent) UsageCached(p []byte) int {
	cached := -1
	if !e.Usage.Has() {
		return cached
	}
	var it objIter
	it.init(p, e.Usage.Start, &e.bad, 0)
	for it.next() {
		if string(it.name()) == "prompt_tokens_details" && isByte(p, it.val, '{') {
			var d objIter
			d.init(p, it.val, &e.bad, 0)
			for d.next() {
				if n, ok := parseUint(p, d.val); ok && string(d.name()) == "cached_tokens" {
					cached = n
				}
				pass(&d)
			}
			it.i = d.i
			continue
		}
		pass(&it)
	}
	return cached
}

// TokenText recognizes the shape nearly every event of a streamed answer
// has — one token of text and nothing else — and returns the span of that
// text (raw string content) without walking the event:
//
//	{…,"choices":[{"index":0,"delta":{"content":"…"},"logprobs":null,"finish_reason":null}]}
//	{…,"choices":[{"index":0,"text":"…","logprobs":null,"finish_reason":null,"stop_reason":null}]}
//	{"type":"content_block_delta","index":N,"delta":{"type":"text_delta","text":"…"}}
//
// (null members after the text in any order). ok is false for anything
// else, which ScanStreamEvent then reads. A chunk's members before
// "choices" (id, created, model, …) are not read, a usage among them
// neither (engines send it after the choices, which the shape excludes).
func TokenText(p []byte) (text Span, ok bool) {
	var i, end int
	if !isByte(p, 0, '{') {
		return Span{}, false
	}
	// The choices' '[' is the first of an OpenAI chunk (found with one
	// vector scan); a '[' before it, in a string, leaves the event to the walk.
	const choices = `"choices":[`
	if k := bytes.IndexByte(p, '['); k >= len(choices)-1 && string(p[k-len(choices)+1:k+1]) == choices && member(p, k-len(choices)+1) {
		rest := p[k+1:]
		switch {
		case bytes.HasPrefix(rest, []byte(`{"index":0,"delta":{"content":"`)):
			i = k + 1 + len(`{"index":0,"delta":{"content":"`)
			if text = strSpan(p, i-1); !text.Has() || !isByte(p, text.End+1, '}') {
				return Span{}, false
			}
			end = text.End + 2
		case bytes.HasPrefix(rest, []byte(`{"index":0,"text":"`)):
			i = k + 1 + len(`{"index":0,"text":"`)
			if text = strSpan(p, i-1); !text.Has() {
				return Span{}, false
			}
			end = text.End + 1
		default:
			return Span{}, false
		}
	} else if bytes.HasPrefix(p, []byte(`{"type":"content_block_delta","index":`)) {
		i = len(`{"type":"content_block_delta","index":`)
		i = digits(p, i)
		if !bytes.HasPrefix(p[i:], []byte(`,"delta":{"type":"text_delta","text":"`)) {
			return Span{}, false
		}
		i += len(`,"delta":{"type":"text_delta","text":"`)
		if text = strSpan(p, i-1); !text.Has() || string(p[text.End:]) != `"}}` {
			return Span{}, false
		}
		return text, true
	} else {
		return Span{}, false
	}
	// The choice's other members, null each, then the chunk's end.
	for {
		switch {
		case string(p[end:]) == "}]}":
			return text, true
		case bytes.HasPrefix(p[end:], []byte(`,"logprobs":null`)):
			end += len(`,"logprobs":null`)
		case bytes.HasPrefix(p[end:], []byte(`,"finish_reason":null`)):
			end += len(`,"finish_reason":null`)
		case bytes.HasPrefix(p[end:], []byte(`,"stop_reason":null`)):
			end += len(`,"stop_reason":null`)
		case bytes.HasPrefix(p[end:], []byte(`,"token_ids":null`)):
			end += len(`,"token_ids":null`)
		default:
			return Span{}, false
		}
	}
}

// member reports whether the key at i is a member of the chunk itself:
// after its '{' or a ','. (A usage object before the choices, which no
// engine sends, is not read: only the walk reads usage.)
func member(p []byte, i int) bool {
	return i == 1 || p[i-1] == ','
}
