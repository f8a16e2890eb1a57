// Command warmroute is a session- and cache-aware router for fleets of
// OpenAI-compatible LLM inference workers (vLLM, SGLang, simulated).
//
//	warmroute --demo                            # embedded simulated workers
//	warmroute --worker-urls http://gpu1:8000 http://gpu2:8000
//	warmroute --config fleet.yaml              # physical + logical models (SAAR)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/examples"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/sharedstate"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(runHUP(ctx, os.Args[1:], os.Stdout, os.Stderr, hupSignals()))
}

// run is the whole program; it returns the exit code. Cancelling ctx (a
// signal) stops accepting, lets in-flight requests finish up to the grace
// period, and returns 0.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runHUP(ctx, args, stdout, stderr, nil)
}

// runHUP is run that reloads on each value of hup (SIGHUP; nil: never).
func runHUP(ctx context.Context, args []string, stdout, stderr io.Writer, hup <-chan os.Signal) int {
	if len(args) > 0 && args[0] == "replay" {
		return replayCmd(args[1:], stdout, stderr)
	}
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, errHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "warmroute:", err)
		return 2
	}
	log, err := newLogger(o.logLevel, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "warmroute:", err)
		return 2
	}
	cfg, err := loadConfig(o)
	if err == nil {
		err = checkConfigRoles(o, cfg)
	}
	if err == nil {
		err = needWorkers(o, cfg)
	}
	if err != nil {
		fmt.Fprintln(stderr, "warmroute:", err)
		return 2
	}
	if err := serve(ctx, o, cfg, log, stdout, stderr, hup); err != nil {
		log.Error("warmroute stopped", "err", err)
		return 1
	}
	return 0
}

func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// loadConfig checks the settings that need no network: the policy name and
// the --config file (or, with --demo and no --config, the embedded demo
// config).
func loadConfig(o *options) (*saar.Config, error) {
	if !slices.Contains(route.Names, o.policy) {
		return nil, fmt.Errorf("--policy %q: want one of %v", o.policy, route.Names)
	}
	switch {
	case o.config != "":
		cfg, err := saar.LoadConfig(o.config)
		if err == nil && cfg.Router != nil {
			// Never read: refused rather than ignored, so that no setting
			// an operator wrote there is silently lost.
			return nil, fmt.Errorf("%s:%d: a router: section is not read; give its settings as flags", o.config, cfg.Router.Line)
		}
		return cfg, err
	case o.demo:
		cfg, err := saar.ParseConfig(examples.Demo)
		if err != nil {
			return nil, fmt.Errorf("embedded demo config: %w", err)
		}
		return cfg, nil
	}
	return &saar.Config{}, nil
}

// errNoWorkers is the refusal of a router given no source of workers: a
// deployment that lost its flags must fail loudly, not answer every client
// with simulated filler text.
var errNoWorkers = errors.New("no workers to route to: give --worker-urls URL..., workers in --config, --worker-dns NAME:PORT, or --service-discovery --selector key=value; " +
	"--demo serves embedded simulated workers; --allow-empty-fleet starts empty for workers added through the admin API")

// PD mode's refusals of a fleet that lacks one side: a request prefilled
// with nowhere to decode, or the reverse, could never be served.
var (
	errNoPrefill = errors.New("--vllm-pd-disaggregation: no prefill workers: give --prefill URL [BOOTSTRAP_PORT|none], prefill_workers in --config, --prefill-worker-dns NAME:PORT, or --service-discovery --prefill-selector key=value; " +
		"--allow-empty-fleet starts empty for workers added through the admin API")
	errNoDecode = errors.New("--vllm-pd-disaggregation: no decode workers: give --decode URL, decode_workers in --config, --decode-worker-dns NAME:PORT, or --service-discovery --decode-selector key=value; " +
		"--allow-empty-fleet starts empty for workers added through the admin API")
)

