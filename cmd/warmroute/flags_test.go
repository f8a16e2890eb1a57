package main

import (
	"io"
	"testing"
)

// TestAffinityFlagSelectsTheFixedRule: without --affinity-chars-per-request
// misses are placed by estimated time to first token; given, even as 0 (the
// RFC rule), the fixed rule applies with that rate.
func TestAffinityFlagSelectsTheFixedRule(t *testing.T) {
	for _, c := range []struct {
		args  []string
		rule  bool
		chars int
	}{
		{nil, false, 0},
		{[]string{"--affinity-chars-per-request", "32768"}, true, 32768},
		{[]string{"--affinity-chars-per-request=0"}, true, 0},
	} {
		o, err := parseFlags(c.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if o.affinityRule != c.rule || o.affinityChars != c.chars {
			t.Fatalf("%v: rule %v chars %d, want %v %d", c.args, o.affinityRule, o.affinityChars, c.rule, c.chars)
		}
	}
	if _, err := parseFlags([]string{"--affinity-chars-per-request=-1"}, io.Discard); err == nil {
		t.Fatal("a negative rate was accepted")
	}
}

// TestWorkerDNSFlags: --worker-dns must be NAME:PORT, intervals must not be
// negative, and a fleet found by DNS is not demo mode (no embedded config).
func TestWorkerDNSFlags(t *testing.T) {
	for _, bad := range [][]string{
		{"--worker-dns", "no-port"},
		{"--worker-dns", "svc:0"},
		{"--worker-dns-interval-secs", "-1"},
		{"--worker-load-scrape-interval-secs", "-1"},
	} {
		if _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	o, err := parseFlags([]string{"--worker-dns", "vllm.ns.svc.cluster.local:8000"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Models) != 0 {
		t.Fatalf("--worker-dns alone loaded the demo config (%d models)", len(cfg.Models))
	}
}
