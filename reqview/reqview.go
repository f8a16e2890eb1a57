// Package reqview extracts, from the raw bytes of an OpenAI-compatible (or
// Anthropic Messages) request body, exactly what routing needs — model, streaming flag, session ids, tool
// loop state, opaque reasoning state and the history key — in one pass,
// without unmarshalling the body. It also learns, from responses
// (whole or streamed as SSE), the ids and token counts the router memory keeps.
//
// # How
//
// Parse walks the body once with a small structural scanner that validates
// as it goes (no separate validation pass): strings are delimited in 8-byte
// register steps, or 64 bytes a step with AVX2 where escapes are resolved
// with bit masks (strend_amd64.s; content strings are copied into the
// history key by the same loads), values the router does not need are
// skipped by a validating loop without recursion, and only the members that
// matter are visited. Text is never unescaped: every []byte in a View is the
// raw escaped JSON string content, exactly as the client sent it, so the same
// client sending the same conversation always yields the same bytes.
// ParseModel is the same walk reading only the model and stream flag.
//
// An agent sends the same tools every turn, and its tool schemas are the
// structure-dense part of its body (at 1 KB, most of the walk). A View
// remembers the last "tools" array it walked and found valid, as a copy of
// up to 64 KiB: a JSON value is delimited by its own bytes, so a later body
// whose "tools" value starts with those bytes holds that very array, and
// Parse takes its tools from the copy instead of walking it again.
//
// # Validation
//
// Parse accepts a body when sonic's validator would — structure, literals,
// numbers, nesting up to 4096, nothing but whitespace after the object; it
// does not look inside strings — and every string the router interprets is valid JSON string content: no
// raw control byte (< 0x20) and only the escapes \" \\ \/ \b \f \n \r \t
// \uXXXX. The interpreted strings are the object keys the scanner matches
// (the members of every object it walks; keys inside skipped values are not
// read) and the string values of model, session_params.session_id,
// session_id, conversation_id, user_id, user, previous_response_id,
// reasoning_effort, reasoning.effort, metadata.user_id (Messages), and, in
// the messages, content parts and blocks, tool calls, input items and tools
// it walks, role, type, tool_call_id, call_id, tool_use_id and the tool and
// function names. ("stream" is only read as the
// literal true.) One malformed interpreted string makes Parse fail with a
// *MalformedError whose Offset is its first offending byte: the raw control
// byte, or the backslash of the bad escape. ScanResponse and SSEScanner
// apply the same rule to the keys, ids, call_ids and types they read, and
// ScanUsage (the token counts only) to the keys.
//
// Content strings — message and part text, tool call arguments, tool
// schemas, instructions, prompts, reasoning content and signatures, and
// every string inside members the scanner skips — are delimited, not
// validated: a bad escape or a raw control byte there is forwarded unchanged,
// and the worker (vLLM), which parses the whole body anyway, rejects it with
// its own 400. Validating every string would read every content byte once
// more, a cost of the order of the rest of the scan on a chat body, to catch
// bodies that the worker catches in any case; the strings the router acts on before the
// worker sees the body are still checked. So Parse accepts such invalid JSON
// bodies, unlike encoding/json. Their History is still built from the raw
// bytes between the quotes, so the prefix property holds; only a raw control
// byte in the text can imitate a separator of the key (see below), which can
// only mis-key a request the worker rejects.
//
// # Lifetimes
//
// A View is reusable and meant to be pooled; Reset and Parse keep its
// buffers' capacity, so a warmed-up View parses with 0 allocations, and the
// copy of its last tools array (above). Fields of type
// []byte (and the elements of ToolResultIDs) alias the body passed to Parse
// and must not be accessed after that body is released — except History and a
// multi-part LastUserText, which live in the View's own buffers and are valid
// until the next Reset or Parse. LastRole may also point to package-level
// constants. None of them may be modified. A View is not safe for concurrent
// use.
//
// # History key
//
// History is one deterministic byte string per request, used as the key of
// the prefix (radix) tree. Separators are ASCII control bytes, which JSON
// requires to be escaped inside strings, so in a valid JSON body they never
// occur in the raw text they delimit (content is not validated: see
// Validation):
//
//	0x08 0x1e <text>            Responses "instructions" (non-empty string)
//	0x01 <raw tool JSON>        one per element of "tools", sorted by function
//	                            name (chat: function.name; Responses: name),
//	                            ties broken by the raw bytes
//	<role tag>                  one per message / input item that contributes:
//	                            0x02 system, 0x03 developer, 0x04 user,
//	                            0x05 assistant, 0x06 tool (also the legacy
//	                            role function, and Responses *_call_output
//	                            items), 0x07 any other role
//	  0x1e <text>               one per text piece of that message: a string
//	                            content, or the "text" of a content part of type
//	                            "text", "input_text" or "output_text"
//	                            (images, audio, files, refusals are skipped)
//	  0x1d <name> 0x1c <args>   one per assistant tool call (chat
//	                            tool_calls[].function, Responses function_call
//	                            items, which carry no role tag, Messages
//	                            tool_use blocks: name and input); args is the raw
//	                            string content, or the raw JSON when not a string
//	  0x06 | 0x0b               Messages: one per tool_result block (0x0b when
//	                            "is_error": true), inside its user message,
//	                            followed by the 0x1e pieces of its content (a
//	                            string, or its text blocks)
//
// Order: for Chat, tools then messages; for Responses, instructions, tools,
// then input (a string input is one user message); for Messages (the
// Anthropic Messages API), tools (sorted by name), then the top-level
// "system" as one system message (0x02, then 0x1e <text> per piece: a
// non-empty string, or the text of each text block; absent without a
// piece), then messages, whose content is a string or an array of blocks
// contributing in block order: text blocks as text pieces, tool_use blocks as
// tool calls, tool_result blocks as above; image, document, thinking and
// redacted_thinking blocks contribute nothing (reasoning stays out of the
// key as in chat, so a client that drops old thinking blocks keeps its
// prefix). A conversation sent through chat and through Messages gets two
// different keys. Within a message the
// order is canonical whatever the key order in the body: role tag, content
// pieces, then tool calls (for Messages: block order). Tool messages
// contribute their content only — tool_call_id (tool_use_id, and a tool_use
// block's id) is random per run and never enters the key. Every element is
// introduced by its tag and nothing terminates the last one, so when request
// B's messages extend request A's (same tools, same client), A.History is a
// prefix of B.History.
//
// When the request carries no text at all — no non-empty text piece, no tool
// call, no tool schema, no instructions (for example image-only messages) —
// History is empty (length 0), not even tags. With tools but no text, History
// holds the tools and the role tags. Completions and Other requests have an
// empty History (Completions expose Prompt instead); Generate's is its
// token ids (generate.go).
//
// # Opaque reasoning
//
// OpaqueReasoning is set when the history carries reasoning state that only
// the model (provider) that produced it can use:
//   - a message (Chat) or input item (Responses) with an "encrypted_content"
//     member holding a non-empty string — this covers Responses "reasoning"
//     items with encrypted content;
//   - a content part (of "content", or of an assistant's "thinking_blocks" or
//     "reasoning_details" array) of type "thinking" with a non-empty
//     "signature" string, of type "redacted_thinking", or of type
//     "reasoning.encrypted" — for Messages, the same content blocks.
//
// ReasoningID names the last of these artifacts by its bytes (see
// ReasoningID): the request that echoes a response's artifact back gets the
// id ScanResponse and SSEScanner learned from that response (Learned.
// ReasoningIDs), the key of the hard lock of docs/design.md §5.
//
// Plain-text reasoning ("reasoning_content" on an assistant message, as vLLM's
// reasoning parsers emit it; for Messages, the non-empty "thinking" text of a
// thinking block) is portable text and does not set OpaqueReasoning; it sets
// HasReasoningContent instead, so the router can decide.
//
// # Messages (Anthropic)
//
// Parse with kind Messages reads a /v1/messages body (docs/design.md §3):
// model, stream and the session-level ids as for chat, "metadata.user_id"
// as MetadataUserID (user level: see UserIDs), the history key above, and
// the tool loop: the tool_use_ids of the tool_result blocks after the last
// assistant message are ToolResultIDs (the hard lock of docs/design.md §5),
// and a user message holding tool_result blocks makes LastRole "tool".
// LastUserText is the text of the latest user message with a string
// content or a text block. ScanResponse and SSEScanner recognise Anthropic
// responses by their shape, with no mode to set: tool_use block ids are
// learned as tool call ids, usage as PromptTokens = input_tokens +
// cache_read_input_tokens + cache_creation_input_tokens and CachedTokens =
// cache_read_input_tokens, and the message id ("msg_...") is not kept.
package reqview

