package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/tracing"
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
	affinityChars          int  // meaningful only with affinityRule
	affinityRule           bool // --affinity-chars-per-request was given: the fixed rule instead of the TTFT estimate
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
	allowEmptyFleet        bool // start with no workers: the admin API adds them
	shutdownGraceSecs      int

	// Production: a closed control plane, classified faults, bounded memory.
	adminAPIKey          string
	clientAPIKeysFile    string
	tlsCertFile          string
	tlsKeyFile           string
	workerAllowlist      string
	maxWorkers           int
	extraWorkerPaths     []string
	requestIDHeaders     []string
	connectTimeoutSecs   float64
	firstByteTimeoutSecs float64
	upstreamStallSecs    float64
	streamResumeAttempts int
	streamResumeMaxBytes int
	cbSuccessThreshold   int
	cbTimeoutSecs        int
	cbWindowSecs         int
	maxSessions          int
	maxConcurrent        int
	clientHeaderSecs     float64

	// Saturation: the router's queue (docs/design.md §9).
	queueSize           int
	queueTimeoutSecs    int
	queueMaxBytes       int64
	queueOrder          string
	forwardPriority     bool
	queuePreempt        bool
	trustTenantHeader   bool
	saturationWaiting   int
	saturationKVUsage   float64
	saturationQueueSecs float64
	queueHeadroom       int

	// Several replicas (docs/design.md §8.3).
	loadScrapeSecs        float64
	workerDNS             string
	workerDNSIntervalSecs float64
	redisURL              string // --redis-url, else $WARMROUTE_REDIS_URL; empty: no shared state

	// Disaggregated prefill and decode (docs/design.md §9, "Disaggregated
	// fleets"); every one but pd needs pd.
	pd            bool
	prefill       []prefillArg
	decode        []string
	prefillPolicy string // "": --policy
	decodePolicy  string // "": --policy
	kvConnector   string
	pdKVHoldSecs  int
	prefillDNS    string
	decodeDNS     string
	pdFlagsGiven  []string // the PD flags given, for the error without --vllm-pd-disaggregation

	// Kubernetes discovery by label selector (docs/design.md §8.3,
	// "Kubernetes discovery"): the vLLM router's flags, plus --kubeconfig.
	// Every one but serviceDiscovery needs it.
	serviceDiscovery bool
	selector         []string // key=value items
	prefillSelector  []string // needs pd too
	decodeSelector   []string // needs pd too
	sdNamespace      string   // "": every namespace
	sdPort           int
	kubeconfig       string
	sdFlagsGiven     []string            // the discovery flags given, for the error without --service-discovery
	sdSelectors      []k8sSelectorOption // parsed from the selectors given, in role order regular, prefill, decode

	// The workers' KV-cache events (docs/design.md §9, the row for KV
	// caches smaller than the working set); every one but kvEvents needs it.
	kvEvents           bool
	kvEventsPort       int
	kvEventsReplayPort int
	kvEventsEndpoints  []string
	kvEventsTopic      string
	kvFlagsGiven       []string                 // the KV-event flags given, for the error without --kv-events
	kvEventsConfig     *loadview.KVEventsConfig // built from them with --kv-events; nil: off

	// Traces (docs/design.md §8.7): the vLLM router's flags; every
	// one but enableTrace needs it.
	enableTrace        bool
	otlpTracesEndpoint string
	otelSamplingRatio  float64
	otelExcludedPaths  []string // nil: tracing.DefaultExcludedPaths
	traceFlagsGiven    []string // the trace flags given, for the error without --enable-trace
	// Reload, audit and secrets (docs/design.md §8, "Reload and audit").
	// Each secret is its flag's value, else its file's content (re-read on
	// reload), else its environment variable: secretSources.
	apiKeyFile          string // --api-key-file
	adminAPIKeyFile     string // --admin-api-key-file
	adminAPIKeysFile    string // --admin-api-keys-file: name:key lines
	redisURLFile        string // --redis-url-file
	workerAllowlistFile string // --worker-allowlist-file: more allow-list entries, re-read on reload
	auditLog            string // --audit-log: the admin calls' JSON lines; empty: stderr
	secrets             secretSources

	// What the router tells clients about its fleet (issue 33).
	exposeWorkerHeaders bool
}

// secretSource is where one secret comes from: the flag's value, else the
// file's content (trimmed; re-read on reload), else the environment
// variable env (read once, at start: envValue). Giving the flag and the
// file is an error.
type secretSource struct {
	flag, value, file, env string
	envValue               string
}

// secretSources are the router's secrets, as given.
type secretSources struct{ apiKey, adminAPIKey, redisURL secretSource }

// maxSecretFile bounds a secret file: a key or a URL, not a document.
const maxSecretFile = 64 << 10