// needWorkers refuses to start without a source of workers, unless asked
// to (--demo, --allow-empty-fleet); in PD mode, without a source of prefill
// workers and one of decode workers (regular workers alone do not do).
func needWorkers(o *options, cfg *saar.Config) error {
	if o.pd && !o.allowEmptyFleet {
		prefill := len(o.prefill) > 0 || o.prefillDNS != "" || len(o.prefillSelector) > 0
		decode := len(o.decode) > 0 || o.decodeDNS != "" || len(o.decodeSelector) > 0
		for _, m := range cfg.Models {
			prefill = prefill || len(m.PrefillWorkers) > 0
			decode = decode || len(m.DecodeWorkers) > 0
		}
		switch {
		case !prefill:
			return errNoPrefill
		case !decode:
			return errNoDecode
		}
		return nil
	}
	if o.demo || o.allowEmptyFleet || len(o.workerURLs) > 0 || o.workerDNS != "" || o.serviceDiscovery {
		return nil
	}
	for _, m := range cfg.Models {
		if len(m.Workers) > 0 {
			return nil
		}
	}
	return errNoWorkers
}

// openShared opens the Redis store shared by the replicas (docs/design.md
// §8.3) when url is set; nil when not (one replica, the demo). An
// unreachable Redis is not an error: the store starts down, every replica
// routes on local state, and it connects when Redis answers.
func openShared(ctx context.Context, url string, set *metrics.Set, log *slog.Logger) (*sharedstate.Store, error) {
	if url == "" {
		return nil, nil
	}
	st, err := sharedstate.Open(ctx, sharedstate.Config{URL: url, Logger: log, Metrics: set})
	if err != nil {
		return nil, errors.New("--redis-url: malformed")
	}
	log.Info("shared state on redis", "up", st.Up(), "namespace", st.Namespace())
	return st, nil
}

// sweep drops expired sessions from the worker step's and the model step's
// memories every interval: each policy's (in PD mode the prefill and the
// decode policy) and the model step's.
func sweep(ctx context.Context, policies []route.Policy, models *saar.Router, every time.Duration, log *slog.Logger) {
	if every <= 0 {
		return
	}
	var memories []route.Sweeper
	for _, p := range policies {
		if m, ok := p.(route.Sweeper); ok {
			memories = append(memories, m)
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n := models.Sweep()
			for _, m := range memories {
				n += m.Sweep()
			}
			if n > 0 {
				log.Debug("session sweep", "dropped", n)
			}
		}
	}
}

// readKeys reads one API key per line of path (blank lines and # comments
// skipped); an empty path means none.
func readKeys(path string) ([]string, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, line := range strings.Split(string(b), "\n") {
		if k := strings.TrimSpace(line); k != "" && !strings.HasPrefix(k, "#") {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, errors.New("no keys in " + path)
	}
	return keys, nil
}

func metricsAddr(o *options) string {
	if o.prometheusPort <= 0 {
		return "off"
	}
	return "http://" + net.JoinHostPort(o.prometheusHost, strconv.Itoa(o.prometheusPort)) + "/metrics"
}

// checkConfigRoles refuses the config's prefill_workers and decode_workers
// outside PD mode, naming the line, and, in PD mode, a worker given in two
// roles across the config and the flags.
func checkConfigRoles(o *options, cfg *saar.Config) error {
	if !o.pd {
		for _, m := range cfg.Models {
			if m.PDLine > 0 {
				return fmt.Errorf("%s:%d: prefill_workers and decode_workers only with --vllm-pd-disaggregation", o.config, m.PDLine)
			}
		}
		return nil
	}
	return fleetRoles(o, cfg)
}

// addWorkers registers the workers of the config's models (with those
// models, in their roles) and those of the flags (--worker-urls, --prefill,
// --decode; their models are discovered). A URL in both is the config's.
func addWorkers(ctx context.Context, reg *loadview.Registry, cfg *saar.Config, o *options) error {
	order, byURL := configWorkers(cfg)
	for _, u := range order {
		if _, err := reg.AddRole(ctx, u, byURL[u].models, byURL[u].role); err != nil {
			return err
		}
	}
	for _, f := range flagWorkers(o) {
		if _, ok := byURL[f.url]; ok {
			continue
		}
		if _, err := reg.AddRole(ctx, f.url, nil, f.role); err != nil {
			return err
		}
	}
	return nil
}

func firstModel(reg *loadview.Registry, models *saar.Router) string {
	if ls := models.LogicalModels(); len(ls) > 0 {
		return ls[0]
	}
	if ms := reg.Models(); len(ms) > 0 {
		return ms[0]
	}
	return "default"
}