import (
	"errors"
	"fmt"

	"github.com/bytedance/sonic/encoder"
)

// Kind is the endpoint family of a request; it selects which members Parse
// reads.
type Kind uint8

const (
	// Chat is /v1/chat/completions: messages, tools.
	Chat Kind = iota
	// Completions is /v1/completions and /generate: the prompt text is the
	// prefix key.
	Completions
	// Responses is /v1/responses (OpenAI Responses API): instructions, tools,
	// input.
	Responses
	// Other is anything else: only the model, session, user and scalar fields.
	Other
	// Messages is /v1/messages (Anthropic Messages API, as vLLM serves it):
	// tools, system, messages, metadata.user_id. After Other so that loops
	// over the OpenAI kinds (Chat … Other) are unchanged.
	Messages
	// Generate is /inference/v1/generate (vLLM's tokens-in, tokens-out
	// endpoint): the history key is the "token_ids" array (generate.go).
	Generate
)

// String returns the name of the kind.
func (k Kind) String() string {
	switch k {
	case Chat:
		return "chat"
	case Completions:
		return "completions"
	case Responses:
		return "responses"
	case Messages:
		return "messages"
	case Generate:
		return "generate"
	default:
		return "other"
	}
}

// ErrMalformed is returned (wrapped in a *MalformedError) when a body is not
// valid JSON or not a JSON object.
var ErrMalformed = errors.New("reqview: malformed JSON body")

