package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/simworker"
)

// startMain runs the router as main does, and returns its address and a
// channel with its exit code. Cancelling ctx is the signal.
func startMain(t *testing.T, ctx context.Context, args ...string) (string, chan int) {
	t.Helper()
	return startMainHUP(t, ctx, nil, io.Discard, args...)
}

func TestDemoModeServesAutoAndStopsCleanly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addr, code := startMain(t, ctx, "--demo", "--demo-workers", "3")
	body := `{"model":"auto","stream":true,"max_tokens":40,"messages":[{"role":"user","content":"hello"}]}`
	done, started := make(chan string, 1), make(chan struct{})
	go func() {
		resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
		close(started) // headers arrived: the stream is in flight (40 tokens × 10 ms)
		if err != nil {
			done <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- resp.Header.Get("x-vsr-selected-model") + " " + string(b)
	}()
	<-started
	cancel() // SIGTERM
	got := <-done
	if !strings.HasPrefix(got, "sim-") || !strings.Contains(got, "[DONE]") {
		t.Fatalf("in-flight stream did not finish across shutdown: %.200q", got)
	}
	waitExit0(t, code)
}

// waitExit0 checks that a router started by startMain, its ctx cancelled
// (the signal), exits with 0 within 10 s.
func waitExit0(t *testing.T, code chan int) {
	t.Helper()
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit code %d after a signal, want 0", c)
		}
	case <-time.After(10 * time.Second):
		t.Error("router did not exit after the signal")
	}
}

