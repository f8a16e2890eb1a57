package reqview

import "bytes"

// Learned is what the router keeps from a response. It owns its bytes:
// ResponseID and ToolCallIDs point into Learned's own buffer and stay valid
// after the response body is released, until the next Reset. Reuse it
// (Reset keeps capacity); not safe for concurrent use.
type Learned struct {
	// ResponseID is the top-level "id" of the response (Responses API
	// "resp_...", chat completion "chatcmpl-..."), or the "id" of the
	// "response" object of a Responses streaming event. Raw (escaped). Not
	// the id of an Anthropic message ("msg_...": an object of "type"
	// "message", whole or in a message_start event), which locks nothing
	// (docs/design.md §5).
	ResponseID []byte
	// ToolCallIDs are the ids of the tool calls the response issued, in
	// order, without duplicates: chat choices[].message.tool_calls[].id and
	// choices[].delta.tool_calls[].id; Responses output items (and streamed
	// "item"s) of type function_call (or any "*_call" type): call_id;
	// Anthropic blocks of type tool_use: id, in the "content" of a message
	// (whole, or in a message_start event) and in the "content_block" of a
	// content_block_start event.
	ToolCallIDs [][]byte
	// ReasoningIDs are the ids of the opaque reasoning artifacts the
	// response carried (docs/design.md §5), in order, without duplicates,
	// at most MaxReasoningIDs (later ones are dropped): the
	// "encrypted_content" of Responses output items (and streamed "item"s);
	// the "signature" of Anthropic thinking blocks (whole, in a
	// content_block_start, or in a signature_delta event's "delta") and the
	// "data" of redacted_thinking blocks; the same blocks, and
	// reasoning.encrypted parts ("data"), in a chat choice's
	// "thinking_blocks" and "reasoning_details". Each is the id a request
	// echoing the artifact gets as View.ReasoningID.
	ReasoningIDs []ReasoningID
	// PromptTokens is usage.prompt_tokens or usage.input_tokens, plus
	// usage.cache_read_input_tokens and usage.cache_creation_input_tokens
	// (Anthropic, whose input_tokens counts only the uncached rest). Each
	// of the three keeps its last value when a later usage object (a
	// message_delta event) omits it.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens,
	// usage.input_tokens_details.cached_tokens or (Anthropic)
	// usage.cache_read_input_tokens; 0 when absent (see CachedKnown).
	CachedTokens int
	// CachedKnown: a cached_tokens count (a non-negative integer) was read
	// from usage.prompt_tokens_details, usage.input_tokens_details or
	// usage.cache_read_input_tokens, so a CachedTokens of 0 means "nothing
	// cached" rather than "not reported".
	// vLLM omits prompt_tokens_details unless started with
	// --enable-prompt-tokens-details. Reset clears it.
	CachedKnown bool
	// CompletionTokens is usage.completion_tokens or usage.output_tokens.
	CompletionTokens int
	// HasUsage: a "usage" object was seen (the token counts are meaningful).
	HasUsage bool

	buf []byte
	bad int // 1 + offset of the first invalid interpreted string byte, 0 none (markBad)

	input, cacheRead, cacheWrite int // the parts of PromptTokens
}

// Reset clears l, keeping the capacity of its buffers.
func (l *Learned) Reset() {
	ids := l.ToolCallIDs[:0]
	clear(ids[:cap(ids)])
	*l = Learned{ToolCallIDs: ids, ReasoningIDs: l.ReasoningIDs[:0], buf: l.buf[:0]}
}

// own copies s into l's buffer. When the buffer grows, slices handed out
// before keep pointing to the old array, whose bytes are never written again.
func (l *Learned) own(s []byte) []byte {
	n := len(l.buf)
	l.buf = append(l.buf, s...)
	return l.buf[n:len(l.buf):len(l.buf)]
}

func (l *Learned) setResponseID(s []byte) {
	if !bytes.Equal(s, l.ResponseID) || l.ResponseID == nil {
		l.ResponseID = l.own(s)
	}
}

