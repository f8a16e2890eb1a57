package main

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

// configColors gives each configuration its line color (the new queue in
// the house's cache_aware orange).
var configColors = map[string]string{cfgPass: "#1f77b4", cfgFIFO: "#9467bd", cfgNew: "#d9822b"}

// svg plots TTFT p99 against load, one line per configuration, in two
// panels (interactive, batch) on a log scale; in the interactive panel a
// dashed line marks issue 29's bound for the new queue: 2× its p99 at the
// lowest load.
func (rep *report) svg(a *analysis) string {
	const (
		top, panelW, panelH, left, gap = 74, 360, 260, 70, 80
	)
	w := left + 2*panelW + gap + 30
	h := top + panelH + 56
	lo, hi := math.Inf(1), 0.0
	for _, rw := range a.rows {
		for c := range rw.st.class {
			if v := rw.st.class[c].p99; rw.st.class[c].served > 0 && v > 0 {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if hi == 0 {
		lo, hi = 0.01, 1
	}
	ylo, yhi := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if yhi == ylo {
		yhi++
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	title := "Overload: TTFT p99 against load (× capacity), simulated seconds, log scale"
	if rep.o.quick {
		title += " (QUICK smoke run: not results)"
	}
	fmt.Fprintf(&sb, `<text x="10" y="20" font-size="14" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	x := 10
	for _, c := range rep.configs {
		col := configColors[c.name]
		fmt.Fprintf(&sb, `<line x1="%d" y1="40" x2="%d" y2="40" stroke="%s" stroke-width="2"/><circle cx="%d" cy="40" r="3.5" fill="%s"/>`+"\n", x, x+18, col, x+9, col)
		fmt.Fprintf(&sb, `<text x="%d" y="44">%s</text>`+"\n", x+24, html.EscapeString(c.name))
		x += 40 + 8*len(c.name)
	}
	loads := rep.o.loads
	xlo, xhi := a.lowLoad, a.highLoad
	if xhi == xlo {
		xlo, xhi = xlo-0.5, xhi+0.5
	}
	for c := range classNames {
		px := left + c*(panelW+gap)
		xpos := func(l float64) float64 { return float64(px) + (l-xlo)/(xhi-xlo)*panelW }
		ypos := func(v float64) float64 {
			lv := min(max(math.Log10(v), ylo), yhi)
			return float64(top+panelH) - (lv-ylo)/(yhi-ylo)*panelH
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" font-weight="bold">%s (priority %d)</text>`+"\n", px, top-12, classNames[c], classPriority[c])
		for e := ylo; e <= yhi; e++ {
			y := ypos(math.Pow(10, e))
			fmt.Fprintf(&sb, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", px, y, px+panelW, y)
			fmt.Fprintf(&sb, `<text x="%d" y="%.1f" text-anchor="end" fill="#666">%s</text>`+"\n", px-6, y+4, strconv.FormatFloat(math.Pow(10, e), 'g', -1, 64))
		}
		for _, l := range loads {
			fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", xpos(l), top, xpos(l), top+panelH)
			fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle" fill="#666">%s</text>`+"\n", xpos(l), top+panelH+16, loadText(l))
		}
		if r, ok := a.find(cfgNew, a.lowLoad); ok && c == 0 && r.st.class[0].served > 0 {
			y := ypos(2 * r.st.class[0].p99)
			fmt.Fprintf(&sb, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#c00" stroke-dasharray="4,3"/>`+"\n", px, y, px+panelW, y)
			fmt.Fprintf(&sb, `<text x="%d" y="%.1f" text-anchor="end" fill="#c00">2× new at %s</text>`+"\n", px+panelW-4, y-4, loadText(a.lowLoad))
		}
		for _, cfg := range rep.configs {
			var pts []string
			for _, l := range loads {
				r, ok := a.find(cfg.name, l)
				if !ok || r.st.class[c].served == 0 {
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xpos(l), ypos(r.st.class[c].p99)))
			}
			col := configColors[cfg.name]
			fmt.Fprintf(&sb, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), col)
			for _, p := range pts {
				xy := strings.Split(p, ",")
				fmt.Fprintf(&sb, `<circle cx="%s" cy="%s" r="3.5" fill="%s"/>`+"\n", xy[0], xy[1], col)
			}
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="middle" fill="#555">load (× capacity)</text>`+"\n", px+panelW/2, top+panelH+36)
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}
