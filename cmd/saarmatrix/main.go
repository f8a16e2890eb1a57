// Command saarmatrix runs the SAAR policy matrix (bench/saarmatrix) and the
// price_sensitivity frontier, and writes bench/results/saar-matrix.{md,csv,svg}
// and saar-frontier.{csv,svg}.
//
//	go run ./cmd/saarmatrix -out bench/results
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/warmroute/warmroute/bench/saarmatrix"
)

func main() {
	p := saarmatrix.DefaultParams()
	out := flag.String("out", "bench/results", "directory for saar-matrix.md, .csv and .svg (empty: stdout only)")
	flag.IntVar(&p.Seeds, "seeds", p.Seeds, "seeds per scenario")
	flag.IntVar(&p.Sessions, "sessions", p.Sessions, "sessions per scenario and seed")
	flag.IntVar(&p.Turns, "turns", p.Turns, "turns per session")
	flag.Float64Var(&p.Lambda, "price-sensitivity", p.Lambda, "price_sensitivity of the policy-v3 rows")
	frontier := flag.Bool("frontier", true, "also run the price_sensitivity frontier over the six scenarios")
	flag.Parse()
	res := saarmatrix.Run(p)
	if *frontier {
		fp := p
		fp.Scenarios = saarmatrix.Scenarios
		res.Frontier = saarmatrix.Frontier(fp, saarmatrix.FrontierLambdas)
		fmt.Print(saarmatrix.FrontierTable(res.Frontier, p.Lambda))
	}
	fmt.Print(res.Table())
	if *out == "" {
		return
	}
	cmdline := "go run ./cmd/saarmatrix " + strings.Join(os.Args[1:], " ")
	if err := res.WriteFiles(*out, strings.TrimSpace(cmdline)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
