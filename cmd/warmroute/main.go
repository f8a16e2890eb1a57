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
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole program; it returns the exit code. Cancelling ctx (a
// signal) stops accepting, lets in-flight requests finish up to the grace
// period, and returns 0.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
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
		err = needWorkers(o, cfg)
	}
	if err != nil {
		fmt.Fprintln(stderr, "warmroute:", err)
		return 2
	}
	if err := serve(ctx, o, cfg, log, stdout); err != nil {
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
var errNoWorkers = errors.New("no workers to route to: give --worker-urls URL..., workers in --config, or --worker-dns NAME:PORT; " +
	"--demo serves embedded simulated workers; --allow-empty-fleet starts empty for workers added through the admin API")

// needWorkers refuses to start without a source of workers, unless asked
// to (--demo, --allow-empty-fleet).
func needWorkers(o *options, cfg *saar.Config) error {
	if o.demo || o.allowEmptyFleet || len(o.workerURLs) > 0 || o.workerDNS != "" {
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
// memories every interval.
func sweep(ctx context.Context, policy route.Policy, models *saar.Router, every time.Duration, log *slog.Logger) {
	if every <= 0 {
		return
	}
	memory, _ := policy.(route.Sweeper)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n := models.Sweep()
			if memory != nil {
				n += memory.Sweep()
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

// addWorkers registers the workers of the config's models (with those
// models) and the --worker-urls (whose models are discovered).
func addWorkers(ctx context.Context, reg *loadview.Registry, cfg *saar.Config, urls []string) error {
	var order []string
	served := map[string][]string{}
	for _, m := range cfg.Models {
		for _, u := range m.Workers {
			if _, ok := served[u]; !ok {
				order = append(order, u)
			}
			served[u] = append(served[u], m.Name)
		}
	}
	for _, u := range order {
		if _, err := reg.Add(ctx, u, served[u]); err != nil {
			return err
		}
	}
	for _, u := range urls {
		if _, ok := served[u]; ok {
			continue
		}
		if _, err := reg.Add(ctx, u, nil); err != nil {
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