// MalformedError tells where a body stopped being acceptable.
type MalformedError struct {
	// Offset is the byte offset of the first offending byte (0 for an empty
	// body).
	Offset int
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("%s at offset %d", ErrMalformed.Error(), e.Offset)
}

// Unwrap makes errors.Is(err, ErrMalformed) true.
func (e *MalformedError) Unwrap() error { return ErrMalformed }

func malformed(off int) error {
	if off < 0 {
		off = 0
	}
	return &MalformedError{Offset: off}
}

// View is the routing view of one request body. See the package
// documentation for lifetimes: []byte fields alias the parsed body (valid
// until it is released), History lives in the View (valid until the next
// Reset/Parse). Read-only.
type View struct {
	// Model is the raw string content of the top-level "model" (escapes not
	// decoded).
	Model []byte
	// ModelStart and ModelEnd are the byte offsets of the model value
	// INCLUDING its quotes (body[ModelStart:ModelEnd] == `"` + Model + `"`),
	// for splicing another model name in; -1 when absent.
	ModelStart, ModelEnd int
	// Stream is top-level "stream": true.
	Stream bool
	// SessionParamsID is "session_params": {"session_id": ...}.
	SessionParamsID []byte
	// SessionID is top-level "session_id".
	SessionID []byte
	// ConversationID is top-level "conversation_id".
	ConversationID []byte
	// UserID is top-level "user_id".
	UserID []byte
	// User is top-level "user".
	User []byte
	// MetadataUserID is "metadata": {"user_id": ...} (Messages only): a
	// user-level key, after UserID and User (see UserIDs).
	MetadataUserID []byte
	// PreviousResponseID is top-level "previous_response_id" (Responses).
	PreviousResponseID []byte
	// ReasoningEffort is top-level "reasoning_effort" or, when that is absent,
	// "reasoning": {"effort": ...} (Responses).
	ReasoningEffort []byte
	// HasTools is a non-empty top-level "tools" array (any kind).
	HasTools bool
	// Messages is the number of elements of "messages" (Chat) or of "input"
	// (Responses; 1 for a string input).
	Messages int
	// LastRole is the role of the last message (Chat), or of the last input
	// item (Responses): its "role" for messages, "assistant" for
	// function_call, reasoning and other *_call items, "tool" for
	// function_call_output and other *_call_output items, else its "type".
	// nil when the last element is not an object or has no role.
	LastRole []byte
	// LastUserText is the text of the latest user message: the raw string
	// content when "content" is a string (aliases the body), or the text
	// parts joined by an escaped newline (`\n`, two bytes) in the View's own
	// buffer, so it is always valid raw JSON string content.
	LastUserText []byte
	// ToolResultIDs holds the tool_call_id of each tool message after the
	// last assistant message (Chat), the call_id of each *_call_output item
	// after the last message item (Responses), or the tool_use_id of each
	// tool_result block after the last assistant message (Messages).
	// Aliases the body.
	ToolResultIDs [][]byte
	// ToolResults counts those trailing tool results, with or without an
	// id (a tool message may omit tool_call_id; legacy role "function").
	ToolResults int
	// OpaqueReasoning: the history carries non-portable reasoning state; see
	// the package documentation for exactly what is detected.
	OpaqueReasoning bool
	// ReasoningID is the id (ReasoningID) of the last opaque reasoning
	// artifact of the history: the string of an "encrypted_content"
	// member, of a thinking part's (block's) "signature", of a
	// redacted_thinking or reasoning.encrypted part's "data". Zero when
	// there is none, or when the last one has no such string.
	ReasoningID ReasoningID
	// HasReasoningContent: an assistant message carries plain-text
	// "reasoning_content" (portable; does not set OpaqueReasoning).
	HasReasoningContent bool
	// History is the history key; see the package documentation. It lives in
	// the View's buffer: valid until the next Reset or Parse.
	History []byte
	// Prompt (Completions) is the "prompt" string, or the first element of a
	// "prompt" array of strings, or else the "text" string (/generate). Raw.
	Prompt []byte
	// Priority is top-level "priority" (vLLM's scheduling priority: lower
	// first), clamped to ±MaxPriority; 0 when absent or not an integer.
	// PriorityStart and PriorityEnd span the whole member, from its key's
	// opening quote to the end of its value, for removing it; -1 when the
	// member is absent, its key written with escapes, or its value not an
	// integer.
	Priority                   int
	PriorityStart, PriorityEnd int
	// TransferParams: the body has a top-level "kv_transfer_params" (its
	// key compared unescaped), which a disaggregated router removes from a
	// client's request (docs/design.md §9).
	TransferParams bool
	// MaxTokens is the completion limit the request asks for: the largest
	// non-negative integer of top-level "max_tokens", "max_completion_tokens"
	// and "max_output_tokens" and, for Generate, "sampling_params.max_tokens";
	// 0 when none is given (or none is an integer literal). Read by Parse
	// and ParseModel (top level only).
	MaxTokens int

	kind Kind

	// history construction
	hbuf      []byte      // body section from hbuf[base:]; the head is written just before it at the end
	base      int         // -1 until messages/input is met
	bodyText  bool        // the body section holds some text
	tools     []toolEntry // collected tool schemas (Chat, Responses)
	toolsLen  int         // bytes the tools take in the key
	instr     []byte      // Responses instructions
	instrSet  bool
	sys       [][]byte // Messages: the text pieces of the top-level "system"
	sysLen    int      // bytes the system takes in the key (0: none)
	sysSet    bool     // "system" was met
	toolsSeen bool
	memo      toolsMemo // kept across Reset and Parse
	effort    bool      // ReasoningEffort came from "reasoning_effort"
	promptP   bool      // Prompt came from "prompt"
	lastUser  int       // offset of the latest user message's content value, -1 none
	ubuf      []byte
	artifact  []byte // raw string content of the last opaque artifact met (nil: none); hashed by finish
	bad       int    // 1 + offset of the first invalid interpreted string byte, 0 none (markBad)
}

