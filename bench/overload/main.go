// Command overload is make bench-overload (issue 29): an open-loop overload
// benchmark of the real router binary over loopback, in front of four
// batching simulated workers (package simworker, in this process). It
// compares three router configurations: pass-through (no router queue:
// today's behaviour, every request straight to a worker up to
// --max-concurrent-requests), fifo (the router queue in arrival order, like
// the vLLM router's) and new (the router queue by priority, tenant
// fairness, warm tool-loop turns, then age).
//
//	go run ./bench/overload [--out DIR]    # make bench-overload (~20 min)
//	go run ./bench/overload --quick        # make bench-overload QUICK=1 (< 1 min; structure only)
//
// Sessions (tau-bench airline trajectories from ../shared/traces, and
// synthetic multi-turn sessions) arrive as a Poisson process; within one,
// each turn follows the previous answer after a think time (closed loop).
// A fifth of the sessions are interactive (x-request-priority 0), the rest
// batch (10); two tenants, one arriving at 4× the other's rate, each with
// its own client key. Every request is streamed with
// stream_options.include_usage, so TTFT and cached tokens are measured.
//
// First the capacity: the session arrival rate at which pass-through's
// TTFT p50 doubles over its light-load value (a doubling search, then
// bisection). Then every configuration at 0.7×, 1×, 1.5× and 2× of it,
// each run on a fresh fleet and router. Every request ends in exactly one
// outcome (served, 429, 503 queue_timeout, client gone, cut at the run's
// end, other error), checked from both ends: the client's ledger and the
// workers' receipts by x-request-id. Output: overload.md, .csv and .svg.
// Exit status 1 when a request broke the one-outcome rule, 2 on a harness
// error.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warmroute/warmroute/bench"
	"github.com/warmroute/warmroute/simworker"
)

// options configure the benchmark. Simulated seconds are the workers'
// clock: a real duration is a simulated one × timeScale.
type options struct {
	out, bin, traceDir string
	records            string // a JSON-lines file of every request (empty: none)
	quick              bool
	configs            []string
	routerArgs         []string
	newArgs            []string // more router flags for the new configuration only
	cmdline            string   // the flags it ran with, for the report
	seed               uint64

	workers, maxNumSeqs, cacheBlocks int
	scheduling                       string  // the workers' simworker.Config.SchedulingPolicy
	timeScale                        float64 // real seconds per simulated second
	maxTokens                        int     // max_tokens of every turn; 0: each turn's recorded answer
	synthetic                        int     // synthetic sessions in the pool

	think    float64 // mean think time between turns, simulated seconds (uniform ×[0.5, 1.5))
	patience float64 // a client's wait for its first token, simulated seconds

	duration, searchDuration time.Duration // real: arrivals of a measured run, of a search run
	warm                     float64       // the first warm of a run's span is not measured (fraction)
	loads                    []float64     // × capacity
	lightRate                float64       // sessions per simulated second of the light-load run
	capacity                 float64       // given: no search (sessions per simulated second)
	bisect                   int           // bisection steps after the doubling search

	queueTimeout int     // --queue-timeout-secs (real seconds)
	queueSize    int     // --queue-size of fifo and new; 0: the router's default
	scrape       float64 // --worker-load-scrape-interval-secs (real seconds)
}

func defaultOptions() options {
	return options{
		out: "bench/results", traceDir: filepath.Join("..", "shared", "traces"),
		configs: allConfigs, seed: 1,
		workers: 4, maxNumSeqs: 8, cacheBlocks: 4096, timeScale: 1, synthetic: 200,
		think: 0.5, patience: 20,
		// A measured run's 120 s give the 0.7× run about 700 interactive
		// requests, so the p99 the interactive bound divides by is their
		// seventh largest, not their fourth; a search run is as long (0),
		// since a shorter one ends before the fleet holds as many sessions
		// at once and overstates the capacity (bench/results/README.md).
		duration: 120 * time.Second, warm: 0.25,
		loads: []float64{0.7, 1, 1.5, 2}, lightRate: 0.5, bisect: 2,
		queueTimeout: 10, scrape: 0.2,
	}
}

// applyQuick shortens everything not set on the command line (set).
func (o *options) applyQuick(set map[string]bool) {
	if !set["duration"] {
		o.duration = 5 * time.Second
	}
	if !set["loads"] {
		o.loads = []float64{0.7, 3}
	}
	if !set["capacity"] {
		o.capacity = 3
	}
	if !set["max-num-seqs"] { // a small fleet, so that 3× saturates it within seconds
		o.maxNumSeqs = 2
	}
	if !set["patience"] {
		o.patience = 2
	}
	if !set["queue-timeout-secs"] {
		o.queueTimeout = 1
	}
	if !set["queue-size"] { // small enough that 3× fills it: the 429 path runs too
		o.queueSize = 8
	}
	if !set["synthetic"] {
		o.synthetic = 40
	}
}

// sim is the workers' configuration.
func (o *options) sim() simworker.Config {
	return simworker.Config{MaxNumSeqs: o.maxNumSeqs, CacheBlocks: o.cacheBlocks, TimeScale: o.timeScale, SchedulingPolicy: o.scheduling}
}

// requestShape is what bench.TurnRequest and bench.ReadStream read.
func (o *options) requestShape() bench.Options {
	return bench.Options{MaxTokens: o.maxTokens, SessionVia: bench.ViaHeader, Sim: o.sim(),
		ThinkTime: time.Duration(o.think * float64(time.Second))}
}

