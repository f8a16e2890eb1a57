package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"go.opentelemetry.io/otel"

	"github.com/warmroute/warmroute/admission"
	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/sharedstate"
	"github.com/warmroute/warmroute/tracing"
)

// serve builds the router from its flags, serves until ctx ends, then lets
// in-flight requests finish for the grace period. Each part is closed, in
// the reverse order of its start, when serve returns.
func serve(ctx context.Context, o *options, cfg *saar.Config, log *slog.Logger, stdout, stderr io.Writer, hup <-chan os.Signal) error {
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	start, err := readFiles(o, false) // the keys, the allow-list, the TLS pair, the audit log: as a reload reads them
	if err != nil {
		return err
	}
	audit := &auditSink{f: start.audit, stderr: stderr}
	closers = append(closers, audit.close)
	reg := newRegistry(o, start, log)
	closers = append(closers, reg.StopKVEvents) // closed last: the consumers hear the engines until the server has stopped
	// One metrics set for the server and the shared store: /metrics writes
	// it once (the store's warmroute_redis_* series included).
	set := metrics.NewSet()
	store, err := openShared(ctx, o.redisURL, set, log)
	if err != nil {
		return err
	}
	if store != nil {
		closers = append(closers, store.Close)
	}
	policy, pd, err := newPolicies(o, reg, store)
	if err != nil {
		return err
	}
	if o.demo {
		demo, err := startDemo(cfg, o.demoWorkers)
		if err != nil {
			return err
		}
		closers = append(closers, demo.close)
		log.Info("demo mode: serving embedded simulated workers (--demo)", "workers", len(demo.workers))
	}
	if err := addWorkers(ctx, reg, cfg, o); err != nil {
		return err
	}
	logKVEvents(o, reg, log)
	replayLog, err := openReplayLog(o.replayLog, &closers)
	if err != nil {
		return err
	}
	models := saar.NewRouter(cfg, saar.Options{Replay: replayLog, Shared: store})
	closers = append(closers, models.Close) // after the server's shutdown: the replay queue drains into the file
	tracer, err := newTracer(o, &closers, log)
	if err != nil {
		return err
	}
	rl := &reloader{o: o, reg: reg, models: models, audit: audit, log: log}
	rl.applied = configWorkersOf(o, cfg)
	srv, err := newServer(o, start, reg, policy, pd, models, set, store, log, audit, rl.reload, tracer)
	if err != nil {
		return err
	}
	rl.srv = srv
	if start.cert != nil {
		rl.cert = &certificate{}
		rl.cert.set(start.cert)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	if err != nil {
		return err
	}
	bg, cancel := context.WithCancel(context.Background())
	closers = append(closers, cancel)
	policies := []route.Policy{policy}
	if pd != nil {
		policies = append(policies, pd.DecodePolicy)
		logPD(o, policy, pd, log)
	}
	if err := startBackground(ctx, bg, o, reg, policies, models, log); err != nil {
		ln.Close()
		return err
	}
	go reloadOn(bg, hup, srv)
	var obs *fasthttpShutdowner
	if o.prometheusPort > 0 {
		oln, err := net.Listen("tcp", net.JoinHostPort(o.prometheusHost, strconv.Itoa(o.prometheusPort)))
		if err != nil {
			ln.Close()
			return fmt.Errorf("metrics listener: %w", err)
		}
		obs = &fasthttpShutdowner{srv.ServeObservability(oln)}
	}
	log.Info("warmroute listening", "addr", ln.Addr().String(), "policy", policy.Name(),
		"workers", len(reg.Workers()), "metrics", metricsAddr(o))
	fmt.Fprintf(stdout, "try: curl -s http://%s/v1/chat/completions -H 'Content-Type: application/json' -H 'X-Session-ID: demo-1' -d '{\"model\":%q,\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]}'\n",
		ln.Addr().String(), firstModel(reg, models))
	return serveUntilDone(ctx, o, srv, ln, obs, rl.cert, log)
}

// fasthttpShutdowner is the metrics listener's server, stopped after the
// inference listener's.
type fasthttpShutdowner struct{ srv interface{ Shutdown() error } }

// newRegistry is the fleet: the worker allow-list, the health checks, the
// circuit breakers and the load scrapes, as the flags set them.
func newRegistry(o *options, f *files, log *slog.Logger) *loadview.Registry {
	return loadview.NewRegistry(loadview.Config{
		ConnectTimeout:     fsecs(o.connectTimeoutSecs),
		CBSuccessThreshold: o.cbSuccessThreshold,
		CBTimeoutDuration:  secs(o.cbTimeoutSecs),
		CBWindowDuration:   secs(o.cbWindowSecs),
		AllowedWorkers:     f.allow,
		MaxWorkers:         o.maxWorkers,
		DPSize:             o.dpSize,
		RequestTimeout:     secs(o.requestTimeoutSecs),
		HealthEndpoint:     o.healthEndpoint,
		HealthInterval:     secs(o.healthIntervalSecs),
		HealthTimeout:      secs(o.healthTimeoutSecs),
		FailureThreshold:   o.healthFailureThreshold,
		SuccessThreshold:   o.healthSuccessThreshold,
		CBFailureThreshold: o.cbFailureThreshold,
		APIKey:             f.auth.APIKey,
		LoadScrapeInterval: fsecs(o.loadScrapeSecs),
		KVEvents:           o.kvEventsConfig, // nil without --kv-events
		Logger:             log,
	})
}

// logKVEvents says once, with --kv-events, how the engines are followed,
// and names each --kv-events-endpoint that maps no worker of the fleet as
// it starts (a typo, or a worker the admin API or DNS has yet to add).
func logKVEvents(o *options, reg *loadview.Registry, log *slog.Logger) {
	if o.kvEventsConfig == nil {
		return
	}
	log.Info("KV events: following each worker's engine (--kv-events)", "port", o.kvEventsPort,
		"replay_port", o.kvEventsReplayPort, "mapped", len(o.kvEventsConfig.Endpoints), "topic", o.kvEventsTopic)
	for _, u := range reg.UnusedKVMappings() {
		log.Warn("--kv-events-endpoint maps no worker of the fleet (yet)", "worker", u)
	}
}

// newPolicies is the worker step's policy (--policy; in PD mode
// --prefill-policy), its cache-aware settings from the flags, sharing its
// bindings through store when set; and in PD mode the disaggregated
// exchange's settings with the decode policy (--decode-policy), nil
// otherwise.
func newPolicies(o *options, reg *loadview.Registry, store *sharedstate.Store) (route.Policy, *fastproxy.PDConfig, error) {
	if !o.pd {
		p, err := newPolicy(o, o.policy, reg, store)
		return p, nil, err
	}
	p, err := newPolicy(o, cmp.Or(o.prefillPolicy, o.policy), reg, store)
	if err != nil {
		return nil, nil, err
	}
	// The decode policy keeps its memory local: the shared store keys a
	// binding by model and session (or conversation), so its bindings and
	// the prefill policy's, for the same session, would overwrite each
	// other (docs/design.md §9, "Disaggregated fleets"; §8.3).
	dp, err := newPolicy(o, cmp.Or(o.decodePolicy, o.policy), reg, nil)
	if err != nil {
		return nil, nil, err
	}
	return p, &fastproxy.PDConfig{DecodePolicy: dp, KVHold: secs(o.pdKVHoldSecs)}, nil
}

// newPolicy is one policy named name over reg, its cache-aware settings
// from the flags, sharing its bindings through store when set.
func newPolicy(o *options, name string, reg *loadview.Registry, store *sharedstate.Store) (route.Policy, error) {
	caCfg := route.CacheAwareConfig{
		Threshold:               o.cacheThreshold,
		BalanceAbs:              o.balanceAbs,
		BalanceRel:              o.balanceRel,
		MaxTreeSize:             o.maxTreeSize,
		MaxSessions:             o.maxSessions,
		AffinityRule:            o.affinityRule,
		AffinityCharsPerRequest: o.affinityChars,
	}
	if store != nil {
		caCfg.Shared = store // never a typed nil: nil means local state only
	}
	return route.New(name, reg, route.Options{CacheAware: caCfg})
}

// logPD says once how the disaggregated exchange is set up.
func logPD(o *options, prefill route.Policy, pd *fastproxy.PDConfig, log *slog.Logger) {
	log.Info("disaggregated prefill/decode (--vllm-pd-disaggregation)", "prefill_policy", prefill.Name(),
		"decode_policy", pd.DecodePolicy.Name(), "kv_connector", o.kvConnector, "kv_hold", pd.KVHold)
	for _, p := range o.prefill {
		if p.bootstrap != 0 {
			log.Info("--prefill bootstrap ports are accepted but unused: NIXL needs none", "worker", p.url, "port", p.bootstrap)
		}
	}
}

// openReplayLog opens --replay-log for appending, its closing added to
// closers; nil when the flag is not set.
func openReplayLog(path string, closers *[]func()) (io.Writer, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--replay-log: %w", err)
	}
	*closers = append(*closers, func() { f.Close() })
	return f, nil
}