type toolEntry struct {
	name []byte
	raw  []byte
}

// toolsMemo is the last "tools" array a View walked and found valid, as a
// copy and the offsets of its entries in it. An agent sends the same tools
// every turn, and they are the structure-dense part of its body: a body
// whose "tools" value starts with these bytes holds this very array (a JSON
// value is delimited by its own bytes), so parseTools takes the entries from
// here instead of walking it again (docs/design.md §7).
//
// ParseModel, which validates the array's structure only (as Parse does for
// a kind that collects no tools), keeps its arrays too, with walked false:
// it may recall any memo, Parse only a walked one.
type toolsMemo struct {
	raw    []byte
	ents   []memoEntry
	walked bool // the entries were collected, and the strings they interpret checked
}

// holds reports whether the value at b[i] is the array in m, and returns
// the index after it.
func (m *toolsMemo) holds(b []byte, i int) (int, bool) {
	end := i + len(m.raw)
	return end, len(m.raw) > 0 && end <= len(b) && string(b[i:end]) == string(m.raw)
}

// keep makes a copy of b[i:end] the memo, with no entries yet and walked as
// given, or empties m when the array is larger than maxToolsMemo.
func (m *toolsMemo) keep(b []byte, i, end int, walked bool) {
	m.raw, m.ents, m.walked = m.raw[:0], m.ents[:0], false
	if end-i <= maxToolsMemo {
		m.raw, m.walked = append(m.raw, b[i:end]...), walked
	}
}

