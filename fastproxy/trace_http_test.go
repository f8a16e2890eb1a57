package fastproxy_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/tracing"
)

// otlpReceiver is an OTLP/HTTP trace receiver on loopback: it decodes each
// ExportTraceServiceRequest and keeps its spans.
type otlpReceiver struct {
	addr  string
	mu    sync.Mutex
	spans []*tracepb.Span
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	rc := &otlpReceiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want a protobuf POST to /v1/traces", http.StatusBadRequest)
			return
		}
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out) //nolint:errcheck
	})}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	rc.addr = ln.Addr().String()
	return rc
}

// trace returns the spans received of the trace id.
func (rc *otlpReceiver) trace(id []byte) []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range rc.spans {
		if bytes.Equal(s.TraceId, id) {
			out = append(out, s)
		}
	}
	return out
}

func (rc *otlpReceiver) all() []*tracepb.Span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]*tracepb.Span(nil), rc.spans...)
}

// attr returns a span attribute's value, a string's as it is, an int's or
// a bool's as int_value:N or bool_value:B, and whether it is set.
func attr(s *tracepb.Span, key string) (string, bool) {
	for _, kv := range s.Attributes {
		if kv.Key != key {
			continue
		}
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue, true
		case *commonpb.AnyValue_IntValue:
			return fmt.Sprintf("int_value:%d", v.IntValue), true
		case *commonpb.AnyValue_BoolValue:
			return fmt.Sprintf("bool_value:%v", v.BoolValue), true
		default:
			return kv.Value.String(), true
		}
	}
	return "", false
}

