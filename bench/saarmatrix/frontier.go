package saarmatrix

import (
	"fmt"
	"strings"
	"sync"

	"github.com/warmroute/warmroute/saar"
)

// FrontierLambdas are the price_sensitivity values of the frontier.
var FrontierLambdas = []float64{0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1, 2}

// Point is one policy on the cost–quality frontier, over the six scenarios
// of issue 14, against single-turn-v1 (policy version 1's selector per
// turn, without memory).
type Point struct {
	Label     string
	Lambda    float64 // price_sensitivity (NaN-free; v1 points: 0)
	V1        bool    // policy version 1 (saar-v1's point)
	CostCut   float64 // % fair cost below single-turn-v1
	Quality   float64 // mean quality_score served
	QDelta    float64 // minus single-turn-v1's
	Shortfall float64 // per turn, against the demand
	Unsafe    int
	Upgrades  int
	Downs     int
	Switches  int
}

// Frontier runs SAAR (policy version 3) at every price_sensitivity of
// lambdas, and saar-v1 (version 1), on p's scenarios (the six of issue 14 by
// default), each against single-turn-v1.
func Frontier(p Params, lambdas []float64) []Point {
	type job struct {
		lambda float64
		ps     PolicySpec
	}
	jobs := []job{{0, PolicySpec{"single-turn-v1", saar.Policy{Version: 1, Mode: saar.ModeSingleTurn}}}, {0, PolicySpec{"saar-v1", saar.Policy{Version: 1}}}}
	for _, l := range lambdas {
		jobs = append(jobs, job{l, PolicySpec{fmt.Sprintf("saar λ=%g", l), saar.Policy{Version: 3}}})
	}
	tot := make([]Stats, len(jobs))
	var wg sync.WaitGroup
	for i := range jobs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for _, s := range runPolicy(ConfigFor(jobs[i].lambda), p, jobs[i].ps) {
				tot[i].add(&s)
			}
		}(i)
	}
	wg.Wait()
	base := &tot[0]
	out := make([]Point, 0, len(jobs)-1)
	for i := 1; i < len(jobs); i++ {
		s := &tot[i]
		out = append(out, Point{Label: jobs[i].ps.Name, Lambda: jobs[i].lambda, V1: i == 1, CostCut: pct(base.Cost, s.Cost),
			Quality: s.MeanQuality(), QDelta: s.MeanQuality() - base.MeanQuality(), Shortfall: s.MeanShortfall(),
			Unsafe: s.Unsafe(), Upgrades: s.Upgrades, Downs: s.Downgrades, Switches: s.Switches})
	}
	return out
}

// FrontierTable renders the frontier in Markdown.
func FrontierTable(pts []Point, def float64) string {
	var sb strings.Builder
	sb.WriteString("| Policy | price_sensitivity | Fair cost cut vs single-turn-v1 | Mean quality | Quality delta | Shortfall / turn | Unsafe | Switches | Upgrades | Downgrades |\n")
	sb.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range pts {
		l, name := fmt.Sprintf("%g", p.Lambda), p.Label
		if p.V1 {
			l = "—"
		} else if p.Lambda == def {
			name += " **(default)**"
		}
		fmt.Fprintf(&sb, "| %s | %s | %.2f%% | %.4f | %+.4f | %.4f | %d | %d | %d | %d |\n",
			name, l, p.CostCut, p.Quality, p.QDelta, p.Shortfall, p.Unsafe, p.Switches, p.Upgrades, p.Downs)
	}
	return sb.String()
}

// FrontierCSV renders the frontier as CSV.
func FrontierCSV(pts []Point) string {
	var sb strings.Builder
	sb.WriteString("policy,version,price_sensitivity,fair_cost_cut_pct,mean_quality,quality_delta,shortfall_per_turn,unsafe_switches,switches,upgrades,downgrades\n")
	for _, p := range pts {
		v := 3
		if p.V1 {
			v = 1
		}
		fmt.Fprintf(&sb, "%s,%d,%g,%.4f,%.6f,%.6f,%.6f,%d,%d,%d,%d\n", p.Label, v, p.Lambda, p.CostCut, p.Quality, p.QDelta, p.Shortfall, p.Unsafe, p.Switches, p.Upgrades, p.Downs)
	}
	return sb.String()
}

