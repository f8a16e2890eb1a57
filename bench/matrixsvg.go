package bench

import (
	"fmt"
	"html"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/warmroute/warmroute/route"
)

// matrixColors gives each matrix policy its marker color.
var matrixColors = map[string]string{
	"round_robin": "#1f77b4", "consistent_hash": "#9467bd", PolicySticky: "#2ca02c",
	PolicyRFCRule: "#e377c2", PolicyCacheAware32k: "#17becf", "cache_aware": "#d9822b", PolicyPrecise: "#d62728",
	PolicyOracle: "#555555", PolicyCacheAwareEvents: "#8c564b",
}

// SVG is a dot plot, one row per cell and one marker per policy, in four
// panels: client hit rate, TTFT p50 and p90 relative to the cell's best
// (the oracle excepted), and in-flight load max/mean (dashed: LoadTarget).
func (m *Matrix) SVG() string {
	cells := m.ran()
	const (
		rowH   = 22
		top    = 92
		labelW = 190
		panelW = 220
		gap    = 46
	)
	h := top + rowH*max(len(cells), 1) + 40
	w := labelW + 4*panelW + 3*gap + 30
	// Relative TTFT axis: 1× to the largest ratio, at least 2×, clipped at 4×.
	maxRel := 2.0
	type rel struct{ p50, p90 map[string]float64 }
	rels := make([]rel, len(cells))
	for i, cr := range cells {
		rels[i] = rel{map[string]float64{}, map[string]float64{}}
		sums := cr.Suite.Summaries()
		b50, b90 := 0.0, 0.0
		for _, s := range sums {
			if s.oracle || len(cr.Suite.Runs[s.Policy]) == 0 {
				continue
			}
			if b50 == 0 || s.TTFT50.Mean < b50 {
				b50 = s.TTFT50.Mean
			}
			if b90 == 0 || s.TTFT90.Mean < b90 {
				b90 = s.TTFT90.Mean
			}
		}
		for _, s := range sums {
			if s.oracle || len(cr.Suite.Runs[s.Policy]) == 0 {
				continue
			}
			rels[i].p50[s.Policy] = ratio(s.TTFT50.Mean, b50)
			rels[i].p90[s.Policy] = ratio(s.TTFT90.Mean, b90)
			maxRel = max(maxRel, min(rels[i].p50[s.Policy], 4), min(rels[i].p90[s.Policy], 4))
		}
	}
	maxRel = float64(int(maxRel*2+0.999)) / 2
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	pdTitle := ""
	if m.pd() {
		pdTitle = "; e: 2 prefill + 2 decode (prefill policy's color; hollow: decode least_loaded)"
	}
	title := "Replay matrix"
	if m.Config.Quick {
		title += " (QUICK smoke run: not results)"
	}
	fmt.Fprintf(&sb, `<text x="10" y="20" font-size="14" font-weight="bold">%s — fleet/workload/session ids/in flight; a: equal, b: one slow prefill, c: half the KV cache, d: 8 workers, a quarter%s</text>`+"\n", html.EscapeString(title), pdTitle)
	// Legend.
	x := 10
	for _, p := range []string{"round_robin", "consistent_hash", PolicySticky, PolicyRFCRule, PolicyCacheAware32k, "cache_aware", PolicyCacheAwareEvents, PolicyPrecise, PolicyOracle} {
		marker(&sb, p, float64(x+5), 40)
		fmt.Fprintf(&sb, `<text x="%d" y="44">%s</text>`+"\n", x+14, html.EscapeString(p))
		x += 24 + 7*len(p)
	}
	panels := []struct {
		title    string
		lo, hi   float64
		ticks    []float64
		tickText func(float64) string
		value    func(i int, cr *CellResult, s *Summary) (float64, bool)
		mark     float64 // a dashed reference line (0: none)
	}{
		{"Hit rate (client; fleet e: prefill, %)", 0, 1, []float64{0, 0.25, 0.5, 0.75, 1}, func(v float64) string { return strconv.Itoa(int(100 * v)) },
			func(_ int, _ *CellResult, s *Summary) (float64, bool) { return s.Hit.Mean, true }, 0},
		{"TTFT p50 (× cell's best, clipped)", 1, maxRel, relTicks(maxRel), relText,
			func(i int, _ *CellResult, s *Summary) (float64, bool) { v, ok := rels[i].p50[s.Policy]; return v, ok }, 0},
		{"TTFT p90 (× cell's best, clipped)", 1, maxRel, relTicks(maxRel), relText,
			func(i int, _ *CellResult, s *Summary) (float64, bool) { v, ok := rels[i].p90[s.Policy]; return v, ok }, MatrixTTFTRatio},
		{"In-flight load max/mean", 1, 2, []float64{1, 1.25, 1.5, 1.75, 2}, relText,
			func(_ int, _ *CellResult, s *Summary) (float64, bool) { return s.LoadMaxMean.Mean, !s.oracle }, LoadTarget},
	}
	bottom := top + rowH*len(cells)
	for k, pn := range panels {
		px := labelW + k*(panelW+gap)
		fmt.Fprintf(&sb, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", px, top-14, html.EscapeString(pn.title))
		pos := func(v float64) float64 {
			v = min(max(v, pn.lo), pn.hi)
			return float64(px) + (v-pn.lo)/(pn.hi-pn.lo)*panelW
		}
		for _, t := range pn.ticks {
			fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", pos(t), top-4, pos(t), bottom)
			fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle" fill="#666">%s</text>`+"\n", pos(t), bottom+16, pn.tickText(t))
		}
		if pn.mark > 0 {
			fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#c00" stroke-dasharray="4,3"/>`+"\n", pos(pn.mark), top-4, pos(pn.mark), bottom)
		}
		for i, cr := range cells {
			y := float64(top + i*rowH + rowH/2)
			sums := cr.Suite.Summaries()
			// cache_aware last, on top of the others.
			for pass := 0; pass < 2; pass++ {
				for j := range sums {
					s := &sums[j]
					if (s.Policy == cr.Suite.Reference()) != (pass == 1) || len(cr.Suite.Runs[s.Policy]) == 0 {
						continue
					}
					if v, ok := pn.value(i, cr, s); ok {
						marker(&sb, s.Policy, pos(v), y)
					}
				}
			}
		}
	}
	for i, cr := range cells {
		y := top + i*rowH + rowH/2 + 4
		if i%2 == 1 {
			fmt.Fprintf(&sb, `<rect x="4" y="%d" width="%d" height="%d" fill="#000" fill-opacity="0.03"/>`+"\n", top+i*rowH, w-8, rowH)
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-12, y, html.EscapeString(cr.Cell.Name()))
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}

func relTicks(hi float64) []float64 {
	var t []float64
	step := 0.5
	if hi > 2.5 {
		step = 1
	}
	for v := 1.0; v <= hi+1e-9; v += step {
		t = append(t, v)
	}
	return t
}

func relText(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) + "×" }

// marker draws policy's marker at (x, y): cache_aware larger and outlined,
// the oracle a square. A disaggregated fleet's pair has its prefill
// policy's color, hollow when it decodes by least_loaded.
func marker(sb *strings.Builder, policy string, x, y float64) {
	prefill, decode, pd := SplitPD(policy)
	c := matrixColors[prefill]
	if c == "" {
		c = "#999"
	}
	if pd && decode == route.LeastLoaded {
		fmt.Fprintf(sb, `<circle cx="%.1f" cy="%.1f" r="4.5" fill="white" stroke="%s" stroke-width="1.6"/>`+"\n", x, y, c)
		return
	}
	switch prefill {
	case PolicyOracle:
		fmt.Fprintf(sb, `<rect x="%.1f" y="%.1f" width="8" height="8" fill="%s" fill-opacity="0.8"/>`+"\n", x-4, y-4, c)
	case "cache_aware":
		fmt.Fprintf(sb, `<circle cx="%.1f" cy="%.1f" r="6" fill="%s" stroke="#222" stroke-width="1.2"/>`+"\n", x, y, c)
	default:
		fmt.Fprintf(sb, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s" fill-opacity="0.85"/>`+"\n", x, y, c)
	}
}

// WriteFiles writes dir/base.md, .csv and .svg.
func (m *Matrix) WriteFiles(dir, base string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for ext, body := range map[string]string{".md": m.Markdown(), ".csv": m.CSV(), ".svg": m.SVG()} {
		if err := os.WriteFile(filepath.Join(dir, base+ext), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}