// lockedBuffer is a log sink the router's goroutines write concurrently.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestTraceOfAStreamFailedOverOnce: a streamed request whose first worker
// pushes back (503) before any byte and whose second one serves it
// exports, to an OTLP/HTTP receiver, one trace under the client's
// traceparent: the server span with the route, status, request id, model
// and tenant; two worker steps; two attempt spans (the first failed with
// its status and error class, the second with its first byte), and the
// stream's span. Each worker receives a traceparent whose trace id is the
// client's and whose parent is its own attempt's span; the log line of
// the failed attempt carries the trace id. An excluded path gets no span.
func TestTraceOfAStreamFailedOverOnce(t *testing.T) {
	chunks := [][]byte{
		[]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"he\"}}]}\n\n"),
		[]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"llo\"}}]}\n\n"),
		[]byte("data: [DONE]\n\n"),
	}
	busy := startEcho(t, []byte(`{"error":"busy"}`), chunks, 0)
	busy.status = 503
	good := startEcho(t, nil, chunks, 0)
	rc := startOTLPReceiver(t)
	tracer, err := tracing.New(tracing.Config{Endpoint: rc.addr, SamplingRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tracer.Shutdown(context.Background()) }) //nolint:errcheck
	logs := &lockedBuffer{}
	r := startRouter(t, []string{busy.url, good.url}, "round_robin", func(fc *fastproxy.Config, _ *loadview.Config) {
		fc.Tracer = tracer
		fc.ClientAPIKeys = []string{"acme:sk-acme"}
		fc.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	if resp, _ := do(t, "GET", r.url+"/health", "", nil); resp.StatusCode != 200 {
		t.Fatalf("/health: %d", resp.StatusCode)
	}

	// Round robin: one of two requests goes to the busy worker first (the
	// first one, unless the health checks took its turn).
	var traceID, clientSpan []byte
	var busyHdr, goodHdr string // the failed-over request's, as each worker got them
	for i := 0; i < 2 && traceID == nil; i++ {
		tid := bytes.Repeat([]byte{byte(0xa0 + i)}, 16)
		sid := bytes.Repeat([]byte{byte(0x10 + i)}, 8)
		tp := "00-" + hex.EncodeToString(tid) + "-" + hex.EncodeToString(sid) + "-01"
		resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", true),
			map[string]string{"traceparent": tp, "tracestate": "vendor=x", "Authorization": "Bearer sk-acme", "X-Request-Id": "rid-" + string(rune('a'+i))})
		if resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		<-good.got
		gh := strings.ToLower(<-good.gotHdr)
		select {
		case <-busy.got:
			traceID, clientSpan = tid, sid
			busyHdr, goodHdr = strings.ToLower(<-busy.gotHdr), gh
		default:
		}
	}
	if traceID == nil {
		t.Fatal("no request went to the busy worker")
	}

	// The spans of the failed-over request: 1 server, 2 worker steps, 2
	// attempts, 1 stream; the relay ends the last three after the stream.
	var spans []*tracepb.Span
	testwait.Until(t, "the failed-over request's 6 spans exported", func() bool {
		tracer.Flush(context.Background()) //nolint:errcheck
		spans = rc.trace(traceID)
		return len(spans) >= 6
	}, func() string { return "got " + spanNames(rc.trace(traceID)) })
	if len(spans) != 6 {
		t.Fatalf("spans: %s", spanNames(spans))
	}
	byName := map[string][]*tracepb.Span{}
	for _, s := range spans {
		byName[s.Name] = append(byName[s.Name], s)
	}
	roots := byName["POST /v1/chat/completions"]
	if len(roots) != 1 {
		t.Fatalf("no single server span: %s", spanNames(spans))
	}
	root := roots[0]
	if root.Kind != tracepb.Span_SPAN_KIND_SERVER || !bytes.Equal(root.ParentSpanId, clientSpan) {
		t.Fatalf("server span: kind %v, parent %x (client's %x)", root.Kind, root.ParentSpanId, clientSpan)
	}
	wantAttrs(t, root, map[string]string{"http.route": "/v1/chat/completions", "http.request.method": "POST",
		"http.response.status_code": "int_value:200", "gen_ai.request.model": "m", "warmroute.model": "m", "warmroute.tenant": "acme"})
	if rid, _ := attr(root, "warmroute.request_id"); !strings.HasPrefix(rid, "rid-") {
		t.Fatalf("request id %q", rid)
	}
	for _, s := range spans {
		if s != root && !bytes.Equal(s.ParentSpanId, root.SpanId) {
			t.Fatalf("%s is not a child of the server span", s.Name)
		}
	}
	if n := len(byName["worker_step"]); n != 2 {
		t.Fatalf("%d worker steps", n)
	}
	attempts := byName["attempt"]
	if len(attempts) != 2 {
		t.Fatalf("%d attempts", len(attempts))
	}
	first, second := attempts[0], attempts[1]
	if r0, _ := attr(first, "warmroute.attempt.retry"); r0 == "int_value:1" {
		first, second = second, first
	}
	for _, a := range attempts {
		if a.Kind != tracepb.Span_SPAN_KIND_CLIENT {
			t.Fatalf("attempt kind %v", a.Kind)
		}
	}
	wantAttrs(t, first, map[string]string{"warmroute.worker": busy.url, "warmroute.attempt.retry": "int_value:0",
		"http.response.status_code": "int_value:503", "error.type": "backpressure"})
	if first.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
		t.Fatalf("the failed attempt's status: %v", first.Status)
	}
	wantAttrs(t, second, map[string]string{"warmroute.worker": good.url, "warmroute.attempt.retry": "int_value:1",
		"http.response.status_code": "int_value:200"})
	if _, ok := attr(second, "error.type"); ok || second.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		t.Fatalf("the serving attempt failed: %v", second.Attributes)
	}
	if len(second.Events) != 1 || second.Events[0].Name != "first_byte" || len(first.Events) != 0 {
		t.Fatalf("first byte events: failed %v, served %v", first.Events, second.Events)
	}
	if !(first.EndTimeUnixNano <= second.StartTimeUnixNano) {
		t.Fatal("the second attempt started before the first ended")
	}
	steps := byName["worker_step"]
	for _, ws := range steps {
		if d, _ := attr(ws, "warmroute.decision"); d != "round_robin" {
			t.Fatalf("worker step decision %q", d)
		}
	}
	stream := byName["stream"][0]
	wantAttrs(t, stream, map[string]string{"warmroute.stream.cut": "bool_value:false", "warmroute.stream.continuations": "int_value:0"})
	if second.EndTimeUnixNano < stream.EndTimeUnixNano-uint64(time.Second) || root.EndTimeUnixNano < stream.EndTimeUnixNano {
		t.Fatal("the server span ended before the stream")
	}

	// Each worker got a traceparent in the client's trace, under its own
	// attempt, and the client's tracestate.
	for _, w := range []struct {
		name, hdr string
		attempt   *tracepb.Span
	}{{"busy", busyHdr, first}, {"serving", goodHdr, second}} {
		want := "traceparent: 00-" + hex.EncodeToString(traceID) + "-" + hex.EncodeToString(w.attempt.SpanId) + "-01\r\n"
		if strings.Count(w.hdr, "traceparent:") != 1 || !strings.Contains(w.hdr, want) || !strings.Contains(w.hdr, "tracestate: vendor=x\r\n") {
			t.Fatalf("the %s worker's trace context is not under its attempt (want %q):\n%s", w.name, want, w.hdr)
		}
	}

	// The log line of the failed attempt carries the trace id.
	line := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "upstream attempt failed") {
			line = l
		}
	}
	if !strings.Contains(line, "trace_id="+hex.EncodeToString(traceID)) {
		t.Fatalf("the failed attempt's log line has no trace id:\n%s", logs.String())
	}
	for _, s := range rc.all() {
		if strings.HasPrefix(s.Name, "GET") {
			t.Fatalf("an excluded path got a span: %s", s.Name)
		}
	}
}

