package main

import (
	"fmt"

	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/simworker"
)

// demoFleet is the embedded simulated workers of demo mode.
type demoFleet struct {
	workers []*simworker.Worker
}

// startDemo starts n simulated workers on loopback ports, in real time,
// spread over cfg's physical models (the first model gets the spare ones),
// and writes their URLs into cfg.
func startDemo(cfg *saar.Config, n int) (*demoFleet, error) {
	if len(cfg.Models) == 0 {
		return nil, fmt.Errorf("demo mode: the config has no models")
	}
	n = max(n, len(cfg.Models))
	d := &demoFleet{}
	for i := 0; i < n; i++ {
		m := &cfg.Models[0]
		if j := n - i - 1; j < len(cfg.Models)-1 {
			m = &cfg.Models[len(cfg.Models)-1-j]
		}
		w, url, err := simworker.Start(simworker.Config{Models: []string{m.Name}, TimeScale: 1, Seed: int64(i + 1)})
		if err != nil {
			d.close()
			return nil, fmt.Errorf("demo worker %d: %w", i, err)
		}
		d.workers = append(d.workers, w)
		m.Workers = append(m.Workers, url)
	}
	return d, nil
}

func (d *demoFleet) close() {
	for _, w := range d.workers {
		_ = w.Close()
	}
}