// read returns the secret: the flag's value, the file's content or the
// environment variable's, in that order ("" when none is set). An
// unreadable or empty file is an error that names the file, never its
// content.
func (s secretSource) read() (string, error) {
	switch {
	case s.value != "":
		return s.value, nil
	case s.file != "":
		b, err := readSmallFile(s.file, maxSecretFile)
		if err != nil {
			return "", fmt.Errorf("--%s-file: %w", s.flag, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" || strings.ContainsAny(v, "\r\n") {
			return "", fmt.Errorf("--%s-file %s: want one line, the secret", s.flag, s.file)
		}
		return v, nil
	}
	return s.envValue, nil
}

// readSmallFile reads path, refusing one larger than limit bytes.
func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// resolveSecrets records where each secret comes from and reads it once:
// a flag given with its -file twin is an error.
func resolveSecrets(o *options) error {
	o.secrets = secretSources{
		apiKey:      secretSource{flag: "api-key", value: o.apiKey, file: o.apiKeyFile, env: "WARMROUTE_API_KEY"},
		adminAPIKey: secretSource{flag: "admin-api-key", value: o.adminAPIKey, file: o.adminAPIKeyFile, env: "WARMROUTE_ADMIN_API_KEY"},
		redisURL:    secretSource{flag: "redis-url", value: o.redisURL, file: o.redisURLFile, env: "WARMROUTE_REDIS_URL"},
	}
	var err error
	for _, s := range []struct {
		src *secretSource
		dst *string
	}{{&o.secrets.apiKey, &o.apiKey}, {&o.secrets.adminAPIKey, &o.adminAPIKey}, {&o.secrets.redisURL, &o.redisURL}} {
		s.src.envValue = os.Getenv(s.src.env)
		if s.src.value != "" && s.src.file != "" {
			return fmt.Errorf("--%s and --%s-file: give one", s.src.flag, s.src.flag)
		}
		if *s.dst, err = s.src.read(); err != nil {
			return err
		}
	}
	return nil
}

// prefillArg is one --prefill: a worker URL and the bootstrap port that may
// follow it (0: none). NIXL needs no bootstrap port; it is accepted and
// checked only so that the vLLM router's command lines work unchanged.
type prefillArg struct {
	url       string
	bootstrap int
}

// prefillFlag collects --prefill values: "URL" or "URL PORT|none", the form
// prefillAsOneValue makes of "--prefill URL PORT".
type prefillFlag struct{ v *[]prefillArg }

func (p prefillFlag) String() string {
	if p.v == nil {
		return ""
	}
	var out []string
	for _, a := range *p.v {
		out = append(out, a.url)
	}
	return strings.Join(out, ",")
}

func (p prefillFlag) Set(s string) error {
	f := strings.Fields(s)
	if len(f) == 0 || len(f) > 2 {
		return errors.New("want URL [BOOTSTRAP_PORT|none]")
	}
	a := prefillArg{url: f[0]}
	if len(f) == 2 && !strings.EqualFold(f[1], "none") {
		port, err := strconv.Atoi(f[1])
		if err != nil || port < 1 || port > 65535 || strings.ContainsAny(f[1], "+-") {
			return fmt.Errorf("%s %s: want a bootstrap port 1-65535 or none after the URL (one --prefill per worker)", f[0], f[1])
		}
		a.bootstrap = port
	}
	*p.v = append(*p.v, a)
	return nil
}

// repeatFlag takes one value per occurrence, commas and all.
type repeatFlag struct{ v *[]string }

func (r repeatFlag) String() string {
	if r.v == nil {
		return ""
	}
	return strings.Join(*r.v, " ")
}

func (r repeatFlag) Set(s string) error {
	*r.v = append(*r.v, s)
	return nil
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
	fs.Var(listFlag{&o.workerURLs}, "worker-urls", "worker URLs (space or comma separated, repeatable); url@rank names one data-parallel rank; with --vllm-pd-disaggregation they serve whole requests and compete with the prefill workers in the worker step")
	fs.BoolVar(&o.pd, "vllm-pd-disaggregation", false, "disaggregated prefill and decode: a request the worker step sends to a prefill worker is prefilled there and decoded on a decode worker (KV moved by NIXL)")
	fs.Var(prefillFlag{&o.prefill}, "prefill", "prefill worker URL, optionally followed by its bootstrap port or none (repeatable: --prefill URL [PORT|none]); url@rank names one data-parallel rank; needs --vllm-pd-disaggregation")
	fs.Var(listFlag{&o.decode}, "decode", "decode worker URL (repeatable); url@rank names one data-parallel rank; needs --vllm-pd-disaggregation")
	fs.StringVar(&o.prefillPolicy, "prefill-policy", "", "worker selection policy among the prefill (and regular) workers in PD mode (default: --policy)")
	fs.StringVar(&o.decodePolicy, "decode-policy", "", "worker selection policy among the decode workers in PD mode (default: --policy)")
	fs.StringVar(&o.kvConnector, "kv-connector", "nixl", "KV transfer between prefill and decode workers in PD mode: nixl (the only one supported)")
	fs.IntVar(&o.pdKVHoldSecs, "pd-kv-hold-secs", int(fastproxy.DefaultKVHold/time.Second), "seconds a prefill worker holds a request's KV blocks for the decode worker (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT): a failed decode leg is retried with them within it, prefilled again after")
	fs.StringVar(&o.prefillDNS, "prefill-worker-dns", "", "NAME:PORT of a headless service of prefill workers, resolved like --worker-dns (every --worker-dns-interval-secs); needs --vllm-pd-disaggregation")
	fs.StringVar(&o.decodeDNS, "decode-worker-dns", "", "NAME:PORT of a headless service of decode workers, resolved like --worker-dns (every --worker-dns-interval-secs); needs --vllm-pd-disaggregation")
	fs.BoolVar(&o.kvEvents, "kv-events", false, "subscribe to every worker's KV-cache events (vLLM --kv-events-config with the zmq publisher): the router follows what each engine's cache stores and evicts; the event socket is unauthenticated, keep it on a private network")
	fs.IntVar(&o.kvEventsPort, "kv-events-port", loadview.DefaultKVEventsPort, "the engines' KV-events port (vLLM's endpoint tcp://*:PORT): tcp://<worker host>:PORT, plus the rank for url@rank, for a worker --kv-events-endpoint does not map; needs --kv-events")
	fs.IntVar(&o.kvEventsReplayPort, "kv-events-replay-port", 0, "the engines' replay port (vLLM's replay_endpoint), on the worker's host or its mapped endpoint's, plus the rank; 0: none, a missed batch resyncs at once; needs --kv-events")
	fs.Var(repeatFlag{&o.kvEventsEndpoints}, "kv-events-endpoint", "WORKER_URL=tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT]: where one worker's engine publishes, instead of the derived endpoint (repeatable; url@rank maps one rank, a base URL every rank at PORT plus the rank); needs --kv-events")
	fs.StringVar(&o.kvEventsTopic, "kv-events-topic-filter", "", "topic prefix of the KV events taken (vLLM's kv-events-config topic; empty: all); needs --kv-events")
	fs.BoolVar(&o.serviceDiscovery, "service-discovery", false, "watch Kubernetes pods by label selector (--selector; in PD mode --prefill-selector, --decode-selector): each ready pod joins as the worker http://POD_IP:PORT, one that stops being ready or is deleted drains")
	fs.Var(listFlag{&o.selector}, "selector", "label selector of the workers' pods: key=value items, all must hold (--selector k1=v1 k2=v2, the vLLM router's form, or comma separated); with --vllm-pd-disaggregation its pods serve whole requests; needs --service-discovery")
	fs.Var(listFlag{&o.prefillSelector}, "prefill-selector", "label selector of the prefill workers' pods (key=value items); their vllm.ai/bootstrap-port annotation is read and unused (NIXL needs none); needs --service-discovery and --vllm-pd-disaggregation")
	fs.Var(listFlag{&o.decodeSelector}, "decode-selector", "label selector of the decode workers' pods (key=value items); needs --service-discovery and --vllm-pd-disaggregation")
	fs.StringVar(&o.sdNamespace, "service-discovery-namespace", "", "namespace of the watched pods (empty: every namespace, which needs a ClusterRole); needs --service-discovery")
	fs.IntVar(&o.sdPort, "service-discovery-port", 80, "the workers' port on each discovered pod's IP; needs --service-discovery")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file of --service-discovery (token, token file or client certificate; no exec plugins); default: the pod's service account in a pod, else $KUBECONFIG, else ~/.kube/config")
	fs.StringVar(&o.policy, "policy", route.CacheAwareName, "worker selection policy: "+strings.Join(route.Names, ", "))
	fs.Float64Var(&o.cacheThreshold, "cache-threshold", 0.3, "prefix match ratio above which cache affinity wins")
	fs.Int64Var(&o.balanceAbs, "balance-abs-threshold", 64, "load gate: chosen load minus min load must exceed this to rebalance")
	fs.Float64Var(&o.balanceRel, "balance-rel-threshold", 1.5, "load gate: chosen load must exceed min load times this to rebalance")
	fs.IntVar(&o.evictionInterval, "eviction-interval", 120, "seconds between session-map sweeps")
	fs.IntVar(&o.maxTreeSize, "max-tree-size", 67108864, "bytes per worker and model in the prefix tree, node overhead included (about one byte per character of long histories)")
	fs.IntVar(&o.maxSessions, "max-sessions", route.DefaultMaxSessions, "session bindings kept per model (least recently used dropped beyond it)")
	fs.IntVar(&o.affinityChars, "affinity-chars-per-request", 0,
		"unset (default): place misses by estimated time to first token, learned from the workers' answers; given: the fixed rule instead, prefix characters a busier worker's cache must save per extra request in flight to win over the least-loaded worker (32768 was the former default; 0: threshold only)")
	fs.StringVar(&o.prometheusHost, "prometheus-host", "127.0.0.1", "address of the metrics/pprof listener")
	fs.IntVar(&o.prometheusPort, "prometheus-port", 29000, "port of the metrics/pprof listener (0 disables)")
	fs.IntVar(&o.dpSize, "intra-node-data-parallel-size", 1, "data-parallel ranks per worker URL")
	fs.IntVar(&o.maxPayloadSize, "max-payload-size", fastproxy.DefaultMaxPayloadSize, "largest request body in bytes (413 above); a request costs up to ~3x its body")
	fs.Float64Var(&o.clientHeaderSecs, "client-header-timeout-secs", 60, "seconds a client has to send a request's headers: from the connection's accept for its first request (a connection that sends nothing is closed after it), from its first byte for later ones")
	fs.IntVar(&o.requestTimeoutSecs, "request-timeout-secs", 1800, "upstream request deadline in seconds (504 past it)")
	fs.IntVar(&o.retryMaxRetries, "retry-max-retries", 5, "attempts in all per request (retries go to another worker)")
	fs.IntVar(&o.retryInitialBackoffMS, "retry-initial-backoff-ms", 50, "first retry backoff")
	fs.IntVar(&o.retryMaxBackoffMS, "retry-max-backoff-ms", 30000, "largest retry backoff")
	fs.IntVar(&o.cbFailureThreshold, "cb-failure-threshold", 10, "consecutive request failures (within the window) that open a worker's circuit breaker (0 disables)")
	fs.IntVar(&o.cbSuccessThreshold, "cb-success-threshold", 3, "successes in half-open that close the breaker again")
	fs.IntVar(&o.cbTimeoutSecs, "cb-timeout-duration-secs", 60, "seconds an open breaker waits before half-open")
	fs.IntVar(&o.cbWindowSecs, "cb-window-duration-secs", 120, "failures older than this do not count toward opening the breaker")
	fs.Float64Var(&o.connectTimeoutSecs, "connect-timeout-secs", 5, "upstream connect timeout in seconds (fractions allowed); a failed connect fails over")
	fs.Float64Var(&o.firstByteTimeoutSecs, "first-byte-timeout-secs", 300, "longest wait for a worker's response headers, streams included, then fail over (0 off); bounds a whole non-streaming generation")
	fs.Float64Var(&o.upstreamStallSecs, "upstream-stall-timeout-secs", 120, "a stream whose worker sends no byte for this long is cut, and continued on another worker when it can be (0 off)")
	fs.IntVar(&o.streamResumeAttempts, "stream-resume-attempts", 1, "continuations of a stream its worker cut, each on another worker of its model (0: none; the stream ends with the stream_cut error event)")
	fs.IntVar(&o.streamResumeMaxBytes, "stream-resume-max-bytes", fastproxy.DefaultStreamResumeMaxBytes, "text of a streamed answer kept to continue it after a cut; past it the stream is not continuable")
	fs.IntVar(&o.maxConcurrent, "max-concurrent-requests", fastproxy.DefaultMaxConcurrentRequests, "requests in flight at most; past it they wait in the queue, or get 429 with Retry-After without one (-1 off)")
	fs.IntVar(&o.queueSize, "queue-size", 100, "requests that may wait for a worker, all models together, while their model's workers are saturated or the router is at --max-concurrent-requests; past it 429 queue_full (0: no queue)")
	fs.IntVar(&o.queueTimeoutSecs, "queue-timeout-secs", 60, "longest wait in the queue, then 503 queue_timeout with Retry-After; the wait counts against --request-timeout-secs")
	fs.Int64Var(&o.queueMaxBytes, "queue-max-bytes", fastproxy.DefaultQueueMaxBytes, "bytes of request bodies the queue holds at most; past it 429 queue_full")
	fs.StringVar(&o.queueOrder, "queue-order", "priority", "release order of the queue: priority (priority, then fair between tenants, then warm tool-loop turns, then oldest) or fifo")
	fs.BoolVar(&o.forwardPriority, "forward-priority", false, `give the workers a request's priority in the body's "priority", X-Request-Priority written in (vLLM refuses a non-zero one unless it runs with priority scheduling); by default the router reads and removes it`)
	fs.BoolVar(&o.queuePreempt, "queue-preempt", false, "a request of priority 0 or more urgent that would wait for a sequence slot on its worker takes one from a stream of positive priority there, which pauses and is continued once the queue releases it again (--queue-order priority only)")
	fs.BoolVar(&o.trustTenantHeader, "trust-tenant-header", false, "name the tenant of a request from its X-Tenant-Id header when no client key names it (behind a gateway that sets it)")
	fs.IntVar(&o.saturationWaiting, "saturation-waiting", 0, "requests a worker may hold waiting in its own queue (its vLLM num_requests_waiting, moved by what the router sent since) before it counts saturated; 0: a request the router releases finds a free slot")
	fs.Float64Var(&o.saturationKVUsage, "saturation-kv-usage", 0.95, "KV cache usage (vLLM kv_cache_usage_perc) at which a worker counts saturated")
	fs.Float64Var(&o.saturationQueueSecs, "saturation-queue-secs", 2, "for a worker that reports no queue: the learned queueing wait per request at which it counts saturated")
	fs.IntVar(&o.queueHeadroom, "queue-headroom", 1, "requests per healthy worker that the queue keeps for requests of priority 0 or more urgent: one of positive priority (background) is released only past them; 0: none")
	fs.StringVar(&o.adminAPIKey, "admin-api-key", "", "bearer token that opens the admin surfaces on the inference port (absent: they answer 404 there)")
	fs.StringVar(&o.clientAPIKeysFile, "client-api-keys", "", "file of inbound API keys, one per line as name:key (the name is the tenant of the queue) or a bare key; inference then needs one as a bearer token")
	fs.StringVar(&o.tlsCertFile, "tls-cert-file", "", "serve the inference port over TLS with this certificate (PEM)")
	fs.StringVar(&o.tlsKeyFile, "tls-key-file", "", "private key of --tls-cert-file (PEM)")
	fs.StringVar(&o.workerAllowlist, "worker-allowlist", "", "hosts or CIDRs that admin calls may add as workers (comma separated; empty: any)")
	fs.IntVar(&o.maxWorkers, "max-workers", 1024, "most workers (ranks included) the registry holds")
	fs.Var(listFlag{&o.extraWorkerPaths}, "extra-worker-paths", "more worker endpoints to proxy besides the built-in list (comma separated paths)")
	fs.Var(listFlag{&o.requestIDHeaders}, "request-id-headers", "headers a request id is read from, first present wins (default x-request-id, x-correlation-id, x-trace-id, request-id)")
	fs.Float64Var(&o.loadScrapeSecs, "worker-load-scrape-interval-secs", 1, "seconds between reads of each worker's vLLM load (running, waiting, KV usage) from its /metrics, so replicas see one fleet (0 off)")
	fs.StringVar(&o.workerDNS, "worker-dns", "", "NAME:PORT of a headless service: its A/AAAA records are resolved periodically and workers added and drained as they change")
	fs.Float64Var(&o.workerDNSIntervalSecs, "worker-dns-interval-secs", 5, "seconds between resolutions of --worker-dns")
	fs.StringVar(&o.redisURL, "redis-url", "", "redis://[user:password@]host:port[/db] or rediss:// (TLS): share session bindings, model-step memory and locks with the other replicas (default $WARMROUTE_REDIS_URL; empty: none)")
	fs.IntVar(&o.healthIntervalSecs, "health-check-interval-secs", 60, "seconds between health checks")
	fs.IntVar(&o.healthTimeoutSecs, "health-check-timeout-secs", 5, "health check deadline in seconds")
	fs.IntVar(&o.healthFailureThreshold, "health-failure-threshold", 3, "failed checks before a worker is unhealthy")
	fs.IntVar(&o.healthSuccessThreshold, "health-success-threshold", 2, "good checks before a worker is healthy again")
	fs.StringVar(&o.healthEndpoint, "health-check-endpoint", "/health", "worker health path")
	fs.StringVar(&o.apiKey, "api-key", "", "bearer token the router sends to workers")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.config, "config", "", "YAML file: physical models and their workers, pricing, logical models, model-step settings")
	fs.StringVar(&o.replayLog, "replay-log", "", "append every model-step replay record to this JSONL file (for: warmroute replay FILE)")
	fs.BoolVar(&o.demo, "demo", false, "serve embedded simulated workers (the demo config's models unless --config names others); never the default")
	fs.BoolVar(&o.allowEmptyFleet, "allow-empty-fleet", false, "start with no source of workers: they are added through the admin API (POST /workers)")
	fs.IntVar(&o.demoWorkers, "demo-workers", 4, "simulated workers in demo mode (spread over the demo config's models)")
	fs.IntVar(&o.shutdownGraceSecs, "shutdown-grace-secs", 30, "on SIGTERM/SIGINT, how long in-flight requests may finish")
	// Traces (docs/design.md §8.7).
	fs.BoolVar(&o.enableTrace, "enable-trace", false, "export OpenTelemetry traces over OTLP/HTTP: a span per request with the stages' child spans; each worker gets a traceparent")
	fs.StringVar(&o.otlpTracesEndpoint, "otlp-traces-endpoint", "", "OTLP/HTTP collector: host:port (plain HTTP, path /v1/traces) or http(s)://host:port[/path] (default $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, $OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4318); needs --enable-trace")
	fs.Float64Var(&o.otelSamplingRatio, "otel-sampling-ratio", 1, "share of the traces the router starts that are sampled, 0 to 1; a client's traceparent decides for its own; needs --enable-trace")
	fs.Var(listFlag{&o.otelExcludedPaths}, "otel-excluded-paths", "exact paths that get no span (comma separated, repeatable; default "+strings.Join(tracing.DefaultExcludedPaths, ",")+"); needs --enable-trace")
	// Reload, audit and secrets (docs/design.md §8, "Reload and audit").
	fs.StringVar(&o.apiKeyFile, "api-key-file", "", "file holding --api-key (one line; re-read on reload); default $WARMROUTE_API_KEY")
	fs.StringVar(&o.adminAPIKeyFile, "admin-api-key-file", "", "file holding --admin-api-key (one line; re-read on reload); default $WARMROUTE_ADMIN_API_KEY")
	fs.StringVar(&o.adminAPIKeysFile, "admin-api-keys-file", "", "file of more admin keys, one per line as name:key (the name is who the audit log names) or a bare key; re-read on reload")
	fs.StringVar(&o.redisURLFile, "redis-url-file", "", "file holding --redis-url (one line); read at start")
	fs.StringVar(&o.workerAllowlistFile, "worker-allowlist-file", "", "file of more --worker-allowlist entries (hosts or CIDRs, commas, spaces or lines; # comments); re-read on reload")
	fs.StringVar(&o.auditLog, "audit-log", "", "append one JSON line per admin call (who, what, result) to this file, reopened on reload (logrotate); default stderr")
	// What the router tells clients about its fleet (issue 33).
	fs.BoolVar(&o.exposeWorkerHeaders, "expose-worker-headers", true, "name the worker on the answers workers gave (x-vllm-router-worker, -base-worker, -dp-rank, -prefill-worker, -decode-worker), as the vLLM router does; =false leaves them off. The router's own error answers never carry them")
	args, err := prefillAsOneValue(args)
	if err != nil {
		return nil, err
	}
	if err := fs.Parse(workerURLsAsOneValue(args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, errHelp
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		o.affinityRule = o.affinityRule || f.Name == "affinity-chars-per-request"
		if pdFlags[f.Name] {
			o.pdFlagsGiven = append(o.pdFlagsGiven, "--"+f.Name)
		}
		if strings.HasPrefix(f.Name, "kv-events-") {
			o.kvFlagsGiven = append(o.kvFlagsGiven, "--"+f.Name)
		}
		if strings.HasPrefix(f.Name, "otel-") || f.Name == "otlp-traces-endpoint" {
			o.traceFlagsGiven = append(o.traceFlagsGiven, "--"+f.Name)
		}
		if sdFlags[f.Name] {
			o.sdFlagsGiven = append(o.sdFlagsGiven, "--"+f.Name)
		}
	})
	if o.affinityChars < 0 {
		return nil, errors.New("--affinity-chars-per-request must not be negative")
	}
	if (o.tlsCertFile == "") != (o.tlsKeyFile == "") {
		return nil, errors.New("--tls-cert-file and --tls-key-file go together")
	}
	for _, p := range o.extraWorkerPaths {
		if !fastproxy.ValidWorkerPath(p) {
			return nil, fmt.Errorf("--extra-worker-paths %q: want an absolute path of plain segments", p)
		}
	}
	if o.queueOrder != "priority" && o.queueOrder != "fifo" {
		return nil, fmt.Errorf("--queue-order %q: want priority or fifo", o.queueOrder)
	}
	if o.queueSize < 0 || o.queueTimeoutSecs <= 0 || o.queueMaxBytes <= 0 || o.saturationWaiting < 0 || o.queueHeadroom < 0 ||
		o.saturationKVUsage <= 0 || o.saturationKVUsage > 1 || o.saturationQueueSecs <= 0 {
		return nil, errors.New("--queue-size, --queue-headroom and --saturation-waiting must not be negative; --queue-timeout-secs, --queue-max-bytes and --saturation-queue-secs must be positive; --saturation-kv-usage in (0, 1]")
	}
	if o.connectTimeoutSecs < 0 || o.firstByteTimeoutSecs < 0 || o.upstreamStallSecs < 0 {
		return nil, errors.New("--connect-timeout-secs, --first-byte-timeout-secs and --upstream-stall-timeout-secs must not be negative")
	}
	if o.streamResumeAttempts < 0 || o.streamResumeMaxBytes <= 0 {
		return nil, errors.New("--stream-resume-attempts must not be negative; --stream-resume-max-bytes must be positive")
	}
	if o.clientHeaderSecs <= 0 {
		return nil, errors.New("--client-header-timeout-secs must be positive")
	}
	if o.loadScrapeSecs < 0 || o.workerDNSIntervalSecs < 0 {
		return nil, errors.New("--worker-load-scrape-interval-secs and --worker-dns-interval-secs must not be negative")
	}
	if o.workerDNS != "" {
		if _, _, err := loadview.ParseDNSTarget(o.workerDNS); err != nil {
			return nil, fmt.Errorf("--worker-dns: %w", err)
		}
	}
	if err := checkPDFlags(o); err != nil {
		return nil, err
	}
	if err := checkKVEventsFlags(o); err != nil {
		return nil, err
	}
	if err := checkTraceFlags(o); err != nil {
		return nil, err
	}
	if err := checkDiscoveryFlags(o); err != nil {
		return nil, err
	}
	if err := resolveSecrets(o); err != nil { // the environment and the files keep secrets out of the process list
		return nil, err
	}
	if err := checkRedisURL(o.redisURL); err != nil {
		return nil, err
	}
	return o, nil
}

