package fastproxy

import (
	"unicode/utf8"

	"github.com/valyala/fasthttp"
)

// writeError answers with an OpenAI-style JSON error body:
// {"error":{"message":..., "type":..., "param":null, "code":...}}.
//
// msg is client-facing: it names what the client can act on and never an
// internal address, raw upstream bytes or a request header (the log line of
// the request, found by its x-request-id, holds the details).
func writeError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
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