func spanNames(spans []*tracepb.Span) string {
	var n []string
	for _, s := range spans {
		n = append(n, s.Name)
	}
	return strings.Join(n, ", ")
}

// wantAttrs fails unless s has each attribute: a string's value, or
// another type's in the protobuf text form (int_value:200).
func wantAttrs(t *testing.T, s *tracepb.Span, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, ok := attr(s, k); !ok || got != v {
			t.Errorf("%s: %s = %q, want %q", s.Name, k, got, v)
		}
	}
}

// TestTraceOfACutStreamContinued: a stream its worker cut and another
// worker continued is one trace whose first attempt ends as cut (error
// class stream), whose second attempt is a continuation, and whose stream
// span says it was not cut for the client and was continued once.
func TestTraceOfACutStreamContinued(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tracer, err := tracing.New(tracing.Config{Exporter: exp, SamplingRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tracer.Shutdown(context.Background()) }) //nolint:errcheck
	r, _, _ := resumeRouter(t, "cut", 4, func(fc *fastproxy.Config) { fc.Tracer = tracer })
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", storyRequest, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var spans tracetest.SpanStubs
	testwait.Until(t, "the server span ended with the stream", func() bool {
		tracer.Flush(context.Background()) //nolint:errcheck
		spans = exp.GetSpans()
		for _, s := range spans {
			if s.Name == "POST /v1/chat/completions" {
				return true
			}
		}
		return false
	})
	got := map[string][]tracetest.SpanStub{}
	for _, s := range spans {
		if s.SpanContext.TraceID() != spans[0].SpanContext.TraceID() {
			t.Fatal("the stream's spans are in two traces")
		}
		got[s.Name] = append(got[s.Name], s)
	}
	attempts := got["attempt"]
	if len(attempts) != 2 || len(got["stream"]) != 1 || len(got["worker_step"]) != 1 {
		t.Fatalf("spans: %v", got)
	}
	kv := func(s tracetest.SpanStub, key string) string {
		for _, a := range s.Attributes {
			if string(a.Key) == key {
				return a.Value.Emit()
			}
		}
		return ""
	}
	cut, cont := attempts[0], attempts[1]
	if kv(cut, "warmroute.attempt.continuation") == "true" {
		cut, cont = cont, cut
	}
	if kv(cut, "error.type") != "stream" || kv(cont, "warmroute.attempt.continuation") != "true" || kv(cont, "error.type") != "" ||
		kv(cut, "warmroute.worker") == kv(cont, "warmroute.worker") {
		t.Fatalf("attempts: cut %v, continuation %v", cut.Attributes, cont.Attributes)
	}
	if len(cont.Events) != 1 || cont.Events[0].Name != "first_byte" {
		t.Fatalf("the continuation's first byte: %v", cont.Events)
	}
	st := got["stream"][0]
	if kv(st, "warmroute.stream.cut") != "false" || kv(st, "warmroute.stream.continuations") != "1" {
		t.Fatalf("stream span %v", st.Attributes)
	}
}