func (l *Learned) addToolCallID(s []byte) {
	for _, id := range l.ToolCallIDs {
		if bytes.Equal(id, s) {
			return
		}
	}
	l.ToolCallIDs = append(l.ToolCallIDs, l.own(s))
}

// addReasoning adds the id of the artifact whose raw string content is raw
// (empty: none).
func (l *Learned) addReasoning(raw []byte) {
	if len(raw) == 0 || len(l.ReasoningIDs) >= MaxReasoningIDs {
		return
	}
	id := reasoningIDOf(raw)
	for _, x := range l.ReasoningIDs {
		if x == id {
			return
		}
	}
	l.ReasoningIDs = append(l.ReasoningIDs, id)
}

// ScanResponse learns from a complete non-streamed JSON response body (a chat
// completion, a completion, a Responses API response or an Anthropic
// message), adding to what l already holds. It returns an error wrapping ErrMalformed (a
// *MalformedError) when body is not a JSON object valid in the sense of Parse
// (see "Validation" in the package documentation: the keys, ids, call_ids
// and types read must be valid JSON string content, other strings are not
// checked); l then learns nothing from it. Its errors are Parse's: one
// pass validates the structure as it learns, and sonic's validator runs only
// to say where a broken body breaks (checkAgainstSonic compares them). 0
// allocations in steady state with a reused Learned.
func ScanResponse(l *Learned, body []byte) error {
	return l.scanWhole(body, (*Learned).scanResponse)
}

// scanWhole learns from body, a whole response, with scan (see learn).
func (l *Learned) scanWhole(body []byte, scan func(*Learned, []byte, int, int) int) error {
	start := skipWS(body, 0)
	if !isByte(body, start, '{') {
		return malformed(start)
	}
	if l.learn(body, start, scan) >= 0 {
		return nil
	}
	if l.bad != 0 {
		off := l.bad - 1
		l.bad = 0
		return malformed(off)
	}
	return structureError(body)
}

// ScanUsage is ScanResponse for a caller that needs only the token counts
// (PromptTokens, CachedTokens, CompletionTokens, HasUsage, CachedKnown): the
// body is validated as ScanResponse validates it, except that ids and types
// are not read, so not checked; only "usage" is read, where ScanResponse
// reads it (the body's object, or a "response" or "message" object in it).
// Nothing else is learned (no ResponseID, ToolCallIDs or ReasoningIDs).
func ScanUsage(l *Learned, body []byte) error {
	return l.scanWhole(body, (*Learned).scanTopUsage)
}

// scanTopUsage walks the object at i (nesting level d) for ScanUsage: its
// "usage" member is read, and, in the body's object, the usage of a
// "response" or "message" object, where scanResponse reads it too; every
// other value is skipped (and validated).
func (l *Learned) scanTopUsage(b []byte, i, d int) int {
	var it objIter
	it.init(b, i, &l.bad, d)
	for it.next() {
		end := 0
		switch string(it.name()) {
		case "usage":
			if b[it.val] == '{' {
				end = l.scanUsage(b, it.val, d+1)
			}
		case "response", "message":
			if d == 1 && b[it.val] == '{' {
				end = l.scanTopUsage(b, it.val, d+1)
			}
		}
		if end < 0 {
			return -1
		}
		if end == 0 {
			it.skip()
		} else {
			it.i = end
		}
	}
	return it.i
}

// learn scans the object at i with scan (scanResponse, or scanTopUsage),
// which must be the last value of b (only whitespace after it), and keeps
// what it learned only when the walk succeeded and every interpreted string
// (key, id, type) was valid; otherwise l is left as it was and learn returns
// -1 (l.bad then holds the offending offset plus one, or 0 when the
// structure is broken).
func (l *Learned) learn(b []byte, i int, scan func(*Learned, []byte, int, int) int) int {
	saved := *l
	l.bad = 0
	end := scan(l, b, i, 1)
	if end >= 0 && skipWS(b, end) < len(b) {
		end = -1 // bytes after the object
	}
	if end >= 0 && l.bad == 0 {
		return end
	}
	bad := l.bad
	if end < 0 {
		bad = 0 // the structure's fault comes first, as in Parse
	}
	clear(l.ToolCallIDs[len(saved.ToolCallIDs):])
	*l = saved // the bytes l.buf got past len(saved.buf) are referenced by nothing kept
	clear(l.ToolCallIDs[len(l.ToolCallIDs):cap(l.ToolCallIDs)])
	l.bad = bad
	return -1
}

