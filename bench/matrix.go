package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

// Fleets of the replay matrix (issue 10; docs/design.md §6 for the workers).
const (
	FleetEqual     = "a" // 4 equal workers whose KV cache holds the working set (AutoCacheBlocks)
	FleetSlow      = "b" // fleet a, but worker 0 prefills at half speed (PerToken × 2)
	FleetHalfKV    = "c" // 4 equal workers whose KV cache holds about half the working set (HalfCacheBlocks)
	FleetQuarterKV = "d" // 8 equal workers whose KV cache holds about a quarter of the working set (QuarterCacheBlocks)
	FleetPD        = "e" // 2 prefill + 2 decode workers, the router in PD mode (docs/design.md §9); caches as fleet a's
	FleetPDHalfKV  = "f" // fleet e with caches as fleet c's: about half the working set (HalfCacheBlocks)
)

// fleetWorkers is the workers of fleet f (its prefill workers when it is
// disaggregated).
func fleetWorkers(f string) int {
	switch f {
	case FleetQuarterKV:
		return 8
	case FleetPD, FleetPDHalfKV:
		return 2
	}
	return 4
}

// fleetDecode is the decode workers of fleet f (0: not disaggregated).
func fleetDecode(f string) int {
	if f == FleetPD || f == FleetPDHalfKV {
		return 2
	}
	return 0
}

// pdPrefill and pdDecode are fleet e's policies of each leg: the pairs
// PDPolicy(prefill, decode) are its cell's policies.
var (
	pdPrefill = []string{route.RoundRobin, route.ConsistentHash, "cache_aware"}
	pdDecode  = []string{"cache_aware", route.LeastLoaded}
)

// Done-when bounds of the matrix (docs/design.md §7).
const (
	MatrixHitGap    = 0.02 // cache_aware within 2 points of the oracle (fleets a, b)
	MatrixTTFTRatio = 1.10 // cache_aware's TTFT p90 within 10 % of the cell's best
)

// MatrixCell is one workload on one fleet: every policy of the cell replays
// the same requests (per seed).
type MatrixCell struct {
	Fleet       string  // FleetEqual, FleetSlow, FleetHalfKV, FleetQuarterKV, FleetPD or FleetPDHalfKV
	Workload    string  // "synthetic", "tau" or "mooncake"
	Via         string  // ViaHeader (session ids) or ViaNone
	Concurrency int     // sessions in flight
	Sessions    int     // sessions (synthetic, tau) or prefix chains (mooncake)
	TimeScale   float64 // simulated time × scale = real time
	TurnsMin    int     // synthetic: turns per session (0: DefaultSynthetic's)
	TurnsMax    int
	MaxPrompt   int // mooncake: skip chains with a longer request (tokens)
}

// Name is "fleet/workload/ids/in-flight", e.g. "a/tau/header/64".
func (c MatrixCell) Name() string {
	return fmt.Sprintf("%s/%s/%s/%d", c.Fleet, c.Workload, c.Via, c.Concurrency)
}

// Policies is the cell's policies in report order: sticky only where
// session ids exist (without them it is min-load); precise, the ceiling a
// router with the workers' true caches reaches (issue 30), before the
// oracle. Fleet e runs every pair of pdPrefill × pdDecode instead, and
// neither precise nor the oracle: both assume workers that serve whole
// requests (precise reads their caches, the oracle is one worker).
func (c MatrixCell) Policies() []string {
	if c.Fleet == FleetPD || c.Fleet == FleetPDHalfKV {
		var ps []string
		for _, p := range pdPrefill {
			for _, d := range pdDecode {
				ps = append(ps, PDPolicy(p, d))
			}
		}
		return ps
	}
	ps := []string{route.RoundRobin, route.ConsistentHash}
	if c.Via != ViaNone {
		ps = append(ps, PolicySticky)
	}
	ps = append(ps, PolicyRFCRule, PolicyCacheAware32k, "cache_aware")
	if c.Fleet == FleetHalfKV || c.Fleet == FleetQuarterKV {
		ps = append(ps, PolicyCacheAwareEvents) // where the cache is smaller than the working set
	}
	return append(ps, PolicyPrecise, PolicyOracle)
}

// MatrixCells returns the matrix of issue 10: on fleet a, synthetic and
// tau-bench × ids in a header / none × 8 and 64 in flight, plus Mooncake
// without ids at 8 and 64; at 64 in flight without ids, synthetic and
// tau-bench also on fleets b and c; tau-bench and Mooncake at 64 in flight
// without ids on fleet d (issue 30); fleet e, disaggregated, with fleet a's
// synthetic and tau-bench cells, and fleet f, disaggregated with fleet c's
// caches, at 64 in flight without ids. Cells at 64 in flight run at a slower
// time scale so that 2 cores' scheduling noise stays small next to the
// simulated latencies. quick: a handful of short cells (a smoke test).
func MatrixCells(quick bool) []MatrixCell {
	if quick {
		syn := func(fleet, via string, conc int) MatrixCell {
			return MatrixCell{Fleet: fleet, Workload: "synthetic", Via: via, Concurrency: conc, Sessions: 2 * conc,
				TimeScale: 0.02, TurnsMin: 4, TurnsMax: 6}
		}
		return []MatrixCell{
			syn(FleetEqual, ViaHeader, 8),
			syn(FleetEqual, ViaNone, 8),
			{Fleet: FleetEqual, Workload: "tau", Via: ViaNone, Concurrency: 8, Sessions: 10, TimeScale: 0.02},
			{Fleet: FleetEqual, Workload: "mooncake", Via: ViaNone, Concurrency: 8, Sessions: 16, TimeScale: 0.02, MaxPrompt: 8192},
			syn(FleetSlow, ViaNone, 8),
			syn(FleetHalfKV, ViaNone, 8),
			syn(FleetPD, ViaHeader, 8),
		}
	}
	var cells []MatrixCell
	size := func(workload string, conc int) (sessions int, scale float64) {
		switch {
		case conc <= 8 && workload == "mooncake":
			return 48, 0.1
		case conc <= 8:
			return 4 * conc, 0.1
		case workload == "mooncake":
			return 160, 0.2
		default:
			return 3 * conc / 2, 0.2
		}
	}
	add := func(fleet, workload, via string, conc int) {
		n, scale := size(workload, conc)
		cells = append(cells, MatrixCell{Fleet: fleet, Workload: workload, Via: via, Concurrency: conc,
			Sessions: n, TimeScale: scale, MaxPrompt: 32768})
	}
	for _, wl := range []string{"synthetic", "tau"} {
		for _, via := range []string{ViaHeader, ViaNone} {
			for _, conc := range []int{8, 64} {
				add(FleetEqual, wl, via, conc)
			}
		}
	}
	add(FleetEqual, "mooncake", ViaNone, 8)
	add(FleetEqual, "mooncake", ViaNone, 64)
	for _, fleet := range []string{FleetSlow, FleetHalfKV} {
		for _, wl := range []string{"synthetic", "tau"} {
			add(fleet, wl, ViaNone, 64)
		}
	}
	add(FleetQuarterKV, "tau", ViaNone, 64)
	add(FleetQuarterKV, "mooncake", ViaNone, 64)
	for _, wl := range []string{"synthetic", "tau"} {
		for _, via := range []string{ViaHeader, ViaNone} {
			for _, conc := range []int{8, 64} {
				add(FleetPD, wl, via, conc)
			}
		}
		add(FleetPDHalfKV, wl, ViaNone, 64) // PD where the caches do not hold the working set
	}
	return cells
}

