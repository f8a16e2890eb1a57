package fastproxy

import (
	"bytes"
	"crypto/sha256"
	"fmt"

	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/reqview"
)

// sessionKey returns the request's exact-match session key (docs/design.md §4), first
// non-empty of: body session_params.session_id; header x-session-id; header
// x-conversation-id; body session_id, conversation_id; header x-user-id; body
// user_id, user, metadata.user_id (Anthropic Messages). Session-level ids win over user-level ids whatever the
// channel, and a body value is JSON-unescaped so that one session sent by
// header or by body is one key. Per-request ids (x-request-id, x-trace-id,
// x-correlation-id) are never keys.
//
// The result aliases the request or scratch: valid until either is reused.
func sessionKey(h *fasthttp.RequestHeader, v *reqview.View, scratch *[]byte) []byte {
	k := rawSessionKey(h, v, scratch)
	if len(k) > maxSessionKey { // kept for an hour in two maps: bound what a client can store
		*scratch = fmt.Appendf((*scratch)[:0], "sha256:%x", sha256.Sum256(k))
		return *scratch
	}
	return k
}

// maxSessionKey is the longest session key kept as sent; longer ones are
// replaced by their SHA-256, which identifies the session just as well.
const maxSessionKey = 256

func rawSessionKey(h *fasthttp.RequestHeader, v *reqview.View, scratch *[]byte) []byte {
	if k := bodyKey(v.SessionParamsID, scratch); len(k) > 0 {
		return k
	}
	if k := h.Peek("X-Session-Id"); len(k) > 0 {
		return k
	}
	if k := h.Peek("X-Conversation-Id"); len(k) > 0 {
		return k
	}
	for _, b := range [...][]byte{v.SessionID, v.ConversationID} {
		if k := bodyKey(b, scratch); len(k) > 0 {
			return k
		}
	}
	if k := h.Peek("X-User-Id"); len(k) > 0 {
		return k
	}
	for _, b := range v.UserIDs() {
		if k := bodyKey(b, scratch); len(k) > 0 {
			return k
		}
	}
	return nil
}

// bodyKey decodes a raw JSON string value; the rare escaped one into scratch.
func bodyKey(raw []byte, scratch *[]byte) []byte {
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw
	}
	q := append(append(append((*scratch)[:0], '"'), raw...), '"')
	var s string
	if err := sonic.Unmarshal(q, &s); err != nil {
		return raw
	}
	*scratch = append(q[:0], s...)
	return *scratch
}