// newServer is the HTTP front end over the fleet, the policy and the model
// step, as the flags set it.
func newServer(o *options, f *files, reg *loadview.Registry, policy route.Policy, pd *fastproxy.PDConfig, models *saar.Router, set *metrics.Set,
	store *sharedstate.Store, log *slog.Logger, audit io.Writer, reload func() error,
	tracer *tracing.Tracer) (*fastproxy.Server, error) {
	return fastproxy.New(fastproxy.Config{
		Registry:        reg,
		Policy:          policy,
		Models:          models,
		MaxPayloadSize:  o.maxPayloadSize,
		RequestTimeout:  secs(o.requestTimeoutSecs),
		RetryMaxRetries: o.retryMaxRetries,
		RetryBackoff:    time.Duration(o.retryInitialBackoffMS) * time.Millisecond,
		RetryMaxBackoff: time.Duration(o.retryMaxBackoffMS) * time.Millisecond,
		APIKey:          f.auth.APIKey,
		Logger:          log,

		AdminAPIKey:           f.auth.AdminAPIKey,
		ClientAPIKeys:         f.auth.ClientAPIKeys,
		RequestIDHeaders:      o.requestIDHeaders,
		ExtraWorkerPaths:      o.extraWorkerPaths,
		ClientHeaderTimeout:   fsecs(o.clientHeaderSecs),
		FirstByteTimeout:      offOr(fsecs(o.firstByteTimeoutSecs)),
		UpstreamStallTimeout:  offOr(fsecs(o.upstreamStallSecs)),
		StreamResumeAttempts:  offOr(o.streamResumeAttempts),
		StreamResumeMaxBytes:  o.streamResumeMaxBytes,
		MaxConcurrentRequests: o.maxConcurrent,
		QueueSize:             o.queueSize,
		QueueTimeout:          secs(o.queueTimeoutSecs),
		QueueMaxBytes:         o.queueMaxBytes,
		QueueOrder:            queueOrder(o.queueOrder),
		ForwardPriority:       o.forwardPriority,
		QueuePreempt:          o.queuePreempt,
		TrustTenantHeader:     o.trustTenantHeader,
		SaturationWaiting:     o.saturationWaiting,
		SaturationKVUsage:     o.saturationKVUsage,
		SaturationQueueSecs:   o.saturationQueueSecs,
		QueueHeadroom:         offOr(o.queueHeadroom),
		Metrics:               set,
		PD:                    pd,    // nil without --vllm-pd-disaggregation
		Shared:                store, // nil without --redis-url

		AdminAPIKeys:      f.auth.AdminAPIKeys,
		Audit:             audit,
		Reload:            reload,
		HideWorkerHeaders: !o.exposeWorkerHeaders,

		Tracer: tracer, // nil without --enable-trace
	})
}

