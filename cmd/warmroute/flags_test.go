package main

import (
	"io"
	"strings"
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

// TestRedisURLFlag: --redis-url takes redis:// and rediss:// URLs (AUTH in
// the URL), falls back to $WARMROUTE_REDIS_URL, is off by default, and a
// rejected URL's error does not echo its password.
func TestRedisURLFlag(t *testing.T) {
	t.Setenv("WARMROUTE_REDIS_URL", "")
	o, err := parseFlags(nil, io.Discard)
	if err != nil || o.redisURL != "" {
		t.Fatalf("default: %q %v", o.redisURL, err)
	}
	for _, ok := range []string{"redis://127.0.0.1:6379", "redis://:pw@10.0.0.1:6379/2", "rediss://user:pw@redis.example:6380"} {
		o, err := parseFlags([]string{"--redis-url", ok}, io.Discard)
		if err != nil || o.redisURL != ok {
			t.Errorf("%s: %q %v", ok, o.redisURL, err)
		}
	}
	for _, bad := range []string{"http://h:6379", "127.0.0.1:6379", "redis://", "redis://:s3cret@h:6379/notadb"} {
		_, err := parseFlags([]string{"--redis-url", bad}, io.Discard)
		if err == nil {
			t.Errorf("%s accepted", bad)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error echoes the password: %v", err)
		}
	}
	t.Setenv("WARMROUTE_REDIS_URL", "redis://:pw@127.0.0.1:6379")
	if o, err := parseFlags(nil, io.Discard); err != nil || o.redisURL != "redis://:pw@127.0.0.1:6379" {
		t.Fatalf("env: %q %v", o.redisURL, err)
	}
	if o, err := parseFlags([]string{"--redis-url", "redis://h:1"}, io.Discard); err != nil || o.redisURL != "redis://h:1" {
		t.Fatalf("flag over env: %q %v", o.redisURL, err)
	}
}
