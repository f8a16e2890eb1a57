// Command chaos attacks the real warmroute binary, run as a subprocess on
// loopback, with hostile clients and broken workers, and writes a table of
// what held (bench/results/chaos.md). With --soak it runs mixed agent
// traffic under scheduled faults instead (bench/results/soak.md).
//
//	go run ./bench/chaos [--only REGEX] [--out DIR]      # make chaos
//	go run ./bench/chaos --soak 10m [--out DIR]          # make soak (SOAK=2m)
//
// Each probe (probes.go) is a small function that starts its own router
// (`go build -o $TMPDIR/.../warmroute ./cmd/warmroute`, then exec) with
// in-process simulated workers (package simworker) and/or purpose-built
// raw-TCP bad workers (workers.go), attacks it, and records problems (FAIL)
// and the client-visible failures the attack makes unavoidable (each with a
// note). After every probe the runner checks the router is alive and that
// its load counter is back to 0, and reads RSS (/proc/PID/status VmRSS) and
// goroutines (go_goroutines on its /metrics). Everything is bounded: each
// probe by count and by a time limit, the whole run by --max.
//
// Exit status: 0 when every probe passes (or the soak verdict is good), 1
// otherwise, 2 on a harness error.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/warmroute/warmroute/bench"
)

func main() {
	only := flag.String("only", "", "run only the probes whose name matches this regexp")
	out := flag.String("out", "bench/results", "directory for chaos.md / soak.md")
	soak := flag.Duration("soak", 0, "run the soak (mixed agent traffic with scheduled faults) for this long instead of the probes")
	prebuilt := flag.String("bin", "", "use this router binary instead of building ./cmd/warmroute (e.g. one built from another revision)")
	maxDur := flag.Duration("max", 8*time.Minute, "no probe starts after this (each is bounded by 2 min, so the run ends within --max + 2 min); later probes are reported as skipped")
	flag.Parse()

	tmp, err := os.MkdirTemp("", "warmroute-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	defer os.RemoveAll(tmp)
	bin := *prebuilt
	if bin == "" {
		bin, err = bench.BuildRouter(tmp)
	} else {
		binNote = "prebuilt binary " + bin + " (--bin), not the tree's ./cmd/warmroute"
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	if *soak > 0 {
		good, err := runSoak(bin, *soak, filepath.Join(*out, "soak.md"), os.Stderr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			os.Exit(2)
		}
		if !good {
			os.Exit(1)
		}
		return
	}
	var re *regexp.Regexp
	if *only != "" {
		if re, err = regexp.Compile(*only); err != nil {
			fmt.Fprintln(os.Stderr, "chaos: --only:", err)
			os.Exit(2)
		}
	}
	t0 := time.Now()
	var rows []row
	for _, p := range probes {
		if re != nil && !re.MatchString(p.name) {
			continue
		}
		if time.Since(t0) > *maxDur {
			rows = append(rows, row{name: p.name, what: p.what, reason: "skipped: --max reached", loadAfter: -1})
			continue
		}
		rw := runProbe(bin, p, 2*time.Minute)
		status := "PASS"
		if !rw.pass {
			status = "FAIL"
		}
		fmt.Fprintf(os.Stderr, "%-26s %s %6.1fs  %s\n", p.name, status, rw.dur.Seconds(), clip(rw.reason, 200))
		if rw.note != "" {
			fmt.Fprintf(os.Stderr, "%-26s %s\n", "", rw.note)
		}
		rows = append(rows, rw)
	}
	cmdline := "go run ./bench/chaos " + strings.Join(os.Args[1:], " ")
	path := filepath.Join(*out, "chaos.md")
	if err := os.WriteFile(path, []byte(chaosReport(rows, cmdline, time.Since(t0))), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	failed := 0
	for _, r := range rows {
		if !r.pass {
			failed++
		}
	}
	fmt.Fprintf(os.Stderr, "chaos: %d/%d probes pass in %s -> %s\n", len(rows)-failed, len(rows), time.Since(t0).Round(time.Second), path)
	if failed > 0 {
		os.Exit(1)
	}
}

// binNote is set when --bin names a prebuilt router binary.
var binNote string

// header is the report header shared by chaos.md and soak.md.
func header(title, cmdline string) string {
	commit := "unknown"
	if binNote != "" {
		return fmt.Sprintf("# %s\n\n- command: `%s`\n- date: %s\n- machine: %d CPUs (nproc), %s/%s, %s\n- router: %s\n",
			title, cmdline, time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), binNote)
	}
	if root, err := bench.RepoRoot(); err == nil {
		if b, err := exec.Command("git", "-C", root, "rev-parse", "--short", "HEAD").Output(); err == nil {
			commit = strings.TrimSpace(string(b))
		}
		if b, err := exec.Command("git", "-C", root, "status", "--porcelain", "--", "cmd", "fastproxy", "loadview", "route").Output(); err == nil && len(b) > 0 {
			commit += " (+ uncommitted changes in the router's packages)"
		}
	}
	return fmt.Sprintf("# %s\n\n- command: `%s`\n- date: %s\n- machine: %d CPUs (nproc), %s/%s, %s\n- router commit: %s\n",
		title, cmdline, time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), commit)
}

func kbMB(kb int) string {
	if kb < 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", float64(kb)/1024)
}

func num(n int) string {
	if n < 0 {
		return "–"
	}
	return fmt.Sprint(n)
}

// mdCell makes s safe inside a markdown table cell.
func mdCell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

func chaosReport(rows []row, cmdline string, took time.Duration) string {
	var b strings.Builder
	b.WriteString(header("Chaos probes against the warmroute binary", cmdline))
	pass := 0
	for _, r := range rows {
		if r.pass {
			pass++
		}
	}
	fmt.Fprintf(&b, "- result: **%d/%d probes pass** in %s\n- /metrics checker: %s\n\n", pass, len(rows), took.Round(time.Second), promChecker)
	b.WriteString("Each probe starts its own router subprocess (loopback, fresh ports) with its own workers. " +
		"\"Client-visible failures\" counts every answer that was not a success, each group explained; anything the contract " +
		"does not allow is a FAIL reason instead. Load after = sum of `load` in `GET /workers` on the metrics listener " +
		"(else `vllm_router_running_requests`), read after the probe (up to 3 s to settle); it must be 0. " +
		"RSS from /proc/PID/status VmRSS, goroutines from `go_goroutines`, both taken when the router is up and after the probe.\n\n")
	b.WriteString("| probe | attack / contract | requests sent | client-visible failures | verdict | load after | RSS MB before→after | goroutines before→after | time |\n")
	b.WriteString("|---|---|---:|---|---|---:|---|---|---:|\n")
	for _, r := range rows {
		verdict := "**PASS**"
		if !r.pass {
			verdict = "**FAIL**: " + mdCell(clip(r.reason, 600))
		}
		if r.note != "" {
			verdict += " (" + mdCell(r.note) + ")"
		}
		note := fmt.Sprint(r.failures)
		if r.failNote != "" {
			note += ": " + mdCell(r.failNote)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s→%s | %s→%s | %.1f s |\n", r.name, mdCell(r.what), r.sent, note, verdict,
			num(r.loadAfter), kbMB(r.rssBefore), kbMB(r.rssAfter), num(r.gorBefore), num(r.gorAfter), r.dur.Seconds())
	}
	b.WriteString("\nA FAIL whose reason starts with \"router exited at start\" means the router rejected a flag of the " +
		"hardening contract it does not have yet; the probe itself then did not run.\n")
	return b.String()
}
