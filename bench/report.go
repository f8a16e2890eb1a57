package bench

import (
	"fmt"
	"html"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/warmroute/warmroute/route"
)

// LoadTarget is docs/design.md §7's bound on cache_aware's max/mean worker load.
const LoadTarget = 1.25

func pctStat(s Stat) string {
	return fmt.Sprintf("%.1f ± %.1f %%", 100*s.Mean, 100*s.SD)
}

func secStat(s Stat) string {
	return fmt.Sprintf("%.3f ± %.3f", s.Mean, s.SD)
}

func numStat(s Stat, prec int) string {
	return strconv.FormatFloat(s.Mean, 'f', prec, 64) + " ± " + strconv.FormatFloat(s.SD, 'f', prec, 64)
}

// Table is the main comparison in Markdown (also what cmd/warmbench prints).
func (s *Suite) Table() string {
	var sb strings.Builder
	sb.WriteString("| Policy | Hit rate (client) | Hit rate (workers) | Session hit p10 / p50 / p90 | TTFT p50 (s) | TTFT p90 (s) | TTFT p99 (s) | E2E p50 (s) | E2E p90 (s) | Req/s | In-flight max/mean | Served max/mean | Errors |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, m := range s.Summaries() {
		sess := fmt.Sprintf("%.0f / %.0f / %.0f %%", 100*m.SessP10.Mean, 100*m.SessP50.Mean, 100*m.SessP90.Mean)
		if m.oracle {
			fmt.Fprintf(&sb, "| %s (bound) | %s | %s | %s | — | — | — | — | — | — | — | — | %d |\n",
				m.Policy, pctStat(m.HitClient), pctStat(m.HitWorkers), sess, m.Errors)
			continue
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n",
			m.Policy, pctStat(m.HitClient), pctStat(m.HitWorkers), sess,
			secStat(m.TTFT50), secStat(m.TTFT90), secStat(m.TTFT99), secStat(m.E2E50), secStat(m.E2E90),
			numStat(m.Throughput, 2), numStat(m.LoadMaxMean, 2), numStat(m.ServedMaxMean, 2), m.Errors)
	}
	return sb.String()
}

// LabelTable is the decision-label mix per policy (x-vllm-router-decision),
// summed over seeds.
func (s *Suite) LabelTable() string {
	var sb strings.Builder
	sb.WriteString("| Policy | Decision labels (share of requests) |\n|---|---|\n")
	for _, m := range s.Summaries() {
		type kv struct {
			k string
			v int
		}
		var ls []kv
		total := 0
		for k, v := range m.Labels {
			ls = append(ls, kv{k, v})
			total += v
		}
		sort.Slice(ls, func(i, j int) bool { return ls[i].v > ls[j].v || ls[i].v == ls[j].v && ls[i].k < ls[j].k })
		var parts []string
		for _, l := range ls {
			parts = append(parts, fmt.Sprintf("%s %.1f %%", l.k, 100*float64(l.v)/float64(max(total, 1))))
		}
		fmt.Fprintf(&sb, "| %s | %s |\n", m.Policy, strings.Join(parts, ", "))
	}
	return sb.String()
}

