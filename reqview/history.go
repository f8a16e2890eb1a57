package reqview

import (
	"bytes"
	"slices"
)

// History key separators; see the package documentation.
const (
	tagTool        = 0x01
	tagSystem      = 0x02
	tagDeveloper   = 0x03
	tagUser        = 0x04
	tagAssistant   = 0x05
	tagToolResult  = 0x06
	tagOtherRole   = 0x07
	tagInstruction = 0x08
	sepArgs        = 0x1c
	sepCall        = 0x1d
	sepText        = 0x1e
)

// maxHeadReserve bounds the room left in front of the history body section
// for the head (instructions, tools) when the head comes after the messages
// in the body; a larger head costs one memmove of the body section.
const maxHeadReserve = 64 << 10

// Static roles derived from Responses item types. Read-only.
var (
	roleUser      = []byte("user")
	roleAssistant = []byte("assistant")
	roleTool      = []byte("tool")
)

func roleTag(role []byte) byte {
	switch string(role) {
	case "system":
		return tagSystem
	case "developer":
		return tagDeveloper
	case "user":
		return tagUser
	case "assistant":
		return tagAssistant
	case "tool", "function": // "function": the legacy tool-result role
		return tagToolResult
	}
	return tagOtherRole
}

// beginBody starts (or restarts, for a duplicate key) the history body
// section, the messages or input, at v.hbuf[v.base:].
//
// The head (instructions, tools) precedes the body in the key but may come
// after it in the request, so the body is written after a reserve: the exact
// size of the head pieces already met, plus, when some may still come, room
// for up to maxHeadReserve bytes. finish writes the head right in front of
// the body when it fits, else moves the body once.
func (v *View) beginBody(b []byte, i int) {
	v.Messages = 0
	v.LastRole = nil
	v.LastUserText = nil
	v.lastUser = -1
	v.OpaqueReasoning = false
	v.artifact = nil
	v.HasReasoningContent = false
	v.bodyText = false
	clear(v.ToolResultIDs)
	v.ToolResultIDs = v.ToolResultIDs[:0]
	v.ToolResults = 0

	base := v.toolsLen + v.sysLen
	if v.instrSet && len(v.instr) > 0 {
		base += 2 + len(v.instr)
	}
	if !v.toolsSeen || (v.kind == Responses && !v.instrSet) || (v.kind == Messages && !v.sysSet) {
		// Some head may still come after this value.
		rest := len(b) - i
		if rest > maxHeadReserve {
			rest = maxHeadReserve
		}
		base += rest
	}
	// The body section never exceeds the body length: every separator
	// replaces at least the two quotes of the string it introduces.
	if need := base + len(b) - i; cap(v.hbuf) < need {
		v.hbuf = make([]byte, base, need)
	} else {
		v.hbuf = v.hbuf[:base]
	}
	v.base = base
}

// addText appends one text piece.
func (v *View) addText(s []byte) {
	v.hbuf = append(v.hbuf, sepText)
	v.hbuf = append(v.hbuf, s...)
	if len(s) > 0 {
		v.bodyText = true
	}
}

// addTextAt appends, as one text piece, the string value at i (b[i] is
// a quote), and returns the index after it, or -1 when it is unterminated:
// strAt then addText, but long strings are copied by the same 64-byte loads
// that look for their end (strEndCopy), not read a second time by a copy.
// That needs room for the rest of the body after the separator, which
// beginBody's capacity gives but is checked all the same.
func (v *View) addTextAt(b []byte, i int) int {
	n := len(v.hbuf)
	if !hasBlocks || i+1+64 > len(b) || cap(v.hbuf)-n-1 < len(b)-i-1 {
		s, e, ok := strAt(b, i)
		if !ok {
			return -1
		}
		v.addText(s)
		return e
	}
	dst := v.hbuf[n+1 : cap(v.hbuf)]
	end, next, esc := strEndCopy(b, i+1, dst)
	if end < 0 {
		// The last bytes of the body, fewer than a block.
		if next+esc > len(b) {
			return -1
		}
		if end = strEndSWAR(b, next+esc); end < 0 {
			return -1
		}
		copy(dst[next-(i+1):], b[next:end])
	}
	v.hbuf = v.hbuf[:n+1+end-(i+1)]
	v.hbuf[n] = sepText
	if end > i+1 {
		v.bodyText = true
	}
	return end + 1
}

