package fastproxy

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/tracing"
)

// Span names (docs/reference.md, "Traces").
const (
	spanModelStep  = "model_step"
	spanQueueWait  = "queue_wait"
	spanWorkerStep = "worker_step"
	spanAttempt    = "attempt"
	spanStream     = "stream"
	eventFirstByte = "first_byte"
)

// reqTrace is one request's spans (docs/design.md §8.7): the
// server span, and the stages' children. nil when tracing is off or the
// path is excluded: every method is then a no-op that allocates nothing,
// inlined where the stages call it. Not pooled: a relay may end its spans
// after the handler returned.
type reqTrace struct {
	tr      *tracing.Tracer
	ctx     context.Context // holds the server span
	root    trace.Span
	attempt trace.Span // the current attempt; a relay ends a streamed one
	actx    context.Context
	stream  trace.Span // the relay's, from the answer's headers to its end
	n       int        // attempts started
	relayed bool       // a relay took the current attempt over
	route   string     // http.route; "": not a fixed route
	rec     bool       // the trace is sampled: the stages record spans; else only the worker's traceparent is set

	// Set on the server span when it ends, in one call: the SDK dedupes
	// attributes on each.
	model, physical, tenant string
	wasAdmitted             bool
}

// startTrace starts the server span of a request to path (nil when the
// path is excluded), the child of the client's traceparent when it sent
// one.
func (s *Server) startTrace(ctx *fasthttp.RequestCtx, path string, ep endpoint, rid []byte) *reqTrace {
	if s.tracer.Excluded(path) {
		return nil
	}
	route := ""
	switch {
	case ep == epResponseByID:
		route = pathResponses + "/{id}"
	case s.rm[path] != nil, ep == epWorkerPath, ep == epModels: // fixed paths: a low-cardinality route
		route = path
	}
	method := string(ctx.Method())
	name := method
	if route != "" {
		name += " " + route
	}
	pctx := s.tracer.Extract(context.Background(), &ctx.Request.Header)
	c, root := s.tracer.Tracer().Start(pctx, name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(ctx.Time()),
		trace.WithAttributes(attribute.String("http.request.method", method),
			attribute.String("warmroute.request_id", string(rid))))
	return &reqTrace{tr: s.tracer, ctx: c, root: root, route: route, rec: root.IsRecording()}
}

// end ends the server span with the response's status (a relay's: its
// stream's end).
func (t *reqTrace) end(status int, cut bool) {
	if t == nil {
		return
	}
	if !t.root.IsRecording() {
		t.root.End()
		return
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	attrs = append(attrs, attribute.Int("http.response.status_code", status))
	if t.route != "" {
		attrs = append(attrs, attribute.String("http.route", t.route))
	}
	if t.wasAdmitted {
		attrs = append(attrs, attribute.String("warmroute.model", t.physical), attribute.String("warmroute.tenant", t.tenant))
	}
	if t.model != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", t.model))
	}
	if cut {
		attrs = append(attrs, attribute.Bool("warmroute.stream.cut", true))
	}
	t.root.SetAttributes(attrs...)
	if status >= 500 || cut {
		t.root.SetStatus(codes.Error, "")
	}
	t.root.End()
}

// log is l with the request's trace id, when it is traced.
func (t *reqTrace) log(l *slog.Logger) *slog.Logger {
	if t == nil {
		return l
	}
	return l.With("trace_id", t.root.SpanContext().TraceID().String())
}

// clock is the start of a stage's span; zero when not traced.
func (t *reqTrace) clock() time.Time {
	if t == nil || !t.rec {
		return time.Time{}
	}
	return time.Now()
}

// admitted records, on the server span, the request's model and tenant
// once admission has run, and its wait in the queue as a span of its own
// when it waited (err: how the wait ended).
func (t *reqTrace) admitted(st *reqState, err error) {
	if t != nil && t.rec {
		t.admittedSlow(st, err)
	}
}