// MatrixConfig configures RunMatrix.
type MatrixConfig struct {
	Quick    bool
	Cells    []MatrixCell // nil: MatrixCells(Quick)
	TraceDir string       // the public traces (../shared/traces)
	// Sim is every worker's template (TimeScale and CacheBlocks are set per
	// cell); zero fields get simworker's defaults (its default latency model).
	Sim        simworker.Config
	CacheAware route.CacheAwareConfig // cache_aware's config (zero: route.DefaultCacheAwareConfig)
	MaxTokens  int                    // max_tokens of every request; 0 (default): each call's recorded answer (Options.MaxTokens)
	// Seeds are run for every policy; ExtraSeeds only in contested cells
	// (see Contested). Defaults: [1] and [2 3] ([2] when Quick).
	Seeds, ExtraSeeds []uint64
	HitNoise          float64   // Contested's margin on hit rate (default 0.01: 1 point)
	TTFTNoise         float64   // Contested's margin on TTFT p90 (default 0.10: 10 %)
	Progress          io.Writer // one line per run (nil: none)
	// Policies, when not empty, keeps only these of each cell's policies
	// (warmbench --matrix --policies: iterating on one policy).
	Policies []string
}

// policies is the cell's policies, filtered by c.Policies; a control
// there (ControlSuffix) of one of the cell's policies runs right after it.
func (c *MatrixConfig) policies(cell MatrixCell) []string {
	ps := cell.Policies()
	if len(c.Policies) == 0 {
		return ps
	}
	var out []string
	for _, p := range ps {
		if slices.Contains(c.Policies, p) {
			out = append(out, p)
		}
		if slices.Contains(c.Policies, p+ControlSuffix) && p != PolicyOracle {
			out = append(out, p+ControlSuffix)
		}
	}
	return out
}

