package saar

import (
	"strings"

	"github.com/VictoriaMetrics/metrics"
	"github.com/puzpuzpuz/xsync/v3"
)

// Metrics (VictoriaMetrics default set, Prometheus text):
//
//	vllm_router_saar_selections_total{model,action}
//	vllm_router_saar_switches_total{from,to,reason}
//	vllm_router_saar_hard_locks_total{kind}              kind: tool_loop | provider_state
//	vllm_router_saar_lock_breaks_total{kind}
//	vllm_router_saar_worker_failovers_total              provider state lost (pinned worker down)
//	vllm_router_saar_continuity_violations_total         must stay 0
//
// Every counter a selection touches is created up front or cached, so the
// hot path does not format names.
type routerMetrics struct {
	sel        [][]*metrics.Counter // [model][action]
	modelIdx   map[string]int
	hard       map[string]*metrics.Counter
	broken     map[string]*metrics.Counter
	switches   *xsync.MapOf[switchKey, *metrics.Counter]
	failovers  *metrics.Counter
	violations *metrics.Counter
}

type switchKey struct{ from, to, reason string }

func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

func newRouterMetrics(cfg *Config) *routerMetrics {
	m := &routerMetrics{
		modelIdx:   map[string]int{},
		hard:       map[string]*metrics.Counter{},
		broken:     map[string]*metrics.Counter{},
		switches:   xsync.NewMapOf[switchKey, *metrics.Counter](),
		failovers:  metrics.GetOrCreateCounter(`vllm_router_saar_worker_failovers_total`),
		violations: metrics.GetOrCreateCounter(`vllm_router_saar_continuity_violations_total`),
	}
	for i := range cfg.Models {
		name := cfg.Models[i].Name
		m.modelIdx[name] = i
		row := make([]*metrics.Counter, len(actions))
		for j, a := range actions {
			row[j] = metrics.GetOrCreateCounter(`vllm_router_saar_selections_total{model="` + labelValue(name) + `",action="` + a + `"}`)
		}
		m.sel = append(m.sel, row)
	}
	for _, k := range []string{LockToolLoop, LockProviderState} {
		m.hard[k] = metrics.GetOrCreateCounter(`vllm_router_saar_hard_locks_total{kind="` + k + `"}`)
		m.broken[k] = metrics.GetOrCreateCounter(`vllm_router_saar_lock_breaks_total{kind="` + k + `"}`)
	}
	return m
}

func (m *routerMetrics) selection(model, action string) {
	i, ok := m.modelIdx[model]
	if !ok {
		return
	}
	for j, a := range actions {
		if a == action {
			m.sel[i][j].Inc()
			return
		}
	}
}

func (m *routerMetrics) hardLock(kind string) {
	if c := m.hard[kind]; c != nil {
		c.Inc()
	}
}

func (m *routerMetrics) lockBreak(kind string) {
	if c := m.broken[kind]; c != nil {
		c.Inc()
	}
}

func (m *routerMetrics) switched(from, to, reason string) {
	k := switchKey{from, to, reason}
	c, ok := m.switches.Load(k)
	if !ok {
		c = metrics.GetOrCreateCounter(`vllm_router_saar_switches_total{from="` + labelValue(from) +
			`",to="` + labelValue(to) + `",reason="` + labelValue(reason) + `"}`)
		m.switches.Store(k, c)
	}
	c.Inc()
}