// memoEntry is a toolEntry as offsets into toolsMemo.raw; name < 0: no name.
type memoEntry struct{ name, nameEnd, raw, rawEnd int32 }

// maxToolsMemo bounds the copy a View keeps: larger tools arrays are walked
// every time.
const maxToolsMemo = 64 << 10

// Reset clears v, keeping the capacity of its buffers.
func (v *View) Reset() {
	ids := v.ToolResultIDs[:0]
	hbuf, ubuf, tools, sys, memo := v.hbuf[:0], v.ubuf[:0], v.tools[:0], v.sys[:0], v.memo
	clear(v.tools[:cap(v.tools)])
	clear(sys[:cap(sys)])
	clear(ids[:cap(ids)])
	*v = View{
		ModelStart:    -1,
		ModelEnd:      -1,
		PriorityStart: -1,
		PriorityEnd:   -1,
		ToolResultIDs: ids,
		hbuf:          hbuf,
		ubuf:          ubuf,
		tools:         tools,
		sys:           sys,
		memo:          memo,
		base:          -1,
		lastUser:      -1,
	}
}

// Parse fills v from body. It returns an error wrapping ErrMalformed (a
// *MalformedError with the offset) when body is not valid JSON or not a JSON
// object; it returns nil on any valid JSON object, even if fields are missing
// or of unexpected types (a wrong-typed field is ignored). Never panics.
// 0 allocations in steady state with a reused View.
//
// Validation (see the package documentation): the scanner checks the
// structure as sonic's validator does (FuzzValidate compares them), nesting
// deeper than 4096 is reported malformed, and the strings
// the router interprets (keys, model, ids, roles, types, names) must be valid
// JSON string content; content strings (text, arguments, schemas) are only
// delimited, and a bad escape or raw control byte there is accepted and
// forwarded for the worker to reject. Invalid UTF-8 inside strings is
// accepted (as encoding/json does) and passed through raw. On error v is
// Reset.
func Parse(v *View, body []byte, kind Kind) error {
	v.Reset()
	start := skipWS(body, 0)
	if !isByte(body, start, '{') {
		return malformed(start)
	}
	end := v.parse(body, start, kind)
	if end < 0 {
		v.Reset()
		return structureError(body)
	}
	if end = skipWS(body, end); end < len(body) {
		v.Reset()
		return malformed(end)
	}
	if v.bad != 0 {
		off := v.bad - 1
		v.Reset()
		return malformed(off)
	}
	return nil
}