// checkRedisURL accepts "" (no shared state) or a redis:// or rediss://
// URL that rueidis can use; the error never repeats the URL, which may
// hold a password.
func checkRedisURL(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		return errors.New("--redis-url: want redis://[user:password@]host:port[/db] or rediss://…")
	}
	if _, err := rueidis.ParseURL(s); err != nil {
		return errors.New("--redis-url: " + strings.ReplaceAll(err.Error(), s, u.Redacted()))
	}
	return nil
}

// multiValueFlags take the values that follow them, as the vLLM router's
// list flags do ("--worker-urls A B C", "--selector k1=v1 k2=v2").
var multiValueFlags = map[string]bool{"worker-urls": true, "selector": true, "prefill-selector": true, "decode-selector": true}

// workerURLsAsOneValue lets "--worker-urls A B C" (the vLLM router's form),
// and the same form of the other multiValueFlags, work with the flag
// package by joining the values that follow the flag.
func workerURLsAsOneValue(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || !multiValueFlags[strings.TrimLeft(a, "-")] {
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

// prefillAsOneValue turns "--prefill URL [BOOTSTRAP_PORT|none]" (the vLLM
// router's form) into one "--prefill=URL PORT" argument for the flag
// package. A URL must follow; what follows the URL and is not a flag must
// be a port or none: each prefill worker takes its own --prefill.
func prefillAsOneValue(args []string) ([]string, error) {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a != "--prefill" && a != "-prefill" {
			out = append(out, a)
			continue
		}
		if i+1 == len(args) || strings.HasPrefix(args[i+1], "-") {
			return nil, errors.New("--prefill needs a URL right after it: --prefill URL [BOOTSTRAP_PORT|none]")
		}
		i++
		v := args[i]
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
			v += " " + args[i]
		}
		out = append(out, "--prefill="+v)
	}
	return out, nil
}

