package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestTraceFlags: every trace flag but --enable-trace needs it; the
// endpoint takes the vLLM router's host:port and a URL; the ratio is 0 to 1.
func TestTraceFlags(t *testing.T) {
	for _, bad := range [][]string{
		{"--otlp-traces-endpoint", "c:4318"},
		{"--otel-sampling-ratio", "0.5"},
		{"--otel-excluded-paths", "/x"},
		{"--enable-trace", "--otlp-traces-endpoint", "collector"},
		{"--enable-trace", "--otlp-traces-endpoint", "grpc://c:4317"},
		{"--enable-trace", "--otel-sampling-ratio", "1.5"},
		{"--enable-trace", "--otel-sampling-ratio", "-0.1"},
		{"--enable-trace", "--otel-sampling-ratio", "NaN"},
		{"--enable-trace", "--otel-excluded-paths", "health"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	for _, good := range [][]string{
		{"--enable-trace"},
		{"--enable-trace", "--otlp-traces-endpoint", "otel-collector:4318", "--otel-sampling-ratio", "0.1"},
		{"--enable-trace", "--otlp-traces-endpoint", "https://otel.example:4318/v1/traces", "--otel-excluded-paths", "/health,/v1/models"},
	} {
		o, err := parseFlags(good, io.Discard)
		if err != nil {
			t.Errorf("%v: %v", good, err)
			continue
		}
		if !o.enableTrace {
			t.Errorf("%v: tracing off", good)
		}
	}
	o, _ := parseFlags([]string{"--enable-trace", "--otel-excluded-paths", "/a,/b", "--otel-excluded-paths", "/c"}, io.Discard)
	if strings.Join(o.otelExcludedPaths, " ") != "/a /b /c" {
		t.Fatalf("excluded paths %v", o.otelExcludedPaths)
	}
}

// TestTracedRouterExportsOnShutdown: the binary with --enable-trace and a
// URL endpoint traces a demo request to a logical model (its model step
// included), and the spans reach the collector by the time it exits.
func TestTracedRouterExportsOnShutdown(t *testing.T) {
	var mu sync.Mutex
	names := map[string]int{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/custom/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names[s.Name]++
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	})}
	go srv.Serve(ln) //nolint:errcheck
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	addr, code := startMain(t, ctx, "--demo", "--demo-workers", "2", "--enable-trace",
		"--otlp-traces-endpoint", "http://"+ln.Addr().String()+"/custom/traces")
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"auto","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if _, err := http.Get("http://" + addr + "/health"); err != nil {
		t.Fatal(err)
	}
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("exit %d", c)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, n := range []string{"POST /v1/chat/completions", "model_step", "worker_step", "attempt"} {
		if names[n] != 1 {
			t.Errorf("%d %q spans exported; all: %v", names[n], n, names)
		}
	}
	if len(names) != 4 {
		t.Errorf("spans exported: %v (an excluded /health, or a span too many)", names)
	}
}
