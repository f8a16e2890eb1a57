// Command plot turns the output of the bench/scale benchmarks (go test
// -bench, any -count) into an SVG of the scale curves and a Markdown table:
//
//	go test -run '^$' -bench . -benchmem -count 3 ./bench/scale | tee /tmp/scale.txt
//	go run ./bench/scale/plot -in /tmp/scale.txt -svg bench/results/scale.svg -md bench/results/scale.md
//
// Each benchmark family Benchmark<Family>/<param>=<value> is one curve; with
// -count > 1 the median of each metric is used. The standard library only.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// panel is one plotted curve: family, the metric on y, a scale and a label.
type panel struct {
	family, unit string
	scale        float64
	ylabel       string
	target       float64 // a horizontal goal line (0: none), in plotted units
	tlabel       string
}

var panels = []panel{
	{"SessionHit", "ns/op", 1, "session-hit decision, ns", 1000, "docs/design.md §7: < 1 µs"},
	{"WorkersHit", "ns/op", 1, "session-hit decision, ns", 1000, "docs/design.md §7: < 1 µs"},
	{"History", "ns/op", 1e-3, "Parse + radix Match, µs", 0, ""},
	{"History", "MB/s", 1e-3, "Parse + radix Match, GB/s", 10, "docs/design.md §7: ≥ 10 GB/s"},
	{"SessionHit", "heapMB/100k", 1, "heap MB per 100k sessions", 0, ""},
	{"RadixMemory", "heapB/char", 1, "radix heap bytes per stored char", 2, "docs/design.md §7: ≤ 2"},
}

var lineRe = regexp.MustCompile(`^Benchmark([A-Za-z0-9_]+)/([A-Za-z_]+)=([0-9]+)(?:-[0-9]+)?\s+[0-9]+\s+(.*)$`)

type series struct {
	param  string
	xs     []float64
	values map[float64]map[string][]float64 // x -> unit -> samples
}

func parse(r io.Reader) (map[string]*series, []string, []string) {
	out := map[string]*series{}
	var order, header []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "goos:") || strings.HasPrefix(line, "goarch:") || strings.HasPrefix(line, "cpu:") || strings.HasPrefix(line, "pkg:") {
			if !slices.Contains(header, line) {
				header = append(header, line)
			}
			continue
		}
		m := lineRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		x, _ := strconv.ParseFloat(m[3], 64)
		s := out[m[1]]
		if s == nil {
			s = &series{param: m[2], values: map[float64]map[string][]float64{}}
			out[m[1]] = s
			order = append(order, m[1])
		}
		if s.values[x] == nil {
			s.values[x] = map[string][]float64{}
			s.xs = append(s.xs, x)
		}
		f := strings.Fields(m[4])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			s.values[x][f[i+1]] = append(s.values[x][f[i+1]], v)
		}
	}
	for _, s := range out {
		sort.Float64s(s.xs)
	}
	return out, order, header
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	v = slices.Clone(v)
	sort.Float64s(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func human(x float64) string {
	switch {
	case x >= 1<<20 && math.Mod(x, 1<<20) == 0:
		return fmt.Sprintf("%.0fM", x/(1<<20))
	case x >= 1e6 && math.Mod(x, 1e6) == 0:
		return fmt.Sprintf("%.0fM", x/1e6)
	case x >= 1<<10 && math.Mod(x, 1<<10) == 0:
		return fmt.Sprintf("%.0fK", x/(1<<10))
	case x >= 1e3 && math.Mod(x, 1e3) == 0:
		return fmt.Sprintf("%.0fk", x/1e3)
	}
	return strconv.FormatFloat(x, 'g', 4, 64)
}

func svg(w io.Writer, data map[string]*series) {
	const cols, pw, ph, mx, my = 3, 320, 240, 58, 44
	rows := (len(panels) + cols - 1) / cols
	W, H := cols*pw, rows*ph+30
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", W, H)
	fmt.Fprintf(w, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="18" font-size="14" text-anchor="middle">warmroute scale curves (bench/scale, medians)</text>`+"\n", W/2)
	for i, p := range panels {
		ox, oy := (i%cols)*pw, 30+(i/cols)*ph
		s := data[p.family]
		fmt.Fprintf(w, `<text x="%d" y="%d" font-size="12" text-anchor="middle">%s</text>`+"\n", ox+pw/2, oy+14, p.ylabel)
		if s == nil || len(s.xs) == 0 {
			fmt.Fprintf(w, `<text x="%d" y="%d" text-anchor="middle">no data</text>`+"\n", ox+pw/2, oy+ph/2)
			continue
		}
		var ys []float64
		ymax := p.target * 1.15
		for _, x := range s.xs {
			y := median(s.values[x][p.unit]) * p.scale
			ys = append(ys, y)
			if !math.IsNaN(y) {
				ymax = math.Max(ymax, y*1.15)
			}
		}
		if ymax <= 0 {
			ymax = 1
		}
		x0, x1 := math.Log(s.xs[0]), math.Log(s.xs[len(s.xs)-1])
		if x1 == x0 {
			x1 = x0 + 1
		}
		left, right, top, bottom := float64(ox+mx), float64(ox+pw-14), float64(oy+24), float64(oy+ph-my)
		px := func(x float64) float64 { return left + (math.Log(x)-x0)/(x1-x0)*(right-left) }
		py := func(y float64) float64 { return bottom - y/ymax*(bottom-top) }
		fmt.Fprintf(w, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", left, top, right-left, bottom-top)
		for k := 0; k <= 4; k++ {
			y := ymax * float64(k) / 4
			fmt.Fprintf(w, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
				left, right, py(y), py(y), left-4, py(y)+4, strconv.FormatFloat(y, 'g', 3, 64))
		}
		for _, x := range s.xs {
			fmt.Fprintf(w, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n", px(x), bottom+14, human(x))
		}
		fmt.Fprintf(w, `<text x="%.0f" y="%.0f" text-anchor="middle" fill="#555">%s (log)</text>`+"\n", (left+right)/2, bottom+30, s.param)
		if p.target > 0 {
			fmt.Fprintf(w, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#c33" stroke-dasharray="4 3"/><text x="%.0f" y="%.1f" fill="#c33" text-anchor="end">%s</text>`+"\n",
				left, right, py(p.target), py(p.target), right-2, py(p.target)-3, p.tlabel)
		}
		var pts []string
		for j, x := range s.xs {
			if !math.IsNaN(ys[j]) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(x), py(ys[j])))
			}
		}
		fmt.Fprintf(w, `<polyline points="%s" fill="none" stroke="#1f6feb" stroke-width="2"/>`+"\n", strings.Join(pts, " "))
		for _, pt := range pts {
			xy := strings.Split(pt, ",")
			fmt.Fprintf(w, `<circle cx="%s" cy="%s" r="3" fill="#1f6feb"/>`+"\n", xy[0], xy[1])
		}
	}
	fmt.Fprintln(w, `</svg>`)
}