// pdFlags are the flags that mean something only with
// --vllm-pd-disaggregation.
var pdFlags = map[string]bool{
	"prefill": true, "decode": true, "prefill-policy": true, "decode-policy": true,
	"kv-connector": true, "pd-kv-hold-secs": true, "prefill-worker-dns": true, "decode-worker-dns": true,
	"prefill-selector": true, "decode-selector": true,
}

// errKVConnector refuses a KV connector other than NIXL, naming where the
// supported exchange is described.
func errKVConnector(name string) error {
	return fmt.Errorf("--kv-connector %q: only nixl is supported; the vLLM router's mooncake, moriio and P2P NCCL "+
		"(--vllm-discovery-address) transfers are not (docs/reference.md, \"Flags: disaggregated prefill and decode\")", name)
}

// checkPDFlags checks the disaggregated-serving flags that need no file:
// each needs --vllm-pd-disaggregation; the policies, the connector, the
// KV hold and the DNS targets must be valid; no worker URL may have two
// roles. Whether both roles have a source is needWorkers' (the config may
// name them).
func checkPDFlags(o *options) error {
	if !o.pd {
		if len(o.pdFlagsGiven) > 0 {
			return fmt.Errorf("%s: only with --vllm-pd-disaggregation", strings.Join(o.pdFlagsGiven, ", "))
		}
		return nil
	}
	for _, p := range []struct{ flag, name string }{{"--prefill-policy", o.prefillPolicy}, {"--decode-policy", o.decodePolicy}} {
		if p.name != "" && !slices.Contains(route.Names, p.name) {
			return fmt.Errorf("%s %q: want one of %v", p.flag, p.name, route.Names)
		}
	}
	if o.kvConnector != "nixl" {
		return errKVConnector(o.kvConnector)
	}
	if o.pdKVHoldSecs <= 0 {
		return errors.New("--pd-kv-hold-secs must be positive")
	}
	targets := map[string]string{}
	for _, d := range []struct{ flag, target string }{{"--worker-dns", o.workerDNS}, {"--prefill-worker-dns", o.prefillDNS}, {"--decode-worker-dns", o.decodeDNS}} {
		if d.target == "" {
			continue
		}
		if _, _, err := loadview.ParseDNSTarget(d.target); err != nil {
			return fmt.Errorf("%s: %w", d.flag, err)
		}
		if prev, dup := targets[d.target]; dup {
			return fmt.Errorf("%s and %s name the same service %q: a worker has one role", prev, d.flag, d.target)
		}
		targets[d.target] = d.flag
	}
	return fleetRoles(o, &saar.Config{})
}