// newTracer is the exporter of --enable-trace (nil without it), flushed
// and stopped by a closer when the server has stopped.
func newTracer(o *options, closers *[]func(), log *slog.Logger) (*tracing.Tracer, error) {
	if !o.enableTrace {
		return nil, nil
	}
	t, err := tracing.New(tracing.Config{Endpoint: o.otlpTracesEndpoint, SamplingRatio: o.otelSamplingRatio,
		ExcludedPaths: o.otelExcludedPaths})
	if err != nil {
		return nil, fmt.Errorf("--enable-trace: %w", err)
	}
	// The SDK reports a failed export to OpenTelemetry's process-wide
	// handler, the standard log package by default: send it to ours.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("traces: export failed", "err", err) }))
	*closers = append(*closers, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(ctx); err != nil {
			log.Warn("traces: the last spans were not all exported", "err", err)
		}
	})
	log.Info("traces: exporting over OTLP/HTTP (--enable-trace)", "endpoint", o.otlpTracesEndpoint, "sampling_ratio", o.otelSamplingRatio)
	return t, nil
}

// startBackground starts, until bg ends, the health checks, the load
// scrapes, the DNS discoveries of --worker-dns, --prefill-worker-dns and
// --decode-worker-dns (each resolved once before the router listens), the
// Kubernetes discovery of --service-discovery (its first list awaited) and
// the session sweeps of policies and models.
func startBackground(ctx, bg context.Context, o *options, reg *loadview.Registry, policies []route.Policy, models *saar.Router, log *slog.Logger) error {
	go reg.RunHealthChecks(bg)
	go reg.RunLoadScrapes(bg)
	for _, t := range []struct {
		flag, target string
		role         loadview.Role
	}{{"--worker-dns", o.workerDNS, loadview.Regular}, {"--prefill-worker-dns", o.prefillDNS, loadview.Prefill}, {"--decode-worker-dns", o.decodeDNS, loadview.Decode}} {
		if t.target == "" {
			continue
		}
		d, err := loadview.NewDNSDiscovery(reg, loadview.DNSConfig{Target: t.target, Interval: fsecs(o.workerDNSIntervalSecs), Role: t.role})
		if err != nil {
			return fmt.Errorf("%s: %w", t.flag, err)
		}
		if err := d.Sync(ctx); err != nil {
			log.Warn(t.flag+": first resolution failed; retrying", "target", t.target, "err", err)
		}
		go d.Run(bg)
	}
	if o.serviceDiscovery {
		if err := startK8sDiscovery(ctx, bg, o, reg, log); err != nil {
			return err
		}
	}
	go sweep(bg, policies, models, secs(o.evictionInterval), log)
	return nil
}

// serveUntilDone serves ln until ctx ends (a signal), then stops accepting
// and waits for in-flight requests, streams included, up to the grace
// period; the metrics listener (obs, may be nil) stops last.
func serveUntilDone(ctx context.Context, o *options, srv *fastproxy.Server, ln net.Listener, obs *fasthttpShutdowner, cert *certificate, log *slog.Logger) error {
	errc := make(chan error, 1)
	go func() {
		if cert != nil { // a reload swaps the pair of new handshakes
			errc <- srv.ServeTLSConfig(ln, &tls.Config{GetCertificate: cert.get, MinVersion: tls.VersionTLS12})
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: no new connections; waiting for in-flight requests", "grace", secs(o.shutdownGraceSecs))
	sctx, cancel := context.WithTimeout(context.Background(), secs(o.shutdownGraceSecs))
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("grace period over with requests still in flight", "err", err)
	}
	if obs != nil {
		_ = obs.srv.Shutdown()
	}
	log.Info("stopped")
	return nil
}

// queueOrder is the admission order --queue-order names (checked by parseFlags).
func queueOrder(name string) admission.Order {
	if name == "fifo" {
		return admission.FIFO
	}
	return admission.Fair
}