// structureError is the error for a body the scanner found broken: sonic's
// validator, run on this rare path only, says where.
func structureError(body []byte) error {
	if ok, off := encoder.Valid(body); !ok {
		return malformed(off)
	}
	// Valid for sonic but not for the scanner: not expected (FuzzValidate,
	// TestValidateDepth compare the two); the body is refused all the same.
	return malformed(0)
}

// parse is Parse without its checks around the object (the bytes after it,
// bad interpreted strings): it walks the object at start, validating its
// structure as it goes, and returns the index after it, or -1 when it is not
// valid JSON. It is total on any input (the fuzz tests call it on arbitrary
// bytes).
func (v *View) parse(b []byte, start int, kind Kind) int {
	v.kind = kind
	var it objIter
	it.init(b, start, &v.bad, 1)
	for it.next() {
		i := it.val
		end := 0
		switch string(it.name()) {
		case "model":
			v.Model, v.ModelStart, v.ModelEnd = nil, -1, -1
			if s, e, ok := idAt(b, i, &v.bad); ok {
				v.Model, v.ModelStart, v.ModelEnd, end = s, i, e, e
			}
		case "stream":
			v.Stream = len(b)-i >= 4 && string(b[i:i+4]) == "true"
		case "session_params":
			v.SessionParamsID = nil
			if b[i] == '{' {
				end = v.sessionParams(b, i)
			}
		case "session_id":
			v.SessionID, end, _ = idAt(b, i, &v.bad)
		case "conversation_id":
			v.ConversationID, end, _ = idAt(b, i, &v.bad)
		case "user_id":
			v.UserID, end, _ = idAt(b, i, &v.bad)
		case "user":
			v.User, end, _ = idAt(b, i, &v.bad)
		case "previous_response_id":
			v.PreviousResponseID, end, _ = idAt(b, i, &v.bad)
		case "reasoning_effort":
			if s, e, ok := idAt(b, i, &v.bad); ok {
				v.ReasoningEffort, end, v.effort = s, e, true
			}
		case "reasoning":
			if !v.effort {
				v.ReasoningEffort = nil
			}
			if b[i] == '{' {
				end = v.reasoning(b, i)
			}
		case "tools":
			end = v.parseTools(b, i)
		case "messages":
			if kind == Chat || kind == Messages {
				end = v.parseMessages(b, i, kind == Messages)
			}
		case "system":
			if kind == Messages {
				end = v.parseSystem(b, i)
			}
		case "metadata":
			if kind == Messages {
				v.MetadataUserID = nil
				if b[i] == '{' {
					end = v.metadata(b, i)
				}
			}
		case "input":
			if kind == Responses {
				end = v.parseInput(b, i)
			}
		case "instructions":
			if kind == Responses {
				v.instr, end, v.instrSet = strAt(b, i)
			}
		case "prompt":
			if kind == Completions {
				end = v.parsePrompt(b, i)
			}
		case "text":
			if kind == Completions && !v.promptP {
				v.Prompt, end, _ = strAt(b, i)
			}
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			v.MaxTokens = max(v.MaxTokens, intAt(b, i)) // not consumed: skip validates it
		case "priority":
			v.priority(b, i) // not consumed: skip validates it
		case "kv_transfer_params":
			v.TransferParams = true
		case "token_ids":
			if kind == Generate {
				end = v.parseTokenIDs(b, i)
			}
		case "sampling_params":
			if kind == Generate && b[i] == '{' {
				end = v.samplingParams(b, i)
			}
		}
		if end == 0 {
			it.skip()
		} else {
			it.i = end
		}
	}
	if it.i < 0 || !v.finish(b) {
		return -1
	}
	return it.i
}

func (v *View) sessionParams(b []byte, i int) int {
	var it objIter
	it.init(b, i, &v.bad, 2)
	for it.next() {
		if string(it.name()) == "session_id" {
			var end int
			if v.SessionParamsID, end, _ = idAt(b, it.val, &v.bad); end > 0 {
				it.i = end
				continue
			}
		}
		it.skip()
	}
	return it.i
}

