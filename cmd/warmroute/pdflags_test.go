package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadview"
)

// TestPrefillFlagForms: --prefill takes the vLLM router's form, a URL
// optionally followed by a bootstrap port or none as a separate argument,
// and Go's --prefill=URL; --decode repeats; both mix with the other flags,
// --worker-urls' list form included.
func TestPrefillFlagForms(t *testing.T) {
	o, err := parseFlags([]string{"--vllm-pd-disaggregation",
		"--prefill", "http://p0:8000", "9000",
		"--worker-urls", "http://r0:8000", "http://r1:8000",
		"--prefill", "http://p1:8000", "none",
		"--policy", "round_robin",
		"--prefill", "http://p2:8000@1", "NONE",
		"--prefill", "http://p3:8000",
		"--decode", "http://d0:8000",
		"--prefill=http://p4:8000",
		"--decode=http://d1:8000@0",
		"--prefill", "http://p5:8000", "65535",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []prefillArg{{"http://p0:8000", 9000}, {"http://p1:8000", 0}, {"http://p2:8000@1", 0}, {"http://p3:8000", 0},
		{"http://p4:8000", 0}, {"http://p5:8000", 65535}}
	if !o.pd || !reflect.DeepEqual(o.prefill, want) {
		t.Fatalf("pd %v prefill %+v, want %+v", o.pd, o.prefill, want)
	}
	if strings.Join(o.decode, " ") != "http://d0:8000 http://d1:8000@0" || strings.Join(o.workerURLs, " ") != "http://r0:8000 http://r1:8000" ||
		o.policy != "round_robin" {
		t.Fatalf("decode %v worker-urls %v policy %q", o.decode, o.workerURLs, o.policy)
	}
	if o.kvConnector != "nixl" || o.pdKVHoldSecs != 480 || o.prefillPolicy != "" || o.decodePolicy != "" {
		t.Fatalf("defaults: connector %q hold %d policies %q %q", o.kvConnector, o.pdKVHoldSecs, o.prefillPolicy, o.decodePolicy)
	}
}

// TestPDFlagErrors: every refusal of the PD flags, each with a message
// that says what is wrong.
func TestPDFlagErrors(t *testing.T) {
	pd := func(args ...string) []string { return append([]string{"--vllm-pd-disaggregation"}, args...) }
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--prefill", "http://p:1"}, "--prefill: only with --vllm-pd-disaggregation"},
		{[]string{"--decode", "http://d:1"}, "--decode: only with --vllm-pd-disaggregation"},
		{[]string{"--prefill-policy", "random"}, "--prefill-policy: only with"},
		{[]string{"--decode-policy", "random"}, "--decode-policy: only with"},
		{[]string{"--kv-connector", "nixl"}, "--kv-connector: only with"},
		{[]string{"--pd-kv-hold-secs", "60"}, "--pd-kv-hold-secs: only with"},
		{[]string{"--prefill-worker-dns", "p.svc:8000"}, "--prefill-worker-dns: only with"},
		{[]string{"--decode-worker-dns", "d.svc:8000", "--decode", "http://d:1"}, "--decode, --decode-worker-dns: only with"},
		{pd("--prefill"), "--prefill needs a URL"},
		{pd("--prefill", "--decode", "http://d:1"), "--prefill needs a URL"},
		{pd("--prefill", "http://p:1", "0"), "bootstrap port 1-65535 or none"},
		{pd("--prefill", "http://p:1", "65536"), "bootstrap port 1-65535 or none"},
		{pd("--prefill", "http://p:1", "+80"), "bootstrap port 1-65535 or none"},
		{pd("--prefill", "http://p:1", "nine"), "bootstrap port 1-65535 or none"},
		{pd("--prefill", "http://p:1", "http://p:2"), "one --prefill per worker"},
		{pd("--prefill", "http://p:1", "9000", "extra"), "unexpected arguments"},
		{pd("--prefill", "ftp://p:1"), "--prefill: worker url"},
		{pd("--decode", "p:1"), "--decode: worker url"},
		{pd("--prefill-policy", "nope"), `--prefill-policy "nope"`},
		{pd("--decode-policy", "nope"), `--decode-policy "nope"`},
		{pd("--kv-connector", "mooncake"), "docs/reference.md"},
		{pd("--kv-connector", "p2pnccl"), "P2P NCCL"},
		{pd("--pd-kv-hold-secs", "0"), "--pd-kv-hold-secs must be positive"},
		{pd("--pd-kv-hold-secs", "-1"), "--pd-kv-hold-secs must be positive"},
		{pd("--prefill-worker-dns", "no-port"), "--prefill-worker-dns"},
		{pd("--decode-worker-dns", "d.svc:0"), "--decode-worker-dns"},
		{pd("--prefill-worker-dns", "x.svc:80", "--decode-worker-dns", "x.svc:80"), "name the same service"},
		{pd("--worker-dns", "x.svc:80", "--prefill-worker-dns", "x.svc:80"), "name the same service"},
		{pd("--prefill", "http://a:1", "--decode", "http://a:1"), "a worker has one role"},
		{pd("--prefill", "http://a:1@0", "--decode", "http://a:1@1"), "a worker has one role"},
		{pd("--worker-urls", "http://a:1", "--prefill", "http://a:1/"), "a worker has one role"},
		{pd("--worker-urls", "http://a:1", "--decode", "http://a:1"), "a worker has one role"},
	} {
		_, err := parseFlags(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// TestPDNeedsBothSides: PD mode starts only with a source of prefill
// workers and one of decode workers (flags, --config or DNS); regular
// workers do not stand in for either; --allow-empty-fleet starts empty.
func TestPDNeedsBothSides(t *testing.T) {
	dir, n := t.TempDir(), 0
	conf := func(body string) string {
		n++
		p := filepath.Join(dir, strconv.Itoa(n)+".yaml")
		if err := os.WriteFile(p, []byte("models:\n  - name: m\n    quality_score: 0.5\n"+body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	check := func(want error, args ...string) {
		t.Helper()
		o, err := parseFlags(append([]string{"--vllm-pd-disaggregation"}, args...), io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		cfg, err := loadConfig(o)
		if err == nil {
			err = checkConfigRoles(o, cfg)
		}
		if err == nil {
			err = needWorkers(o, cfg)
		}
		if !errors.Is(err, want) {
			t.Errorf("%v: %v, want %v", args, err, want)
		}
	}
	check(errNoPrefill)
	check(errNoPrefill, "--worker-urls", "http://r:1", "--decode", "http://d:1")
	check(errNoPrefill, "--decode-worker-dns", "d.svc:80", "--demo")
	check(errNoDecode, "--prefill", "http://p:1")
	check(errNoDecode, "--prefill-worker-dns", "p.svc:80", "--worker-dns", "r.svc:80")
	check(nil, "--prefill", "http://p:1", "--decode", "http://d:1")
	check(nil, "--prefill-worker-dns", "p.svc:80", "--decode-worker-dns", "d.svc:80")
	check(nil, "--allow-empty-fleet")
	check(nil, "--allow-empty-fleet", "--prefill", "http://p:1")
	check(nil, "--config", conf("    prefill_workers: [\"http://p:1\"]\n    decode_workers: [\"http://d:1\"]\n"))
	check(nil, "--config", conf("    prefill_workers: [\"http://p:2\"]\n"), "--decode", "http://d:2")
	check(errNoDecode, "--config", conf("    workers: [\"http://r:3\"]\n    prefill_workers: [\"http://p:3\"]\n"))

	// A worker in two roles across the config and the flags.
	o, err := parseFlags([]string{"--vllm-pd-disaggregation", "--config", conf("    prefill_workers: [\"http://p:4\"]\n    decode_workers: [\"http://d:4\"]\n"),
		"--worker-urls", "http://d:4"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkConfigRoles(o, cfg); err == nil || !strings.Contains(err.Error(), "a worker has one role") ||
		!strings.Contains(err.Error(), "model m in --config") {
		t.Fatalf("config decode worker also in --worker-urls: %v", err)
	}
}

// TestPDConfigListsNeedTheFlag: prefill_workers and decode_workers in
// --config without --vllm-pd-disaggregation exit 2 naming their line; the
// PD errors exit 2 through run.
func TestPDConfigListsNeedTheFlag(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pd.yaml")
	if err := os.WriteFile(p, []byte("models:\n  - name: m\n    quality_score: 0.5\n    workers: [\"http://r:1\"]\n    decode_workers: [\"http://d:1\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", p}, p + ":5: prefill_workers and decode_workers only with --vllm-pd-disaggregation"},
		{[]string{"--vllm-pd-disaggregation", "--prefill", "http://p:1"}, "no decode workers"},
		{[]string{"--vllm-pd-disaggregation", "--decode", "http://d:1"}, "no prefill workers"},
		{[]string{"--prefill", "http://p:1", "9000"}, "only with --vllm-pd-disaggregation"},
		{[]string{"--vllm-pd-disaggregation", "--kv-connector", "mooncake", "--prefill", "http://p:1", "--decode", "http://d:1"}, "only nixl"},
	} {
		var stderr strings.Builder
		if code := run(context.Background(), append([]string{"--port", "0", "--prometheus-port", "0"}, c.args...), io.Discard, &stderr); code != 2 ||
			!strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d %q, want 2 with %q", c.args, code, stderr.String(), c.want)
		}
	}
}

// TestPDPolicies: in PD mode the worker step's policy is --prefill-policy
// and the decode policy --decode-policy, each --policy unless given; the
// KV hold is --pd-kv-hold-secs. Outside PD mode there is no PD config.
func TestPDPolicies(t *testing.T) {
	reg := loadview.NewRegistry(loadview.Config{})
	for _, c := range []struct {
		args            []string
		prefill, decode string
		hold            time.Duration
	}{
		{[]string{"--policy", "round_robin"}, "round_robin", "", 0},
		{[]string{"--vllm-pd-disaggregation", "--policy", "round_robin"}, "round_robin", "round_robin", 480 * time.Second},
		{[]string{"--vllm-pd-disaggregation", "--decode-policy", "random", "--pd-kv-hold-secs", "30"}, "cache_aware", "random", 30 * time.Second},
		{[]string{"--vllm-pd-disaggregation", "--policy", "random", "--prefill-policy", "cache_aware", "--decode-policy", "power_of_two"}, "cache_aware", "power_of_two", 480 * time.Second},
	} {
		o, err := parseFlags(c.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		p, pd, err := newPolicies(o, reg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if p.Name() != c.prefill || (pd == nil) != (c.decode == "") {
			t.Fatalf("%v: policy %s, pd %+v", c.args, p.Name(), pd)
		}
		if pd != nil && (pd.DecodePolicy.Name() != c.decode || pd.KVHold != c.hold) {
			t.Fatalf("%v: decode policy %s hold %v, want %s %v", c.args, pd.DecodePolicy.Name(), pd.KVHold, c.decode, c.hold)
		}
	}
}

// TestAddWorkersInRoles: the config's workers, prefill_workers and
// decode_workers are added in their roles with the models that list them,
// a URL the flags repeat is the config's, and the flags' others are added
// in theirs with their models left to discovery.
func TestAddWorkersInRoles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pd.yaml")
	if err := os.WriteFile(p, []byte(`models:
  - name: a
    quality_score: 0.5
    workers: ["http://127.0.0.1:1"]
    prefill_workers: ["http://127.0.0.1:2"]
    decode_workers: ["http://127.0.0.1:3"]
  - name: b
    quality_score: 0.9
    prefill_workers: ["http://127.0.0.1:2"]
    decode_workers: ["http://127.0.0.1:4@1"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	o, err := parseFlags([]string{"--vllm-pd-disaggregation", "--config", p, "--prefill", "http://127.0.0.1:2", "none",
		"--decode", "http://127.0.0.1:5"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(o)
	if err == nil {
		err = checkConfigRoles(o, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	reg := loadview.NewRegistry(loadview.Config{HealthTimeout: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err := addWorkers(context.Background(), reg, cfg, o); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		url    string
		role   loadview.Role
		models string
	}{
		{"http://127.0.0.1:1", loadview.Regular, "[a]"},
		{"http://127.0.0.1:2", loadview.Prefill, "[a b]"},
		{"http://127.0.0.1:3", loadview.Decode, "[a]"},
		{"http://127.0.0.1:4@1", loadview.Decode, "[b]"},
		{"http://127.0.0.1:5", loadview.Decode, "[]"}, // discovery failed: any model
	} {
		w := reg.ByURL(c.url)
		if w == nil || w.Role() != c.role || fmt.Sprint(w.Models()) != c.models {
			t.Errorf("%s: %v, want a %s worker of %s", c.url, w, c.role, c.models)
		}
	}
	if n := len(reg.Workers()); n != 5 {
		t.Errorf("%d workers, want 5", n)
	}
}