// Verdict states, from the numbers, whether cache_aware is ahead of every
// baseline on hit rate and TTFT, whether its load stays within LoadTarget, and
// its distance to the oracle. Empty when cache_aware did not run.
func (s *Suite) Verdict() string {
	sums := s.Summaries()
	var ca, oracle *Summary
	var base []*Summary
	for i := range sums {
		switch m := &sums[i]; m.Policy {
		case "cache_aware":
			ca = m
		case PolicyOracle:
			oracle = m
		default:
			base = append(base, m)
		}
	}
	if ca == nil {
		return ""
	}
	var sb strings.Builder
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "**no**"
	}
	if len(base) > 0 {
		bestHit, bestTTFT := base[0], base[0]
		for _, m := range base {
			if m.HitClient.Mean > bestHit.HitClient.Mean {
				bestHit = m
			}
			if m.TTFT50.Mean < bestTTFT.TTFT50.Mean {
				bestTTFT = m
			}
		}
		fmt.Fprintf(&sb, "- cache_aware ahead of every baseline on hit rate: %s (%.1f %% vs best baseline %s %.1f %%).\n",
			yes(ca.HitClient.Mean > bestHit.HitClient.Mean), 100*ca.HitClient.Mean, bestHit.Policy, 100*bestHit.HitClient.Mean)
		fmt.Fprintf(&sb, "- cache_aware ahead of every baseline on TTFT p50: %s (%.3f s vs best baseline %s %.3f s).\n",
			yes(ca.TTFT50.Mean < bestTTFT.TTFT50.Mean), ca.TTFT50.Mean, bestTTFT.Policy, bestTTFT.TTFT50.Mean)
	}
	fmt.Fprintf(&sb, "- cache_aware in-flight max/mean ≤ %.2f: %s (%.2f; requests served max/mean %.2f).\n",
		LoadTarget, yes(ca.LoadMaxMean.Mean <= LoadTarget), ca.LoadMaxMean.Mean, ca.ServedMaxMean.Mean)
	if oracle != nil && oracle.HitClient.Mean > 0 {
		gap := oracle.HitClient.Mean - ca.HitClient.Mean
		rel := gap / oracle.HitClient.Mean
		fmt.Fprintf(&sb, "- distance to the oracle bound: %.1f points (%.1f %% of the bound; docs/design.md §7 asks ≤ 5 %%: %s).\n",
			100*gap, 100*rel, yes(rel <= 0.05))
	}
	for _, m := range sums {
		if m.MaxHitGap > float64(max(s.Options.Sim.BlockTokens, 16)) {
			fmt.Fprintf(&sb, "- **client and worker hit counts disagree** for %s: %.1f tokens per request.\n", m.Policy, m.MaxHitGap)
		}
	}
	return sb.String()
}

// Setup describes the fleet and the client in one paragraph.
func (s *Suite) Setup() string {
	o := &s.Options
	c := o.Sim
	ca := o.CacheAware
	return fmt.Sprintf("%d simulated workers (simworker over loopback, fresh for every policy and seed), each: prefix cache %d blocks of %d tokens (LRU), "+
		"TTFT = %v + %v per uncached prompt token, %v per output token, max-num-seqs %d, time scale %g (times below are simulated seconds = measured / %g). "+
		"Router: fastproxy over loopback, cache_aware with --cache-threshold %g --balance-abs-threshold %d --balance-rel-threshold %g --max-tree-size %d, %s "+
		"(pre_rfc uses the same threshold and gates). Client: closed loop, %d sessions in flight, turns strictly in order, think time %v (simulated), "+
		"session id via %s, streaming with include_usage, %s, ignore_eos. "+
		"The oracle is one worker with an unbounded cache and unbounded max-num-seqs: its hit rate is the bound, its latency is not meaningful.",
		o.Workers, c.CacheBlocks, c.BlockTokens, c.Overhead, c.PerToken, c.InterToken, c.MaxNumSeqs, c.TimeScale, c.TimeScale,
		ca.Threshold, ca.BalanceAbs, ca.BalanceRel, ca.MaxTreeSize, missPlacement(ca),
		o.Concurrency, o.ThinkTime, sessionVia(o.SessionVia), o.maxTokensText())
}

// missPlacement names how cache_aware places a session miss (docs/design.md §4).
func missPlacement(ca route.CacheAwareConfig) string {
	if ca.AffinityRule {
		return fmt.Sprintf("misses placed by --affinity-chars-per-request %d", ca.AffinityCharsPerRequest)
	}
	return "misses placed by estimated time to first token"
}

func sessionVia(v string) string {
	switch v {
	case ViaHeader:
		return "header X-Session-ID"
	case ViaBody:
		return "body session_params.session_id"
	}
	return "nothing (history-only routing)"
}

