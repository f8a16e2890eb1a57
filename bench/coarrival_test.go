package bench

import (
	"context"
	"os"
	"testing"
)

// TestCoArrivals measures where each policy puts new sessions on the
// matrix cell named by BENCH_COARRIVAL (docs/design.md §4 (6)): per session
// started after the first wave, the other requests that reached its worker
// within 10 simulated ms of its first turn, and that turn's mean TTFT.
//
//	BENCH_COARRIVAL=a/synthetic/header/64 go test -run CoArrivals -v ./bench
func TestCoArrivals(t *testing.T) {
	name := os.Getenv("BENCH_COARRIVAL")
	if name == "" {
		t.Skip("set BENCH_COARRIVAL to a matrix cell name")
	}
	var cell *MatrixCell
	for _, c := range MatrixCells(false) {
		if c.Name() == name {
			cell = &c
		}
	}
	if cell == nil {
		t.Fatalf("no matrix cell %q", name)
	}
	cfg := MatrixConfig{TraceDir: "../../shared/traces"}
	cfg.setDefaults()
	for _, policy := range []string{"cache_aware", PolicyRFCRule} {
		var co, ttft, n float64
		for seed := uint64(1); seed <= 4; seed++ {
			wl, err := LoadMatrixWorkload(*cell, cfg.TraceDir, cfg.MaxTokens, seed)
			if err != nil {
				t.Skip(err)
			}
			opt := cellOptions(&cfg, *cell, wl)
			opt.KeepTurns = true
			r, err := Run(context.Background(), opt, wl, policy, seed)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range r.Turns {
				if x.Turn != 0 || x.Session < cell.Concurrency || x.Err != "" {
					continue
				}
				n++
				ttft += x.TTFT
				for _, y := range r.Turns {
					if y.Worker == x.Worker && (y.Session != x.Session || y.Turn != 0) && y.Sent > x.Sent-0.01 && y.Sent < x.Sent+0.01 {
						co++
					}
				}
			}
		}
		t.Logf("%-12s %.0f new sessions: %.1f other requests within 10 ms on their worker; first-turn TTFT mean %.3f s", policy, n, co/n, ttft/n)
	}
}
