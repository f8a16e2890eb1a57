// Command saarmatrix runs the SAAR policy matrix (bench/saarmatrix) and
// writes bench/results/saar-matrix.{md,csv,svg}.
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
	flag.Parse()
	res := saarmatrix.Run(p)
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