// scanResponse walks a response object or a streaming event. Here and in
// the scan functions below, d is the nesting level of the container at i (1
// for the body's object) that bounds what skipValue accepts below it, as in
// Parse; d is 2 inside an event's "response" (Responses) or "message"
// (Anthropic message_start) object. The object's "id" is kept at its end,
// unless its "type" is "message" (an Anthropic message).
func (l *Learned) scanResponse(b []byte, i, d int) int {
	var id, typ []byte
	var it objIter
	it.init(b, i, &l.bad, d)
	for it.next() {
		j := it.val
		end := 0
		switch string(it.name()) {
		case "id":
			if s, e, ok := idAt(b, j, &l.bad); ok {
				id, end = s, e
			}
		case "type":
			if s, e, ok := idAt(b, j, &l.bad); ok {
				typ, end = s, e
			}
		case "content":
			if b[j] == '[' {
				var a arrIter
				a.init(b, j, d+1)
				for a.nextObject() {
					a.i = l.scanBlock(b, a.val, d+2)
				}
				end = a.i
			}
		case "content_block":
			if b[j] == '{' {
				end = l.scanBlock(b, j, d+1)
			}
		case "delta": // an Anthropic content_block_delta event's signature_delta
			if d == 1 && b[j] == '{' {
				end = l.scanBlock(b, j, d+1)
			}
		case "choices":
			end = l.scanChoices(b, j, d+1)
		case "output":
			if b[j] == '[' {
				var a arrIter
				a.init(b, j, d+1)
				for a.next() {
					if b[a.val] == '{' {
						a.i = l.scanItem(b, a.val, d+2)
					} else {
						a.skip()
					}
				}
				end = a.i
			}
		case "item":
			if b[j] == '{' {
				end = l.scanItem(b, j, d+1)
			}
		case "response", "message":
			if d == 1 && b[j] == '{' {
				end = l.scanResponse(b, j, d+1)
			}
		case "usage":
			if b[j] == '{' {
				end = l.scanUsage(b, j, d+1)
			}
		}
		if end < 0 {
			return -1
		}
		if end == 0 {
			it.skip()
		} else {
			it.i = end
		}
	}
	if id != nil && string(typ) != "message" {
		l.setResponseID(id)
	}
	return it.i
}

// scanBlock: an Anthropic content block (or a content_block_delta's
// delta, or a chat thinking_blocks / reasoning_details part); a tool_use
// block contributes its id, a thinking block (a signature_delta) its
// signature, a redacted_thinking block (a reasoning.encrypted part) its data.
func (l *Learned) scanBlock(b []byte, i, d int) int {
	f := l.fields(b, i, d, "id")
	switch string(f.typ) {
	case "tool_use":
		if f.val != nil {
			l.addToolCallID(f.val)
		}
	case "thinking", "signature_delta":
		l.addReasoning(f.sig)
	case "redacted_thinking", "reasoning.encrypted":
		l.addReasoning(f.data)
	}
	return f.end
}

// scanChoices: choices[].message.tool_calls[].id and choices[].delta.tool_calls[].id.
func (l *Learned) scanChoices(b []byte, i, d int) int {
	if b[i] != '[' {
		return 0
	}
	var a arrIter
	a.init(b, i, d)
	for a.nextObject() {
		var c objIter
		c.init(b, a.val, &l.bad, d+1)
		for c.next() {
			if k := string(c.name()); (k == "message" || k == "delta") && b[c.val] == '{' {
				var m objIter
				m.init(b, c.val, &l.bad, d+2)
				for m.next() {
					switch string(m.name()) {
					case "tool_calls":
						if b[m.val] == '[' {
							m.i = l.scanToolCalls(b, m.val, d+3)
							continue
						}
					case "thinking_blocks", "reasoning_details":
						if b[m.val] == '[' {
							var p arrIter
							p.init(b, m.val, d+3)
							for p.nextObject() {
								p.i = l.scanBlock(b, p.val, d+4)
							}
							m.i = p.i
							continue
						}
					}
					m.skip()
				}
				c.i = m.i
				continue
			}
			c.skip()
		}
		a.i = c.i
	}
	return a.i
}