// checkKVEventsFlags builds o.kvEventsConfig from the KV-event flags, each
// of which needs --kv-events: the ports, the mappings (the vLLM router's
// WORKER_URL=tcp://HOST:PORT, one per worker) and, for the workers the
// flags name, an endpoint each and none shared (loadview.CheckKVEvents).
// The workers of --config, --worker-dns and the admin API are checked as
// they join: one left without a usable endpoint is logged, not followed.
func checkKVEventsFlags(o *options) error {
	if !o.kvEvents {
		if len(o.kvFlagsGiven) > 0 {
			return fmt.Errorf("%s: only with --kv-events", strings.Join(o.kvFlagsGiven, ", "))
		}
		return nil
	}
	if o.kvEventsPort < 1 || o.kvEventsPort > 65535 {
		return fmt.Errorf("--kv-events-port %d: want 1-65535", o.kvEventsPort)
	}
	if o.kvEventsReplayPort < 0 || o.kvEventsReplayPort > 65535 {
		return fmt.Errorf("--kv-events-replay-port %d: want 1-65535, or 0 for none", o.kvEventsReplayPort)
	}
	if o.kvEventsReplayPort == o.kvEventsPort {
		return fmt.Errorf("--kv-events-replay-port %d is --kv-events-port: the replay socket needs its own port", o.kvEventsReplayPort)
	}
	cfg := &loadview.KVEventsConfig{
		Port:       o.kvEventsPort,
		ReplayPort: o.kvEventsReplayPort,
		Endpoints:  map[string]loadview.KVEndpoints{},
		Topic:      o.kvEventsTopic,
	}
	for _, m := range o.kvEventsEndpoints {
		worker, eps, err := loadview.ParseKVEndpointMapping(m)
		if err != nil {
			return fmt.Errorf("--kv-events-endpoint %q: %w", m, err)
		}
		if _, dup := cfg.Endpoints[worker]; dup {
			return fmt.Errorf("--kv-events-endpoint: %s is mapped twice", worker)
		}
		cfg.Endpoints[worker] = eps
	}
	var urls []string
	for _, f := range flagWorkers(o) {
		urls = append(urls, f.url)
	}
	if err := loadview.CheckKVEvents(*cfg, urls, o.dpSize); err != nil {
		return fmt.Errorf("--kv-events: %w", err)
	}
	o.kvEventsConfig = cfg
	return nil
}