func (c *MatrixConfig) setDefaults() {
	if c.Cells == nil {
		c.Cells = MatrixCells(c.Quick)
	}
	if c.CacheAware.Threshold == 0 && c.CacheAware.BalanceRel == 0 && c.CacheAware.MaxTreeSize == 0 {
		c.CacheAware = route.DefaultCacheAwareConfig()
	}
	if c.Sim.BlockTokens <= 0 {
		c.Sim.BlockTokens = 16
	}
	if c.Sim.PerToken <= 0 {
		c.Sim.PerToken = 50 * time.Microsecond // simworker's default, explicit so fleet b can double it
	}
	if len(c.Seeds) == 0 {
		c.Seeds = []uint64{1}
	}
	if c.ExtraSeeds == nil {
		c.ExtraSeeds = []uint64{2, 3}
		if c.Quick {
			c.ExtraSeeds = []uint64{2}
		}
	}
	if c.HitNoise <= 0 {
		c.HitNoise = 0.01
	}
	if c.TTFTNoise <= 0 {
		c.TTFTNoise = 0.10
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// CellResult is one cell's runs, as a Suite (policy → runs, possibly fewer
// seeds for policies outside the contested set).
type CellResult struct {
	Cell    MatrixCell
	Suite   *Suite
	Reran   []string // policies that also ran ExtraSeeds (empty: not contested)
	Skipped string   // why the cell did not run (a missing trace)
}

// Matrix is the whole replay matrix.
type Matrix struct {
	Config  MatrixConfig
	Cells   []*CellResult
	CmdLine string
	Machine Machine
	Date    time.Time
	Elapsed time.Duration
}

// matrixPlan is one cell ready to run.
type matrixPlan struct {
	res  *CellResult
	opt  Options
	wl1  *Workload // the first seed's workload
	unit float64   // estimated wall time of one run, seconds (ETA)
}

// cost is the estimated wall time of one run of each of policies (the
// oracle runs without sleeping: about a tenth of a run).
func (p *matrixPlan) cost(policies []string) float64 {
	var c float64
	for _, pol := range policies {
		if pol == PolicyOracle {
			c += p.unit / 10
		} else {
			c += p.unit
		}
	}
	return c
}

// runCost estimates the wall time of one run of wl in cell, for the ETA
// only: (requests / in flight) × (a 64-token decode ≈ 0.5 s + 50 µs of
// prefill per prompt token) × time scale, in seconds.
func runCost(wl *Workload, cell MatrixCell) float64 {
	var chars int
	for i := range wl.Sessions {
		for j := range wl.Sessions[i].Turns {
			chars += wl.Sessions[i].Turns[j].Chars()
		}
	}
	n := float64(max(wl.Requests(), 1))
	perReq := 0.5 + float64(chars)/4/n*50e-6
	return n / float64(cell.Concurrency) * perReq * cell.TimeScale
}

// LoadMatrixWorkload returns cell's workload for seed. A missing trace file
// yields an error wrapping ErrTraceMissing.
func LoadMatrixWorkload(cell MatrixCell, traceDir string, maxTokens int, seed uint64) (*Workload, error) {
	switch cell.Workload {
	case "synthetic":
		c := DefaultSynthetic()
		c.Sessions, c.AssistantTokens, c.Seed = cell.Sessions, cmp.Or(maxTokens, DefaultAnswerTokens), seed
		if cell.TurnsMin > 0 {
			c.TurnsMin, c.TurnsMax = cell.TurnsMin, max(cell.TurnsMin, cell.TurnsMax)
		}
		return Synthetic(c), nil
	case "tau", "mooncake":
		spec, err := ParseTrace(cell.Workload, traceDir)
		if err != nil {
			return nil, err
		}
		return LoadTrace(spec, TraceOptions{Sessions: cell.Sessions, MaxPromptTokens: cell.MaxPrompt, IDStyle: IDSeq, Seed: seed})
	}
	return nil, fmt.Errorf("unknown workload %q", cell.Workload)
}

// cellOptions returns the replay options of cell, its cache sized from wl.
func cellOptions(cfg *MatrixConfig, cell MatrixCell, wl *Workload) Options {
	opt := Options{Workers: fleetWorkers(cell.Fleet), Decode: fleetDecode(cell.Fleet), Sim: cfg.Sim, CacheAware: cfg.CacheAware,
		Concurrency: cell.Concurrency, MaxTokens: cfg.MaxTokens, SessionVia: cell.Via}
	opt.Sim.TimeScale = cell.TimeScale
	opt.setDefaults()
	switch cell.Fleet {
	case FleetHalfKV, FleetPDHalfKV:
		opt.Sim.CacheBlocks = HalfCacheBlocks(wl, opt)
	case FleetQuarterKV:
		opt.Sim.CacheBlocks = QuarterCacheBlocks(wl, opt)
	default:
		// Fleet e: sized over its prefill workers, so that each holds its
		// share of the working set as fleet a's workers do; its decode
		// workers get as many blocks.
		opt.Sim.CacheBlocks = AutoCacheBlocks(wl, opt)
	}
	if cell.Fleet == FleetSlow {
		opt.WorkerSim = func(i int, c *simworker.Config) {
			if i == 0 {
				c.PerToken *= 2
			}
		}
	}
	return opt
}

// RunMatrix runs every cell: each policy on the first seeds, then, where
// Contested finds the top two within noise, the contested policies plus
// cache_aware (on fleet e: cache_aware prefilling, with either decode
// policy) and the oracle on ExtraSeeds. Cells whose trace is missing
// are skipped (CellResult.Skipped). A progress line per run (cell, policy,
// seed, result, elapsed, ETA) goes to cfg.Progress.
func RunMatrix(ctx context.Context, cfg MatrixConfig) (*Matrix, error) {
	cfg.setDefaults()
	m := &Matrix{Config: cfg, Date: time.Now().UTC()}
	var plans []*matrixPlan
	var remaining float64
	for _, cell := range cfg.Cells {
		res := &CellResult{Cell: cell}
		m.Cells = append(m.Cells, res)
		wl, err := LoadMatrixWorkload(cell, cfg.TraceDir, cfg.MaxTokens, cfg.Seeds[0])
		if errors.Is(err, ErrTraceMissing) {
			res.Skipped = err.Error()
			fmt.Fprintf(cfg.Progress, "matrix: skipping %s: %v\n", cell.Name(), err)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cell.Name(), err)
		}
		p := &matrixPlan{res: res, opt: cellOptions(&cfg, cell, wl), wl1: wl}
		p.unit = runCost(wl, cell)
		remaining += p.cost(cfg.policies(cell)) * float64(len(cfg.Seeds))
		res.Suite = &Suite{Workload: wl.Name, Options: p.opt, Policies: cfg.policies(cell), Runs: map[string][]*RunResult{}, Date: m.Date}
		plans = append(plans, p)
	}
	fmt.Fprintf(cfg.Progress, "matrix: %d cells; first seeds: %d runs, ~%s of simulated sleep (wall time is about 2× that on 2 cores); reruns where contested come on top\n",
		len(plans), func() (n int) {
			for _, p := range plans {
				n += len(cfg.policies(p.res.Cell)) * len(cfg.Seeds)
			}
			return n
		}(), time.Duration(remaining*float64(time.Second)).Round(time.Second))
	start := time.Now()
	var done float64
	runs, total := 0, 0
	for _, p := range plans {
		total += len(cfg.policies(p.res.Cell)) * len(cfg.Seeds)
	}
	run := func(ci int, p *matrixPlan, wl *Workload, policy string, seed uint64) error {
		opt := p.opt
		if policy == PolicyOracle {
			// Its latency means nothing: run it without sleeping.
			opt.Sim.TimeScale = 0
		}
		r, err := Run(ctx, opt, wl, policy, seed)
		if err != nil {
			return fmt.Errorf("%s %s seed %d: %w", p.res.Cell.Name(), policy, seed, err)
		}
		p.res.Suite.Runs[policy] = append(p.res.Suite.Runs[policy], r)
		runs++
		done += p.cost([]string{policy})
		remaining -= p.cost([]string{policy})
		elapsed := time.Since(start)
		eta := time.Duration(float64(elapsed) / done * remaining)
		fmt.Fprintf(cfg.Progress, "[cell %d/%d %s] run %d/%d %-15s seed %d %5d req  hit %5.1f%%  TTFT p90 %.3fs  max/mean %.2f  %s  %.1fs  elapsed %s  ETA %s\n",
			ci+1, len(plans), p.res.Cell.Name(), runs, total, policy, seed, r.Requests, 100*r.Hit(),
			Percentile(r.TTFT, 90), r.LoadMaxMean(), errNote(r), r.Wall.Seconds(),
			elapsed.Round(time.Second), eta.Round(time.Second))
		return nil
	}
	for ci, p := range plans {
		cell := p.res.Cell
		for si, seed := range cfg.Seeds {
			wl := p.wl1
			if si > 0 {
				var err error
				if wl, err = LoadMatrixWorkload(cell, cfg.TraceDir, cfg.MaxTokens, seed); err != nil {
					return nil, err
				}
			}
			p.res.Suite.Seeds = append(p.res.Suite.Seeds, seed)
			p.res.Suite.Requests = append(p.res.Suite.Requests, wl.Requests())
			if !slices.Contains(p.res.Suite.Notes, wl.Note) {
				p.res.Suite.Notes = append(p.res.Suite.Notes, wl.Note)
			}
			for _, pol := range cfg.policies(cell) {
				if err := run(ci, p, wl, pol, seed); err != nil {
					return nil, err
				}
			}
		}
		if c := Contested(p.res.Suite, cfg.HitNoise, cfg.TTFTNoise); len(c) > 0 && len(cfg.ExtraSeeds) > 0 {
			for _, pol := range cfg.policies(cell) {
				if slices.Contains(c, pol) || p.res.Suite.reference(pol) || pol == PolicyOracle {
					p.res.Reran = append(p.res.Reran, pol)
				}
			}
			remaining += p.cost(p.res.Reran) * float64(len(cfg.ExtraSeeds))
			total += len(p.res.Reran) * len(cfg.ExtraSeeds)
			for _, seed := range cfg.ExtraSeeds {
				wl, err := LoadMatrixWorkload(cell, cfg.TraceDir, cfg.MaxTokens, seed)
				if err != nil {
					return nil, err
				}
				p.res.Suite.Seeds = append(p.res.Suite.Seeds, seed)
				p.res.Suite.Requests = append(p.res.Suite.Requests, wl.Requests())
				if !slices.Contains(p.res.Suite.Notes, wl.Note) {
					p.res.Suite.Notes = append(p.res.Suite.Notes, wl.Note)
				}
				for _, pol := range p.res.Reran {
					if err := run(ci, p, wl, pol, seed); err != nil {
						return nil, err
					}
				}
			}
		}
		p.res.Suite.Elapsed = time.Since(start)
	}
	m.Elapsed = time.Since(start)
	return m, nil
}

// Contested returns the policies (the oracle excepted) within noise of the
// best on the first seed — hit rate ≥ best − hitNoise, or TTFT p90 ≤ best ×
// (1 + ttftNoise) — when the top two are within noise on either metric;
// nil when one policy is ahead on both by more than the margins. These
// policies are the ones whose order more seeds can change; the others are
// behind the best by more than the noise already. cache_aware's own TTFT
// check is contested too: when its p90 misses the best's by more than
// ttftNoise, cache_aware and the best run the other seeds, whose spread
// the check then uses. One seed's miss may be the machine's: A/A runs of
// one policy, and one policy's seed run twice, differ by more than the
// margin (bench/results/README.md, the replay matrix).
func Contested(s *Suite, hitNoise, ttftNoise float64) []string {
	type first struct {
		policy   string
		hit, p90 float64
	}
	var fs []first
	bestHit, bestP90 := -1.0, -1.0
	for _, p := range s.Policies {
		if _, control := controlOf(p); control || p == PolicyOracle || len(s.Runs[p]) == 0 {
			continue
		}
		r := s.Runs[p][0]
		f := first{p, r.Hit(), Percentile(r.TTFT, 90)}
		fs = append(fs, f)
		bestHit = max(bestHit, f.hit)
		if bestP90 < 0 || f.p90 < bestP90 {
			bestP90 = f.p90
		}
	}
	var byHit, byP90 []string
	caMiss := false // cache_aware's p90 misses the best's by more than the noise
	for _, f := range fs {
		if f.hit >= bestHit-hitNoise {
			byHit = append(byHit, f.policy)
		}
		if f.p90 <= bestP90*(1+ttftNoise) {
			byP90 = append(byP90, f.policy)
		}
		if f.policy == s.Reference() && f.p90 > bestP90*(1+ttftNoise) {
			caMiss = true
		}
	}
	if len(byHit) < 2 && len(byP90) < 2 && !caMiss {
		return nil
	}
	var out []string
	for _, f := range fs {
		if slices.Contains(byHit, f.policy) || slices.Contains(byP90, f.policy) ||
			(caMiss && (f.policy == s.Reference() || f.p90 == bestP90)) {
			out = append(out, f.policy)
		}
	}
	return out
}

// CellCheck is a cell's done-when checks (docs/design.md §7) of cache_aware,
// the new choice (Suite.Reference: on both legs on fleet e).
type CellCheck struct {
	HitApplies bool    // fleets a and b (on c and d the oracle's unbounded cache is no bound for small caches)
	HitGap     float64 // oracle − cache_aware hit rate (client), fraction
	HitOK      bool

	Best     string  // the policy with the lowest TTFT p90 (the oracle excepted)
	P90Ratio float64 // cache_aware / best TTFT p90
	P90OK    bool    // ratio ≤ MatrixTTFTRatio, or the difference within the seeds' spread

	LoadApplies bool // fleet a
	Load        float64
	LoadOK      bool

	Errors int // failed requests in the cell (any policy): fails the cell
}

// OK reports whether every check that applies passed.
func (c CellCheck) OK() bool {
	return (!c.HitApplies || c.HitOK) && c.P90OK && (!c.LoadApplies || c.LoadOK) && c.Errors == 0
}

// Check computes the cell's done-when checks; ok is false when the cell did
// not run cache_aware (skipped, or not in the cell).
func (c *CellResult) Check() (chk CellCheck, ok bool) {
	if c.Suite == nil {
		return chk, false
	}
	var ca, oracle, best *Summary
	sums := c.Suite.Summaries()
	for i := range sums {
		m := &sums[i]
		chk.Errors += m.Errors
		switch m.Policy {
		case PolicyOracle:
			oracle = m
			continue
		case c.Suite.Reference():
			ca = m
		}
		if _, control := controlOf(m.Policy); control {
			continue // the noise, not a contender
		}
		if len(c.Suite.Runs[m.Policy]) > 0 && (best == nil || m.TTFT90.Mean < best.TTFT90.Mean) {
			best = m
		}
	}
	if ca == nil || len(c.Suite.Runs[ca.Policy]) == 0 {
		return chk, false
	}
	if oracle != nil && len(c.Suite.Runs[PolicyOracle]) > 0 {
		chk.HitApplies = c.Cell.Fleet == FleetEqual || c.Cell.Fleet == FleetSlow
		chk.HitGap = oracle.Hit.Mean - ca.Hit.Mean
		chk.HitOK = chk.HitGap <= MatrixHitGap+1e-9
	}
	chk.Best = best.Policy
	chk.P90Ratio = ratio(ca.TTFT90.Mean, best.TTFT90.Mean)
	spread := ca.TTFT90.SD + best.TTFT90.SD
	chk.P90OK = chk.P90Ratio <= MatrixTTFTRatio || (spread > 0 && ca.TTFT90.Mean-best.TTFT90.Mean <= spread)
	chk.LoadApplies = c.Cell.Fleet == FleetEqual
	chk.Load = ca.LoadMaxMean.Mean
	chk.LoadOK = chk.Load <= LoadTarget
	return chk, true
}

// routerHit returns the mean over a policy's runs of the router's predicted
// and served hit rates; ok is false when no run had the counters.
func routerHit(runs []*RunResult) (pred, served float64, ok bool) {
	n := 0
	for _, r := range runs {
		p, has := r.HitPredicted()
		if !has {
			continue
		}
		s, _ := r.HitServed()
		pred += p
		served += s
		n++
	}
	if n == 0 {
		return 0, 0, false
	}
	return pred / float64(n), served / float64(n), true
}

// fleetText describes a fleet in a few words.
func fleetText(f string) string {
	switch f {
	case FleetEqual:
		return "4 equal workers, KV cache holds the working set"
	case FleetSlow:
		return "4 workers, worker 0 prefills at half speed"
	case FleetHalfKV:
		return "4 equal workers, KV cache holds about half the working set"
	case FleetQuarterKV:
		return "8 equal workers, KV cache holds about a quarter of the working set"
	case FleetPD:
		return "2 prefill + 2 decode workers, the router in PD mode; each prefill worker's KV cache holds its share of the working set"
	case FleetPDHalfKV:
		return "fleet e with each worker's KV cache holding about half its share of the working set (HalfCacheBlocks)"
	}
	return f
}

// viaText is "header" or "none" for the table.
func viaText(v string) string {
	if v == ViaNone {
		return "none"
	}
	return v
}

// pd reports whether a disaggregated cell ran: the report then has fleet
// e's columns.
func (m *Matrix) pd() bool {
	for _, c := range m.ran() {
		if c.Suite.Options.Decode > 0 {
			return true
		}
	}
	return false
}

// PDCheck compares a disaggregated cell with the cell of fleet a that runs
// the same workload, ids and in flight (docs/design.md §9).
type PDCheck struct {
	Cell, FleetA string
	// Prefill hit rate of the reference (cache_aware on both legs) and of
	// cache_aware prefilling with least_loaded decoding; fleet a's
	// cache_aware hit rate (NaN-free: 0 when fleet a's cell, or fleet c's
	// for fleet f, did not run).
	Hit, HitLL, HitA float64
	HitOK            bool // |Hit − HitA| ≤ MatrixHitGap
	HasA             bool
	// TTFT p90 of cache_aware prefilling with each decode policy, and
	// which is lower ("" when within the seeds' spread, sd + sd).
	P90, P90LL   Stat
	BetterDecode string
}

// PDChecks returns a PDCheck per disaggregated cell that ran cache_aware
// prefilling with both decode policies.
func (m *Matrix) PDChecks() []PDCheck {
	byName := map[string]*CellResult{}
	for _, c := range m.ran() {
		byName[c.Cell.Name()] = c
	}
	var out []PDCheck
	for _, cr := range m.ran() {
		if cr.Suite.Options.Decode == 0 {
			continue
		}
		sums := map[string]Summary{}
		for _, s := range cr.Suite.Summaries() {
			if len(cr.Suite.Runs[s.Policy]) > 0 {
				sums[s.Policy] = s
			}
		}
		ca, ok1 := sums[PDPolicy("cache_aware", "cache_aware")]
		ll, ok2 := sums[PDPolicy("cache_aware", route.LeastLoaded)]
		if !ok1 || !ok2 {
			continue
		}
		a := cr.Cell
		a.Fleet = FleetEqual
		if cr.Cell.Fleet == FleetPDHalfKV {
			a.Fleet = FleetHalfKV // the same caches, one side
		}
		chk := PDCheck{Cell: cr.Cell.Name(), FleetA: a.Name(), Hit: ca.Hit.Mean, HitLL: ll.Hit.Mean, P90: ca.TTFT90, P90LL: ll.TTFT90}
		if ac := byName[a.Name()]; ac != nil && len(ac.Suite.Runs["cache_aware"]) > 0 {
			for _, s := range ac.Suite.Summaries() {
				if s.Policy == "cache_aware" {
					chk.HitA, chk.HasA = s.Hit.Mean, true
				}
			}
			d := chk.Hit - chk.HitA
			chk.HitOK = d <= MatrixHitGap+1e-9 && -d <= MatrixHitGap+1e-9
		}
		switch diff := ca.TTFT90.Mean - ll.TTFT90.Mean; {
		case diff < 0 && -diff > ca.TTFT90.SD+ll.TTFT90.SD:
			chk.BetterDecode = "cache_aware"
		case diff > 0 && diff > ca.TTFT90.SD+ll.TTFT90.SD:
			chk.BetterDecode = route.LeastLoaded
		}
		out = append(out, chk)
	}
	return out
}

// ran returns the cells that ran.
func (m *Matrix) ran() []*CellResult {
	var out []*CellResult
	for _, c := range m.Cells {
		if c.Suite != nil {
			out = append(out, c)
		}
	}
	return out
}

func passText(ok bool) string {
	if ok {
		return "PASS"
	}
	return "**FAIL**"
}

// Markdown is the whole report: setup, done-when checks, the table.
func (m *Matrix) Markdown() string {
	var sb strings.Builder
	cfg := &m.Config
	mode := "full"
	if cfg.Quick {
		mode = "QUICK (a smoke test: short cells, numbers are not results)"
	}
	fmt.Fprintf(&sb, "# Replay matrix (%s)\n\nProduced by:\n\n```\n%s\n```\n\n", mode, m.CmdLine)
	fmt.Fprintf(&sb, "- Date: %s (took %s)\n- Machine: `%s`; CPU: %s; nproc %d; %s\n",
		m.Date.Format("2006-01-02 15:04 MST"), m.Elapsed.Round(time.Second), m.Machine.Uname, m.Machine.CPU, m.Machine.NProc, m.Machine.Go)
	ca := cfg.CacheAware
	fmt.Fprintf(&sb, "- Workers: simworker over loopback, fresh for every run; %s; %s (ignore_eos). "+
		"Fleet a: %s (KV cache per worker: bench.AutoCacheBlocks of the first seed's workload). Fleet b: %s (its PerToken × 2). Fleet c: %s (bench.HalfCacheBlocks). Fleet d: %s (bench.QuarterCacheBlocks).\n",
		m.latencyText(), (&Options{MaxTokens: cfg.MaxTokens}).maxTokensText(), fleetText(FleetEqual), fleetText(FleetSlow), fleetText(FleetHalfKV), fleetText(FleetQuarterKV))
	if m.pd() {
		fmt.Fprintf(&sb, "- Fleet e: %s (bench.AutoCacheBlocks over the 2 prefill workers; the decode workers get as many blocks); "+
			"every worker serves both legs (docs/design.md §6): a decode worker pulls the prompt's held blocks beyond its own prefix hit, "+
			"paying the transfer latency and per-token time instead of prefilling them. Fleet f: %s; its cells are compared with fleet c's.\n",
			fleetText(FleetPD), fleetText(FleetPDHalfKV))
	}
	fmt.Fprintf(&sb, "- Router: fastproxy in process, --cache-threshold %g --balance-abs-threshold %d --balance-rel-threshold %g --max-tree-size %d. "+
		"Policies: round_robin; consistent_hash (random without ids); sticky (session map, only with ids); "+
		"rfc_rule (cache_aware, --affinity-chars-per-request 0: the plain threshold rule); cache_aware_32k (the fixed exchange rate of --affinity-chars-per-request 32768); "+
		"**cache_aware** (the new choice: route.DefaultCacheAwareConfig); "+
		"precise (bench only, a ceiling: cache_aware's placement with each worker's true KV cache, read from the simulated workers, instead of the tree's prediction); oracle (one worker, unbounded cache and max-num-seqs, run without sleeping: its hit rate is the bound, its latency means nothing).\n",
		ca.Threshold, ca.BalanceAbs, ca.BalanceRel, ca.MaxTreeSize)
	if m.pd() {
		fmt.Fprintf(&sb, "- Fleet e's policies are prefill+decode pairs (--prefill-policy, --decode-policy): %s × %s. "+
			"**cache_aware+cache_aware** (what --policy cache_aware gives: --decode-policy defaults to it) is the one the checks judge; "+
			"cache_aware prefilling runs the extra seeds with either decode policy. No sticky, rfc_rule, cache_aware_32k, precise or oracle there: "+
			"precise reads the caches of workers that serve whole requests and the oracle is one worker, so both assume one side.\n",
			strings.Join(pdPrefill, ", "), strings.Join(pdDecode, ", "))
	}
	fmt.Fprintf(&sb, "- Clients: closed loop, turns strictly in order, streaming with include_usage; session id in `X-Session-ID` or not sent. "+
		"Times are simulated seconds (measured / the cell's time scale).\n")
	fmt.Fprintf(&sb, "- Seeds: every policy runs seed %v. Where the top two policies of a cell are within noise on that seed "+
		"(hit rate within %.0f point(s), or TTFT p90 within %.0f %%), the policies within that margin of the best, plus cache_aware and the oracle, also run seeds %v; "+
		"so do cache_aware, the best and the oracle where cache_aware's TTFT p90 misses the best's by more than that (its verdict then uses the seeds' spread); "+
		"the others were already behind by more than the noise. The table gives mean ± sd over the seeds a policy ran (column Seeds).\n\n",
		cfg.Seeds, 100*cfg.HitNoise, 100*cfg.TTFTNoise, cfg.ExtraSeeds)

	// Done-when summary.
	var hitN, hitP, p90N, p90P, loadN, loadP, cellsOK, cellsN int
	var fails []string
	for _, cr := range m.ran() {
		chk, ok := cr.Check()
		if !ok {
			continue
		}
		cellsN++
		if chk.OK() {
			cellsOK++
		} else {
			fails = append(fails, cr.Cell.Name())
		}
		if chk.HitApplies {
			hitN++
			if chk.HitOK {
				hitP++
			}
		}
		p90N++
		if chk.P90OK {
			p90P++
		}
		if chk.LoadApplies {
			loadN++
			if chk.LoadOK {
				loadP++
			}
		}
	}
	sb.WriteString("## Done when (computed)\n\n")
	fmt.Fprintf(&sb, "- cache_aware within %.0f points of the oracle's hit rate, every cell of fleets a and b: %d/%d PASS.\n", 100*MatrixHitGap, hitP, hitN)
	fmt.Fprintf(&sb, "- cache_aware's TTFT p90 within %.0f %% of the cell's best (or within the seeds' spread), every cell: %d/%d PASS.\n", 100*(MatrixTTFTRatio-1), p90P, p90N)
	fmt.Fprintf(&sb, "- cache_aware's in-flight load max/mean ≤ %.2f, every cell of fleet a: %d/%d PASS.\n", LoadTarget, loadP, loadN)
	fmt.Fprintf(&sb, "- Cells passing every check that applies (and without failed requests): %d/%d", cellsOK, cellsN)
	if len(fails) > 0 {
		fmt.Fprintf(&sb, "; failing: %s", strings.Join(fails, ", "))
	}
	sb.WriteString(".\n")
	pdc := m.PDChecks()
	if len(pdc) > 0 {
		n, pass := 0, 0
		for _, c := range pdc {
			if c.HasA {
				n++
				if c.HitOK {
					pass++
				}
			}
		}
		fmt.Fprintf(&sb, "- Fleets e and f: cache_aware+cache_aware's prefill hit rate within %.0f points of cache_aware's hit rate on the one-sided cell of the same caches, workload, ids and in flight (fleet a for e, c for f): %d/%d PASS (table below).\n",
			100*MatrixHitGap, pass, n)
	}
	for _, cr := range m.Cells {
		if cr.Skipped != "" {
			fmt.Fprintf(&sb, "- Skipped %s: %s\n", cr.Cell.Name(), cr.Skipped)
		}
	}
	sb.WriteString("\n| Cell | Hit: oracle − cache_aware | TTFT p90: cache_aware / best | Load max/mean | Seeds rerun for | Verdict |\n|---|---:|---:|---:|---|---|\n")
	for _, cr := range m.ran() {
		chk, ok := cr.Check()
		if !ok {
			continue
		}
		hit := fmt.Sprintf("%.1f pts (n/a: bound unbounded)", 100*chk.HitGap)
		if len(cr.Suite.Runs[PolicyOracle]) == 0 {
			hit = "— (no oracle)"
		}
		if chk.HitApplies {
			hit = fmt.Sprintf("%.1f pts %s", 100*chk.HitGap, passText(chk.HitOK))
		}
		load := fmt.Sprintf("%.2f (n/a)", chk.Load)
		if chk.LoadApplies {
			load = fmt.Sprintf("%.2f %s", chk.Load, passText(chk.LoadOK))
		}
		rerun := "—"
		if len(cr.Reran) > 0 {
			rerun = strings.Join(cr.Reran, ", ")
		}
		verdict := passText(chk.OK())
		if chk.Errors > 0 {
			verdict += fmt.Sprintf(" (%d failed requests)", chk.Errors)
		}
		fmt.Fprintf(&sb, "| %s | %s | %.2f× (best %s) %s | %s | %s | %s |\n",
			cr.Cell.Name(), hit, chk.P90Ratio, chk.Best, passText(chk.P90OK), load, rerun, verdict)
	}
	if len(pdc) > 0 {
		sb.WriteString("\nFleet e against fleet a (prefill hit: the prefill workers' prefix-cache hits / queries; the decode policy with the lower TTFT p90 mean, or a tie within the seeds' spread, sd + sd):\n\n")
		sb.WriteString("| Cell | Prefill hit: cache_aware+cache_aware / +least_loaded | One-sided (a or c): cache_aware hit | PD − one-sided | TTFT p90 (s): cache_aware+cache_aware / +least_loaded | Lower p90 decoding by |\n|---|---:|---:|---:|---:|---|\n")
		for _, c := range pdc {
			a, gap := "—", "— (the one-sided cell did not run)"
			if c.HasA {
				a, gap = fmt.Sprintf("%.1f %%", 100*c.HitA), fmt.Sprintf("%+.1f pts %s", 100*(c.Hit-c.HitA), passText(c.HitOK))
			}
			better := c.BetterDecode
			if better == "" {
				better = "tie (within spread)"
			}
			fmt.Fprintf(&sb, "| %s | %.1f / %.1f %% | %s | %s | %s / %s | %s |\n", c.Cell, 100*c.Hit, 100*c.HitLL, a, gap,
				secStat(c.P90), secStat(c.P90LL), better)
		}
	}

	sb.WriteString("\n## Results\n\nCell = fleet/workload/session ids/sessions in flight.\n\n")
	sb.WriteString(m.Table())
	sb.WriteString(`
## Columns

- **Hit rate**: Σ usage.prompt_tokens_details.cached_tokens / Σ usage.prompt_tokens at the clients (token-weighted), mean ± sd over seeds.
- **Predicted / served**: the router's vllm_router_prefix_tokens_predicted_total and _served_total (summed over workers) / Σ prompt tokens; blank when the router does not export them (every policy but the cache_aware ones).
- **TTFT**: request sent → first content chunk at the client, through the router, simulated seconds; p50 and p90 over the run's requests, mean ± sd over seeds.
- **Load max/mean**: each worker's in-flight requests (the router's counters) sampled every 5 ms and averaged over the run; max over workers / mean over workers.
- The oracle's TTFT and load are not shown: one worker with an unbounded cache is a hit-rate bound, not a fleet.
`)
	if m.pd() {
		sb.WriteString(`- Fleet e: **Hit rate** is the prefill workers' Σ Δ vllm:prefix_cache_hits_total / Σ Δ vllm:prefix_cache_queries_total (the clients' cached_tokens there also count the tokens the decode worker pulled); **Predicted / served** is the prefill policy's; **Load max/mean** is over the prefill workers; **Decode load max/mean** the same over the decode workers; **KV transferred** is Σ over the decode workers of the prompt tokens they pulled (simworker's KVTransferredTokens) per run, mean over seeds; **Failed transfers** Σ of the pulls that failed and were recomputed, over every seed.
`)
	}
	sb.WriteString("\n## Workloads and caches\n\n")
	for _, cr := range m.ran() {
		note := ""
		if len(cr.Suite.Notes) > 0 {
			note = cr.Suite.Notes[0] // later seeds sample likewise
		}
		fmt.Fprintf(&sb, "- %s: %d sessions in flight, time scale %g, KV cache %d blocks per worker; requests per run by seed %v; %s\n",
			cr.Cell.Name(), cr.Cell.Concurrency, cr.Cell.TimeScale, cr.Suite.Options.Sim.CacheBlocks, cr.Suite.Requests, note)
	}
	return sb.String()
}

// latencyText describes the workers' latency model from the effective
// config of a run of an equal fleet (docs/design.md §6): fleet b's slow
// worker is the exception, not the model.
func (m *Matrix) latencyText() string {
	for _, cr := range m.ran() {
		for _, runs := range cr.Suite.Runs {
			if len(runs) == 0 || cr.Cell.Fleet == FleetSlow || runs[0].Policy == PolicyOracle {
				continue
			}
			c := runs[0].WorkerConfig
			if c.LatencyModel == simworker.LatencyLegacy {
				return fmt.Sprintf("legacy latency model: %v + %v per uncached prompt token, then %v per output token; max-num-seqs %d; blocks of %d tokens",
					c.Overhead, c.PerToken, c.InterToken, c.MaxNumSeqs, c.BlockTokens)
			}
			return fmt.Sprintf("%s latency model (continuous batching): step = %v + %v per prefill token + %v per decoding sequence, "+
				"%d tokens per step, max-num-seqs %d, KV cache in blocks of %d tokens (capacity per cell below)",
				c.LatencyModel, c.StepBase, c.PerToken, c.DecodePerSeq, c.MaxNumBatchedTokens, c.MaxNumSeqs, c.BlockTokens)
		}
	}
	return "no run"
}

// Table is the results table in Markdown: one row per cell and policy.
func (m *Matrix) Table() string {
	var sb strings.Builder
	pd := m.pd()
	if pd {
		sb.WriteString("| Cell | Policy | Seeds | Hit rate | Predicted / served | TTFT p50 (s) | TTFT p90 (s) | Load max/mean | Decode load max/mean | KV transferred (tokens) | Failed transfers | Errors |\n")
		sb.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	} else {
		sb.WriteString("| Cell | Policy | Seeds | Hit rate | Predicted / served | TTFT p50 (s) | TTFT p90 (s) | Load max/mean | Errors |\n")
		sb.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	}
	for _, cr := range m.ran() {
		for i, s := range cr.Suite.Summaries() {
			runs := cr.Suite.Runs[s.Policy]
			if len(runs) == 0 {
				continue
			}
			cell := ""
			if i == 0 {
				cell = "**" + cr.Cell.Name() + "**"
			}
			router := ""
			if p, sv, ok := routerHit(runs); ok {
				router = fmt.Sprintf("%.1f / %.1f %%", 100*p, 100*sv)
			}
			name := s.Policy
			if name == cr.Suite.Reference() {
				name = "**" + name + "**"
			}
			one := len(runs) == 1
			hit := pctStat(s.Hit)
			if one {
				hit = fmt.Sprintf("%.1f %%", 100*s.Hit.Mean)
			}
			pdCols := ""
			if pd {
				pdCols = " — | — | — |"
				if s.PD {
					dl, kv := numStat(s.DecodeLoadMaxMean, 2), fmt.Sprintf("%.0f ± %.0f", s.KVTransferred.Mean, s.KVTransferred.SD)
					if one {
						dl, kv = fmt.Sprintf("%.2f", s.DecodeLoadMaxMean.Mean), fmt.Sprintf("%.0f", s.KVTransferred.Mean)
					}
					pdCols = fmt.Sprintf(" %s | %s | %d |", dl, kv, s.KVFailed)
				}
			}
			if s.oracle {
				fmt.Fprintf(&sb, "| %s | oracle (bound) | %d | %s | %s | — | — | — |%s %d |\n", cell, len(runs), hit, router, pdCols, s.Errors)
				continue
			}
			p50, p90, load := secStat(s.TTFT50), secStat(s.TTFT90), numStat(s.LoadMaxMean, 2)
			if one {
				p50, p90, load = fmt.Sprintf("%.3f", s.TTFT50.Mean), fmt.Sprintf("%.3f", s.TTFT90.Mean), fmt.Sprintf("%.2f", s.LoadMaxMean.Mean)
			}
			fmt.Fprintf(&sb, "| %s | %s | %d | %s | %s | %s | %s | %s |%s %d |\n", cell, name, len(runs), hit, router, p50, p90, load, pdCols, s.Errors)
		}
	}
	return sb.String()
}

// CSV is the table with one row per cell and policy (means and sds over the
// policy's seeds); the check columns are filled on cache_aware's row.
//
// A report with a disaggregated cell has its columns too: the prefill hit
// rate (hit_prefill: hit_client is the clients' there, which counts the
// pulled tokens), the decode workers' load max/mean, the tokens pulled per
// run and the failed pulls; blank on the other fleets' rows.
func (m *Matrix) CSV() string {
	var sb strings.Builder
	pd := m.pd()
	pdHead := ""
	if pd {
		pdHead = "hit_prefill,hit_prefill_sd,decode_load_max_mean,decode_load_max_mean_sd,kv_transferred_tokens,kv_transferred_tokens_sd,kv_failed_transfers,"
	}
	sb.WriteString("fleet,workload,session_ids,in_flight,policy,seeds,requests,errors,hit_client,hit_client_sd,hit_predicted,hit_served," +
		"ttft_p50_s,ttft_p50_sd,ttft_p90_s,ttft_p90_sd,load_max_mean,load_max_mean_sd,cache_blocks,time_scale," + pdHead +
		"check_hit_gap,check_ttft_p90_ratio,check_load,check_pass\n")
	f := func(v float64, prec int) string { return fmt.Sprintf("%.*f", prec, v) }
	for _, cr := range m.ran() {
		chk, chkOK := cr.Check()
		for _, s := range cr.Suite.Summaries() {
			runs := cr.Suite.Runs[s.Policy]
			if len(runs) == 0 {
				continue
			}
			pred, served := "", ""
			if p, sv, ok := routerHit(runs); ok {
				pred, served = f(p, 6), f(sv, 6)
			}
			lat := []string{f(s.TTFT50.Mean, 4), f(s.TTFT50.SD, 4), f(s.TTFT90.Mean, 4), f(s.TTFT90.SD, 4), f(s.LoadMaxMean.Mean, 4), f(s.LoadMaxMean.SD, 4)}
			if s.oracle {
				lat = []string{"", "", "", "", "", ""}
			}
			checks := []string{"", "", "", ""}
			if s.Policy == cr.Suite.Reference() && chkOK {
				checks = []string{f(chk.HitGap, 6), f(chk.P90Ratio, 4), f(chk.Load, 4), fmt.Sprint(chk.OK())}
				if !chk.HitApplies {
					checks[0] = ""
				}
				if !chk.LoadApplies {
					checks[2] = ""
				}
			}
			row := []string{cr.Cell.Fleet, cr.Cell.Workload, viaText(cr.Cell.Via), fmt.Sprint(cr.Cell.Concurrency), s.Policy,
				fmt.Sprint(len(runs)), fmt.Sprint(s.Requests), fmt.Sprint(s.Errors), f(s.HitClient.Mean, 6), f(s.HitClient.SD, 6), pred, served}
			row = append(row, lat...)
			row = append(row, fmt.Sprint(cr.Suite.Options.Sim.CacheBlocks), fmt.Sprint(cr.Cell.TimeScale))
			switch {
			case pd && s.PD:
				row = append(row, f(s.Hit.Mean, 6), f(s.Hit.SD, 6), f(s.DecodeLoadMaxMean.Mean, 4), f(s.DecodeLoadMaxMean.SD, 4),
					f(s.KVTransferred.Mean, 0), f(s.KVTransferred.SD, 0), fmt.Sprint(s.KVFailed))
			case pd:
				row = append(row, "", "", "", "", "", "", "")
			}
			row = append(row, checks...)
			sb.WriteString(strings.Join(row, ",") + "\n")
		}
	}
	return sb.String()
}