func (l *Learned) scanToolCalls(b []byte, i, d int) int {
	var a arrIter
	a.init(b, i, d)
	for a.nextObject() {
		var t objIter
		t.init(b, a.val, &l.bad, d+1)
		for t.next() {
			if string(t.name()) == "id" {
				if s, e, ok := idAt(b, t.val, &l.bad); ok {
					l.addToolCallID(s)
					t.i = e
					continue
				}
			}
			t.skip()
		}
		a.i = t.i
	}
	return a.i
}

// scanItem: a Responses output item; *_call items contribute their
// call_id, any item its non-empty "encrypted_content" (a reasoning item).
func (l *Learned) scanItem(b []byte, i, d int) int {
	f := l.fields(b, i, d, "call_id")
	if f.val != nil && bytes.HasSuffix(f.typ, []byte("_call")) {
		l.addToolCallID(f.val)
	}
	l.addReasoning(f.enc)
	return f.end
}

// objFields is what fields reads of an object.
type objFields struct {
	typ, val       []byte // "type" and the named field: unescaped ids, nil when absent
	enc, sig, data []byte // raw string content of "encrypted_content", "signature", "data"
	end            int
}

// fields reads the object at b[i:] for its "type", its field named field,
// and the strings of its opaque reasoning artifacts.
func (l *Learned) fields(b []byte, i, d int, field string) objFields {
	var f objFields
	var it objIter
	it.init(b, i, &l.bad, d)
	for it.next() {
		var dst *[]byte
		switch k := string(it.name()); k {
		case "type", field:
			if s, e, ok := idAt(b, it.val, &l.bad); ok {
				if k == "type" {
					f.typ = s
				} else {
					f.val = s
				}
				it.i = e
				continue
			}
		case "encrypted_content":
			dst = &f.enc
		case "signature":
			dst = &f.sig
		case "data":
			dst = &f.data
		}
		if dst != nil {
			if s, e, ok := strAt(b, it.val); ok {
				*dst, it.i = s, e
				continue
			}
		}
		it.skip()
	}
	f.end = it.i
	return f
}

func (l *Learned) scanUsage(b []byte, i, d int) int {
	l.HasUsage = true
	var it objIter
	it.init(b, i, &l.bad, d)
	for it.next() {
		switch string(it.name()) {
		case "prompt_tokens", "input_tokens":
			if n, ok := parseUint(b, it.val); ok {
				l.input = n
			}
		case "cache_read_input_tokens":
			if n, ok := parseUint(b, it.val); ok {
				l.cacheRead = n
				l.CachedTokens = n
				l.CachedKnown = true
			}
		case "cache_creation_input_tokens":
			if n, ok := parseUint(b, it.val); ok {
				l.cacheWrite = n
			}
		case "completion_tokens", "output_tokens":
			if n, ok := parseUint(b, it.val); ok {
				l.CompletionTokens = n
			}
		case "prompt_tokens_details", "input_tokens_details":
			if b[it.val] == '{' {
				var in objIter
				in.init(b, it.val, &l.bad, d+1)
				for in.next() {
					if string(in.name()) == "cached_tokens" {
						if n, ok := parseUint(b, in.val); ok {
							l.CachedTokens = n
							l.CachedKnown = true
						}
					}
					in.skip()
				}
				it.i = in.i
				continue
			}
		}
		it.skip()
	}
	l.PromptTokens = l.input + l.cacheRead + l.cacheWrite
	return it.i
}
