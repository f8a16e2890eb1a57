package main

import (
	"fmt"
	"log/slog"
	"net"

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
func startDemo(cfg *saar.Config, n int, log *slog.Logger) (*demoFleet, error) {
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
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			d.close()
			return nil, fmt.Errorf("demo worker %d: %w", i, err)
		}
		w := simworker.New(simworker.Config{Models: []string{m.Name}, TimeScale: 1, Seed: int64(i + 1)})
		go func() {
			if err := w.Serve(ln); err != nil {
				log.Debug("demo worker stopped", "err", err)
			}
		}()
		d.workers = append(d.workers, w)
		m.Workers = append(m.Workers, "http://"+ln.Addr().String())
	}
	return d, nil
}

func (d *demoFleet) close() {
	for _, w := range d.workers {
		_ = w.Close()
	}
}
