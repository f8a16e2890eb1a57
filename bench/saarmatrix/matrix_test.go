package saarmatrix

import (
	"strings"
	"testing"
)

func TestSmallMatrix(t *testing.T) {
	p := DefaultParams()
	p.Seeds, p.Sessions, p.Turns = 1, 40, 18
	res := Run(p)
	single, saarT := res.Total("single-turn"), res.Total("saar")
	if saarT.Unsafe() != 0 {
		t.Fatalf("SAAR unsafe switches %d", saarT.Unsafe())
	}
	if saarT.Switches >= single.Switches {
		t.Fatalf("SAAR switches %d ≥ single-turn %d", saarT.Switches, single.Switches)
	}
	for _, s := range res.Totals {
		if s.Violations != 0 {
			t.Fatalf("%s: %d continuity violations", s.Policy, s.Violations)
		}
	}
	t.Log("\n" + res.Table())
	if res.Total("saar-no-tool-lock").UnsafeTool == 0 {
		t.Fatal("ablating the tool lock should cost unsafe tool-loop switches")
	}
	if single.Unsafe() == 0 {
		t.Fatal("single-turn should switch unsafely")
	}
	// Deterministic: a second run gives the same totals.
	again := Run(p)
	for i := range res.Totals {
		if res.Totals[i] != again.Totals[i] {
			t.Fatalf("nondeterministic: %+v vs %+v", res.Totals[i], again.Totals[i])
		}
	}
	md := res.Markdown("go test")
	if !strings.Contains(md, "| saar |") || !strings.Contains(res.SVG(), "</svg>") || strings.Count(res.CSV(), "\n") != 1+len(res.Totals)*(1+len(p.Scenarios)) {
		t.Fatal("report")
	}
	t.Log("\n" + res.Table())
}
