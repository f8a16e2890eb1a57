package bench

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// TestMatrixQuick runs the QUICK matrix (make bench-matrix QUICK=1) and
// checks the report is produced and sane: every cell ran (or was skipped for
// a missing trace) without failed requests, the oracle bounds every policy's
// hit rate, and with session ids cache_aware beats round_robin on hit rate
// (on fleet e, prefilling). On fleet e, disaggregated, every run moved KV
// blocks from the prefill workers to the decode workers, none failed, and
// the hit rate is the prefill workers'. Under the race detector only the
// two synthetic fleet-a cells run.
func TestMatrixQuick(t *testing.T) {
	cells := MatrixCells(true)
	if raceEnabled {
		cells = cells[:2]
	}
	m, err := RunMatrix(context.Background(), MatrixConfig{Quick: true, Cells: cells, TraceDir: "../../shared/traces", Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, cr := range m.Cells {
		if cr.Skipped != "" {
			if cr.Cell.Workload == "synthetic" {
				t.Fatalf("%s skipped: %s", cr.Cell.Name(), cr.Skipped)
			}
			t.Logf("%s skipped: %s", cr.Cell.Name(), cr.Skipped)
			continue
		}
		s := cr.Suite
		pd := cr.Cell.Fleet == FleetPD
		for _, p := range cr.Cell.Policies() {
			runs := s.Runs[p]
			if len(runs) == 0 {
				t.Fatalf("%s: %s did not run", cr.Cell.Name(), p)
			}
			rows++
			for _, r := range runs {
				if r.Errors != 0 {
					t.Fatalf("%s %s seed %d: %d errors, first: %s", cr.Cell.Name(), p, r.Seed, r.Errors, r.FirstErr)
				}
				if n := r.Labels[PreciseUnknown]; n > 0 {
					t.Fatalf("%s %s seed %d: %d requests whose prompt precise did not know", cr.Cell.Name(), p, r.Seed, n)
				}
				if r.PD != pd {
					t.Fatalf("%s %s seed %d: PD %v", cr.Cell.Name(), p, r.Seed, r.PD)
				}
				if pd {
					// Every decode leg pulled the prompt's blocks beyond its
					// own hit; the hit rate is the prefill side's, below the
					// clients' (which count the pulled tokens as cached).
					if r.KVTransferred == 0 || r.KVFailed != 0 {
						t.Errorf("%s %s seed %d: %d tokens transferred, %d failed transfers", cr.Cell.Name(), p, r.Seed, r.KVTransferred, r.KVFailed)
					}
					if r.WorkerQueries == 0 || r.Hit() <= 0 || r.Hit() >= r.HitClient() {
						t.Errorf("%s %s seed %d: prefill hit %.3f (%v queries), client %.3f", cr.Cell.Name(), p, r.Seed, r.Hit(), r.WorkerQueries, r.HitClient())
					}
					if len(r.InflightMean) != 2 || len(r.DecodeInflightMean) != 2 || r.DecodeLoadMaxMean() < 1 {
						t.Errorf("%s %s seed %d: load of %d prefill and %d decode workers", cr.Cell.Name(), p, r.Seed, len(r.InflightMean), len(r.DecodeInflightMean))
					}
				}
			}
		}
		// The oracle's single unbounded cache bounds every policy (noise:
		// arrival order differs between runs).
		if !pd {
			oracle := s.Runs[PolicyOracle][0].Hit()
			for _, p := range cr.Cell.Policies() {
				if h := s.Runs[p][0].Hit(); h > oracle+0.02 {
					t.Errorf("%s: %s hit %.3f above the oracle's %.3f", cr.Cell.Name(), p, h, oracle)
				}
			}
		}
		if cr.Cell.Via != ViaNone {
			rrName := route.RoundRobin
			if pd {
				rrName = PDPolicy(route.RoundRobin, "cache_aware")
			}
			if rr, ca := s.Runs[rrName][0].Hit(), s.Runs[s.Reference()][0].Hit(); rr >= ca {
				t.Errorf("%s: %s hit %.3f not below %s's %.3f", cr.Cell.Name(), rrName, rr, s.Reference(), ca)
			}
		}
		if _, ok := cr.Check(); !ok {
			t.Errorf("%s: no check computed", cr.Cell.Name())
		}
	}
	md := m.Markdown()
	want := []string{"## Done when (computed)", "| a/synthetic/header/8 |", "**a/synthetic/none/8**", "| oracle (bound) |", "| sticky |", "| rfc_rule |", "| cache_aware_32k |"}
	if !raceEnabled {
		want = append(want, "| e/synthetic/header/8 |", "**cache_aware+cache_aware**", "| cache_aware+least_loaded |", "Decode load max/mean",
			"Fleet e against fleet a", "Fleets e and f: cache_aware+cache_aware's prefill hit rate")
	}
	for _, w := range want {
		if !strings.Contains(md, w) {
			t.Errorf("report lacks %q", w)
		}
	}
	recs, err := csv.NewReader(strings.NewReader(m.CSV())).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1+rows {
		t.Errorf("CSV: %d records, want 1 + %d", len(recs), rows)
	}
	for _, rec := range recs[1:] {
		if len(rec) != len(recs[0]) {
			t.Errorf("CSV: %d fields, want %d: %v", len(rec), len(recs[0]), rec)
		}
		if (rec[4] == "cache_aware" || rec[4] == "cache_aware+cache_aware") && rec[len(rec)-1] == "" {
			t.Errorf("CSV: %s row without checks: %v", rec[4], rec)
		}
	}
	if svg := m.SVG(); !strings.HasPrefix(svg, "<svg") || !strings.Contains(svg, "a/synthetic/header/8") || !strings.HasSuffix(svg, "</svg>\n") {
		t.Error("bad SVG")
	}
}

// fakeRun is a run with a given hit rate, TTFT p90 (every request) and load.
func fakeRun(policy string, seed uint64, hit, ttft, load float64) *RunResult {
	return &RunResult{Policy: policy, Seed: seed, Requests: 10, PromptTokens: 1000, CachedTokens: int64(1000 * hit),
		TTFT: slices.Repeat([]float64{ttft}, 10), InflightMean: []float64{load, 2 - load}}
}

func fakeSuite(cell MatrixCell, runs map[string][]*RunResult) *CellResult {
	return &CellResult{Cell: cell, Suite: &Suite{Policies: cell.Policies(), Runs: runs}}
}

func TestContested(t *testing.T) {
	cell := MatrixCell{Fleet: FleetEqual, Workload: "synthetic", Via: ViaNone, Concurrency: 8}
	runs := map[string][]*RunResult{
		"round_robin":       {fakeRun("round_robin", 1, 0.40, 1.0, 1)},
		"consistent_hash":   {fakeRun("consistent_hash", 1, 0.30, 1.2, 1)},
		PolicyRFCRule:       {fakeRun(PolicyRFCRule, 1, 0.70, 0.80, 1)},
		PolicyCacheAware32k: {fakeRun(PolicyCacheAware32k, 1, 0.80, 0.60, 1)},
		"cache_aware":       {fakeRun("cache_aware", 1, 0.795, 0.50, 1)},
		PolicyOracle:        {fakeRun(PolicyOracle, 1, 0.99, 0.01, 1)}, // never counted
	}
	s := fakeSuite(cell, runs).Suite
	// Hit: 0.80 and 0.795 within 1 point; TTFT p90: 0.50 alone (0.60 is 20 % behind).
	if got, want := Contested(s, 0.01, 0.10), []string{PolicyCacheAware32k, "cache_aware"}; !slices.Equal(got, want) {
		t.Fatalf("Contested = %v, want %v", got, want)
	}
	// TTFT margin 25 %: 0.60 joins (already in); hit margin 12 points: rfc_rule joins.
	if got, want := Contested(s, 0.12, 0.25), []string{PolicyRFCRule, PolicyCacheAware32k, "cache_aware"}; !slices.Equal(got, want) {
		t.Fatalf("Contested = %v, want %v", got, want)
	}
	// One policy ahead on both by more than the margins: nothing to rerun.
	runs["cache_aware"] = []*RunResult{fakeRun("cache_aware", 1, 0.90, 0.30, 1)}
	if got := Contested(s, 0.01, 0.10); got != nil {
		t.Fatalf("Contested = %v, want nil", got)
	}
	// cache_aware behind the best (round_robin, 0.60) by more than the
	// noise, ahead on hit rate: its TTFT check is decided by the seeds.
	runs["round_robin"] = []*RunResult{fakeRun("round_robin", 1, 0.40, 0.60, 1)}
	runs[PolicyCacheAware32k] = []*RunResult{fakeRun(PolicyCacheAware32k, 1, 0.80, 0.90, 1)}
	for _, p90 := range []float64{0.69, 0.90} {
		runs["cache_aware"] = []*RunResult{fakeRun("cache_aware", 1, 0.90, p90, 1)}
		if got, want := Contested(s, 0.01, 0.10), []string{"round_robin", "cache_aware"}; !slices.Equal(got, want) {
			t.Fatalf("cache_aware at p90 %v: Contested = %v, want %v", p90, got, want)
		}
	}
}

func TestCellCheck(t *testing.T) {
	runs := func(caHit, caP90, caLoad float64) map[string][]*RunResult {
		return map[string][]*RunResult{
			"round_robin":       {fakeRun("round_robin", 1, 0.40, 1.00, 1.0)},
			"consistent_hash":   {fakeRun("consistent_hash", 1, 0.30, 1.20, 1.1)},
			PolicyRFCRule:       {fakeRun(PolicyRFCRule, 1, 0.70, 0.50, 1.9)},
			PolicyCacheAware32k: {fakeRun(PolicyCacheAware32k, 1, 0.80, 0.60, 1.0)},
			"cache_aware":       {fakeRun("cache_aware", 1, caHit, caP90, caLoad)},
			PolicyOracle:        {fakeRun(PolicyOracle, 1, 0.82, 0.01, 1.0)},
		}
	}
	a := MatrixCell{Fleet: FleetEqual, Workload: "synthetic", Via: ViaNone, Concurrency: 8}
	chk, ok := fakeSuite(a, runs(0.80, 0.54, 1.2)).Check()
	if !ok || !chk.HitApplies || !chk.HitOK || !chk.P90OK || chk.Best != PolicyRFCRule || !chk.LoadApplies || !chk.LoadOK || !chk.OK() {
		t.Fatalf("passing cell: %+v", chk)
	}
	if d := chk.HitGap - 0.02; d > 1e-9 || d < -1e-9 {
		t.Fatalf("hit gap %v, want 0.02", chk.HitGap)
	}
	// 2.1 points from the oracle, p90 12 % behind rfc_rule, load 1.3.
	chk, _ = fakeSuite(a, runs(0.799, 0.56, 1.3)).Check()
	if chk.HitOK || chk.P90OK || chk.LoadOK || chk.OK() {
		t.Fatalf("failing cell: %+v", chk)
	}
	// Within the seeds' spread: cache_aware 0.56 ± sd vs best 0.50.
	r := runs(0.80, 0.56, 1.0)
	r["cache_aware"] = append(r["cache_aware"], fakeRun("cache_aware", 2, 0.80, 0.48, 1.0), fakeRun("cache_aware", 3, 0.80, 0.52, 1.0))
	if chk, _ = fakeSuite(a, r).Check(); !chk.P90OK || chk.P90Ratio <= 1 {
		t.Fatalf("within spread: %+v", chk)
	}
	// Fleet c: the hit bound and the load bound do not apply; fleet b: load does not.
	c := a
	c.Fleet = FleetHalfKV
	if chk, _ = fakeSuite(c, runs(0.50, 0.50, 1.9)).Check(); chk.HitApplies || chk.LoadApplies || !chk.OK() {
		t.Fatalf("fleet c: %+v", chk)
	}
	b := a
	b.Fleet = FleetSlow
	if chk, _ = fakeSuite(b, runs(0.50, 0.50, 1.9)).Check(); !chk.HitApplies || chk.HitOK || chk.LoadApplies || chk.OK() {
		t.Fatalf("fleet b: %+v", chk)
	}
	// Failed requests fail the cell.
	r = runs(0.80, 0.50, 1.0)
	r["round_robin"][0].Errors = 1
	if chk, _ = fakeSuite(a, r).Check(); chk.OK() {
		t.Fatalf("errors: %+v", chk)
	}
}

func TestMatrixCellsShape(t *testing.T) {
	full := MatrixCells(false)
	names := map[string]bool{}
	for _, c := range full {
		names[c.Name()] = true
		if slices.Contains(c.Policies(), PolicySticky) != (c.Via != ViaNone && fleetDecode(c.Fleet) == 0) {
			t.Errorf("%s: sticky only where ids exist: %v", c.Name(), c.Policies())
		}
	}
	for _, want := range []string{"a/synthetic/header/8", "a/synthetic/none/64", "a/tau/header/64", "a/tau/none/8",
		"a/mooncake/none/8", "a/mooncake/none/64", "b/synthetic/none/64", "b/tau/none/64", "c/synthetic/none/64", "c/tau/none/64",
		"d/tau/none/64", "d/mooncake/none/64"} {
		if !names[want] {
			t.Errorf("no cell %s", want)
		}
	}
	if len(full) != 26 || len(names) != 26 {
		t.Errorf("%d cells (%d names), want 26", len(full), len(names))
	}
	// Fleet f: fleet e where the caches do not hold the working set, beside
	// fleet c's cells of the same size.
	for _, n := range []string{"f/synthetic/none/64", "f/tau/none/64"} {
		if !names[n] {
			t.Errorf("no cell %s", n)
		}
	}
	// Fleet e runs fleet a's synthetic and tau-bench cells, of the same
	// sizes, disaggregated: 2 prefill + 2 decode workers, six policy pairs.
	byName := map[string]MatrixCell{}
	for _, c := range full {
		byName[c.Name()] = c
	}
	pds := 0
	for _, c := range full {
		if c.Fleet != FleetPD {
			continue
		}
		pds++
		a := c
		a.Fleet = FleetEqual
		if got, ok := byName[a.Name()]; !ok || got != a {
			t.Errorf("%s: no fleet a cell of the same size (%+v)", c.Name(), got)
		}
		if fleetWorkers(c.Fleet) != 2 || fleetDecode(c.Fleet) != 2 {
			t.Errorf("%s: %d prefill and %d decode workers", c.Name(), fleetWorkers(c.Fleet), fleetDecode(c.Fleet))
		}
		want := []string{"round_robin+cache_aware", "round_robin+least_loaded", "consistent_hash+cache_aware", "consistent_hash+least_loaded",
			"cache_aware+cache_aware", "cache_aware+least_loaded"}
		if ps := c.Policies(); !slices.Equal(ps, want) {
			t.Errorf("%s: policies %v, want %v", c.Name(), ps, want)
		}
		for _, p := range c.Policies() {
			if !ValidPolicy(p) {
				t.Errorf("%s: %s not a valid policy", c.Name(), p)
			}
		}
	}
	if pds != 8 {
		t.Errorf("%d cells of fleet e, want 8", pds)
	}
	for _, c := range full {
		if c.Fleet == FleetPD {
			continue
		}
		if c.Fleet == FleetPDHalfKV {
			if fleetWorkers(c.Fleet) != 2 || fleetDecode(c.Fleet) != 2 || len(c.Policies()) != 6 {
				t.Errorf("%s: fleet e's shape and policies", c.Name())
			}
			continue
		}
		if fleetDecode(c.Fleet) != 0 {
			t.Errorf("%s: decode workers", c.Name())
		}
		ps := c.Policies()
		if !slices.Contains(ps, PolicyPrecise) || !slices.Contains(ps, "cache_aware") || ps[len(ps)-1] != PolicyOracle {
			t.Errorf("%s: policies %v: want cache_aware, precise, then the oracle", c.Name(), ps)
		}
		want := 4
		if c.Fleet == FleetQuarterKV {
			want = 8
			if c.Via != ViaNone || c.Concurrency != 64 {
				t.Errorf("%s: fleet d runs without ids at 64 in flight", c.Name())
			}
		}
		if n := fleetWorkers(c.Fleet); n != want {
			t.Errorf("%s: %d workers, want %d", c.Name(), n, want)
		}
	}
	q := MatrixCells(true)
	if len(q) > 8 || q[0].Fleet != FleetEqual || !slices.ContainsFunc(q, func(c MatrixCell) bool { return c.Fleet == FleetPD }) {
		t.Errorf("quick cells: %v", q)
	}
}

func TestCacheAwareVariants(t *testing.T) {
	base := route.DefaultCacheAwareConfig()
	for _, name := range append([]string{"cache_aware"}, CacheAwareVariants...) {
		if !ValidPolicy(name) {
			t.Errorf("%s not a valid policy", name)
		}
	}
	if c, ok := CacheAwareVariant("cache_aware", base); !ok || c.AffinityRule != base.AffinityRule || c.AffinityCharsPerRequest != base.AffinityCharsPerRequest {
		t.Errorf("cache_aware = %+v, want the base config", c)
	}
	if c, ok := CacheAwareVariant(PolicyCacheAware32k, base); !ok || !c.AffinityRule || c.AffinityCharsPerRequest != 32768 || c.Threshold != base.Threshold {
		t.Errorf("cache_aware_32k = %+v", c)
	}
	if c, ok := CacheAwareVariant(PolicyRFCRule, base); !ok || !c.AffinityRule || c.AffinityCharsPerRequest != 0 {
		t.Errorf("rfc_rule = %+v", c)
	}
	if _, ok := CacheAwareVariant(route.RoundRobin, base); ok {
		t.Error("round_robin is not a cache_aware variant")
	}
}

func TestParseRouterCounters(t *testing.T) {
	text := "# TYPE vllm_router_prefix_tokens_predicted_total counter\n" +
		`vllm_router_prefix_tokens_predicted_total{worker="http://a"} 100` + "\n" +
		`vllm_router_prefix_tokens_predicted_total{worker="http://b"} 50` + "\n" +
		`vllm_router_prefix_tokens_predicted_total_other{worker="x"} 7` + "\n" +
		`vllm_router_prefix_tokens_served_total{worker="http://a"} 90` + "\n" +
		"vllm_router_sessions{model=\"m\"} 3\n"
	p, s, ok := parseRouterCounters(text)
	if !ok || p != 150 || s != 90 {
		t.Fatalf("parseRouterCounters = %v, %v, %v; want 150, 90, true", p, s, ok)
	}
	if _, _, ok := parseRouterCounters("vllm_router_sessions{model=\"m\"} 3\n"); ok {
		t.Fatal("counters found where there are none")
	}
}

func TestHalfCacheBlocks(t *testing.T) {
	wl := Synthetic(smallSynthetic(3))
	opt := testOptions(4, 8)
	full, half, quarter := AutoCacheBlocks(wl, opt), HalfCacheBlocks(wl, opt), QuarterCacheBlocks(wl, opt)
	per, longest := workingSet(wl, opt)
	if half >= full || half < int(longest) || (float64(half) > per/2+1 && half > int(longest+0.5)) {
		t.Fatalf("AutoCacheBlocks %d, HalfCacheBlocks %d (working set %.1f, longest %.1f)", full, half, per, longest)
	}
	if quarter > half || quarter < int(longest) || (float64(quarter) > per/4+1 && quarter > int(longest+0.5)) {
		t.Fatalf("QuarterCacheBlocks %d, HalfCacheBlocks %d (working set %.1f, longest %.1f)", quarter, half, per, longest)
	}
}

// TestSharedBlocks: the blocks two sessions' final turns both start with
// count once, however the messages split them; a session's own blocks and
// what follows a divergence do not count.
func TestSharedBlocks(t *testing.T) {
	doc := strings.Repeat("d", 3*64) // three blocks of 64 characters
	turn := func(parts ...string) Session {
		var ms []json.RawMessage
		for _, p := range parts {
			ms = append(ms, json.RawMessage(p))
		}
		return Session{Turns: []Turn{{Messages: ms}}}
	}
	wl := &Workload{Sessions: []Session{
		turn(doc + strings.Repeat("a", 128)),
		turn(doc[:100], doc[100:]+strings.Repeat("b", 128)), // the same characters, split otherwise
		turn(strings.Repeat("c", 256)),
	}}
	if got := sharedBlocks(wl, 64); got != 3 {
		t.Fatalf("sharedBlocks = %d, want 3 (the document)", got)
	}
	wl.Sessions = wl.Sessions[:1]
	if got := sharedBlocks(wl, 64); got != 0 {
		t.Fatalf("one session shares %d blocks, want 0", got)
	}
}

// An A/A control runs its policy again right after it, is never the cell's
// best nor contested, and the oracle has none.
func TestControls(t *testing.T) {
	if !ValidPolicy(PolicyRFCRule+ControlSuffix) || !ValidPolicy("cache_aware"+ControlSuffix) || ValidPolicy(PolicyOracle+ControlSuffix) || ValidPolicy("nope"+ControlSuffix) {
		t.Fatal("ValidPolicy of controls")
	}
	cell := MatrixCell{Fleet: FleetEqual, Workload: "synthetic", Via: ViaNone, Concurrency: 8}
	cfg := MatrixConfig{Policies: []string{"cache_aware", "cache_aware" + ControlSuffix, PolicyRFCRule, PolicyOracle + ControlSuffix}}
	if got, want := cfg.policies(cell), []string{PolicyRFCRule, "cache_aware", "cache_aware" + ControlSuffix}; !slices.Equal(got, want) {
		t.Fatalf("policies = %v, want %v", got, want)
	}
	reg := loadview.NewRegistry(loadview.Config{})
	if p, err := newPolicy(PolicyRFCRule+ControlSuffix, reg, route.DefaultCacheAwareConfig(), nil); err != nil || p.Name() != "cache_aware" {
		t.Fatalf("control of rfc_rule: %v %v", p, err)
	}
	runs := map[string][]*RunResult{
		PolicyRFCRule:                 {fakeRun(PolicyRFCRule, 1, 0.80, 0.60, 1)},
		"cache_aware":                 {fakeRun("cache_aware", 1, 0.80, 0.55, 1)},
		"cache_aware" + ControlSuffix: {fakeRun("cache_aware"+ControlSuffix, 1, 0.80, 0.40, 1)},
	}
	cr := &CellResult{Cell: cell, Suite: &Suite{Policies: cfg.policies(cell), Runs: runs}}
	if chk, ok := cr.Check(); !ok || chk.Best != "cache_aware" {
		t.Fatalf("a control counted as the best: %+v", chk)
	}
	if got := Contested(cr.Suite, 0.01, 0.10); slices.Contains(got, "cache_aware"+ControlSuffix) {
		t.Fatalf("a control contested: %v", got)
	}
}

// fakePDRun is a run of a disaggregated fleet: its hit rate is the prefill
// workers' (the clients' counts the pulled tokens too).
func fakePDRun(policy string, seed uint64, prefillHit, ttft float64) *RunResult {
	r := fakeRun(policy, seed, 0.99, ttft, 1)
	r.PD, r.WorkerQueries, r.WorkerHits = true, 1000, 1000*prefillHit
	r.DecodeInflightMean, r.KVTransferred = []float64{1, 1}, 500
	return r
}

// Fleet e's checks judge cache_aware on both legs; its prefill hit rate is
// compared with cache_aware's on fleet a's cell of the same shape, and the
// decode policies by TTFT p90 beyond the seeds' spread.
func TestPDChecks(t *testing.T) {
	a := MatrixCell{Fleet: FleetEqual, Workload: "tau", Via: ViaHeader, Concurrency: 8}
	e := a
	e.Fleet = FleetPD
	caca, call := PDPolicy("cache_aware", "cache_aware"), PDPolicy("cache_aware", route.LeastLoaded)
	eRuns := map[string][]*RunResult{
		PDPolicy(route.RoundRobin, "cache_aware"):     {fakePDRun("", 1, 0.50, 0.40)},
		PDPolicy(route.RoundRobin, route.LeastLoaded): {fakePDRun("", 1, 0.50, 0.30)},
		caca: {fakePDRun(caca, 1, 0.81, 0.50), fakePDRun(caca, 2, 0.79, 0.52)},
		call: {fakePDRun(call, 1, 0.80, 0.30), fakePDRun(call, 2, 0.80, 0.31)},
	}
	ec := &CellResult{Cell: e, Suite: &Suite{Policies: e.Policies(), Runs: eRuns, Options: Options{Decode: 2}}}
	if got := ec.Suite.Reference(); got != caca {
		t.Fatalf("reference %q", got)
	}
	chk, ok := ec.Check()
	if !ok || chk.HitApplies || chk.LoadApplies || chk.Best != PDPolicy(route.RoundRobin, route.LeastLoaded) || chk.P90OK {
		t.Fatalf("fleet e check: %+v %v", chk, ok)
	}
	ac := fakeSuite(a, map[string][]*RunResult{"cache_aware": {fakeRun("cache_aware", 1, 0.815, 0.4, 1)}})
	m := &Matrix{Cells: []*CellResult{ac, ec}}
	pc := m.PDChecks()
	if len(pc) != 1 {
		t.Fatalf("PDChecks = %+v", pc)
	}
	c := pc[0]
	if !c.HasA || c.FleetA != a.Name() || !c.HitOK || c.Hit != 0.80 || c.HitLL != 0.80 || c.HitA != 0.815 || c.BetterDecode != route.LeastLoaded {
		t.Fatalf("PDCheck = %+v", c)
	}
	// 3 points below fleet a fails; a p90 difference within the spread is a tie.
	ac.Suite.Runs["cache_aware"][0] = fakeRun("cache_aware", 1, 0.83, 0.4, 1)
	eRuns[call] = []*RunResult{fakePDRun(call, 1, 0.80, 0.45), fakePDRun(call, 2, 0.80, 0.56)}
	if c = m.PDChecks()[0]; c.HitOK || c.BetterDecode != "" {
		t.Fatalf("PDCheck = %+v", c)
	}
	md := m.Markdown()
	for _, w := range []string{"| e/tau/header/8 | 80.0 / 80.0 % | 83.0 % | -3.0 pts **FAIL** |", "tie (within spread)", "0/1 PASS", "— (no oracle)"} {
		if !strings.Contains(md, w) {
			t.Errorf("report lacks %q", w)
		}
	}
}
