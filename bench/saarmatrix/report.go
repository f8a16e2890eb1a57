package saarmatrix

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func pct(base, v float64) float64 {
	if base == 0 {
		return 0
	}
	return 100 * (base - v) / base
}

// Table is the main table in Markdown (also printed to stdout).
func (r *Result) Table() string {
	b := r.Baseline()
	var sb strings.Builder
	sb.WriteString("| Policy | Turns | Switches | Upgrades | Downgrades | Unsafe switches (tool / state) | Fair cost ($) | Fair cost cut | Mean quality | Quality delta | Shortfall / turn | Hard locks | Lock breaks | Continuity violations |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range r.Totals {
		s := &r.Totals[i]
		fmt.Fprintf(&sb, "| %s | %d | %d | %d | %d | %d (%d / %d) | %.4f | %.2f%% | %.4f | %+.4f | %.4f | %d | %d | %d |\n",
			s.Policy, s.Turns, s.Switches, s.Upgrades, s.Downgrades, s.Unsafe(), s.UnsafeTool, s.UnsafeState,
			s.Cost, pct(b.Cost, s.Cost), s.MeanQuality(), s.MeanQuality()-b.MeanQuality(), s.MeanShortfall(), s.HardLocks, s.LockBreaks, s.Violations)
	}
	return sb.String()
}

// ScenarioTable is switches / unsafe / cost per scenario and policy.
func (r *Result) ScenarioTable() string {
	var sb strings.Builder
	sb.WriteString("| Scenario |")
	for _, p := range r.Params.Policies {
		sb.WriteString(" " + p.Name + " |")
	}
	sb.WriteString("\n|---|")
	for range r.Params.Policies {
		sb.WriteString("---:|")
	}
	sb.WriteString("\n")
	for si, name := range r.scenarioNames() {
		sb.WriteString("| " + name + " |")
		for _, p := range r.Params.Policies {
			s := &r.ByScenario[p.Name][si]
			fmt.Fprintf(&sb, " %d↑ %d↓ / %d / $%.3f / q%.3f / sf%.3f |", s.Upgrades, s.Downgrades, s.Unsafe(), s.Cost, s.MeanQuality(), s.MeanShortfall())
		}
		sb.WriteString("\n")
	}
	return sb.String()
}

// CSV returns one row per policy and scenario plus a total row per policy.
func (r *Result) CSV() string {
	var sb strings.Builder
	sb.WriteString("policy,scenario,turns,switches,upgrades,downgrades,unsafe_switches,unsafe_tool,unsafe_state,fair_cost_usd,mean_quality,quality_delta,quality_shortfall,hard_locks,lock_breaks,continuity_violations,resets_idle,resets_drift,economic_switches,cached_tokens,prompt_tokens\n")
	base := r.Baseline()
	row := func(s *Stats, scenario string, bq float64) {
		fmt.Fprintf(&sb, "%s,%s,%d,%d,%d,%d,%d,%d,%d,%.6f,%.6f,%.6f,%.6f,%d,%d,%d,%d,%d,%d,%d,%d\n",
			s.Policy, scenario, s.Turns, s.Switches, s.Upgrades, s.Downgrades, s.Unsafe(), s.UnsafeTool, s.UnsafeState, s.Cost, s.MeanQuality(),
			s.MeanQuality()-bq, s.MeanShortfall(), s.HardLocks, s.LockBreaks, s.Violations, s.ResetsIdle, s.ResetsDrift, s.EconomicSwitch,
			s.CachedTokens, s.PromptTokens)
	}
	for i := range r.Totals {
		row(&r.Totals[i], "all", base.MeanQuality())
	}
	for _, p := range r.Params.Policies {
		for si, name := range r.scenarioNames() {
			s := &r.ByScenario[p.Name][si]
			row(s, name, r.ByScenario[base.Policy][si].MeanQuality())
		}
	}
	return sb.String()
}

// SVG is a hand-written grouped bar chart: switches and unsafe switches
// per policy, and the cost reduction vs single-turn as a label.
func (r *Result) SVG() string {
	const (
		w, h             = 900, 420
		left, right      = 60, 20
		top, bottom      = 40, 120
		barGap           = 6
		switchesColor    = "#4C78A8"
		unsafeColor      = "#E45756"
		plotW, plotH     = w - left - right, h - top - bottom
		labelFontSize    = 11
		titleFontSizePix = 15
	)
	maxV := 1
	for i := range r.Totals {
		maxV = max(maxV, r.Totals[i].Switches)
	}
	base := r.Baseline()
	n := len(r.Totals)
	group := float64(plotW) / float64(n)
	bw := (group - 3*barGap) / 2
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n", w, h, w, h)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&sb, `<text x="%d" y="22" font-size="%d" font-weight="bold">SAAR policy matrix: %d turns per policy — switches (blue), unsafe switches (red), cost reduction vs single-turn</text>`+"\n", left, titleFontSizePix, base.Turns)
	for k := 0; k <= 4; k++ {
		v := maxV * k / 4
		y := float64(top+plotH) - float64(plotH)*float64(v)/float64(maxV)
		fmt.Fprintf(&sb, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" font-size="%d" text-anchor="end">%d</text>`+"\n",
			left, y, w-right, y, left-6, y+4, labelFontSize, v)
	}
	for i := range r.Totals {
		s := &r.Totals[i]
		x0 := float64(left) + group*float64(i) + barGap
		bar := func(x float64, v int, color string) {
			bh := float64(plotH) * float64(v) / float64(maxV)
			y := float64(top+plotH) - bh
			fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/><text x="%.1f" y="%.1f" font-size="%d" text-anchor="middle">%d</text>`+"\n",
				x, y, bw, bh, color, x+bw/2, y-3, labelFontSize, v)
		}
		bar(x0, s.Switches, switchesColor)
		bar(x0+bw+barGap, s.Unsafe(), unsafeColor)
		cx := float64(left) + group*(float64(i)+0.5)
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" font-size="%d" text-anchor="end" transform="rotate(-30 %.1f %d)">%s</text>`+"\n",
			cx, top+plotH+16, labelFontSize, cx, top+plotH+16, s.Policy)
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" font-size="%d" text-anchor="middle" fill="#333">cost %+.1f%%</text>`+"\n",
			cx, h-12, labelFontSize, -pct(base.Cost, s.Cost))
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}