// FrontierSVG draws the frontier: fair cost cut (x) against mean quality
// (left panel) and against shortfall per turn (right panel); the knob's
// points joined in order, the default filled, saar-v1 a red square.
func FrontierSVG(pts []Point, def float64, turns int) string {
	const (
		w, h           = 1000, 440
		pw, ph         = 400, 300
		top            = 60
		left1, left2   = 70, 570
		fs             = 11
		lineColor      = "#4C78A8"
		v1Color        = "#E45756"
		defaultColor   = "#F58518"
		gridColor      = "#ddd"
		axisLabelColor = "#333"
	)
	xmin, xmax := 100.0, -100.0
	for _, p := range pts {
		xmin, xmax = min(xmin, p.CostCut), max(xmax, p.CostCut)
	}
	xmin, xmax = 10*float64(int(xmin/10)-1), 10*float64(int(xmax/10)+1)
	if xmax > 100 {
		xmax = 100
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n", w, h, w, h)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&sb, `<text x="%d" y="24" font-size="15" font-weight="bold">SAAR cost–quality frontier of price_sensitivity (%d turns, six scenarios, qwen3-8b / qwen3-32b / frontier-reasoner)</text>`+"\n", left1-40, turns)
	fmt.Fprintf(&sb, `<text x="%d" y="42" font-size="%d" fill="%s">x: fair cost cut vs single-turn-v1 (%%). Blue: policy v3 at each price_sensitivity (label); orange: default %g; red square: today (saar-v1). 0 unsafe switches at every point.</text>`+"\n", left1-40, fs, axisLabelColor, def)
	panel := func(left int, title string, y func(Point) float64, ymin, ymax float64, yfmt string) {
		sx := func(v float64) float64 { return float64(left) + float64(pw)*(v-xmin)/(xmax-xmin) }
		sy := func(v float64) float64 { return float64(top+ph) - float64(ph)*(v-ymin)/(ymax-ymin) }
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", left, top, pw, ph)
		for k := 0; k <= 5; k++ {
			yv := ymin + (ymax-ymin)*float64(k)/5
			fmt.Fprintf(&sb, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/><text x="%d" y="%.1f" font-size="%d" text-anchor="end">`+yfmt+`</text>`+"\n",
				left, sy(yv), left+pw, sy(yv), gridColor, left-4, sy(yv)+4, fs, yv)
			xv := xmin + (xmax-xmin)*float64(k)/5
			fmt.Fprintf(&sb, `<text x="%.1f" y="%d" font-size="%d" text-anchor="middle">%.0f%%</text>`+"\n", sx(xv), top+ph+16, fs, xv)
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" font-size="%d" text-anchor="middle">%s</text>`+"\n", left+pw/2, top+ph+36, fs+1, "fair cost cut vs single-turn-v1")
		fmt.Fprintf(&sb, `<text x="%d" y="%d" font-size="%d" font-weight="bold">%s</text>`+"\n", left, top-6, fs+1, title)
		var path strings.Builder
		for _, p := range pts {
			if p.V1 {
				continue
			}
			if path.Len() == 0 {
				path.WriteString("M")
			} else {
				path.WriteString(" L")
			}
			fmt.Fprintf(&path, "%.1f %.1f", sx(p.CostCut), sy(y(p)))
		}
		fmt.Fprintf(&sb, `<path d="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", path.String(), lineColor)
		for _, p := range pts {
			x, yy := sx(p.CostCut), sy(y(p))
			switch {
			case p.V1:
				fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="9" height="9" fill="%s"/><text x="%.1f" y="%.1f" font-size="%d" fill="%s">saar-v1</text>`+"\n", x-4.5, yy-4.5, v1Color, x+7, yy+12, fs, v1Color)
			case p.Lambda == def:
				fmt.Fprintf(&sb, `<circle cx="%.1f" cy="%.1f" r="6" fill="%s"/><text x="%.1f" y="%.1f" font-size="%d">%g</text>`+"\n", x, yy, defaultColor, x+7, yy-6, fs, p.Lambda)
			default:
				fmt.Fprintf(&sb, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/><text x="%.1f" y="%.1f" font-size="%d" fill="#555">%g</text>`+"\n", x, yy, lineColor, x+5, yy-5, fs-1, p.Lambda)
			}
		}
	}
	qmin, qmax, smax := 1.0, 0.0, 0.0
	for _, p := range pts {
		qmin, qmax, smax = min(qmin, p.Quality), max(qmax, p.Quality), max(smax, p.Shortfall)
	}
	panel(left1, "mean quality (higher is better)", func(p Point) float64 { return p.Quality }, float64(int(qmin*50))/50, float64(int(qmax*50)+1)/50, "%.2f")
	panel(left2, "shortfall per turn (lower is better)", func(p Point) float64 { return p.Shortfall }, 0, float64(int(smax*100)+1)/100, "%.3f")
	sb.WriteString("</svg>\n")
	return sb.String()
}