func TestBadFlagsExit2(t *testing.T) {
	f := func(args ...string) {
		t.Helper()
		if c := run(context.Background(), args, io.Discard, io.Discard); c != 2 {
			t.Errorf("run(%v) = %d, want 2", args, c)
		}
	}
	f("--policy", "nope")
	f("--log-level", "loud")
	f("--no-such-flag")
	f("stray-argument")
	f("--config", filepath.Join(t.TempDir(), "missing.yaml"))
	withRouter := filepath.Join(t.TempDir(), "router.yaml") // a section the router never reads is refused, not ignored
	if err := os.WriteFile(withRouter, []byte("router:\n  port: 8080\nmodels:\n  - name: a\n    quality_score: 0.5\n    workers: [\"http://127.0.0.1:1\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f("--config", withRouter)
}

func TestWorkerURLsTakeSeveralValues(t *testing.T) {
	o, err := parseFlags([]string{"--worker-urls", "http://a:1", "http://b:2", "--policy", "round_robin", "--worker-urls=http://c:3,http://d:4"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(o.workerURLs, " "); got != "http://a:1 http://b:2 http://c:3 http://d:4" || o.policy != "round_robin" {
		t.Fatalf("worker urls %q policy %q", got, o.policy)
	}
}

func TestConfigErrorNamesTheLine(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(p, []byte("models:\n  - name: a\n    quality_score: 0.5\n    bogus: 1\n"), 0o644) //nolint:errcheck
	var stderr strings.Builder
	if c := run(context.Background(), []string{"--config", p, "--port", "0"}, io.Discard, &stderr); c != 2 {
		t.Fatalf("exit %d", c)
	}
	if !strings.Contains(stderr.String(), "line 4") {
		t.Fatalf("error does not name line 4: %s", stderr.String())
	}
}

func TestReplayLogReproduces(t *testing.T) {
	log := filepath.Join(t.TempDir(), "replay.jsonl")
	ctx, cancel := context.WithCancel(context.Background())
	addr, code := startMain(t, ctx, "--demo", "--replay-log", log, "--demo-workers", "3")
	for i, text := range []string{"hello", "prove the theorem step by step", "debug this python", "thanks"} {
		body := `{"model":"auto","max_tokens":4,"messages":[{"role":"user","content":"` + text + `"}]}`
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("X-Session-ID", "replayed")
		req.Header.Set("x-warmroute-complexity", []string{"0.1", "0.9", "0.5", "0.2"}[i])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck
		resp.Body.Close()
	}
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("exit %d", c)
	}
	var out, errOut strings.Builder
	if c := run(context.Background(), []string{"replay", log}, &out, &errOut); c != 0 {
		t.Fatalf("replay exit %d: %s %s", c, out.String(), errOut.String())
	}
	if !strings.Contains(errOut.String(), "all 4 decisions reproduced") {
		t.Fatalf("replay said: %s", errOut.String())
	}
	// A record whose outcome was tampered with is reported.
	b, _ := os.ReadFile(log)
	tampered := filepath.Join(t.TempDir(), "tampered.jsonl")
	os.WriteFile(tampered, []byte(strings.Replace(string(b), `"action":"first"`, `"action":"stay"`, 1)), 0o644) //nolint:errcheck
	if c := run(context.Background(), []string{"replay", tampered}, io.Discard, io.Discard); c != 1 {
		t.Fatalf("tampered replay exit %d, want 1", c)
	}
}

// A router given no source of workers refuses to start and says how to give
// one, rather than serving simulated workers nobody asked for.
func TestNoWorkersNoDemoExits2(t *testing.T) {
	f := func(args ...string) {
		t.Helper()
		var stderr strings.Builder
		if c := run(context.Background(), append([]string{"--port", "0", "--prometheus-port", "0"}, args...), io.Discard, &stderr); c != 2 {
			t.Fatalf("run(%v) = %d, want 2", args, c)
		}
		for _, want := range []string{"--worker-urls", "--demo", "--worker-dns", "--config", "--allow-empty-fleet"} {
			if !strings.Contains(stderr.String(), want) {
				t.Fatalf("run(%v): message %q does not name %s", args, stderr.String(), want)
			}
		}
	}
	f()
	f("--policy", "round_robin")
	p := filepath.Join(t.TempDir(), "no-workers.yaml") // models, but no worker serves them
	if err := os.WriteFile(p, []byte("models:\n  - name: a\n    quality_score: 0.5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f("--config", p)
}

// --allow-empty-fleet starts a router that the admin API fills: it is up,
// not ready, and routes once a worker is added.
func TestAllowEmptyFleetStartsEmpty(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, code := startMain(t, ctx, "--allow-empty-fleet", "--admin-api-key", "k")
	resp, err := http.Get("http://" + addr + "/readiness")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readiness of an empty fleet: %d, want 503", resp.StatusCode)
	}
	w, url, err := simworker.Start(simworker.Config{Models: []string{"m"}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	req, _ := http.NewRequest("POST", "http://"+addr+"/workers", strings.NewReader(`{"url":"`+url+`"}`))
	req.Header.Set("Authorization", "Bearer k")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /workers: %d", resp.StatusCode)
	}
	resp, err = http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat after the admin API added a worker: %d", resp.StatusCode)
	}
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("exit code %d", c)
	}
}

// TestClientKeyFileErrorNamesTheLine: a malformed --client-api-keys line
// stops the start (exit 1) naming its line in the file, comments and blank
// lines counted, and never quoting the key.
func TestClientKeyFileErrorNamesTheLine(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(p, []byte("# tenants\nalpha:sk-alpha-secret rpm=10\n\nbeta:sk-beta-secret rpm=ten\n"), 0o600) //nolint:errcheck
	var stderr strings.Builder
	if c := run(context.Background(), []string{"--worker-urls", "http://127.0.0.1:1", "--client-api-keys", p,
		"--port", "0", "--prometheus-port", "0"}, io.Discard, &stderr); c != 1 {
		t.Fatalf("exit %d: %s", c, stderr.String())
	}
	if !strings.Contains(stderr.String(), "line 4") || strings.Contains(stderr.String(), "secret") {
		t.Fatalf("error does not name line 4, or quotes a key: %s", stderr.String())
	}
}
