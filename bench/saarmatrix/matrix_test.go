package saarmatrix

import (
	"strings"
	"testing"
)

func TestSmallMatrix(t *testing.T) {
	p := DefaultParams()
	p.Seeds, p.Sessions, p.Turns = 1, 40, 18
	res := Run(p)
	single, saarT := res.Total("single-turn-v1"), res.Total("saar")
	for _, name := range []string{"saar", "saar-v1", "sticky", "saar-no-drift-reset", "saar-no-idle-reset", "saar-no-economics"} {
		if u := res.Total(name).Unsafe(); u != 0 {
			t.Fatalf("%s: %d unsafe switches", name, u)
		}
	}
	if saarT.Cost >= single.Cost {
		t.Fatalf("SAAR cost %.2f ≥ single-turn-v1 %.2f", saarT.Cost, single.Cost)
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
	// Hard turns mid-session (no topic drift) win upgrades under policy
	// version 2; version 1's fixed hurdle left them on the middle model.
	hi := len(p.Scenarios) - 1
	if p.Scenarios[hi].Name != HardMidSession.Name {
		t.Fatal("hard-midsession is not the last scenario")
	}
	v2, v1 := res.ByScenario["saar"][hi], res.ByScenario["saar-v1"][hi]
	t.Logf("hard-midsession: v2 %d up / %d down, shortfall %.4f; v1 %d up / %d down, shortfall %.4f",
		v2.Upgrades, v2.Downgrades, v2.MeanShortfall(), v1.Upgrades, v1.Downgrades, v1.MeanShortfall())
	if v2.Upgrades < 20 || v2.MeanShortfall() >= v1.MeanShortfall() {
		t.Fatalf("hard-midsession: v2 upgrades %d, shortfall %.4f (v1 %.4f)", v2.Upgrades, v2.MeanShortfall(), v1.MeanShortfall())
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
}

// The frontier of price_sensitivity: 0 unsafe switches at every point,
// cost falls and shortfall rises with the knob.
func TestFrontier(t *testing.T) {
	p := DefaultParams()
	p.Scenarios, p.Seeds, p.Sessions = Scenarios, 1, 20
	pts := Frontier(p, []float64{0, 0.1, 1})
	t.Log("\n" + FrontierTable(pts, 0.1))
	for _, pt := range pts {
		if pt.Unsafe != 0 {
			t.Fatalf("%s: %d unsafe switches", pt.Label, pt.Unsafe)
		}
	}
	if !(pts[1].CostCut < pts[2].CostCut && pts[2].CostCut < pts[3].CostCut) || !(pts[1].Shortfall < pts[3].Shortfall) {
		t.Fatalf("frontier not monotone: %+v", pts)
	}
	if svg := FrontierSVG(pts, 0.1, 1); !strings.Contains(svg, "</svg>") || !strings.Contains(svg, "saar-v1") {
		t.Fatal("svg")
	}
}
