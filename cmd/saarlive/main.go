// Command saarlive runs the SAAR live check (bench/saarlive) and writes its
// report to bench/results/saar-live.md; exit 1 when the check fails.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warmroute/warmroute/bench/saarlive"
)

func main() {
	var o saarlive.Options
	flag.IntVar(&o.Sessions, "sessions", 60, "concurrent agent sessions")
	flag.IntVar(&o.Turns, "turns", 30, "turns per session before the outage")
	flag.IntVar(&o.OutageTurns, "outage-turns", 6, "turns per session during the outage")
	flag.Int64Var(&o.Seed, "seed", 1, "seed")
	out := flag.String("out", "bench/results", "directory for saar-live.md (empty: stdout only)")
	flag.Parse()
	start := time.Now()
	rep, err := saarlive.Run(context.Background(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "saarlive:", err)
		os.Exit(2)
	}
	verdict := "PASSED"
	if !rep.Passed() {
		verdict = "FAILED"
	}
	text := fmt.Sprintf("# SAAR live check\n\n`go run ./cmd/saarlive %s` (%s, %.1f s)\n\n%s\n**%s**: 0 continuity violations and 0 unsafe switches required, every affected session must complete a later turn, ≥ 2,000 requests.\n",
		strings.Join(os.Args[1:], " "), time.Now().UTC().Format("2006-01-02"), time.Since(start).Seconds(), rep.String(), verdict)
	fmt.Print(text)
	if *out != "" {
		if err := os.WriteFile(filepath.Join(*out, "saar-live.md"), []byte(text), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "saarlive:", err)
			os.Exit(2)
		}
	}
	if !rep.Passed() {
		os.Exit(1)
	}
}
