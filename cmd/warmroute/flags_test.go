package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/kvevents"
	"github.com/warmroute/warmroute/loadview"
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

// TestKVEventsFlags: --kv-events builds the subscription's settings from
// the vLLM router's flag names; every other KV-event flag needs it, and
// each invalid port, mapping or shared endpoint is refused with exit 2.
func TestKVEventsFlags(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil || o.kvEventsConfig != nil {
		t.Fatalf("default: %+v %v, want off", o.kvEventsConfig, err)
	}
	o, err = parseFlags([]string{"--kv-events", "--worker-urls", "http://a:8000", "http://b:8000", "http://h:8000", "http://h:8001"}, io.Discard)
	if err == nil {
		t.Fatal("two workers on one host shared the derived endpoint tcp://h:5557")
	}
	o, err = parseFlags([]string{"--kv-events", "--worker-urls", "http://a:8000", "http://h:8000", "http://h:8001",
		"--kv-events-endpoint", "http://h:8000=tcp://h:5557",
		"--kv-events-endpoint=HTTP://H:8001/=tcp://H:6557,tcp://h:6558",
		"--kv-events-replay-port", "5600", "--kv-events-topic-filter", "kv@"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.kvEventsConfig
	if c == nil || c.Port != 5557 || c.ReplayPort != 5600 || c.Topic != "kv@" || len(c.Endpoints) != 2 ||
		c.Endpoints["http://h:8001"] != (loadview.KVEndpoints{Endpoint: "tcp://h:6557", Replay: "tcp://h:6558"}) {
		t.Fatalf("config %+v", c)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--kv-events-port", "6000"}, "--kv-events-port: only with --kv-events"},
		{[]string{"--kv-events-endpoint", "http://a:1=tcp://a:2", "--kv-events-topic-filter", "x"}, "--kv-events-endpoint, --kv-events-topic-filter: only with --kv-events"},
		{[]string{"--kv-events-replay-port", "5558"}, "only with --kv-events"},
		{[]string{"--kv-events", "--kv-events-port", "0"}, "--kv-events-port 0: want 1-65535"},
		{[]string{"--kv-events", "--kv-events-port", "65536"}, "--kv-events-port 65536"},
		{[]string{"--kv-events", "--kv-events-replay-port", "-1"}, "--kv-events-replay-port -1"},
		{[]string{"--kv-events", "--kv-events-replay-port", "70000"}, "--kv-events-replay-port 70000"},
		{[]string{"--kv-events", "--kv-events-replay-port", "5557"}, "needs its own port"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1"}, "WORKER_URL=tcp://HOST:PORT"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1=ipc:///tmp/kv"}, "want tcp://HOST:PORT"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1=tcp://*:5557"}, "wildcard"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1=tcp://0.0.0.0:5557"}, "unspecified"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1=tcp://u:p@a:5557"}, "without credentials"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1=tcp://a:5557/x"}, "without credentials or paths"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1=tcp://a:0"}, "want a port 1-65535"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1=tcp://a:1,tcp://a:1"}, "both the PUB and the replay"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1/v1=tcp://a:1"}, "worker url"},
		{[]string{"--kv-events", "--kv-events-endpoint", "http://a:1=tcp://a:1", "--kv-events-endpoint", "http://A:1/=tcp://a:2"}, "mapped twice"},
		{[]string{"--kv-events", "--worker-urls", "http://h:1,http://h:2"}, "cannot share the KV endpoint tcp://h:5557"},
		{[]string{"--kv-events", "--worker-urls", "http://a:1,http://b:1", "--kv-events-endpoint", "http://a:1=tcp://B:5557"}, "cannot share the KV endpoint tcp://b:5557"},
		{[]string{"--kv-events", "--worker-urls", "http://0.0.0.0:8000"}, "unspecified"},
		{[]string{"--kv-events", "--worker-urls", "http://a:1", "--intra-node-data-parallel-size", "2", "--kv-events-replay-port", "5558"}, "cannot share the KV endpoint tcp://a:5558"},
		{[]string{"--kv-events", "--worker-urls", "http://a:1", "--intra-node-data-parallel-size", "2", "--kv-events-port", "65535"}, "over 65535"},
		{[]string{"--kv-events", "--vllm-pd-disaggregation", "--prefill", "http://p:1", "--decode", "http://p:2"}, "cannot share"},
	} {
		_, err := parseFlags(bad.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v: %v, want an error with %q", bad.args, err, bad.want)
		}
		if c := run(context.Background(), bad.args, io.Discard, io.Discard); c != 2 {
			t.Errorf("%v: exit %d, want 2", bad.args, c)
		}
	}
}

// TestKVEventsFollowedUntilShutdown: with --kv-events the router
// subscribes to each worker's engine at the worker's host and
// --kv-events-port, and the subscription ends when the router stops.
func TestKVEventsFollowedUntilShutdown(t *testing.T) {
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(pub.Addr(), "tcp://"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, code := startMain(t, ctx, "--worker-urls", "http://127.0.0.1:1", "--kv-events", "--kv-events-port", port)
	testwait.Until(t, "the router's subscription", func() bool { return pub.Subscribers() == 1 })
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("exit %d", c)
	}
	testwait.Until(t, "the subscription to end with the router", func() bool { return pub.Subscribers() == 0 })
}
