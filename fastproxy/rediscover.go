package fastproxy

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/loadview"
)

// Defaults of the rediscovery a request for an unlisted model triggers.
const (
	// DefaultModelRediscoveryInterval is the shortest time between two
	// rediscovery rounds started by requests for unlisted models.
	DefaultModelRediscoveryInterval = time.Second
	// modelRediscoveryTimeout bounds one round: each worker's answer, and
	// so the wait of the requests that wait for it.
	modelRediscoveryTimeout = time.Second
)

// modelRediscovery asks the fleet for its models again when a request names
// a model no worker lists (docs/design.md §8.4): an adapter loaded on a
// worker directly, not through the router, is otherwise unroutable until
// the next health check. It is rate-limited for the whole router, so that
// a flood of unknown names is no flood to the workers: at most one round is
// in flight, and a round starts at most once per interval. A request that
// finds a round in flight waits for it (at most modelRediscoveryTimeout);
// one that comes within the interval of the last round's start, with none
// in flight, gets its 404 at once.
type modelRediscovery struct {
	reg      *loadview.Registry
	interval time.Duration // 0: off
	rounds   *metrics.Counter
	log      *slog.Logger

	mu       sync.Mutex
	inFlight chan struct{} // closed when the round in flight ends; nil: none
	last     time.Time     // when the latest round started
}

// await runs a round, or waits for the one in flight, and reports whether
// one ended; false at once when rate-limited or off.
func (m *modelRediscovery) await(model string) bool {
	if m.interval <= 0 {
		return false
	}
	m.mu.Lock()
	done := m.inFlight
	if done == nil {
		now := time.Now()
		if !m.last.IsZero() && now.Sub(m.last) < m.interval {
			m.mu.Unlock()
			return false
		}
		done = make(chan struct{})
		m.inFlight, m.last = done, now
		m.rounds.Inc()
		m.log.Debug("a request names a model no worker lists; rediscovering the fleet's models", "model", clip(model, 256))
		go m.run(done)
	}
	m.mu.Unlock()
	<-done // within modelRediscoveryTimeout: the round's context ends then
	return true
}

// run is one round: every worker's /v1/models, at once.
func (m *modelRediscovery) run(done chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), modelRediscoveryTimeout)
	m.reg.RediscoverAll(ctx)
	cancel()
	m.mu.Lock()
	m.inFlight = nil
	m.mu.Unlock()
	close(done)
}
