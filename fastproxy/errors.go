package fastproxy

import (
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// writeError answers with an OpenAI-style JSON error body:
// {"error":{"message":..., "type":..., "param":null, "code":...}}, or, on
// the Anthropic endpoints, Anthropic's shape (anthropicError).
//
// msg is client-facing: it names what the client can act on and never an
// internal address, raw upstream bytes or a request header (the log line of
// the request, found by its x-request-id, holds the details).
func writeError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	if isAnthropic(ctx.Request.URI().Path()) {
		ctx.Response.SetBodyRaw(anthropicError(status, msg))
		return
	}
	buf := make([]byte, 0, 96+len(msg))
	buf = append(buf, `{"error":{"message":`...)
	buf = appendJSONString(buf, msg)
	buf = append(buf, `,"type":`...)
	buf = appendJSONString(buf, typ)
	buf = append(buf, `,"param":null,"code":`...)
	buf = appendJSONString(buf, code)
	buf = append(buf, "}}"...)
	ctx.Response.SetBodyRaw(buf)
}

// isAnthropic reports whether path is an Anthropic Messages endpoint, whose
// clients (the Anthropic SDKs) read Anthropic-shaped errors.
func isAnthropic(path []byte) bool {
	return string(path) == pathMessages || string(path) == pathCountTokens
}

const pathCountTokens = "/v1/messages/count_tokens"

// anthropicError is the router's error in Anthropic's shape,
// {"type":"error","error":{"type":...,"message":...}}, its type chosen by
// the status as Anthropic's API does (the status stays the router's).
// Errors a worker made pass through unchanged.
func anthropicError(status int, msg string) []byte {
	var typ string
	switch status {
	case fasthttp.StatusUnauthorized:
		typ = "authentication_error"
	case fasthttp.StatusForbidden:
		typ = "permission_error"
	case fasthttp.StatusNotFound:
		typ = "not_found_error"
	case fasthttp.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case fasthttp.StatusTooManyRequests:
		typ = "rate_limit_error"
	case fasthttp.StatusServiceUnavailable, 529:
		typ = "overloaded_error"
	default:
		typ = "api_error" // 500, 502, 504, and a client gone (499)
		if status >= 400 && status < 499 {
			typ = "invalid_request_error" // 400, 405, 408, 409, 431
		}
	}
	buf := make([]byte, 0, 64+len(typ)+len(msg))
	buf = append(buf, `{"type":"error","error":{"type":`...)
	buf = appendJSONString(buf, typ)
	buf = append(buf, `,"message":`...)
	buf = appendJSONString(buf, msg)
	return append(buf, "}}"...)
}

// appendJSONString appends s as a JSON string (RFC 8259): control bytes as
// \u00XX, invalid UTF-8 as U+FFFD, so any input gives valid JSON.
func appendJSONString(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				dst = append(dst, `\ufffd`...)
			} else {
				dst = append(dst, s[i:i+n]...)
			}
			i += n
			continue
		}
		switch {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c == '\n':
			dst = append(dst, `\n`...)
		case c == '\r':
			dst = append(dst, `\r`...)
		case c == '\t':
			dst = append(dst, `\t`...)
		case c < 0x20 || c == 0x7f:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
		i++
	}
	return append(dst, '"')
}

func badRequest(ctx *fasthttp.RequestCtx, msg string) {
	writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "invalid_request", msg)
}

func notFound(ctx *fasthttp.RequestCtx, code, msg string) {
	writeError(ctx, fasthttp.StatusNotFound, "invalid_request_error", code, msg)
}

// noRoute answers a path the router does not serve.
func noRoute(ctx *fasthttp.RequestCtx) {
	notFound(ctx, "not_found", "no such endpoint")
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
		"method not allowed here; allowed: "+allow)
}

func noWorker(ctx *fasthttp.RequestCtx, model []byte) {
	msg := "no healthy worker is available"
	if len(model) > 0 {
		msg += " for model " + string(model)
	}
	writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "no_healthy_worker", msg)
}
