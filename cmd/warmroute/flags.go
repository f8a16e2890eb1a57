package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/warmroute/warmroute/route"
	"io"
	"strings"
	"time"
)

// options are the router's flags: the vLLM router's names and defaults,
// plus --config and --demo.
type options struct {
	host, prometheusHost   string
	port, prometheusPort   int
	workerURLs             []string
	policy                 string
	cacheThreshold         float64
	balanceAbs             int64
	balanceRel             float64
	evictionInterval       int
	maxTreeSize            int
	affinityChars          int
	dpSize                 int
	maxPayloadSize         int
	requestTimeoutSecs     int
	retryMaxRetries        int
	retryInitialBackoffMS  int
	retryMaxBackoffMS      int
	cbFailureThreshold     int
	healthIntervalSecs     int
	healthTimeoutSecs      int
	healthFailureThreshold int
	healthSuccessThreshold int
	healthEndpoint         string
	apiKey                 string
	logLevel               string
	config                 string
	replayLog              string
	demo                   bool
	demoWorkers            int
	shutdownGraceSecs      int
}

// listFlag accepts a comma-separated list and may be repeated.
type listFlag struct{ v *[]string }

func (l listFlag) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, ",")
}

func (l listFlag) Set(s string) error {
	*l.v = append(*l.v, strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })...)
	return nil
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("warmroute", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&o.port, "port", 30000, "port to listen on")
	fs.Var(listFlag{&o.workerURLs}, "worker-urls", "worker URLs (space or comma separated, repeatable); url@rank names one data-parallel rank")
	fs.StringVar(&o.policy, "policy", "cache_aware", "worker selection policy: cache_aware, round_robin, random, power_of_two, consistent_hash")
	fs.Float64Var(&o.cacheThreshold, "cache-threshold", 0.3, "prefix match ratio above which cache affinity wins")
	fs.Int64Var(&o.balanceAbs, "balance-abs-threshold", 64, "load gate: chosen load minus min load must exceed this to rebalance")
	fs.Float64Var(&o.balanceRel, "balance-rel-threshold", 1.5, "load gate: chosen load must exceed min load times this to rebalance")
	fs.IntVar(&o.evictionInterval, "eviction-interval", 120, "seconds between session-map sweeps")
	fs.IntVar(&o.maxTreeSize, "max-tree-size", 67108864, "characters per worker in the prefix tree; also sessions per model")
	fs.IntVar(&o.affinityChars, "affinity-chars-per-request", route.DefaultCacheAwareConfig().AffinityCharsPerRequest,
		"on a session miss, prefix characters a busier worker's cache must save per extra request in flight to win over the least-loaded worker (0: threshold only)")
	fs.StringVar(&o.prometheusHost, "prometheus-host", "127.0.0.1", "address of the metrics/pprof listener")
	fs.IntVar(&o.prometheusPort, "prometheus-port", 29000, "port of the metrics/pprof listener (0 disables)")
	fs.IntVar(&o.dpSize, "intra-node-data-parallel-size", 1, "data-parallel ranks per worker URL")
	fs.IntVar(&o.maxPayloadSize, "max-payload-size", 256<<20, "largest request body in bytes (413 above)")
	fs.IntVar(&o.requestTimeoutSecs, "request-timeout-secs", 1800, "upstream request deadline in seconds (504 past it)")
	fs.IntVar(&o.retryMaxRetries, "retry-max-retries", 5, "attempts in all per request (retries go to another worker)")
	fs.IntVar(&o.retryInitialBackoffMS, "retry-initial-backoff-ms", 50, "first retry backoff")
	fs.IntVar(&o.retryMaxBackoffMS, "retry-max-backoff-ms", 30000, "largest retry backoff")
	fs.IntVar(&o.cbFailureThreshold, "cb-failure-threshold", 10, "consecutive request failures that mark a worker unhealthy (0 disables)")
	fs.IntVar(&o.healthIntervalSecs, "health-check-interval-secs", 60, "seconds between health checks")
	fs.IntVar(&o.healthTimeoutSecs, "health-check-timeout-secs", 5, "health check deadline in seconds")
	fs.IntVar(&o.healthFailureThreshold, "health-failure-threshold", 3, "failed checks before a worker is unhealthy")
	fs.IntVar(&o.healthSuccessThreshold, "health-success-threshold", 2, "good checks before a worker is healthy again")
	fs.StringVar(&o.healthEndpoint, "health-check-endpoint", "/health", "worker health path")
	fs.StringVar(&o.apiKey, "api-key", "", "bearer token the router sends to workers")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.config, "config", "", "YAML file: models, pricing, logical models, SAAR settings (flags win)")
	fs.StringVar(&o.replayLog, "replay-log", "", "append every model-step replay record to this JSONL file (for `warmroute replay FILE`)")
	fs.BoolVar(&o.demo, "demo", false, "serve embedded simulated workers (the default without --worker-urls and --config)")
	fs.IntVar(&o.demoWorkers, "demo-workers", 4, "simulated workers in demo mode (spread over the demo config's models)")
	fs.IntVar(&o.shutdownGraceSecs, "shutdown-grace-secs", 30, "on SIGTERM/SIGINT, how long in-flight requests may finish")
	if err := fs.Parse(workerURLsAsOneValue(args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errHelp
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	return o, nil
}

// workerURLsAsOneValue lets "--worker-urls A B C" (the vLLM router's form)
// work with the flag package by joining the values that follow the flag.
func workerURLsAsOneValue(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a != "--worker-urls" && a != "-worker-urls" {
			out = append(out, a)
			continue
		}
		var vals []string
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
			vals = append(vals, args[i])
		}
		out = append(out, a+"="+strings.Join(vals, ","))
	}
	return out
}

var errHelp = errors.New("help requested")

func secs(n int) time.Duration { return time.Duration(n) * time.Second }