// addCall appends one tool call.
func (v *View) addCall(name, args []byte) {
	v.hbuf = append(v.hbuf, sepCall)
	v.hbuf = append(v.hbuf, name...)
	v.hbuf = append(v.hbuf, sepArgs)
	v.hbuf = append(v.hbuf, args...)
	v.bodyText = true
}

// The keys the history walk expects (see keySet), and their indexes there
// (objIter.id).
var (
	messageKeys  = newKeySet("role", "content", "tool_calls", "tool_call_id")
	toolCallKeys = newKeySet("function", "id", "type")
	functionKeys = newKeySet("name", "arguments")
	partKeys     = newKeySet("type", "text", "signature", "data")
	itemKeys     = newKeySet("type", "role", "content", "call_id", "output", "name", "arguments")
	roleValues   = valueSet("user", "assistant", "tool", "system")
	typeValues   = valueSet("function", "text", "message", "function_call", "input_text", "output_text")
)

const (
	mRole = iota
	mContent
	mToolCalls
	mToolCallID
)

const (
	tcFunction = iota
	tcID
	tcType
)

const (
	fnName = iota
	fnArguments
)

const (
	pType = iota
	pText
	pSignature
	pData
)

const (
	iType = iota
	iRole
	iContent
	iCallID
	iOutput
	iName
	iArguments
)

// parseMessages reads "messages": an array of chat messages or, with
// anthropic (kind Messages), of Anthropic {role, content} messages whose
// content is a string or an array of blocks (anthropicMessage).
func (v *View) parseMessages(b []byte, i int, anthropic bool) int {
	v.beginBody(b, i)
	if b[i] != '[' {
		return 0
	}
	var it arrIter
	end := 0
	j, ok := it.step(it.init(b, i, 2))
	for ; ok; j, ok = it.step(end) {
		v.Messages++
		if b[j] != '{' {
			v.LastRole = nil
			end = skipValue(b, j, it.depth)
			continue
		}
		if anthropic {
			end = v.anthropicMessage(b, j)
		} else {
			end = v.parseMessage(b, j)
		}
	}
	return j
}

// parseMessage walks one chat message in one pass, appending its content
// pieces as met; the role tag is reserved first and filled in at the end, and
// tool calls met before the content are deferred until after it.
func (v *View) parseMessage(b []byte, s int) int {
	tagPos := len(v.hbuf)
	v.hbuf = append(v.hbuf, tagOtherRole)
	var role, callID []byte
	content, pendingCalls := -1, -1
	var it objIter
	it.keys = messageKeys
	end := 0
	i, ok := it.step(it.init(b, s, &v.bad, 3))
	for ; ok; i, ok = it.step(end) {
		end = 0
		switch it.id {
		case mRole:
			role, end, _ = idIn(b, i, roleValues, &v.bad)
		case mContent:
			content = i
			end = v.appendContent(b, i)
			if pendingCalls >= 0 {
				if v.appendToolCalls(b, pendingCalls) < 0 {
					return -1
				}
				pendingCalls = -1
			}
		case mToolCalls:
			if content >= 0 {
				end = v.appendToolCalls(b, i)
			} else {
				pendingCalls = i
			}
		case mToolCallID:
			callID, end, _ = idAt(b, i, &v.bad)
		default:
			switch string(it.name()) {
			case "encrypted_content":
				end = v.opaqueAt(b, i)
			case "thinking_blocks", "reasoning_details":
				end = v.checkParts(b, i)
			case "reasoning_content":
				end = setIfText(b, i, &v.HasReasoningContent)
			}
		}
		if end < 0 {
			return -1
		}
		if end == 0 {
			end = skipValue(b, i, it.depth)
		}
	}
	if i < 0 {
		return -1
	}
	if pendingCalls >= 0 && v.appendToolCalls(b, pendingCalls) < 0 {
		return -1
	}
	tag := roleTag(role)
	v.hbuf[tagPos] = tag
	v.LastRole = role
	switch tag {
	case tagAssistant:
		clear(v.ToolResultIDs)
		v.ToolResultIDs = v.ToolResultIDs[:0]
		v.ToolResults = 0
	case tagToolResult:
		v.ToolResults++
		if callID != nil {
			v.ToolResultIDs = append(v.ToolResultIDs, callID)
		}
	case tagUser:
		v.lastUser = content
	}
	return i
}

