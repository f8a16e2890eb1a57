package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// ignoreClient drops the load generator's samples from the allocation,
// mutex and block profiles (which carry no goroutine labels): every client
// stack runs under generator.agent or generator.phase.
const ignoreClient = `main\.\(\*generator\)`

// pprofTool runs go tool pprof with args and returns its output.
func pprofTool(args ...string) (string, error) {
	cmd := exec.Command("go", append([]string{"tool", "pprof"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

var totalRe = regexp.MustCompile(`accounting for ([0-9.]+)([a-zA-Zµ]*),`)

// total parses the "Showing nodes accounting for X" of a -top header (the
// filtered total when every node is shown), scaled by its unit.
func total(top string) float64 {
	m := totalRe.FindStringSubmatch(top)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	mul := map[string]float64{"": 1, "B": 1, "kB": 1e3, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40,
		"k": 1e3, "M": 1e6, "G": 1e9, "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "mins": 60, "hrs": 3600}[m[2]]
	if mul == 0 {
		mul = 1
	}
	return v * mul
}

// trimTop keeps a -top output from its header line on, at most n rows.
func trimTop(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	start := 0
	for i, l := range lines {
		if strings.HasPrefix(l, "Showing nodes") || strings.HasPrefix(strings.TrimSpace(l), "flat") {
			start = i
			break
		}
	}
	lines = lines[start:]
	if len(lines) > n+2 {
		lines = lines[:n+2]
	}
	return strings.Join(lines, "\n")
}

// trimPeek keeps a -peek output from its table on.
func trimPeek(s string) string {
	if i := strings.Index(s, "-----"); i >= 0 {
		s = s[i:]
	}
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func writeSummary(o options, client, routed result) error {
	dir := o.out
	cpu := filepath.Join(dir, "cpu.pprof")
	allocs := filepath.Join(dir, "allocs.pprof")
	mutex := filepath.Join(dir, "mutex.pprof")
	block := filepath.Join(dir, "block.pprof")
	run := func(args ...string) string {
		out, err := pprofTool(args...)
		if err != nil {
			return "(go tool pprof failed: " + err.Error() + ")\n" + out
		}
		return out
	}
	tags := run("-tags", cpu)
	routerTop := run("-top", "-nodecount=25", "-tagfocus=role=router", cpu)
	routerCum := run("-top", "-cum", "-nodecount=30", "-tagfocus=role=router", `-focus=warmroute/warmroute/`, cpu)
	allocObj := run("-top", "-nodecount=20", "-sample_index=alloc_objects", "-ignore="+ignoreClient, allocs)
	allocSpace := run("-top", "-nodecount=15", "-sample_index=alloc_space", "-unit=B", "-ignore="+ignoreClient, allocs)
	mutexTop := run("-top", "-nodecount=15", "-ignore="+ignoreClient, mutex)
	mutexPeek := run("-peek", `sync\.\(\*Mutex\)\.Unlock|sync\.\(\*RWMutex\)\.R?Unlock`, "-ignore="+ignoreClient, mutex)
	blockTop := run("-top", "-nodecount=12", "-ignore="+ignoreClient+"|tcpAddrsClean", block)

	all := []string{"-top", "-nodecount=1000000", "-nodefraction=0", "-edgefraction=0"}
	routerCPU := total(run(append(all, "-tagfocus=role=router", cpu)...)) // seconds of CPU in role=router samples
	profObjs := total(run(append(all, "-sample_index=alloc_objects", "-ignore="+ignoreClient, allocs)...))
	profBytes := total(run(append(all, "-sample_index=alloc_space", "-unit=B", "-ignore="+ignoreClient, allocs)...))
	req := float64(max(routed.requests, 1))

	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Profile summary (`make profile`)\n\n")
	w("Produced by `go run ./bench/profile --duration %v --out %s` on %s (%s/%s, %d CPUs, %s).\n",
		o.duration, o.out, time.Now().UTC().Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	w("Load: %d concurrent agent sessions (one connection each) on /v1/chat/completions with X-Session-ID; a shared 6 KB system prompt + 3 tool schemas,\n", o.sessions)
	w("then turns of ~%d B (user text, assistant tool call, tool result with escaped JSON, assistant reply); a session ends at %d B and a new one starts;\n", o.turn, o.history)
	w("%.0f%% of requests stream (SSE). Router: policy %s over %d zero-latency simulated workers (simworker TimeScale 0, in a child process).\n\n",
		o.stream*100, o.policy, o.workers)
	w("The raw profiles (gitignored) are in `%s/`: `cpu.pprof`, `allocs.pprof`, `mutex.pprof`, `block.pprof`. Flame graph:\n\n", dir)
	w("    go tool pprof -http=:8081 -tagfocus=role=router %s/cpu.pprof      # router goroutines only\n", dir)
	w("    go tool pprof -http=:8081 %s/cpu.pprof                            # router + load generator\n", dir)
	w("    go tool pprof -http=:8081 -sample_index=alloc_objects -ignore='%s' %s/allocs.pprof\n\n", ignoreClient, dir)

	w("## Numbers\n\n")
	w("| measure | value |\n|---|---:|\n")
	w("| requests routed (measured run) | %d in %v (%.0f req/s, %d errors) |\n", routed.requests, routed.elapsed.Round(time.Millisecond), routed.rps(), routed.errors)
	w("| router CPU per request (role=router samples ÷ requests) | %.1f µs |\n", routerCPU*1e6/req)
	w("| allocations per request, router (allocs.pprof, sampled 1/%d B, load-generator stacks ignored) | %.2f |\n", o.memRate, profObjs/req)
	w("| bytes allocated per request, router (allocs.pprof) | %.0f B |\n", profBytes/req)
	w("| cross-check: allocations per request, whole process (MemStats) minus the load generator's %.1f measured alone; noisy | %.1f |\n",
		client.allocsPerReq(), routed.allocsPerReq()-client.allocsPerReq())
	w("| cross-check: bytes per request, whole process minus the load generator's %.0f B; noisy | %.0f B |\n\n",
		client.bytesPerReq(), routed.bytesPerReq()-client.bytesPerReq())

	w("## CPU by goroutine role\n\n```\n%s\n```\n\n", strings.TrimSpace(tags))
	w("## Top functions by CPU (router goroutines, flat)\n\n```\n%s\n```\n\n", trimTop(routerTop, 25))
	w("## warmroute functions by cumulative CPU (router goroutines)\n\n```\n%s\n```\n\n", trimTop(routerCum, 30))
	w("## Allocation sites (objects; router)\n\n```\n%s\n```\n\n", trimTop(allocObj, 20))
	w("## Allocation sites (bytes; router)\n\n```\n%s\n```\n\n", trimTop(allocSpace, 15))
	w("## Mutex contention (delay; fraction 1/%d)\n\n```\n%s\n```\n\n", o.mutexFraction, trimTop(mutexTop, 15))
	w("## Who holds the contended mutexes (callers of Unlock)\n\n```\n%s\n```\n\n", trimPeek(mutexPeek))
	w("## Blocking (delay; rate %d ns)\n\n```\n%s\n```\n", o.blockRate, trimTop(blockTop, 12))
	path := filepath.Join(dir, "SUMMARY.md")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wrote", path)
	return nil
}
