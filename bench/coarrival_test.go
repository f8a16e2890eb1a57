package bench

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestCoArrivals measures where each policy puts new sessions on the
// matrix cell named by BENCH_COARRIVAL (docs/design.md §4 (6)): per session
// started after the first wave, the other requests that reached its worker
// within 10 simulated ms of its first turn, and that turn's mean TTFT; and
// the TTFT p50 / p90 of first turns and of later turns, pooled over the
// seeds. BENCH_COARRIVAL_POLICIES lists the policies (default cache_aware
// and rfc_rule); a policy listed twice is an A/A control.
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
	policies := []string{"cache_aware", PolicyRFCRule}
	if p := os.Getenv("BENCH_COARRIVAL_POLICIES"); p != "" {
		policies = strings.Split(p, ",")
	}
	for _, policy := range policies {
		var first, later []float64
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
				switch {
				case x.Err != "":
					continue
				case x.Turn == 0:
					first = append(first, x.TTFT)
				default:
					later = append(later, x.TTFT)
				}
				if x.Turn != 0 || x.Session < cell.Concurrency {
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
		all := append(slices.Clone(first), later...)
		t.Logf("%-12s TTFT p50 / p90: every turn %.3f / %.3f, first turns %.3f / %.3f (%d), later turns %.3f / %.3f",
			policy, Percentile(all, 50), Percentile(all, 90), Percentile(first, 50), Percentile(first, 90), len(first), Percentile(later, 50), Percentile(later, 90))
		t.Logf("%-12s %.0f new sessions: %.1f other requests within 10 ms on their worker; first-turn TTFT mean %.3f s", policy, n, co/n, ttft/n)
	}
}