func (t *reqTrace) admittedSlow(st *reqState, err error) {
	// Copies: the names may alias the request's body or pooled state, and
	// the exporter reads the spans after the request ended.
	t.wasAdmitted, t.physical, t.tenant = true, strings.Clone(st.req.Model), st.tenant
	if st.view != nil && len(st.view.Model) > 0 {
		t.model = strings.Clone(st.modelName())
	}
	w := st.ticket.Waited
	if w <= 0 {
		return
	}
	end := time.Now()
	result := "admitted"
	if err != nil {
		result = err.Error()
	}
	_, sp := t.tr.Tracer().Start(t.ctx, spanQueueWait, trace.WithTimestamp(end.Add(-w)),
		trace.WithAttributes(attribute.String("warmroute.model", t.physical),
			attribute.Float64("warmroute.queue.waited_seconds", w.Seconds()),
			attribute.String("warmroute.queue.result", result)))
	sp.End(trace.WithTimestamp(end))
}

// modelStep records the model step's choice for a logical model (logical
// → physical, action and reason), from start.
func (t *reqTrace) modelStep(start time.Time, logical string, sel *saar.Selection) {
	if t != nil && t.rec {
		t.modelStepSlow(start, logical, sel)
	}
}

func (t *reqTrace) modelStepSlow(start time.Time, logical string, sel *saar.Selection) {
	_, sp := t.tr.Tracer().Start(t.ctx, spanModelStep, trace.WithTimestamp(start),
		trace.WithAttributes(attribute.String("warmroute.model.logical", strings.Clone(logical)), // may alias the body
			attribute.String("warmroute.model.physical", sel.Model),
			attribute.String("warmroute.model_step.decision", sel.Decision),
			attribute.String("warmroute.model_step.phase", sel.Phase),
			attribute.String("warmroute.model_step.action", sel.Action),
			attribute.String("warmroute.model_step.reason", sel.Reason)))
	if sel.Model == "" {
		sp.SetStatus(codes.Error, "no physical model")
	}
	sp.End()
}

// workerStep records an attempt's worker choice, from start: its decision
// label, its worker, and the estimate it went by (the key's characters the
// worker held, the worker's load).
func (t *reqTrace) workerStep(start time.Time, st *reqState, ch route.Choice) {
	if t != nil && t.rec {
		t.workerStepSlow(start, st, ch)
	}
}

func (t *reqTrace) workerStepSlow(start time.Time, st *reqState, ch route.Choice) {
	attrs := []attribute.KeyValue{attribute.String("warmroute.decision", ch.Decision),
		attribute.Int("warmroute.candidates", len(st.req.Workers))}
	if ch.Worker != nil {
		held, key := ch.Held()
		attrs = append(attrs, attribute.String("warmroute.worker", ch.Worker.URL()),
			attribute.Int("warmroute.estimate.prefix_held_chars", held),
			attribute.Int("warmroute.estimate.prefix_chars", key),
			attribute.Int64("warmroute.estimate.worker_load", ch.Worker.FleetLoad()))
	}
	_, sp := t.tr.Tracer().Start(t.ctx, spanWorkerStep, trace.WithTimestamp(start), trace.WithAttributes(attrs...))
	if ch.Worker == nil {
		sp.SetStatus(codes.Error, "no healthy candidate")
	}
	sp.End()
}

// attemptStart starts attempt n's span (client kind) to w and sets req's
// traceparent and tracestate to it, so that the worker's spans are its
// children; continuation: a stream's continuation (resume.go).
func (t *reqTrace) attemptStart(h *fasthttp.RequestHeader, w *loadview.Worker, continuation bool) {
	if t != nil {
		t.attemptStartSlow(h, w, continuation)
	}
}