func markdown(w io.Writer, data map[string]*series, order, header []string, cmd string) {
	fmt.Fprintf(w, "# Scale curves\n\nProduced by `%s` (medians over -count runs). Plot: [scale.svg](scale.svg).\n\n", cmd)
	if len(header) > 0 {
		fmt.Fprintf(w, "```\n%s\n```\n\n", strings.Join(header, "\n"))
	}
	for _, fam := range order {
		s := data[fam]
		var units []string
		for _, x := range s.xs {
			for u := range s.values[x] {
				if !slices.Contains(units, u) {
					units = append(units, u)
				}
			}
		}
		sort.Strings(units)
		fmt.Fprintf(w, "## %s\n\n| %s | %s |\n|---:|%s\n", fam, s.param, strings.Join(units, " | "), strings.Repeat("---:|", len(units)))
		for _, x := range s.xs {
			var cells []string
			for _, u := range units {
				cells = append(cells, strconv.FormatFloat(median(s.values[x][u]), 'g', 4, 64))
			}
			fmt.Fprintf(w, "| %s | %s |\n", human(x), strings.Join(cells, " | "))
		}
		fmt.Fprintln(w)
	}
}

func main() {
	in := flag.String("in", "-", "go test -bench output (- for stdin)")
	svgOut := flag.String("svg", "bench/results/scale.svg", "SVG output")
	mdOut := flag.String("md", "bench/results/scale.md", "Markdown output (empty: none)")
	cmd := flag.String("cmd", "go test -run '^$' -bench . -benchmem -count 3 ./bench/scale", "command to cite in the Markdown")
	notes := flag.String("notes", "", "file whose text is appended to the Markdown")
	flag.Parse()
	r := io.Reader(os.Stdin)
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			fail(err)
		}
		defer f.Close()
		r = f
	}
	data, order, header := parse(r)
	if len(data) == 0 {
		fail(fmt.Errorf("no Benchmark<Family>/<param>=<n> lines in the input"))
	}
	f, err := os.Create(*svgOut)
	if err != nil {
		fail(err)
	}
	svg(f, data)
	if err := f.Close(); err != nil {
		fail(err)
	}
	if *mdOut != "" {
		f, err := os.Create(*mdOut)
		if err != nil {
			fail(err)
		}
		markdown(f, data, order, header, *cmd)
		if *notes != "" {
			b, err := os.ReadFile(*notes)
			if err != nil {
				fail(err)
			}
			f.Write(b) //nolint:errcheck
		}
		if err := f.Close(); err != nil {
			fail(err)
		}
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "plot:", err)
	os.Exit(1)
}
