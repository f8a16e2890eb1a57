package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warmroute/warmroute/simworker"
)

// base is the output files' name.
func (rep *report) base() string {
	if rep.o.quick {
		return "overload-quick"
	}
	return "overload"
}

// write writes base.md, .csv and .svg into dir.
func (rep *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	a := rep.analyze()
	for ext, text := range map[string]string{".md": rep.markdown(a), ".csv": rep.csv(a), ".svg": rep.svg(a)} {
		if err := os.WriteFile(filepath.Join(dir, rep.base()+ext), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// command is how the report was produced.
func (rep *report) command() string {
	if rep.o.quick {
		return "make bench-overload QUICK=1"
	}
	return "make bench-overload"
}

func (rep *report) markdown(a *analysis) string {
	var sb strings.Builder
	o := rep.o
	sb.WriteString("# Overload: the router queue under saturation\n\n")
	if o.quick {
		sb.WriteString("> QUICK smoke run: short runs at a fixed guess of the capacity. It checks that every request has one outcome and that the report renders; its numbers are not results.\n\n")
	}
	fmt.Fprintf(&sb, "Produced by `%s` (`%s`, issue 29) on %s in %s. Machine: %s, %d CPUs (%s), %s. How to read it: [README](README.md#saturation-the-overload-benchmark).\n\n",
		rep.command(), strings.TrimSpace("go run ./bench/overload "+o.cmdline), rep.started.Format("2006-01-02"), rep.wall.Round(time.Second), rep.machine.CPU, rep.machine.NProc, rep.machine.Uname, rep.machine.Go)
	rep.writeSetup(&sb)
	rep.writeCapacity(&sb, a)
	rep.writeResults(&sb, a)
	rep.writeTail(&sb, a)
	rep.writeOutcomes(&sb, a)
	rep.writeCriteria(&sb, a)
	return sb.String()
}

func (rep *report) writeSetup(sb *strings.Builder) {
	o := rep.o
	sim := o.sim()
	bin := "built from this tree's `./cmd/warmroute`"
	if !rep.built {
		bin = "`" + rep.bin.path + "` (--bin)"
	}
	sb.WriteString("## Setup\n\n")
	fmt.Fprintf(sb, "- **Router**: the real binary, %s, on loopback; a fresh router and fleet for every run. Configurations: ", bin)
	var names []string
	for _, c := range rep.configs {
		names = append(names, fmt.Sprintf("%s (`%s`)", c.name, strings.ReplaceAll(strings.Join(c.args, " "), rep.tmp, "$TMP")))
	}
	sb.WriteString(strings.Join(names, "; ") + ".\n")
	for _, s := range rep.skipped {
		fmt.Fprintf(sb, "- **Skipped**: %s.\n", s)
	}
	fmt.Fprintf(sb, "- **Workers**: %d batching simulated workers (simworker's engine: continuous batching, chunked prefill, at most %d sequences each, "+
		"KV cache %d blocks of 16 tokens, prefix cache in it, waiting requests taken %s). **Time scale %g**: a simulated second lasts %g real seconds, so the "+
		"machine's CPU is not the bottleneck (idle CPU per run below). Every time in this report is simulated unless it says real.\n",
		o.workers, o.maxNumSeqs, o.cacheBlocks, schedulingText(sim.SchedulingPolicy), sim.TimeScale, sim.TimeScale)
	var pools []string
	for _, p := range rep.pools {
		pools = append(pools, fmt.Sprintf("%s (%d sessions, %.1f turns on average: %s)", p.name, len(p.sessions), p.meanTurns(), p.note))
	}
	fmt.Fprintf(sb, "- **Sessions**: arrivals alternate between %s. %s Each arrival's first message ends with its own conversation mark: "+
		"arrivals of one trace session share the system prompt, not their histories. max_tokens: %s. Streamed, `stream_options.include_usage`.\n",
		strings.Join(pools, " and "), strings.Join(rep.poolNotes, " "), maxTokensText(o.maxTokens))
	keys := "`name:key` lines"
	if !rep.bin.namedKeys {
		keys = "bare key lines: this binary has no named keys"
	}
	fmt.Fprintf(sb, "- **Arrivals**: a Poisson process of sessions; %.0f %% interactive (`x-request-priority: %d`), %.0f %% batch (`%d`); "+
		"tenants %s (%.0f %% of arrivals) and %s (%.0f %%), each with its client key (%s). Within a session each turn follows the previous "+
		"answer after a think time of %.3g s on average (uniform ×[0.5, 1.5)). A client gives up on its conversation at the first turn not "+
		"served, and waits %.3g s for a first token before it hangs up (client gone).\n",
		100*classShares[0], classPriority[0], 100*classShares[1], classPriority[1],
		tenantNames[0], 100*tenantShares[0], tenantNames[1], 100*tenantShares[1], keys, o.think, o.patience)
	fmt.Fprintf(sb, "- **A run**: sessions arrive for %.3g s (%s real); no turn starts after that, and requests still in flight %.3g s + 10 s real "+
		"later are cut. Measured: the requests sent after the first %.0f %% of that span (warm-up); outcomes count every request. "+
		"Router queue timeout %d s real (%.3g s), load scrape every %g s real.\n",
		o.span(o.duration), o.duration, o.patience, 100*o.warm, o.queueTimeout, float64(o.queueTimeout)/o.timeScale, o.scrape)
	sb.WriteString("\n")
}

// schedulingText says in what order a worker takes its waiting requests.
func schedulingText(policy string) string {
	if policy == simworker.SchedulePriority {
		return "by the request's priority, then arrival (vLLM's `--scheduling-policy priority`)"
	}
	return "first come, first served"
}

func maxTokensText(n int) string {
	if n > 0 {
		return strconv.Itoa(n)
	}
	return "each turn's recorded answer length"
}

func (rep *report) writeCapacity(sb *strings.Builder, a *analysis) {
	sb.WriteString("## Capacity\n\n")
	switch {
	case rep.searched:
		sb.WriteString("The session arrival rate at which pass-through's TTFT p50 (every served request) doubles over its light-load value: the rate doubles until it does, " +
			"then bisects, then interpolates between the last rate below and the first above.\n\n")
		sb.WriteString("| sessions/s | TTFT p50 (s) | × light load | requests | served | idle CPU mean / min (own) |\n|---:|---:|---:|---:|---:|---:|\n")
		base := 0.0
		for i, r := range rep.search {
			st := r.stats(rep.o, nil)
			if i == 0 {
				base = st.p50All
			}
			fmt.Fprintf(sb, "| %.3g | %.3f | %.2f | %d | %d | %s |\n", r.spec.rate, st.p50All, ratioOr0(st.p50All, base), st.sent, st.outcomes[outServed], idleText(r.idle))
		}
		fmt.Fprintf(sb, "\nCapacity: **%.3g sessions/s**.", rep.capacity)
	case rep.o.quick:
		fmt.Fprintf(sb, "Not searched (QUICK): %.3g sessions/s assumed.", rep.capacity)
	default:
		fmt.Fprintf(sb, "Not searched: %.3g sessions/s given (--capacity).", rep.capacity)
	}
	if a.hasYard {
		fmt.Fprintf(sb, " In requests: %.3g/s, pass-through's served rate at %s ÷ %g. A tenant's demand in a run is its own served rate there "+
			"(below capacity every request is served) × the turns its sessions that arrived in the run ask for ÷ those of its sessions at %s: "+
			"a heavier load replays the same arrivals and adds more, each with its own tenant draw, so a tenant's share of the sessions differs by chance from load to load. "+
			"The fair shares divide the capacity in requests max-min among the demands.",
			a.capReq, loadText(a.lowLoad), a.lowLoad, loadText(a.lowLoad))
	}
	sb.WriteString("\n\n")
}

func (rep *report) writeResults(sb *strings.Builder, a *analysis) {
	sb.WriteString("## Results\n\n")
	if a.hasYard {
		fmt.Fprintf(sb, "TTFT of served requests in the measured window, seconds. Goodput: served requests per second whose TTFT is at most %d× "+
			"their class's TTFT p50 through pass-through at %s (%.3g s interactive, %.3g s batch: one yardstick for every configuration). "+
			"Tenants: served requests per second / min(demand, max-min fair share of the capacity), and the share of the requests the tenant's sessions sent in the window that were served "+
			"(sessions are closed loops: a turn follows the last answer, so a slower service also lowers what a tenant sends below its demand). Queue wait: `x-vllm-router-queue-ms` of the served requests.\n\n",
			goodputFactor, loadText(a.lowLoad), a.yard[0], a.yard[1])
	}
	sb.WriteString("| configuration | load | sessions/s | interactive p50 | interactive p99 | batch p50 | batch p99 | goodput/s | × pass-through | hit rate | " +
		tenantNames[0] + " served / fair | " + tenantNames[1] + " served / fair | queue wait p99 | idle CPU mean / min (own) |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, rw := range a.rows {
		st := &rw.st
		fmt.Fprintf(sb, "| %s | %s | %.3g | %s | %s | %s | %s | %.3g | %s | %.1f %% | %s | %s | %s | %s |\n",
			rw.run.spec.config.name, loadText(rw.run.spec.load), rw.run.spec.rate,
			secText(st.class[0].served, st.class[0].p50), secText(st.class[0].served, st.class[0].p99),
			secText(st.class[1].served, st.class[1].p50), secText(st.class[1].served, st.class[1].p99),
			st.goodput, relText(rw.goodRel), 100*st.hit, fairText(rw, 0), fairText(rw, 1), queueText(st), idleText(rw.run.idle))
	}
	sb.WriteString("\n![TTFT p99 against load](" + rep.base() + ".svg)\n\n")
}

// writeTail says where each class's slowest requests waited, from the
// workers' engine reports (simworker.FirstToken).
func (rep *report) writeTail(sb *strings.Builder, a *analysis) {
	sb.WriteString("## Where the slowest requests waited\n\n" +
		"From the workers' engines: each reports, at a request's first token, the sequences it was running when the request arrived and how long the request then waited for a sequence slot. " +
		"*At a full engine*: the served requests that arrived at a worker running all its slots. *Slowest*: those at or above the class's TTFT p99, with their median wait in the router's queue and in the engine's queue for a slot (simulated seconds; the rest of a TTFT is prefill and the first step).\n\n" +
		"| configuration | load | class | served | at a full engine | slowest | of them at a full engine | their router-queue wait p50 | their engine-queue wait p50 |\n|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, rw := range a.rows {
		for c, cs := range rw.st.class {
			if cs.served == 0 {
				continue
			}
			fmt.Fprintf(sb, "| %s | %s | %s | %d | %s | %d | %s | %.3f | %.3f |\n", rw.run.spec.config.name, loadText(rw.run.spec.load), classNames[c],
				cs.served, pctText(cs.atFull, cs.served), cs.tail.n, pctText(cs.tail.atFull, cs.tail.n), cs.tail.routerQueue, cs.tail.engineQueue)
		}
	}
	sb.WriteString("\n")
}

// pctText is n of total as a percentage.
func pctText(n, total int) string {
	if total == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f %%", 100*float64(n)/float64(total))
}

func (rep *report) writeOutcomes(sb *strings.Builder, a *analysis) {
	sb.WriteString("## Outcomes\n\nThe sessions that arrived and every request they sent, each with exactly one outcome. **Checked** counts the requests that broke that rule, from both ends: " +
		"every id has one outcome; a served request reached exactly one worker (the workers record each request's `x-request-id`), a 429 or 503 none, " +
		"no request two; every answer carries its own request's id; every 429 and 503 carries Retry-After; the workers received nothing unsent.\n\n")
	sb.WriteString("| configuration | load | sessions | requests | waited in the router queue | answer continued |")
	for _, n := range outcomeNames {
		sb.WriteString(" " + n + " |")
	}
	sb.WriteString(" checked |\n|---|---:|---:|---:|---:|---:|" + strings.Repeat("---:|", int(numOutcomes)) + "---|\n")
	write := func(name, load string, r *runResult, st runStats) {
		fmt.Fprintf(sb, "| %s | %s | %d | %d | %d | %d |", name, load, len(r.arrivals), st.sent, st.waited, st.continued)
		for _, n := range st.outcomes {
			fmt.Fprintf(sb, " %d |", n)
		}
		if r.violations == 0 {
			sb.WriteString(" ok |\n")
		} else {
			fmt.Fprintf(sb, " **%d broken**: %s |\n", r.violations, strings.Join(r.examples, "; "))
		}
	}
	for _, r := range rep.search {
		write("pass-through (search)", fmt.Sprintf("%.3g sessions/s", r.spec.rate), r, r.stats(rep.o, nil))
	}
	for _, rw := range a.rows {
		write(rw.run.spec.config.name, loadText(rw.run.spec.load), rw.run, rw.st)
	}
	var others []string
	for _, rs := range [][]*runResult{rep.search, rep.runs} {
		for _, r := range rs {
			for i := range r.records {
				if rec := &r.records[i]; rec.out == outOther && len(others) < 5 {
					others = append(others, fmt.Sprintf("%s %s: %s", r.spec.config.name, loadText(r.spec.load), rec.detail))
				}
			}
		}
	}
	if len(others) > 0 {
		sb.WriteString("\nOther errors (first " + strconv.Itoa(len(others)) + "): " + strings.Join(others, "; ") + "\n")
	}
	sb.WriteString("\n")
}

func (rep *report) writeCriteria(sb *strings.Builder, a *analysis) {
	cs := a.criteria()
	cost := a.lowLoadCost()
	if len(cs) == 0 && len(cost) == 0 {
		return
	}
	sb.WriteString("## Issue 29's bounds\n\n")
	if len(cs) > 0 {
		sb.WriteString("| configuration | bound | measured | |\n|---|---|---|---|\n")
		for _, c := range cs {
			fmt.Fprintf(sb, "| %s | %s | %s | %s |\n", c.config, c.what, c.value, verdictText(c))
		}
		sb.WriteString("\n")
	}
	for _, line := range cost {
		sb.WriteString("- " + line + "\n")
	}
	sb.WriteString("\n")
}

func verdictText(c criterion) string {
	switch {
	case c.na:
		return "n/a (no data)"
	case c.pass:
		return "pass"
	}
	return "**fail**"
}

func secText(n int, v float64) string {
	if n == 0 {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

func relText(v float64) string {
	switch {
	case v == 0:
		return "–"
	case math.IsInf(v, 1):
		return "∞ (pass-through: 0)"
	}
	return fmt.Sprintf("%.2f×", v)
}

func fairText(rw row, t int) string {
	if !rw.hasFair {
		return "–"
	}
	return fmt.Sprintf("%.3g / %.3g (%.0f %%; %.0f %% of offered)", rw.fair.served[t], min(rw.fair.demand[t], rw.fair.fair[t]), 100*rw.fair.ratio(t),
		100*ratioOr0(rw.st.tenant[t], rw.st.offered[t]))
}

func queueText(st *runStats) string {
	if !st.queueSeen {
		return "–"
	}
	return strconv.FormatFloat(st.queueP99, 'f', 3, 64)
}

func idleText(c cpuIdle) string {
	if c.mean < 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f %% / %.0f %% (own %.0f %%)", 100*c.mean, 100*max(c.min, 0), 100*max(c.own, 0))
}

// csv is one line per run, the search's included (kind search).
func (rep *report) csv(a *analysis) string {
	var sb strings.Builder
	sb.WriteString("kind,config,load,sessions_per_s,span_s,window_s,requests,waited,continued")
	for _, n := range csvNames {
		sb.WriteString("," + n)
	}
	sb.WriteString(",violations,ttft_p50_all,ttft_p50_interactive,ttft_p99_interactive,ttft_p50_batch,ttft_p99_batch,goodput_per_s,goodput_interactive_per_s,goodput_batch_per_s,goodput_vs_pass,hit_rate")
	for _, t := range tenantNames {
		fmt.Fprintf(&sb, ",%s_served_per_s,%s_demand_per_s,%s_fair_per_s,%s_offered_per_s", t, t, t, t)
	}
	sb.WriteString(",queue_wait_p99_s,interactive_at_full_engine,interactive_slowest,interactive_slowest_at_full_engine,interactive_slowest_router_queue_p50_s,interactive_slowest_engine_queue_p50_s")
	sb.WriteString(",idle_cpu_mean,idle_cpu_min,own_cpu,wall_s\n")
	line := func(kind string, r *runResult, st runStats, rw *row) {
		fmt.Fprintf(&sb, "%s,%s,%g,%.4g,%.4g,%.4g,%d,%d,%d", kind, r.spec.config.name, r.spec.load, r.spec.rate, r.spec.span, st.window, st.sent, st.waited, st.continued)
		for _, n := range st.outcomes {
			fmt.Fprintf(&sb, ",%d", n)
		}
		fmt.Fprintf(&sb, ",%d,%.4f,%.4f,%.4f,%.4f,%.4f,%.4g,%.4g,%.4g", r.violations, st.p50All, st.class[0].p50, st.class[0].p99, st.class[1].p50, st.class[1].p99,
			st.goodput, ratioOr0(float64(st.class[0].good), st.window), ratioOr0(float64(st.class[1].good), st.window))
		good, hasFair := 0.0, false
		var f fairness
		if rw != nil {
			good, hasFair, f = rw.goodRel, rw.hasFair, rw.fair
		}
		fmt.Fprintf(&sb, ",%.4g,%.4f", good, st.hit)
		for t := range tenantNames {
			if hasFair {
				fmt.Fprintf(&sb, ",%.4g,%.4g,%.4g,%.4g", f.served[t], f.demand[t], f.fair[t], st.offered[t])
			} else {
				fmt.Fprintf(&sb, ",%.4g,,,%.4g", st.tenant[t], st.offered[t])
			}
		}
		it := &st.class[0]
		fmt.Fprintf(&sb, ",%.4f,%d,%d,%d,%.4f,%.4f", st.queueP99, it.atFull, it.tail.n, it.tail.atFull, it.tail.routerQueue, it.tail.engineQueue)
		fmt.Fprintf(&sb, ",%.3f,%.3f,%.3f,%.1f\n", r.idle.mean, r.idle.min, r.idle.own, r.wall.Seconds())
	}
	for _, r := range rep.search {
		line("search", r, r.stats(rep.o, nil), nil)
	}
	for i := range a.rows {
		rw := &a.rows[i]
		line("run", rw.run, rw.st, rw)
	}
	return sb.String()
}

// writeRecords writes every request of every run as one JSON object per
// line (--records), for analysis beyond the tables.
func (rep *report) writeRecords(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, rs := range [][]*runResult{rep.search, rep.runs} {
		for _, r := range rs {
			for i := range r.records {
				rec := &r.records[i]
				line := map[string]any{
					"config": r.spec.config.name, "load": r.spec.load, "rate": r.spec.rate,
					"session": rec.session, "turn": rec.turn, "tenant": tenantNames[rec.tenant], "class": classNames[rec.class],
					"sent": rec.sent, "outcome": rec.out.String(), "ttft": rec.ttft, "e2e": rec.e2e,
					"prompt": rec.prompt, "cached": rec.cached, "queue_ms": rec.queueMS, "detail": rec.detail, "continued": rec.continued,
				}
				if e := rec.engine; e != nil {
					line["engine_queued_s"], line["engine_running"], line["engine_waiting"], line["engine_slots"] = e.Queued.Seconds(), e.Running, e.Waiting, e.Slots
				}
				err = enc.Encode(line)
				if err != nil {
					f.Close()
					return err
				}
			}
		}
	}
	return f.Close()
}