// Markdown is the full report.
func (r *Result) Markdown(cmdline string) string {
	p := r.Params
	var sb strings.Builder
	sb.WriteString("# SAAR policy matrix\n\n")
	fmt.Fprintf(&sb, "Produced by:\n\n```\n%s\n```\n\n", cmdline)
	fmt.Fprintf(&sb, "%d scenarios × %d seeds × %d sessions × %d turns = %d turns per policy, each turn driven through the shipped "+
		"`saar.Router` (`Select` + `Observe`, injected clock) with a deterministic simulated backend per model "+
		"(tool calls, response ids, usage). Every policy sees the same scripted sessions.\n\n",
		len(p.Scenarios), p.Seeds, p.Sessions, p.Turns, len(p.Scenarios)*p.Seeds*p.Sessions*p.Turns)
	sb.WriteString(r.Table())
	fmt.Fprintf(&sb, "\nPolicies `-v1` run policy version 1 (today's score selector and fixed margins); the others version 3 "+
		"(demand-calibrated selector priced on the turn's warm cost, look-ahead at the session's demand, switches priced in money; docs/design.md §5) with price_sensitivity %g. The reference for cost "+
		"and quality deltas is single-turn-v1.\n", p.Lambda)
	sb.WriteString(`
- **Switches**: turns served by another model than the session's previous turn; **upgrades** / **downgrades**: those to a
  model with a higher / lower quality_score (any cause: economics, resets, lock breaks).
- **Unsafe switches**: switches on a tool-loop turn (tool results) or a provider-state turn (previous_response_id or opaque reasoning state).
- **Fair cost**: the same cache model for every policy, single-turn included: the prefix carried from the previous turn is billed at the
  cached input price when the same model serves the turn, at the full prompt price otherwise; completion at the completion price.
- **Quality delta**: mean quality_score of the served models minus single-turn's. It rewards serving an expensive model
  whatever the turn needs, so read it with the next column.
- **Shortfall / turn**: per turn, how far the served model's quality_score fell below the turn's demand: the quality_score
  of the cheapest model whose quality_score is at least the turn's complexity (every turn carries x-warmroute-complexity),
  the best model's when none is; over-serving counts 0. The same demand for every policy.
- **Continuity violations**: served model ≠ the hard lock's model without an explicit lock_broken (must be 0).

## Per scenario (upgrades↑ downgrades↓ / unsafe / fair cost / mean quality / shortfall per turn)

`)
	sb.WriteString(r.ScenarioTable())
	sb.WriteString("\n## Scenarios\n\n| Scenario | intents (reasoning, coding, tools, default) | tools offered | tool call | state | opaque | idle | drift |\n|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range p.Scenarios {
		fmt.Fprintf(&sb, "| %s | %v | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", s.Name, s.Intents, s.ToolsOffered, s.ToolCall, s.State, s.Opaque, s.Idle, s.Drift)
	}
	if len(r.Frontier) > 0 {
		sb.WriteString("\n## Frontier of price_sensitivity (six scenarios of issue 14, 21,600 turns per point)\n\n")
		sb.WriteString("![frontier](saar-frontier.svg)\n\n")
		sb.WriteString(FrontierTable(r.Frontier, p.Lambda))
	}
	sb.WriteString("\nFiles: `saar-matrix.csv` (per policy and scenario), `saar-matrix.svg` (chart), `saar-frontier.csv` and `saar-frontier.svg` (frontier).\n")
	return sb.String()
}

// WriteFiles writes saar-matrix.md, .csv and .svg under dir.
func (r *Result) WriteFiles(dir, cmdline string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	files := map[string]string{
		"saar-matrix.md":  r.Markdown(cmdline),
		"saar-matrix.csv": r.CSV(),
		"saar-matrix.svg": r.SVG(),
	}
	if len(r.Frontier) > 0 {
		files["saar-frontier.csv"] = FrontierCSV(r.Frontier)
		files["saar-frontier.svg"] = FrontierSVG(r.Frontier, r.Params.Lambda, r.Params.Seeds*r.Params.Sessions*r.Params.Turns*len(Scenarios))
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}