func (t *reqTrace) attemptStartSlow(h *fasthttp.RequestHeader, w *loadview.Worker, continuation bool) {
	if !t.rec { // not sampled: the worker hears so, under the server span
		t.tr.Inject(t.ctx, h)
		return
	}
	if t.attempt != nil { // a continuation's: the cut stream's attempt ends here
		t.attempt.SetAttributes(attribute.String("error.type", kindStream))
		t.attempt.SetStatus(codes.Error, kindStream)
		t.attempt.End()
	}
	t.actx, t.attempt = t.tr.Tracer().Start(t.ctx, spanAttempt, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("warmroute.worker", w.URL()),
			attribute.Int("warmroute.attempt.retry", t.n),
			attribute.Bool("warmroute.attempt.continuation", continuation),
			attribute.String("server.address", w.Client().Addr)))
	t.n++
	t.relayed = false
	t.tr.Inject(t.actx, h)
}

// attemptEnd records the attempt's outcome: the status, the error class of
// a failure. It ends the span unless a relay took it over (streamed).
func (t *reqTrace) attemptEnd(out outcome, fail failure, status int) {
	if t != nil {
		t.attemptEndSlow(out, fail, status)
	}
}

func (t *reqTrace) attemptEndSlow(out outcome, fail failure, status int) {
	sp := t.attempt
	if sp == nil {
		return
	}
	if fail.status != 0 {
		status = fail.status
	}
	switch {
	case fail.kind != "" && status != 0 && fail.kind != kindCanceled:
		sp.SetAttributes(attribute.Int("http.response.status_code", status), attribute.String("error.type", fail.kind))
	case fail.kind != "":
		sp.SetAttributes(attribute.String("error.type", fail.kind))
	case status != 0:
		sp.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if fail.kind != "" {
		sp.SetStatus(codes.Error, fail.kind)
	}
	if !t.relayed || out != sent {
		sp.End()
		t.attempt = nil
	}
}

// relay hands the current attempt to a relay, which ends it with its
// stream, and starts the stream's span.
func (t *reqTrace) relay() {
	if t != nil && t.attempt != nil {
		t.relayed = true
		_, t.stream = t.tr.Tracer().Start(t.ctx, spanStream)
	}
}

// firstByte marks the first byte of the current attempt's answer.
func (t *reqTrace) firstByte() {
	if t != nil && t.attempt != nil {
		t.attempt.AddEvent(eventFirstByte)
		if t.stream != nil {
			t.stream.AddEvent(eventFirstByte)
		}
	}
}

// streamEnd ends a relayed stream's span and its attempt's: whether the
// worker cut it, and the continuations made.
func (t *reqTrace) streamEnd(cut bool, resumes int, clientLeft bool) {
	if t == nil {
		return
	}
	if sp := t.stream; sp != nil {
		sp.SetAttributes(attribute.Bool("warmroute.stream.cut", cut),
			attribute.Int("warmroute.stream.continuations", resumes),
			attribute.Bool("warmroute.stream.client_left", clientLeft))
		if cut {
			sp.SetStatus(codes.Error, "stream_cut")
		}
		sp.End()
		t.stream = nil
	}
	if sp := t.attempt; sp != nil {
		if cut {
			sp.SetAttributes(attribute.String("error.type", kindStream))
			sp.SetStatus(codes.Error, kindStream)
		}
		sp.End()
		t.attempt = nil
	}
}

// continuation records how a continuation's attempt went (err nil: the
// stream goes on from it, and the relay ends it).
func (t *reqTrace) continuation(err error, status int) {
	if t == nil || t.attempt == nil {
		return
	}
	if err == nil {
		t.relayed = true
		return
	}
	class := "continuation_failed"
	if err == errNotOK {
		class = kindStatus
	}
	t.attempt.SetAttributes(attribute.String("error.type", class))
	if status != 0 {
		t.attempt.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	t.attempt.SetStatus(codes.Error, "continuation failed")
	t.attempt.End()
	t.attempt = nil
}
