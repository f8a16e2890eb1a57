package reqview

// The Anthropic Messages API (/v1/messages, kind Messages): the request
// walk. The history key keeps the tagged format of chat (package
// documentation, "History key"; docs/design.md §3), the locks those of
// chat (docs/design.md §5): a tool_result block's tool_use_id is a tool
// call id, a signed thinking block or a redacted_thinking block is opaque
// reasoning. Responses are learned by ScanResponse and SSEScanner, which
// recognise the Messages shapes (learn.go).

// tagToolError introduces a tool_result block with "is_error": true (in
// place of tagToolResult); not a JSON whitespace byte, so it never occurs
// in the raw tool JSON of the head either.
const tagToolError = 0x0b

// The keys and values the Messages walk expects (see keySet).
var (
	anthropicMsgKeys = newKeySet("role", "content")
	blockKeys        = newKeySet("type", "text", "id", "name", "input", "tool_use_id", "content", "is_error", "signature", "thinking", "source", "cache_control", "data")
	blockTypes       = valueSet("text", "tool_use", "tool_result", "thinking", "image")
	textKeys         = newKeySet("type", "text")
)

const (
	amRole = iota
	amContent
)

const (
	bType = iota
	bText
	bID // matched to be skipped at once, as source and cache_control
	bName
	bInput
	bToolUseID
	bContent
	bIsError
	bSignature
	bThinking
	bSource // matched to be skipped at once
	bCacheControl
	bData
)

// blockStats is what the blocks of one message showed.
type blockStats struct {
	results int  // tool_result blocks
	text    bool // a string content or a text block: the message has user text
}