// appendContent appends the text pieces of a "content" (or "output") value:
// a string, or an array of parts. It returns the index after the value, 0
// when the value is of another type, -1 when broken.
func (v *View) appendContent(b []byte, i int) int {
	switch b[i] {
	case '"':
		return v.addTextAt(b, i)
	case '[':
		var it arrIter
		end := 0
		j, ok := it.step(it.init(b, i, 4))
		for ; ok; j, ok = it.step(end) {
			if b[j] != '{' {
				end = skipValue(b, j, it.depth)
				continue
			}
			var typ, text []byte
			if typ, text, end = v.part(b, j); end < 0 {
				return -1
			}
			if text != nil && isTextType(typ) {
				v.addText(text)
			}
		}
		return j
	}
	return 0
}

func isTextType(typ []byte) bool {
	switch string(typ) {
	case "text", "input_text", "output_text":
		return true
	}
	return false
}

// part reads one content part: its type, its "text" string, and whether it
// carries opaque reasoning (which sets v.OpaqueReasoning).
func (v *View) part(b []byte, i int) (typ, text []byte, end int) {
	var sig, data []byte
	var it objIter
	it.keys = partKeys
	j, ok := it.step(it.init(b, i, &v.bad, 5))
	for ; ok; j, ok = it.step(end) {
		switch it.id {
		case pType:
			if s, e, ok := idIn(b, j, typeValues, &v.bad); ok {
				typ, end = s, e
				continue
			}
		case pText:
			if s, e, ok := strAt(b, j); ok {
				text, end = s, e
				continue
			}
		case pSignature:
			if s, e, ok := strAt(b, j); ok {
				sig, end = s, e
				continue
			}
		case pData:
			if s, e, ok := strAt(b, j); ok {
				data, end = s, e
				continue
			}
		}
		end = skipValue(b, j, it.depth)
	}
	switch string(typ) {
	case "thinking":
		if len(sig) > 0 {
			v.OpaqueReasoning, v.artifact = true, sig
		}
	case "redacted_thinking", "reasoning.encrypted":
		v.OpaqueReasoning, v.artifact = true, data
	}
	return typ, text, j
}

// checkParts walks an array of parts only for opaque reasoning.
func (v *View) checkParts(b []byte, i int) int {
	if b[i] != '[' {
		return 0
	}
	var it arrIter
	it.init(b, i, 4)
	for it.nextObject() {
		_, _, it.i = v.part(b, it.val)
	}
	return it.i
}

// appendToolCalls appends chat tool_calls[].function {name, arguments}.
func (v *View) appendToolCalls(b []byte, i int) int {
	if b[i] != '[' {
		return 0
	}
	var it arrIter
	end := 0
	j, ok := it.step(it.init(b, i, 4))
	for ; ok; j, ok = it.step(end) {
		if b[j] != '{' {
			end = skipValue(b, j, it.depth)
			continue
		}
		var name, args []byte
		var tc objIter
		tc.keys = toolCallKeys
		te := 0
		k, ok := tc.step(tc.init(b, j, &v.bad, 5))
		for ; ok; k, ok = tc.step(te) {
			if tc.id == tcFunction && b[k] == '{' {
				var fn objIter
				fn.keys = functionKeys
				fe := 0
				m, ok := fn.step(fn.init(b, k, &v.bad, 6))
				for ; ok; m, ok = fn.step(fe) {
					switch fn.id {
					case fnName:
						if s, e, ok := idAt(b, m, &v.bad); ok {
							name, fe = s, e
							continue
						}
					case fnArguments:
						args, fe = argsAt(b, m, 6)
						continue
					}
					fe = skipValue(b, m, fn.depth)
				}
				te = m
				continue
			}
			if tc.id == tcType { // not interpreted: "function" skipped at once
				if e := wordEnd(b, k, typeValues); e > 0 {
					te = e
					continue
				}
			}
			te = skipValue(b, k, tc.depth)
		}
		if k < 0 {
			return -1
		}
		v.addCall(name, args)
		end = k
	}
	return j
}