// span is a run's arrival span in simulated seconds.
func (o *options) span(d time.Duration) float64 { return d.Seconds() / o.timeScale }

func main() {
	o := defaultOptions()
	fs := flag.CommandLine
	fs.StringVar(&o.out, "out", o.out, "directory of overload.{md,csv,svg} (overload-quick.* with --quick)")
	fs.StringVar(&o.records, "records", "", "also write every request (run, tenant, class, outcome, TTFT, tokens, queue wait) to this JSON-lines file")
	fs.StringVar(&o.bin, "bin", "", "router binary to measure (default: build ./cmd/warmroute)")
	fs.StringVar(&o.traceDir, "trace-dir", o.traceDir, "directory of the tau-bench trace (absent: synthetic sessions only)")
	fs.BoolVar(&o.quick, "quick", false, "a smoke run: no search, two short loads per configuration (< 1 min); checks structure, not results")
	configs := fs.String("configs", strings.Join(allConfigs, ","), "router configurations to run (comma separated)")
	routerArgs := fs.String("router-args", "", "more router flags for every configuration (space separated)")
	newArgs := fs.String("new-args", "", "more router flags for the new configuration only (space separated), e.g. --queue-preempt")
	fs.Uint64Var(&o.seed, "seed", o.seed, "arrivals, sessions and think times")
	fs.IntVar(&o.workers, "workers", o.workers, "simulated workers")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", o.maxNumSeqs, "sequences a worker runs at once")
	fs.StringVar(&o.scheduling, "worker-scheduling", "fcfs", `the workers' order of waiting requests: fcfs, or priority (by the request's "priority", which the router then must forward: --router-args "--forward-priority")`)
	fs.IntVar(&o.cacheBlocks, "cache-blocks", o.cacheBlocks, "a worker's KV cache in blocks of 16 tokens")
	fs.Float64Var(&o.timeScale, "time-scale", o.timeScale, "real seconds per simulated second (larger: less CPU per simulated second)")
	fs.IntVar(&o.maxTokens, "max-tokens", o.maxTokens, "max_tokens of every turn (0: the turn's recorded answer length)")
	fs.IntVar(&o.synthetic, "synthetic", o.synthetic, "synthetic sessions in the pool")
	fs.Float64Var(&o.think, "think", o.think, "mean think time between a session's turns, simulated seconds")
	fs.Float64Var(&o.patience, "patience", o.patience, "how long a client waits for its first token, simulated seconds")
	fs.DurationVar(&o.duration, "duration", o.duration, "real time during which sessions arrive in a measured run")
	fs.DurationVar(&o.searchDuration, "search-duration", o.searchDuration, "the same in a capacity-search run (0: as --duration)")
	fs.Float64Var(&o.warm, "warm", o.warm, "fraction of a run's span not measured (warm-up)")
	loads := fs.String("loads", "0.7,1,1.5,2", "loads as multiples of the capacity")
	fs.Float64Var(&o.lightRate, "light-rate", o.lightRate, "sessions per simulated second of the light-load run")
	fs.Float64Var(&o.capacity, "capacity", 0, "capacity in sessions per simulated second (skips the search)")
	fs.IntVar(&o.bisect, "bisect", o.bisect, "bisection steps after the doubling search")
	fs.IntVar(&o.queueTimeout, "queue-timeout-secs", o.queueTimeout, "the router's --queue-timeout-secs (fifo, new), real seconds")
	fs.IntVar(&o.queueSize, "queue-size", 0, "the router's --queue-size (fifo, new); 0: its default")
	fs.Float64Var(&o.scrape, "scrape", o.scrape, "the router's --worker-load-scrape-interval-secs, real seconds")
	flag.Parse()
	o.cmdline = strings.Join(os.Args[1:], " ")
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.configs = splitList(*configs, ",")
	o.routerArgs = splitList(*routerArgs, " ")
	o.newArgs = splitList(*newArgs, " ")
	var err error
	if o.loads, err = parseLoads(*loads); err != nil {
		fail(2, err)
	}
	if o.quick {
		o.applyQuick(set)
	}
	if o.searchDuration <= 0 {
		o.searchDuration = o.duration
	}
	if err := o.sim().Validate(); err != nil {
		fail(2, err)
	}
	if o.timeScale <= 0 || o.workers <= 0 || o.think < 0 || o.patience <= 0 || o.warm < 0 || o.warm >= 1 {
		fail(2, fmt.Errorf("want --time-scale, --workers, --patience > 0, --think >= 0 and --warm in [0, 1)"))
	}
	rep, err := run(&o, os.Stderr)
	if err != nil {
		fail(2, err)
	}
	if err := rep.write(o.out); err != nil {
		fail(2, err)
	}
	if o.records != "" {
		if err := rep.writeRecords(o.records); err != nil {
			fail(2, err)
		}
	}
	if n := rep.violations(); n > 0 {
		fail(1, fmt.Errorf("%d requests broke the one-outcome rule (see the report)", n))
	}
}

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "bench-overload:", err)
	os.Exit(code)
}

func splitList(s, sep string) []string {
	var out []string
	for part := range strings.SplitSeq(s, sep) {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

func parseLoads(s string) ([]float64, error) {
	var out []float64
	for _, part := range splitList(s, ",") {
		v, err := strconv.ParseFloat(part, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("--loads: %q is not a positive number", part)
		}
		out = append(out, v)
	}
	return out, nil
}
