// Command warmbench replays multi-turn agent sessions through the real
// warmroute router (in process, over loopback) to a fleet of simulated
// workers, once per routing policy and seed, and reports the prompt-cache hit
// rate, TTFT, latency, throughput and load balance of each policy side by
// side. See package bench.
//
//	go run ./cmd/warmbench                      # built-in synthetic workload, every policy, 3 seeds
//	go run ./cmd/warmbench --trace tau          # tau-bench airline sessions from ../shared/traces
//	go run ./cmd/warmbench --trace mooncake     # Mooncake conversation trace, prefix chains as sessions
//	go run ./cmd/warmbench --preset seed        # the RFC's setup in shape: 25 sessions × 4 turns, 4 clients
//	go run ./cmd/warmbench --matrix [--quick]   # the replay matrix: fleets × workloads × ids × in flight (make bench-matrix)
//
// Progress goes to stderr, the table to stdout, and the report to
// bench/results/replay-<workload>.{md,csv,svg} (replay-seed.* for the preset;
// matrix.* or matrix-quick.* for the matrix).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"time"

	"github.com/warmroute/warmroute/bench"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "warmbench:", err)
		os.Exit(1)
	}
}

func run() error {
	syn := bench.DefaultSynthetic()
	var (
		preset      = flag.String("preset", "", `"seed": the RFC's evaluation in shape (25 sessions × 4 turns, max_tokens 256, 4 clients, session id in the body, gates abs 8 / rel 1.5, threshold 0.5); explicit flags still win`)
		trace       = flag.String("trace", "", "replay a trace instead of the synthetic workload: tau[:PATH] or mooncake[:PATH] (default PATH: --trace-dir/"+bench.TauFile+" or "+bench.MooncakeFile+")")
		traceDir    = flag.String("trace-dir", "../shared/traces", "directory of the public traces (relative to the working directory)")
		policies    = flag.String("policies", strings.Join(bench.Policies, ","), "policies to compare, comma-separated; P"+bench.ControlSuffix+" runs P again under a second name (an A/A control: the two rows' spread is the harness's own noise)")
		seeds       = flag.Int("seeds", 3, "seeds (1..N): workload sampling, policy randomness")
		sessions    = flag.Int("sessions", syn.Sessions, "sessions (synthetic), sessions sampled (tau, 0 = all) or chains sampled (mooncake)")
		conc        = flag.Int("concurrency", 8, "sessions in flight (closed loop)")
		via         = flag.String("session-via", bench.ViaHeader, "how the session id travels: header (X-Session-ID), body (session_params.session_id) or none (history-only routing)")
		idStyle     = flag.String("session-ids", bench.IDSeq, "session id style: seq (session-1, session-2, ...) or hex (random 16 hex digits)")
		maxTokens   = flag.Int("max-tokens", 0, "max_tokens of every request (ignore_eos), and the length of the synthetic assistant replies; 0: each call's recorded answer length (tau-bench: the assistant message, ~4 characters per token; Mooncake: output_length; synthetic: 64)")
		think       = flag.Duration("think-time", 0, "simulated pause between a session's turns")
		turnsMin    = flag.Int("turns-min", syn.TurnsMin, "synthetic: fewest turns per session")
		turnsMax    = flag.Int("turns-max", syn.TurnsMax, "synthetic: most turns per session")
		sysTokens   = flag.Int("system-tokens", syn.SystemTokens, "synthetic: shared system prompt, tokens")
		preTokens   = flag.Int("prefix-tokens", syn.SessionPrefixTokens, "synthetic: per-session prefix, mean tokens (uniform ±50%)")
		userMin     = flag.Int("user-tokens-min", syn.UserTokensMin, "synthetic: smallest user turn, tokens")
		userMax     = flag.Int("user-tokens-max", syn.UserTokensMax, "synthetic: largest user turn, tokens")
		maxPrompt   = flag.Int("max-prompt-tokens", 32768, "mooncake: skip chains with a longer request")
		workers     = flag.Int("workers", 4, "simulated workers")
		cacheBlocks = flag.Int("cache-blocks", 0, "prefix-cache capacity per worker in blocks (0: sized from the workload, see bench.AutoCacheBlocks)")
		blockTokens = flag.Int("block-tokens", 16, "prefix-cache block size in tokens")
		timeScale   = flag.Float64("time-scale", 0.05, "simulated time × scale = real time")
		overhead    = flag.Duration("overhead", 20*time.Millisecond, "simulated fixed TTFT per request")
		perToken    = flag.Duration("prefill-per-token", 100*time.Microsecond, "simulated prefill time per uncached prompt token")
		interToken  = flag.Duration("inter-token", 10*time.Millisecond, "simulated decode time per output token")
		maxSeqs     = flag.Int("max-num-seqs", 64, "requests a worker runs at once")
		threshold   = flag.Float64("cache-threshold", 0.3, "router --cache-threshold (cache_aware and pre_rfc)")
		balAbs      = flag.Int64("balance-abs-threshold", 64, "router --balance-abs-threshold")
		balRel      = flag.Float64("balance-rel-threshold", 1.5, "router --balance-rel-threshold")
		treeSize    = flag.Int("max-tree-size", 1<<26, "router --max-tree-size")
		affChars    = flag.Int("affinity-chars-per-request", route.DefaultCacheAwareConfig().AffinityCharsPerRequest, "router --affinity-chars-per-request (cache_aware): when given, misses are placed by this fixed exchange rate instead of the estimated TTFT (0: the RFC's plain threshold rule)")
		out         = flag.String("out", "bench/results", "directory for the report files (empty: stdout only)")
		name        = flag.String("name", "", "report file base name (default replay-<workload>, replay-seed with --preset seed)")
		matrix      = flag.Bool("matrix", false, "run the replay matrix (bench.MatrixCells: fleets a–e × workloads × session ids × in flight, its own policies and seeds; -trace-dir, -out and -name apply)")
		quick       = flag.Bool("quick", false, "with --matrix: a handful of short cells (a smoke test), written as matrix-quick.*")
		cells       = flag.String("cells", "", "with --matrix: run only the cells whose name (fleet/workload/ids/in-flight, e.g. a/tau/none/64) matches this regexp")
	)
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *matrix {
		var pols []string
		if set["policies"] {
			pols = strings.Split(*policies, ",")
		}
		var nseeds int
		if set["seeds"] {
			nseeds = *seeds
		}
		return runMatrix(*quick, *cells, *traceDir, *out, *name, pols, nseeds, *maxTokens)
	}
	def := func(name string, apply func()) {
		if !set[name] {
			apply()
		}
	}
	switch *preset {
	case "":
	case "seed":
		// Codex SWE-bench Pro replay in shape: a large shared agent prompt
		// (instructions + tool schemas), a per-task prefix (the issue and the
		// repository context), and big user turns (tool output).
		def("sessions", func() { *sessions = 25 })
		def("turns-min", func() { *turnsMin = 4 })
		def("turns-max", func() { *turnsMax = 4 })
		def("concurrency", func() { *conc = 4 })
		def("max-tokens", func() { *maxTokens = 256 })
		def("session-via", func() { *via = bench.ViaBody })
		def("system-tokens", func() { *sysTokens = 3000 })
		def("prefix-tokens", func() { *preTokens = 2000 })
		def("user-tokens-min", func() { *userMin = 300 })
		def("user-tokens-max", func() { *userMax = 1500 })
		def("balance-abs-threshold", func() { *balAbs = 8 })
		def("balance-rel-threshold", func() { *balRel = 1.5 })
		def("cache-threshold", func() { *threshold = 0.5 })
		def("policies", func() { *policies = "pre_rfc,cache_aware,sticky,round_robin,consistent_hash,oracle" })
		def("name", func() { *name = "replay-seed" })
	default:
		return fmt.Errorf("unknown --preset %q (want seed)", *preset)
	}
	switch *via {
	case bench.ViaHeader, bench.ViaBody, bench.ViaNone:
	default:
		return fmt.Errorf("--session-via %q: want header, body or none", *via)
	}
	var pols []string
	for p := range strings.SplitSeq(*policies, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !bench.ValidPolicy(p) {
			return fmt.Errorf("unknown policy %q (want some of %v)", p, bench.Policies)
		}
		pols = append(pols, p)
	}
	if *seeds < 1 {
		return errors.New("--seeds must be ≥ 1")
	}
	seedList := make([]uint64, *seeds)
	for i := range seedList {
		seedList[i] = uint64(i + 1)
	}

	var load func(seed uint64) (*bench.Workload, error)
	if *trace == "" {
		load = func(seed uint64) (*bench.Workload, error) {
			c := syn
			c.Sessions, c.TurnsMin, c.TurnsMax = *sessions, *turnsMin, *turnsMax
			c.SystemTokens, c.SessionPrefixTokens = *sysTokens, *preTokens
			c.UserTokensMin, c.UserTokensMax = *userMin, *userMax
			c.AssistantTokens, c.IDStyle, c.Seed = cmp.Or(*maxTokens, bench.DefaultAnswerTokens), *idStyle, seed
			return bench.Synthetic(c), nil
		}
	} else {
		spec, err := bench.ParseTrace(*trace, *traceDir)
		if err != nil {
			return err
		}
		if _, err := os.Stat(spec.Path); err != nil {
			fmt.Fprintf(os.Stderr, "warmbench: skipping the %s workload: trace file not found: %s (the public traces live in ../shared/traces; see its README)\n", spec.Kind, spec.Path)
			return nil
		}
		n := *sessions
		if !set["sessions"] && *preset == "" {
			n = 48
		}
		load = func(seed uint64) (*bench.Workload, error) {
			return bench.LoadTrace(spec, bench.TraceOptions{Sessions: n, MaxPromptTokens: *maxPrompt, IDStyle: *idStyle, Seed: seed})
		}
	}

	opt := bench.Options{
		Workers: *workers,
		Sim: simworker.Config{
			BlockTokens: *blockTokens, CacheBlocks: *cacheBlocks, TimeScale: *timeScale,
			Overhead: *overhead, PerToken: *perToken, InterToken: *interToken, MaxNumSeqs: *maxSeqs,
		},
		Concurrency: *conc, MaxTokens: *maxTokens, ThinkTime: *think, SessionVia: *via,
	}
	opt.CacheAware.Threshold, opt.CacheAware.BalanceAbs, opt.CacheAware.BalanceRel, opt.CacheAware.MaxTreeSize = *threshold, *balAbs, *balRel, *treeSize
	opt.CacheAware.AffinityCharsPerRequest = *affChars
	opt.CacheAware.AffinityRule = set["affinity-chars-per-request"] // as cmd/warmroute does
	if opt.Sim.CacheBlocks <= 0 {
		wl, err := load(seedList[0])
		if err != nil {
			return err
		}
		opt.Sim.CacheBlocks = bench.AutoCacheBlocks(wl, opt)
		fmt.Fprintf(os.Stderr, "warmbench: %s: %d sessions, %d requests per run; cache %d blocks per worker (auto)\n",
			wl.Name, len(wl.Sessions), wl.Requests(), opt.Sim.CacheBlocks)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	suite, err := bench.RunAll(ctx, opt, load, pols, seedList, os.Stderr)
	if err != nil {
		return err
	}
	suite.Preset = *preset
	suite.CmdLine = strings.TrimSpace("go run ./cmd/warmbench " + strings.Join(os.Args[1:], " "))
	suite.Machine = bench.HostMachine()
	fmt.Print(suite.Table())
	fmt.Println()
	fmt.Print(suite.Verdict())
	if *out == "" {
		return nil
	}
	base := *name
	if base == "" {
		base = "replay-" + suite.Workload
	}
	if err := suite.WriteFiles(*out, base); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "warmbench: wrote %s/%s.{md,csv,svg}\n", *out, base)
	return nil
}