// Markdown is the whole report.
func (s *Suite) Markdown() string {
	var sb strings.Builder
	title := s.Workload
	if s.Preset != "" {
		title = s.Preset + " preset (" + s.Workload + ")"
	}
	fmt.Fprintf(&sb, "# Replay benchmark: %s\n\nProduced by:\n\n```\n%s\n```\n\n", title, s.CmdLine)
	fmt.Fprintf(&sb, "- Date: %s (took %s)\n- Machine: `%s`; CPU: %s; nproc %d; %s\n",
		s.Date.Format("2006-01-02 15:04 MST"), s.Elapsed.Round(1e9), s.Machine.Uname, s.Machine.CPU, s.Machine.NProc, s.Machine.Go)
	fmt.Fprintf(&sb, "- Seeds: %v; requests per policy, by seed: %v\n", s.Seeds, s.Requests)
	for _, n := range s.Notes {
		fmt.Fprintf(&sb, "- Workload: %s\n", n)
	}
	fmt.Fprintf(&sb, "- Setup: %s\n\n", s.Setup())
	sb.WriteString("Mean ± sd over seeds.\n\n")
	sb.WriteString(s.Table())
	sb.WriteString("\n")
	if v := s.Verdict(); v != "" {
		sb.WriteString("## Verdict (computed)\n\n" + v + "\n")
	}
	sb.WriteString("## Decision labels\n\n" + s.LabelTable() + "\n")
	sb.WriteString(`## Columns

- **Hit rate (client)**: Σ usage.prompt_tokens_details.cached_tokens / Σ usage.prompt_tokens over the run (token-weighted).
- **Hit rate (workers)**: Σ Δ vllm:prefix_cache_hits_total / Σ Δ vllm:prefix_cache_queries_total scraped from every worker's /metrics before and after the run. Must equal the client's.
- **Session hit**: per-session token-weighted hit rate; p10 / p50 / p90 over sessions (mean over seeds).
- **TTFT**: request sent → first content chunk at the client, through the router; **E2E**: → end of stream. Simulated seconds.
- **Req/s**: completed requests per simulated second of the run's wall time.
- **In-flight max/mean**: each worker's in-flight requests (the router's load counters) sampled every 5 ms and averaged over the run; max over workers / mean over workers. **Served max/mean**: the same over requests served per worker.
- Request histories are the workload's own text: the assistant replies inside them are deterministic text of max_tokens tokens (synthetic) or the trace's (tau, mooncake), never what the simulated worker answered, so every policy of a seed sends byte-identical requests.
`)
	return sb.String()
}

// CSV has one row per policy and seed.
func (s *Suite) CSV() string {
	var sb strings.Builder
	sb.WriteString("workload,policy,seed,requests,errors,prompt_tokens,cached_tokens,hit_client,worker_queries,worker_hits,hit_workers," +
		"session_hit_p10,session_hit_p50,session_hit_p90,ttft_p50_s,ttft_p90_s,ttft_p99_s,e2e_p50_s,e2e_p90_s,req_per_s,inflight_max_mean,served_max_mean,sim_seconds\n")
	for _, p := range s.Policies {
		for _, r := range s.Runs[p] {
			fmt.Fprintf(&sb, "%s,%s,%d,%d,%d,%d,%d,%.6f,%.0f,%.0f,%.6f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f\n",
				s.Workload, p, r.Seed, r.Requests, r.Errors, r.PromptTokens, r.CachedTokens, r.HitClient(), r.WorkerQueries, r.WorkerHits, r.HitWorkers(),
				Percentile(r.SessionHit, 10), Percentile(r.SessionHit, 50), Percentile(r.SessionHit, 90),
				Percentile(r.TTFT, 50), Percentile(r.TTFT, 90), Percentile(r.TTFT, 99), Percentile(r.E2E, 50), Percentile(r.E2E, 90),
				r.Throughput(), r.LoadMaxMean(), r.ServedMaxMean(), r.SimSeconds)
		}
	}
	return sb.String()
}