func (v *View) reasoning(b []byte, i int) int {
	var it objIter
	it.init(b, i, &v.bad, 2)
	for it.next() {
		if string(it.name()) == "effort" && !v.effort {
			var end int
			if v.ReasoningEffort, end, _ = idAt(b, it.val, &v.bad); end > 0 {
				it.i = end
				continue
			}
		}
		it.skip()
	}
	return it.i
}

func (v *View) parsePrompt(b []byte, i int) int {
	v.promptP = true
	v.Prompt = nil
	switch b[i] {
	case '"':
		var end int
		v.Prompt, end, _ = strAt(b, i)
		return end
	case '[':
		var it arrIter
		it.init(b, i, 2)
		for n := 0; it.next(); n++ {
			if n == 0 {
				if s, end, ok := strAt(b, it.val); ok {
					v.Prompt = s
					it.i = end
					continue
				}
			}
			it.skip()
		}
		return it.i
	}
	return 0
}

// parseTools sets HasTools and, for Chat and Responses, collects each tool's
// name and raw bytes for the history key.
func (v *View) parseTools(b []byte, i int) int {
	v.HasTools = false
	v.toolsSeen = true
	clear(v.tools)
	v.tools = v.tools[:0]
	v.toolsLen = 0
	if b[i] != '[' {
		return 0
	}
	collect := v.kind == Chat || v.kind == Responses || v.kind == Messages
	if collect {
		if end, ok := v.recallTools(b, i); ok {
			return end
		}
	}
	var it arrIter
	it.init(b, i, 2)
	for it.next() {
		v.HasTools = true
		s := it.val
		if !collect {
			it.skip()
			continue
		}
		var name []byte
		e := 0
		if b[s] == '{' {
			name, e = toolName(b, s, &v.bad)
		} else {
			e = skipValue(b, s, 2)
		}
		if e < 0 {
			return -1
		}
		v.tools = append(v.tools, toolEntry{name: name, raw: b[s:e]})
		v.toolsLen += 1 + e - s
		it.i = e
	}
	if collect && it.i >= 0 && v.bad == 0 {
		v.rememberTools(b, i, it.i)
	}
	return it.i
}

// recallTools is parseTools for the array at b[i] when it is the one in
// v.memo: it sets the tools from the memo and returns the index after the
// array and true, or false when the bytes differ.
func (v *View) recallTools(b []byte, i int) (int, bool) {
	m := &v.memo
	end, ok := m.holds(b, i)
	if !ok || !m.walked {
		return 0, false
	}
	for _, e := range m.ents {
		t := toolEntry{raw: b[i+int(e.raw) : i+int(e.rawEnd)]}
		if e.name >= 0 {
			t.name = b[i+int(e.name) : i+int(e.nameEnd)]
		}
		v.tools = append(v.tools, t)
		v.toolsLen += 1 + len(t.raw)
	}
	v.HasTools = len(m.ents) > 0
	return end, true
}

// rememberTools keeps b[i:end], the tools array just walked into v.tools
// with no invalid string, in v.memo.
func (v *View) rememberTools(b []byte, i, end int) {
	m := &v.memo
	if m.keep(b, i, end, true); !m.walked {
		return
	}
	// Every slice of b the walk made is b[x:y], whose capacity reaches
	// the end of b: the capacities tell the offset.
	off := func(s []byte) int32 { return int32(cap(b[i:]) - cap(s)) }
	for _, t := range v.tools {
		e := memoEntry{name: -1, raw: off(t.raw)}
		e.rawEnd = e.raw + int32(len(t.raw))
		if t.name != nil {
			e.name = off(t.name)
			e.nameEnd = e.name + int32(len(t.name))
		}
		m.ents = append(m.ents, e)
	}
}