// flagWorker is a worker URL given by a flag, in its role.
type flagWorker struct {
	url, where string
	role       loadview.Role
}

// flagWorkers lists --worker-urls, --prefill and --decode in that order.
func flagWorkers(o *options) []flagWorker {
	var out []flagWorker
	for _, u := range o.workerURLs {
		out = append(out, flagWorker{u, "--worker-urls", loadview.Regular})
	}
	for _, p := range o.prefill {
		out = append(out, flagWorker{p.url, "--prefill", loadview.Prefill})
	}
	for _, u := range o.decode {
		out = append(out, flagWorker{u, "--decode", loadview.Decode})
	}
	return out
}

// fleetRoles refuses a worker given in two roles, by the config's models
// or the flags: an engine runs as one. Ranks of one engine count as it.
func fleetRoles(o *options, cfg *saar.Config) error {
	roles := workerRoles{}
	for _, m := range cfg.Models {
		where := fmt.Sprintf("model %s in --config", m.Name)
		for _, l := range []struct {
			urls []string
			role loadview.Role
		}{{m.Workers, loadview.Regular}, {m.PrefillWorkers, loadview.Prefill}, {m.DecodeWorkers, loadview.Decode}} {
			for _, u := range l.urls {
				if err := roles.add(u, l.role, where); err != nil {
					return err
				}
			}
		}
	}
	for _, f := range flagWorkers(o) {
		if err := roles.add(f.url, f.role, f.where); err != nil {
			return err
		}
	}
	return nil
}