// argsAt returns the raw string content of the arguments at i, or the raw
// JSON when it is not a string, and the index after it (-1 when invalid;
// depth: that of the object holding it).
func argsAt(b []byte, i, depth int) ([]byte, int) {
	if s, e, ok := strAt(b, i); ok {
		return s, e
	}
	e := skipValue(b, i, depth)
	if e < 0 {
		return nil, -1
	}
	return b[i:e], e
}

// parseInput reads the Responses "input": a string (one user message) or an
// array of items.
func (v *View) parseInput(b []byte, i int) int {
	v.beginBody(b, i)
	switch b[i] {
	case '"':
		s, e, ok := strAt(b, i)
		if !ok {
			return -1
		}
		v.Messages = 1
		v.LastRole = roleUser
		v.lastUser = i
		v.hbuf = append(v.hbuf, tagUser)
		v.addText(s)
		return e
	case '[':
		var it arrIter
		end := 0
		j, ok := it.step(it.init(b, i, 2))
		for ; ok; j, ok = it.step(end) {
			v.Messages++
			if b[j] != '{' {
				v.LastRole = nil
				end = skipValue(b, j, it.depth)
				continue
			}
			end = v.parseItem(b, j)
		}
		return j
	}
	return 0
}

// parseItem walks one Responses input item in one pass. Content/output
// pieces are appended as met after a reserved tag byte; at the end the item's
// type decides the tag, or drops the pieces (function_call: name and
// arguments only; reasoning and other items contribute nothing).
func (v *View) parseItem(b []byte, s int) int {
	tagPos := len(v.hbuf)
	textBefore := v.bodyText
	v.hbuf = append(v.hbuf, tagOtherRole)
	var typ, role, name, args, callID []byte
	content := -1
	var it objIter
	it.keys = itemKeys
	end := 0
	i, ok := it.step(it.init(b, s, &v.bad, 3))
	for ; ok; i, ok = it.step(end) {
		end = 0
		switch it.id {
		case iType:
			typ, end, _ = idIn(b, i, typeValues, &v.bad)
		case iRole:
			role, end, _ = idIn(b, i, roleValues, &v.bad)
		case iContent:
			content = i
			end = v.appendContent(b, i)
		case iOutput:
			end = v.appendContent(b, i)
		case iName:
			name, end, _ = idAt(b, i, &v.bad)
		case iArguments:
			args, end = argsAt(b, i, 3)
		case iCallID:
			callID, end, _ = idAt(b, i, &v.bad)
		default:
			if string(it.name()) == "encrypted_content" {
				end = v.opaqueAt(b, i)
			}
		}
		if end < 0 {
			return -1
		}
		if end == 0 {
			end = skipValue(b, i, it.depth)
		}
	}
	if i < 0 {
		return -1
	}
	drop := func() {
		v.hbuf = v.hbuf[:tagPos]
		v.bodyText = textBefore
	}
	switch {
	case string(typ) == "message" || (typ == nil && role != nil):
		tag := roleTag(role)
		v.hbuf[tagPos] = tag
		v.LastRole = role
		clear(v.ToolResultIDs)
		v.ToolResultIDs = v.ToolResultIDs[:0]
		v.ToolResults = 0
		if tag == tagUser {
			v.lastUser = content
		}
	case string(typ) == "function_call":
		drop()
		v.addCall(name, args)
		v.LastRole = roleAssistant
	case bytes.HasSuffix(typ, []byte("_call_output")):
		v.hbuf[tagPos] = tagToolResult
		v.LastRole = roleTool
		v.ToolResults++
		if callID != nil {
			v.ToolResultIDs = append(v.ToolResultIDs, callID)
		}
	case string(typ) == "reasoning" || bytes.HasSuffix(typ, []byte("_call")):
		drop()
		v.LastRole = roleAssistant
	default:
		drop()
		v.LastRole = typ
	}
	return i
}