// SVG is a two-panel bar chart: hit rate and TTFT p50 (with a p90 tick) per
// policy, mean over seeds with ± sd whiskers.
func (s *Suite) SVG() string {
	sums := s.Summaries()
	const (
		rowH   = 26
		top    = 56
		labelW = 130
		panelW = 330
		gap    = 60
	)
	h := top + rowH*len(sums) + 40
	w := labelW + 2*panelW + gap + 40
	maxT := 0.0
	for _, m := range sums {
		if !m.oracle {
			maxT = max(maxT, m.TTFT90.Mean, m.TTFT50.Mean+m.TTFT50.SD)
		}
	}
	if maxT == 0 {
		maxT = 1
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&sb, `<text x="10" y="20" font-size="14" font-weight="bold">Replay: %s — %d workers, %d in flight, seeds %v</text>`+"\n",
		html.EscapeString(s.Workload), s.Options.Workers, s.Options.Concurrency, s.Seeds)
	x1 := labelW
	x2 := labelW + panelW + gap
	fmt.Fprintf(&sb, `<text x="%d" y="44" font-weight="bold">Prompt-cache hit rate (%%, client)</text>`+"\n", x1)
	fmt.Fprintf(&sb, `<text x="%d" y="44" font-weight="bold">TTFT p50, simulated s (tick: p90)</text>`+"\n", x2)
	for _, gx := range []int{x1, x2} {
		for k := 0; k <= 4; k++ {
			x := gx + k*panelW/4
			fmt.Fprintf(&sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#ddd"/>`+"\n", x, top-4, x, top+rowH*len(sums))
			lab := fmt.Sprintf("%d", k*25)
			if gx == x2 {
				lab = strconv.FormatFloat(maxT*float64(k)/4, 'g', 3, 64)
			}
			fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="middle" fill="#666">%s</text>`+"\n", x, top+rowH*len(sums)+16, lab)
		}
	}
	for i, m := range sums {
		y := top + i*rowH
		color := "#8aa4c8"
		switch m.Policy {
		case "cache_aware":
			color = "#d9822b"
		case PolicyOracle:
			color = "#9a9a9a"
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-8, y+16, html.EscapeString(m.Policy))
		bw := m.HitClient.Mean * panelW
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x1, y+4, bw, rowH-8, color)
		whisker(&sb, float64(x1)+(m.HitClient.Mean-m.HitClient.SD)*panelW, float64(x1)+(m.HitClient.Mean+m.HitClient.SD)*panelW, y+rowH/2)
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" fill="#222">%.1f</text>`+"\n", float64(x1)+bw+4, y+16, 100*m.HitClient.Mean)
		if m.oracle {
			fmt.Fprintf(&sb, `<text x="%d" y="%d" fill="#888">n/a (bound)</text>`+"\n", x2+4, y+16)
			continue
		}
		sc := float64(panelW) / maxT
		tw := m.TTFT50.Mean * sc
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x2, y+4, tw, rowH-8, color)
		whisker(&sb, float64(x2)+(m.TTFT50.Mean-m.TTFT50.SD)*sc, float64(x2)+(m.TTFT50.Mean+m.TTFT50.SD)*sc, y+rowH/2)
		px := float64(x2) + m.TTFT90.Mean*sc
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#333" stroke-width="2"/>`+"\n", px, y+3, px, y+rowH-3)
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" fill="#222">%.3f</text>`+"\n", max(float64(x2)+tw, px)+4, y+16, m.TTFT50.Mean)
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}

func whisker(sb *strings.Builder, a, b float64, y int) {
	if b-a < 0.5 {
		return
	}
	fmt.Fprintf(sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222"/>`+"\n", a, y, b, y)
	fmt.Fprintf(sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222"/>`+"\n", a, y-4, a, y+4)
	fmt.Fprintf(sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222"/>`+"\n", b, y-4, b, y+4)
}

// WriteFiles writes dir/base.md, .csv and .svg.
func (s *Suite) WriteFiles(dir, base string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for ext, body := range map[string]string{".md": s.Markdown(), ".csv": s.CSV(), ".svg": s.SVG()} {
		if err := os.WriteFile(filepath.Join(dir, base+ext), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}
