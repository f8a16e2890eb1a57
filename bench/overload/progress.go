package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress writes one line per run while it runs: rewritten in place every
// second on a terminal, else every 10 s; and a summary line when it ends.
type progress struct {
	w       io.Writer
	tty     bool
	planned int // measured runs planned
	doneN   int // measured runs done
}

func newProgress(w io.Writer, planned int) *progress {
	p := &progress{w: w, planned: planned}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// label names a run.
func (p *progress) label(spec runSpec) string {
	if spec.load == 0 {
		return fmt.Sprintf("search  %-12s %6.3g sessions/s", spec.config.name, spec.rate)
	}
	return fmt.Sprintf("[%d/%d] %-12s %4g× %6.3g sessions/s", p.doneN+1, p.planned, spec.config.name, spec.load, spec.rate)
}

// follow prints c's counters until the returned stop is called.
func (p *progress) follow(spec runSpec, c *client) (stop func()) {
	label := p.label(spec)
	every := 10 * time.Second
	if p.tty {
		every = time.Second
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				p.line(label, c)
			}
		}
	}()
	return func() {
		close(quit)
		wg.Wait()
		if p.tty {
			fmt.Fprint(p.w, "\r\033[K")
		}
	}
}

func (p *progress) line(label string, c *client) {
	el := time.Since(c.start).Seconds()
	span := c.stopSend.Sub(c.start).Seconds()
	text := fmt.Sprintf("%s  %3.0f/%.0f s real  sessions %d  sent %d: served %d, 429 %d, 503 %d, gone %d, cut %d, other %d",
		label, el, span, c.active.Load(), c.sent.Load(), c.outs[outServed].Load(), c.outs[outBusy].Load()+c.outs[outFull].Load(),
		c.outs[outTimeout].Load(), c.outs[outGone].Load(), c.outs[outCut].Load(), c.outs[outOther].Load())
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K"+text)
	} else {
		fmt.Fprintln(p.w, text)
	}
}

// done prints a run's summary line.
func (p *progress) done(r *runResult) {
	label := p.label(r.spec)
	if r.spec.load > 0 {
		p.doneN++
	}
	check := "one outcome each"
	if r.violations > 0 {
		check = fmt.Sprintf("%d BROKE the one-outcome rule", r.violations)
	}
	fmt.Fprintf(p.w, "%s  %.0f s real: %s; %s; idle CPU %s\n", label, r.wall.Seconds(), r.outcomeLine(), check, idleText(r.idle))
}