// runMatrix runs bench.RunMatrix (the cells matching only, when given) and
// writes out/name.{md,csv,svg} (default name: matrix, or matrix-quick).
// policies, when given, filters each cell's policies; seeds > 0 runs
// seeds 1..seeds for every policy and no contested reruns; maxTokens > 0
// fixes every call's answer length.
func runMatrix(quick bool, only, traceDir, out, name string, policies []string, seeds, maxTokens int) error {
	cfg := bench.MatrixConfig{Quick: quick, TraceDir: traceDir, Progress: os.Stderr, Policies: policies, MaxTokens: maxTokens}
	if seeds > 0 {
		cfg.ExtraSeeds = []uint64{}
		for s := 1; s <= seeds; s++ {
			cfg.Seeds = append(cfg.Seeds, uint64(s))
		}
	}
	if only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			return fmt.Errorf("--cells: %w", err)
		}
		cfg.Cells = []bench.MatrixCell{}
		for _, c := range bench.MatrixCells(quick) {
			if re.MatchString(c.Name()) {
				cfg.Cells = append(cfg.Cells, c)
			}
		}
		if len(cfg.Cells) == 0 {
			return fmt.Errorf("--cells %q matches no cell", only)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	m, err := bench.RunMatrix(ctx, cfg)
	if err != nil {
		return err
	}
	m.CmdLine = strings.TrimSpace("go run ./cmd/warmbench " + strings.Join(os.Args[1:], " "))
	m.Machine = bench.HostMachine()
	fmt.Print(m.Table())
	if out == "" {
		return nil
	}
	if name == "" {
		name = "matrix"
		if quick {
			name = "matrix-quick"
		}
	}
	if err := m.WriteFiles(out, name); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "warmbench: wrote %s/%s.{md,csv,svg} in %s\n", out, name, m.Elapsed.Round(time.Second))
	return nil
}