// workerRoles maps a worker's base URL to its role and where it was given,
// to refuse a worker given in two roles: an engine runs as one.
type workerRoles map[string]struct {
	role  loadview.Role
	where string
}

func (r workerRoles) add(raw string, role loadview.Role, where string) error {
	base, _, err := loadview.ParseWorkerURL(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if prev, ok := r[base]; ok && prev.role != role {
		return fmt.Errorf("worker %s is given as %s (%s) and as %s (%s): a worker has one role", base, prev.role, prev.where, role, where)
	}
	r[base] = struct {
		role  loadview.Role
		where string
	}{role, where}
	return nil
}

// checkTraceFlags checks the trace flags, each of which but --enable-trace
// needs it: the endpoint's form, the ratio's range, the paths.
func checkTraceFlags(o *options) error {
	if !o.enableTrace {
		if len(o.traceFlagsGiven) > 0 {
			return fmt.Errorf("%s: only with --enable-trace", strings.Join(o.traceFlagsGiven, ", "))
		}
		return nil
	}
	if _, err := tracing.EndpointOptions(o.otlpTracesEndpoint); err != nil {
		return fmt.Errorf("--otlp-traces-endpoint %q: %w", o.otlpTracesEndpoint, err)
	}
	if !(o.otelSamplingRatio >= 0 && o.otelSamplingRatio <= 1) {
		return fmt.Errorf("--otel-sampling-ratio %v: want 0 to 1", o.otelSamplingRatio)
	}
	for _, p := range o.otelExcludedPaths {
		if !strings.HasPrefix(p, "/") {
			return fmt.Errorf("--otel-excluded-paths %q: want absolute paths", p)
		}
	}
	return nil
}

var errHelp = errors.New("help requested")

func secs(n int) time.Duration { return time.Duration(n) * time.Second }

func fsecs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// offOr turns a flag's 0 ("off") into the router config's negative "off",
// whose 0 means "the default".
func offOr[T time.Duration | int](v T) T {
	if v == 0 {
		return -1
	}
	return v
}