// finish sorts the tools, writes the head in front of the body section and
// sets History and LastUserText.
func (v *View) finish(b []byte) bool {
	if v.artifact != nil {
		v.ReasoningID = reasoningIDOf(v.artifact)
	}
	if v.lastUser >= 0 && !v.lastUserText(b) {
		return false
	}
	if v.kind == Generate {
		v.History = v.hbuf // the token ids (generate.go)
		return true
	}
	if v.kind != Chat && v.kind != Responses && v.kind != Messages {
		v.History = v.hbuf[:0]
		return true
	}
	if len(v.tools) > 1 {
		slices.SortFunc(v.tools, func(x, y toolEntry) int {
			if c := bytes.Compare(x.name, y.name); c != 0 {
				return c
			}
			return bytes.Compare(x.raw, y.raw)
		})
	}
	head := v.toolsLen + v.sysLen
	if v.instrSet && len(v.instr) > 0 {
		head += 2 + len(v.instr)
	}
	if !v.bodyText && head == 0 {
		v.History = v.hbuf[:0]
		return true
	}
	if v.base < 0 {
		v.base = 0
		v.hbuf = v.hbuf[:0]
	}
	n := len(v.hbuf) - v.base
	if head <= v.base {
		s := v.base - head
		v.appendHead(v.hbuf[s:s])
		v.History = v.hbuf[s:]
		return true
	}
	// The head did not fit in the reserve: move the body section once.
	if need := head + n; cap(v.hbuf) < need {
		nb := make([]byte, need, need+need/4)
		copy(nb[head:], v.hbuf[v.base:])
		v.hbuf = nb
	} else {
		v.hbuf = v.hbuf[:need]
		copy(v.hbuf[head:], v.hbuf[v.base:v.base+n])
	}
	v.base = head
	v.appendHead(v.hbuf[:0])
	v.History = v.hbuf
	return true
}

// appendHead appends instructions (Responses), sorted tools, then the
// system (Messages) to dst, which has the capacity for them (finish passes
// a window of hbuf).
func (v *View) appendHead(dst []byte) []byte {
	if v.instrSet && len(v.instr) > 0 {
		dst = append(dst, tagInstruction, sepText)
		dst = append(dst, v.instr...)
	}
	for _, t := range v.tools {
		dst = append(dst, tagTool)
		dst = append(dst, t.raw...)
	}
	if v.sysLen > 0 {
		dst = append(dst, tagSystem)
		for _, s := range v.sys {
			dst = append(dst, sepText)
			dst = append(dst, s...)
		}
	}
	return dst
}

// lastUserText sets LastUserText from the latest user content value.
func (v *View) lastUserText(b []byte) bool {
	i := v.lastUser
	switch {
	case isByte(b, i, '"'):
		s, _, ok := strAt(b, i)
		v.LastUserText = s
		return ok
	case isByte(b, i, '['):
		u := v.ubuf[:0]
		n := 0
		var it arrIter
		it.init(b, i, 4)
		for it.nextObject() {
			var typ, text []byte
			var p objIter
			p.init(b, it.val, &v.bad, 5)
			for p.next() {
				switch string(p.name()) {
				case "type":
					if s, e, ok := idAt(b, p.val, &v.bad); ok {
						typ = s
						p.i = e
						continue
					}
				case "text":
					if s, e, ok := strAt(b, p.val); ok {
						text = s
						p.i = e
						continue
					}
				}
				p.skip()
			}
			if text != nil && isTextType(typ) {
				if n > 0 {
					u = append(u, '\\', 'n')
				}
				u = append(u, text...)
				n++
			}
			it.i = p.i
		}
		v.ubuf = u
		if n > 0 {
			v.LastUserText = u
		}
		return it.i >= 0
	}
	return true
}

// setIfText sets *flag when the value at i is a non-empty string, and
// returns the index after it (0 when the value is not a string: skip it).
// opaqueAt reads an "encrypted_content" value at i: a non-empty string
// sets OpaqueReasoning and is the latest artifact. It returns the index
// after a string, else 0.
func (v *View) opaqueAt(b []byte, i int) int {
	s, e, ok := strAt(b, i)
	if !ok {
		return 0
	}
	if len(s) > 0 {
		v.OpaqueReasoning, v.artifact = true, s
	}
	return e
}

func setIfText(b []byte, i int, flag *bool) int {
	s, e, ok := strAt(b, i)
	if !ok {
		return 0
	}
	if len(s) > 0 {
		*flag = true
	}
	return e
}