// anthropicMessage walks one message: its role tag (reserved first, filled
// in at the end), then its content pieces as met. A user message with
// tool_result blocks is a tool-loop turn: LastRole "tool", and its
// tool_use_ids join ToolResultIDs; an assistant message clears them.
func (v *View) anthropicMessage(b []byte, s int) int {
	tagPos := len(v.hbuf)
	v.hbuf = append(v.hbuf, tagOtherRole)
	var role []byte
	content := -1
	var st blockStats
	var it objIter
	it.keys = anthropicMsgKeys
	end := 0
	i, ok := it.step(it.init(b, s, &v.bad, 3))
	for ; ok; i, ok = it.step(end) {
		end = 0
		switch it.id {
		case amRole:
			role, end, _ = idIn(b, i, roleValues, &v.bad)
		case amContent:
			content = i
			end = v.anthropicContent(b, i, &st)
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
	tag := roleTag(role)
	v.hbuf[tagPos] = tag
	v.LastRole = role
	switch tag {
	case tagAssistant:
		clear(v.ToolResultIDs)
		v.ToolResultIDs = v.ToolResultIDs[:0]
		v.ToolResults = 0
	case tagUser:
		if st.results > 0 {
			v.LastRole = roleTool
		}
		if st.text {
			v.lastUser = content
		}
	}
	return i
}

// anthropicContent appends the pieces of a message's "content": a string,
// or an array of blocks (depth 5). It returns the index after the value, 0
// when the value is of another type, -1 when broken.
func (v *View) anthropicContent(b []byte, i int, st *blockStats) int {
	switch b[i] {
	case '"':
		st.text = true
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
			end = v.block(b, j, st)
		}
		return j
	}
	return 0
}

// block walks one content block (depth 5) and appends what it contributes:
//   - text: 0x1e <text>;
//   - tool_use: 0x1d <name> 0x1c <input> (the raw JSON; the id is random
//     per run and never enters the key, as chat's tool_call_id);
//   - tool_result: 0x06 (0x0b when "is_error": true), then the pieces of
//     its content (a string, or its text blocks); its tool_use_id is a
//     tool result id;
//   - thinking, redacted_thinking: nothing (reasoning is not in the key, as
//     chat's reasoning_content and thinking_blocks; clients that drop old
//     thinking blocks keep their prefix); a non-empty signature or a
//     redacted_thinking block sets OpaqueReasoning, a non-empty thinking
//     text HasReasoningContent;
//   - image, document and any other type: nothing.
//
// The tool_result tag is reserved first and its content appended as met;
// the block's type, known at the end, keeps or drops them.
func (v *View) block(b []byte, s int, st *blockStats) int {
	tagPos, textBefore := len(v.hbuf), v.bodyText
	v.hbuf = append(v.hbuf, tagToolResult)
	var typ, text, name, input, useID, sig, data []byte
	var isErr, thinking bool
	var it objIter
	it.keys = blockKeys
	end := 0
	i, ok := it.step(it.init(b, s, &v.bad, 5))
	for ; ok; i, ok = it.step(end) {
		end = 0
		switch it.id {
		case bType:
			typ, end, _ = idIn(b, i, blockTypes, &v.bad)
		case bText:
			text, end, _ = strAt(b, i)
		case bInput:
			input, end = argsAt(b, i, 5)
		case bName:
			name, end, _ = idAt(b, i, &v.bad)
		case bToolUseID:
			useID, end, _ = idAt(b, i, &v.bad)
		case bContent:
			end = v.resultContent(b, i)
		case bIsError:
			if e := i + 4; e <= len(b) && string(b[i:e]) == "true" {
				isErr = true
			}
		case bSignature:
			sig, end, _ = strAt(b, i)
		case bData:
			data, end, _ = strAt(b, i)
		case bThinking:
			end = setIfText(b, i, &thinking)
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
	if string(typ) == "tool_result" {
		if isErr {
			v.hbuf[tagPos] = tagToolError
		}
		st.results++
		v.ToolResults++
		if useID != nil {
			v.ToolResultIDs = append(v.ToolResultIDs, useID)
		}
		return i
	}
	v.hbuf, v.bodyText = v.hbuf[:tagPos], textBefore
	switch string(typ) {
	case "text":
		if text != nil {
			v.addText(text)
			st.text = true
		}
	case "tool_use":
		v.addCall(name, input)
	case "thinking":
		if len(sig) > 0 {
			v.OpaqueReasoning, v.artifact = true, sig
		}
		v.HasReasoningContent = v.HasReasoningContent || thinking
	case "redacted_thinking":
		v.OpaqueReasoning, v.artifact = true, data
	}
	return i
}

// resultContent appends the pieces of a tool_result's "content" (depth 6):
// a string, or the texts of its text blocks (depth 7).
func (v *View) resultContent(b []byte, i int) int {
	switch b[i] {
	case '"':
		return v.addTextAt(b, i)
	case '[':
		var it arrIter
		end := 0
		j, ok := it.step(it.init(b, i, 6))
		for ; ok; j, ok = it.step(end) {
			if b[j] != '{' {
				end = skipValue(b, j, it.depth)
				continue
			}
			var typ, text []byte
			if typ, text, end = textBlock(b, j, 7, &v.bad); end > 0 && text != nil && string(typ) == "text" {
				v.addText(text)
			}
		}
		return j
	}
	return 0
}

// textBlock reads the type and text of a block at depth d, and returns the
// index after it (-1 when broken).
func textBlock(b []byte, s, d int, bad *int) (typ, text []byte, end int) {
	var it objIter
	it.keys = textKeys
	e := 0
	i, ok := it.step(it.init(b, s, bad, d))
	for ; ok; i, ok = it.step(e) {
		e = 0
		switch it.id {
		case 0:
			typ, e, _ = idIn(b, i, blockTypes, bad)
		case 1:
			text, e, _ = strAt(b, i)
		}
		if e == 0 {
			e = skipValue(b, i, it.depth)
		}
	}
	return typ, text, i
}

// parseSystem reads the top-level "system" (kind Messages): a string (one
// piece when non-empty) or an array of text blocks (one piece each). It
// enters the key after the tools as a system message: 0x02, then 0x1e
// <text> per piece; not at all without a piece.
func (v *View) parseSystem(b []byte, i int) int {
	clear(v.sys)
	v.sys, v.sysLen, v.sysSet = v.sys[:0], 0, true
	end := 0
	switch b[i] {
	case '"':
		s, e, ok := strAt(b, i)
		if !ok {
			return -1
		}
		if len(s) > 0 {
			v.sys = append(v.sys, s)
		}
		end = e
	case '[':
		var it arrIter
		e := 0
		j, ok := it.step(it.init(b, i, 2))
		for ; ok; j, ok = it.step(e) {
			if b[j] != '{' {
				e = skipValue(b, j, it.depth)
				continue
			}
			var typ, text []byte
			if typ, text, e = textBlock(b, j, 3, &v.bad); e > 0 && text != nil && string(typ) == "text" {
				v.sys = append(v.sys, text)
			}
		}
		end = j
	default:
		return 0
	}
	if len(v.sys) > 0 {
		v.sysLen = 1
		for _, s := range v.sys {
			v.sysLen += 1 + len(s)
		}
	}
	return end
}

// metadata reads "metadata": {"user_id": ...} (kind Messages).
func (v *View) metadata(b []byte, i int) int {
	var it objIter
	it.init(b, i, &v.bad, 2)
	for it.next() {
		if string(it.name()) == "user_id" {
			var end int
			if v.MetadataUserID, end, _ = idAt(b, it.val, &v.bad); end > 0 {
				it.i = end
				continue
			}
		}
		it.skip()
	}
	return it.i
}

// UserIDs returns the user-level ids of the body in priority order (after
// the session-level ones and the x-user-id header; docs/design.md §4): top-level
// "user_id", "user", then "metadata.user_id" (Messages). Raw, as the
// fields; nil where absent.
func (v *View) UserIDs() [3][]byte {
	return [3][]byte{v.UserID, v.User, v.MetadataUserID}
}