// toolName returns the tool's function.name (chat) or name (Responses,
// Messages), and the index after the tool object.
func toolName(b []byte, i int, bad *int) (name []byte, end int) {
	var fn []byte
	var it objIter
	it.init(b, i, bad, 3)
	for it.next() {
		switch string(it.name()) {
		case "name":
			if s, e, ok := idAt(b, it.val, bad); ok {
				name = s
				it.i = e
				continue
			}
		case "function":
			if b[it.val] == '{' {
				var fit objIter
				fit.init(b, it.val, bad, 4)
				for fit.next() {
					if string(fit.name()) == "name" {
						if s, e, ok := idAt(b, fit.val, bad); ok {
							fn = s
							fit.i = e
							continue
						}
					}
					fit.skip()
				}
				it.i = fit.i
				continue
			}
		}
		it.skip()
	}
	if fn != nil {
		name = fn
	}
	return name, it.i
}

// ParseModel is Parse for a policy that routes by model alone: it fills
// only v.Model, v.ModelStart, v.ModelEnd, v.Stream and the top-level
// v.MaxTokens (as Parse does) and
// leaves every other field of v zero — no history key, no session fields.
// Every other member is skipped, not interpreted, but validated all the
// same: ParseModel rejects exactly what Parse(v, body, Other) rejects, with
// the same *MalformedError, and reads the same model and stream flag
// (TestParseModelMatchesParse). 0 allocations with a reused View; same
// lifetimes as Parse. See docs/design.md §7.
func ParseModel(v *View, body []byte) error {
	v.Reset()
	i := skipWS(body, 0)
	if !isByte(body, i, '{') {
		return malformed(i)
	}
	effort := false // as View.effort: reasoning.effort is then not read
	var it objIter
	it.init(body, i, &v.bad, 1)
	for it.next() {
		j := it.val
		switch string(it.name()) {
		case "model":
			v.Model, v.ModelStart, v.ModelEnd = nil, -1, -1
			if s, e, ok := idAt(body, j, &v.bad); ok {
				v.Model, v.ModelStart, v.ModelEnd = s, j, e
				it.i = e
				continue
			}
		case "stream":
			v.Stream = len(body)-j >= 4 && string(body[j:j+4]) == "true"
		case "max_tokens", "max_completion_tokens", "max_output_tokens":
			v.MaxTokens = max(v.MaxTokens, intAt(body, j))
		case "priority":
			v.priority(body, j)
		case "kv_transfer_params":
			v.TransferParams = true
		case "session_params", "reasoning":
			// Parse(…, Other) walks these objects: their keys and the one
			// member it reads are validated here too.
			want := "session_id"
			if string(it.name()) == "reasoning" {
				want = "effort"
			}
			if body[j] == '{' {
				var in objIter
				in.init(body, j, &v.bad, 2)
				for in.next() {
					if k := string(in.name()); k == want && (want == "session_id" || !effort) {
						if _, e, ok := idAt(body, in.val, &v.bad); ok {
							in.i = e
							continue
						}
					}
					in.skip()
				}
				it.i = in.i
				continue
			}
		case "tools":
			// Structure only, as Parse(…, Other) checks it; the memo
			// spares the walk of an agent's tools (see toolsMemo).
			if body[j] == '[' {
				end, ok := v.memo.holds(body, j)
				if !ok {
					if end = skipValue(body, j, 1); end >= 0 {
						v.memo.keep(body, j, end, false)
					}
				}
				it.i = end
				continue
			}
		case "session_id", "conversation_id", "user_id", "user", "previous_response_id", "reasoning_effort":
			// Interpreted by Parse, so validated here too.
			if _, e, ok := idAt(body, j, &v.bad); ok {
				effort = effort || string(it.name()) == "reasoning_effort"
				it.i = e
				continue
			}
		}
		it.skip()
	}
	var err error
	switch end := skipWS(body, it.i); {
	case it.i < 0:
		err = structureError(body)
	case end < len(body):
		err = malformed(end)
	case v.bad != 0:
		err = malformed(v.bad - 1)
	}
	if err != nil {
		v.Reset()
	}
	return err
}
