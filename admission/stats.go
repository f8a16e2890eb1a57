package admission

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/warmroute/warmroute/promtext"
)

// Outcome is how a request that met the queue left it.
type Outcome uint8

const (
	Released  Outcome = iota // waited, then went to a worker
	Expired                  // waited the queue timeout
	Rejected                 // refused: queue full, shutting down, or no queue and the in-flight bound reached
	Abandoned                // its client left while it waited
)

var outcomeNames = [...]string{Released: "released", Expired: "expired", Rejected: "rejected", Abandoned: "abandoned"}

// MaxTenantLabels bounds the tenant label of the queue's series: the first
// tenants seen get their own, every later one counts as "other".
const MaxTenantLabels = 32

// OtherTenant is the label of the tenants past MaxTenantLabels.
const OtherTenant = "other"

// Stats counts the queue's outcomes per tenant and times the waits, in a
// metrics.Set of its own (WriteMetrics).
type Stats struct {
	set  *metrics.Set
	wait *metrics.PrometheusHistogram

	mu      sync.Mutex
	tenants map[string]*[len(outcomeNames)]*metrics.Counter
}

// waitBuckets are the wait histogram's upper bounds in seconds.
var waitBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

func newStats() *Stats {
	s := &Stats{set: metrics.NewSet(), tenants: map[string]*[len(outcomeNames)]*metrics.Counter{}}
	s.wait = s.set.NewPrometheusHistogramExt("vllm_router_queue_wait_seconds", waitBuckets)
	return s
}

// count adds one request of tenant with outcome o.
func (s *Stats) count(tenant string, o Outcome) {
	s.mu.Lock()
	cs := s.tenants[tenant]
	if cs == nil {
		if len(s.tenants) >= MaxTenantLabels {
			tenant = OtherTenant
		} else {
			tenant = strings.Clone(tenant) // it may alias a request buffer
		}
		if cs = s.tenants[tenant]; cs == nil {
			cs = new([len(outcomeNames)]*metrics.Counter)
			for i, name := range outcomeNames {
				cs[i] = s.set.NewCounter(`vllm_router_queue_requests_total{` + promtext.Label("tenant", tenant) + `,` +
					promtext.Label("outcome", name) + `}`)
			}
			s.tenants[tenant] = cs
		}
	}
	s.mu.Unlock()
	cs[o].Inc()
}

// Count is the number of requests of tenant (or OtherTenant) with outcome o.
func (s *Stats) Count(tenant string, o Outcome) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cs := s.tenants[tenant]; cs != nil {
		return cs[o].Get()
	}
	return 0
}

func (s *Stats) waited(d time.Duration) { s.wait.Update(d.Seconds()) }

// WriteMetrics writes the queue's series in Prometheus text format:
// vllm_router_queue_requests_total{tenant,outcome}, the wait histogram
// vllm_router_queue_wait_seconds (requests that waited), and
// vllm_router_queue_depth{model,priority} and
// vllm_router_queue_bytes (bodies held) for what waits now.
func (c *Controller) WriteMetrics(w io.Writer) {
	c.stats.set.WritePrometheus(w)
	for _, d := range c.Depths() {
		fmt.Fprintf(w, "vllm_router_queue_depth{%s,%s} %d\n", promtext.Label("model", d.Model),
			promtext.Label("priority", strconv.Itoa(d.Priority)), d.Waiting)
	}
	c.mu.Lock()
	bytes := c.bytes
	c.mu.Unlock()
	fmt.Fprintf(w, "vllm_router_queue_bytes %d\n", bytes)
}

// Depth is one model's waiting requests at one priority, for the
// operator's page.
type Depth struct {
	Model    string
	Priority int
	Waiting  int
}

// Depths lists what waits now, by model then priority.
func (c *Controller) Depths() []Depth {
	var ds []Depth
	c.mu.Lock()
	for _, q := range c.models {
		for _, b := range q.bands {
			ds = append(ds, Depth{q.name, b.prio, b.n})
		}
	}
	c.mu.Unlock()
	sort.Slice(ds, func(i, j int) bool {
		if ds[i].Model != ds[j].Model {
			return ds[i].Model < ds[j].Model
		}
		return ds[i].Priority < ds[j].Priority
	})
	return ds
}
