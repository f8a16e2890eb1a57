package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/warmroute/warmroute/bench"
)

// report is everything one benchmark run found.
type report struct {
	o         *options
	started   time.Time
	wall      time.Duration
	machine   bench.Machine
	bin       *binary
	tmp       string // the run's temporary directory (the keys file), shown as $TMP
	built     bool   // bin was built from this tree's ./cmd/warmroute
	configs   []routerConfig
	skipped   []string
	pools     []*pool
	poolNotes []string
	capacity  float64 // sessions per simulated second
	searched  bool    // capacity came from the search (else --capacity or --quick)
	search    []*runResult
	runs      []*runResult
}

// run measures: build or take the binary, search the capacity, run every
// configuration at every load. Progress goes to log.
func run(o *options, log io.Writer) (*report, error) {
	rep := &report{o: o, started: time.Now(), machine: bench.HostMachine()}
	tmp, err := os.MkdirTemp("", "warmroute-overload-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	rep.tmp = tmp
	path := o.bin
	if path == "" {
		if path, err = bench.BuildRouter(tmp); err != nil {
			return nil, err
		}
		rep.built = true
	}
	if rep.bin, err = inspect(path); err != nil {
		return nil, err
	}
	if rep.pools, rep.poolNotes, err = loadPools(o.traceDir, o.synthetic, o.seed); err != nil {
		return nil, err
	}
	if err := checkPools(rep.pools); err != nil {
		return nil, err
	}
	common, err := commonArgs(rep.bin, o, tmp)
	if err != nil {
		return nil, err
	}
	rep.configs, rep.skipped = configurations(rep.bin, o.configs, o, common)
	for _, s := range rep.skipped {
		fmt.Fprintln(log, "bench-overload: skipped", s)
	}
	pass, ok := findConfig(rep.configs, cfgPass)
	if !ok {
		return nil, errors.New("pass-through must run: it measures the capacity and is every comparison's baseline")
	}
	p := newProgress(log, len(o.loads)*len(rep.configs))
	rep.capacity = o.capacity
	if rep.capacity <= 0 {
		rep.searched = true
		if rep.capacity, rep.search, err = searchCapacity(o, rep.bin, pass, rep.pools, p); err != nil {
			return nil, err
		}
	}
	span := o.span(o.duration)
	for li, load := range o.loads {
		for ci, cfg := range rep.configs {
			spec := runSpec{config: cfg, load: load, rate: load * rep.capacity, span: span}
			res, err := execute(o, rep.bin, spec, rep.pools, fmt.Sprintf("r%d%d", li, ci), p)
			if err != nil {
				return nil, fmt.Errorf("%s at %.2g×: %w", cfg.name, load, err)
			}
			rep.runs = append(rep.runs, res)
			p.done(res)
		}
	}
	rep.wall = time.Since(rep.started)
	return rep, nil
}

func findConfig(cs []routerConfig, name string) (routerConfig, bool) {
	for _, c := range cs {
		if c.name == name {
			return c, true
		}
	}
	return routerConfig{}, false
}

// checkPools makes sure every pool session can be personalized (its first
// message has string content), so a run cannot fail half way.
func checkPools(pools []*pool) error {
	for _, p := range pools {
		for i := range p.sessions {
			if _, err := personalize(&p.sessions[i], "check"); err != nil {
				return fmt.Errorf("%s session %d: %w", p.name, i, err)
			}
		}
	}
	return nil
}

// maxDoublings bounds the doubling search: 2^8 × the light rate.
const maxDoublings = 8

// searchCapacity finds the session arrival rate at which pass-through's
// TTFT p50 (every request served in the measured window) reaches twice its
// value at o.lightRate: doubling the rate until it does, o.bisect
// geometric bisections, then linear interpolation of the p50 between the
// last rate below and the first above.
func searchCapacity(o *options, bin *binary, pass routerConfig, pools []*pool, p *progress) (float64, []*runResult, error) {
	var steps []*runResult
	span := o.span(o.searchDuration)
	measure := func(rate float64) (float64, error) {
		res, err := execute(o, bin, runSpec{config: pass, rate: rate, span: span}, pools, fmt.Sprintf("s%d", len(steps)), p)
		if err != nil {
			return 0, err
		}
		steps = append(steps, res)
		p.done(res)
		st := res.stats(o, nil)
		if st.servedAll == 0 {
			return 0, fmt.Errorf("search at %.3g sessions/s: nothing served (%s)", rate, res.outcomeLine())
		}
		return st.p50All, nil
	}
	base, err := measure(o.lightRate)
	if err != nil {
		return 0, steps, err
	}
	target := 2 * base
	lo, loP := o.lightRate, base
	hi, hiP := 0.0, 0.0
	for rate, k := 2*o.lightRate, 0; hi == 0; rate, k = 2*rate, k+1 {
		if k == maxDoublings {
			return 0, steps, fmt.Errorf("pass-through's TTFT p50 did not double up to %.3g sessions/s (light load: %.3g s)", rate/2, base)
		}
		v, err := measure(rate)
		if err != nil {
			return 0, steps, err
		}
		if v >= target {
			hi, hiP = rate, v
		} else {
			lo, loP = rate, v
		}
	}
	for range o.bisect {
		mid := math.Sqrt(lo * hi)
		v, err := measure(mid)
		if err != nil {
			return 0, steps, err
		}
		if v >= target {
			hi, hiP = mid, v
		} else {
			lo, loP = mid, v
		}
	}
	return interpolate(lo, loP, hi, hiP, target), steps, nil
}

// interpolate returns the rate between lo and hi where a straight line
// through (lo, loP) and (hi, hiP) reaches target (lo when the line is flat).
func interpolate(lo, loP, hi, hiP, target float64) float64 {
	if hiP <= loP {
		return lo
	}
	f := min(max((target-loP)/(hiP-loP), 0), 1)
	return lo + f*(hi-lo)
}
