package fastproxy

import (
	"strconv"

	"github.com/valyala/fasthttp"
)

// writeError answers with an OpenAI-style JSON error body:
// {"error":{"message":..., "type":..., "param":null, "code":...}}.
func writeError(ctx *fasthttp.RequestCtx, status int, typ, code, msg string) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b := ctx.Response.BodyWriter()
	buf := make([]byte, 0, 96+len(msg))
	buf = append(buf, `{"error":{"message":`...)
	buf = strconv.AppendQuote(buf, msg)
	buf = append(buf, `,"type":`...)
	buf = strconv.AppendQuote(buf, typ)
	buf = append(buf, `,"param":null,"code":`...)
	buf = strconv.AppendQuote(buf, code)
	buf = append(buf, "}}"...)
	_, _ = b.Write(buf)
}

func badRequest(ctx *fasthttp.RequestCtx, msg string) {
	writeError(ctx, fasthttp.StatusBadRequest, "invalid_request_error", "invalid_request", msg)
}

func notFound(ctx *fasthttp.RequestCtx, code, msg string) {
	writeError(ctx, fasthttp.StatusNotFound, "invalid_request_error", code, msg)
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
		"method "+string(ctx.Method())+" is not allowed on "+string(ctx.Path())+"; allowed: "+allow)
}

func noWorker(ctx *fasthttp.RequestCtx, model []byte) {
	msg := "no healthy worker is available"
	if len(model) > 0 {
		msg += " for model " + strconv.Quote(string(model))
	}
	writeError(ctx, fasthttp.StatusServiceUnavailable, "service_unavailable_error", "no_healthy_worker", msg)
}