// TestTraceQueueWait: a request that waited in the router's queue has a
// queue_wait span under its server span, as long as the wait; one that
// went straight to its worker has none.
func TestTraceQueueWait(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tracer, err := tracing.New(tracing.Config{Exporter: exp, SamplingRatio: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tracer.Shutdown(context.Background()) }) //nolint:errcheck
	arrived, release := make(chan struct{}, 2), make(chan struct{})
	w := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			return // health
		}
		arrived <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`) //nolint:errcheck
	}))
	t.Cleanup(w.Close)
	r := startRouter(t, []string{w.URL}, "round_robin", func(fc *fastproxy.Config, _ *loadview.Config) {
		fc.Tracer, fc.MaxConcurrentRequests, fc.QueueSize = tracer, 1, 10
	})
	done := make(chan int, 2)
	send := func(rid string) {
		resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), map[string]string{"X-Request-Id": rid})
		done <- resp.StatusCode
	}
	go send("first")
	<-arrived
	go send("waiting")
	testwait.Until(t, "the second request waiting in the queue", func() bool { return queued(r) == 1 })
	close(release)
	for range 2 {
		if c := <-done; c != 200 {
			t.Fatalf("status %d", c)
		}
	}
	var spans tracetest.SpanStubs
	testwait.Until(t, "both server spans exported", func() bool {
		tracer.Flush(context.Background()) //nolint:errcheck
		spans = exp.GetSpans()
		n := 0
		for _, s := range spans {
			if s.Name == "POST /v1/chat/completions" {
				n++
			}
		}
		return n == 2
	})
	roots := map[string]tracetest.SpanStub{}
	var waits []tracetest.SpanStub
	for _, s := range spans {
		switch s.Name {
		case "POST /v1/chat/completions":
			for _, a := range s.Attributes {
				if a.Key == "warmroute.request_id" {
					roots[a.Value.AsString()] = s
				}
			}
		case "queue_wait":
			waits = append(waits, s)
		}
	}
	if len(waits) != 1 {
		t.Fatalf("%d queue_wait spans", len(waits))
	}
	q, waiting := waits[0], roots["waiting"]
	if q.Parent.SpanID() != waiting.SpanContext.SpanID() || q.SpanContext.TraceID() != waiting.SpanContext.TraceID() {
		t.Fatal("the queue_wait span is not the waiting request's")
	}
	if !q.EndTime.After(q.StartTime) || q.StartTime.Before(waiting.StartTime) {
		t.Fatalf("queue_wait from %v to %v, request from %v", q.StartTime, q.EndTime, waiting.StartTime)
	}
	for _, a := range q.Attributes {
		if a.Key == "warmroute.queue.result" && a.Value.AsString() != "admitted" {
			t.Fatalf("result %q", a.Value.AsString())
		}
	}
}

// TestTraceNotSampled: at --otel-sampling-ratio 0 a request the client
// sent no traceparent records no span, and its worker still gets a
// traceparent, not sampled, whose trace id is the one its log lines carry.
func TestTraceNotSampled(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tracer, err := tracing.New(tracing.Config{Exporter: exp, SamplingRatio: 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tracer.Shutdown(context.Background()) }) //nolint:errcheck
	busy := startEcho(t, []byte(`{}`), nil, 0)
	busy.status = 503
	good := startEcho(t, []byte(`{}`), nil, 0)
	logs := &lockedBuffer{}
	r := startRouter(t, []string{busy.url, good.url}, "round_robin", func(fc *fastproxy.Config, _ *loadview.Config) {
		fc.Tracer = tracer
		fc.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	failedOver := 0
	for range 2 {
		if resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), nil); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		<-good.got
		h := strings.ToLower(<-good.gotHdr)
		i := strings.Index(h, "traceparent: 00-")
		if i < 0 || !strings.HasPrefix(h[i+16+32+1+16:], "-00\r\n") {
			t.Fatalf("the worker's traceparent:\n%s", h)
		}
		select {
		case <-busy.got:
			<-busy.gotHdr
			tid := h[i+16 : i+16+32]
			if !strings.Contains(logs.String(), "trace_id="+tid) {
				t.Fatalf("the failed attempt's log line lacks trace_id=%s:\n%s", tid, logs.String())
			}
			failedOver++
		default:
		}
	}
	if failedOver == 0 {
		t.Fatal("no request went to the busy worker")
	}
	tracer.Flush(context.Background()) //nolint:errcheck
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("%d spans recorded at ratio 0", n)
	}
}
