package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/internal/testwait"
)

// query is one PromQL expression of the dashboard, with its panel.
type query struct {
	panel, expr, legend string
}

// dashboardQueries reads every target of grafana/warmroute.json.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile("grafana/warmroute.json")
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		ID         int             `json:"id"`
		Type       string          `json:"type"`
		Title      string          `json:"title"`
		Datasource json.RawMessage `json:"datasource"`
		Targets    []struct {
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
		Panels []panel `json:"panels"`
	}
	var d struct {
		UID    string  `json:"uid"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana/warmroute.json: %v", err)
	}
	var qs []query
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" && !strings.Contains(string(p.Datasource), "${datasource}") {
				t.Errorf("panel %q: datasource %s, want the ${datasource} variable", p.Title, p.Datasource)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q: a target without expr", p.Title)
				}
				qs = append(qs, query{p.Title, tg.Expr, tg.LegendFormat})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	if d.UID == "" || len(qs) == 0 {
		t.Fatalf("dashboard uid %q with %d queries", d.UID, len(qs))
	}
	return qs
}

// PromQL words that are not series names.
var (
	promAggregations = set("sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group")
	promFunctions    = set("rate", "irate", "increase", "delta", "idelta", "deriv", "histogram_quantile", "clamp", "clamp_min", "clamp_max",
		"abs", "ceil", "floor", "round", "sqrt", "ln", "exp", "label_replace", "label_join", "vector", "scalar", "time", "sort", "sort_desc",
		"absent", "absent_over_time", "changes", "resets", "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
		"count_over_time", "last_over_time", "quantile_over_time", "predict_linear", "timestamp")
	promGrouping = set("by", "without", "on", "ignoring", "group_left", "group_right")
	promKeywords = set("and", "or", "unless", "bool", "offset", "atan2", "inf", "nan")
)

func set(words ...string) map[string]bool {
	m := map[string]bool{}
	for _, w := range words {
		m[w] = true
	}
	return m
}

// promqlRefs returns the series names and the label names (in matchers and
// by/without/on/ignoring lists) of a PromQL expression. Strings, range and
// offset durations, numbers and Grafana variables are skipped; an unknown
// function is an error, so a typo cannot pass for a series name.
func promqlRefs(expr string) (names, labels []string, err error) {
	isIdent := func(c byte, first bool) bool {
		return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && '0' <= c && c <= '9'
	}
	ident := func(i int) (string, int) {
		j := i
		for j < len(expr) && isIdent(expr[j], j == i) {
			j++
		}
		return expr[i:j], j
	}
	skipSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n') {
			i++
		}
		return i
	}
	skipString := func(i int) (int, error) { // expr[i] is the quote
		q := expr[i]
		for j := i + 1; j < len(expr); j++ {
			switch {
			case expr[j] == '\\' && q != '`':
				j++
			case expr[j] == q:
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string at %d", i)
	}
	number := regexp.MustCompile(`^(0x[0-9a-fA-F]+|[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?)`)
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			if i, err = skipString(i); err != nil {
				return nil, nil, err
			}
		case c == '[': // range or subquery duration, Grafana variables included
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, nil, fmt.Errorf("unterminated [ at %d", i)
			}
			i += j + 1
		case c == '{': // label matchers: name op "value", ...
			for i = skipSpace(i + 1); i < len(expr) && expr[i] != '}'; i = skipSpace(i) {
				var l string
				if l, i = ident(i); l == "" {
					return nil, nil, fmt.Errorf("bad label matcher at %d", i)
				}
				labels = append(labels, l)
				i = skipSpace(i)
				i += len(expr[i:]) - len(strings.TrimLeft(expr[i:], "=!~"))
				if i = skipSpace(i); i >= len(expr) || expr[i] != '"' && expr[i] != '\'' && expr[i] != '`' {
					return nil, nil, fmt.Errorf("label %s without a quoted value", l)
				}
				if i, err = skipString(i); err != nil {
					return nil, nil, err
				}
				if i = skipSpace(i); i < len(expr) && expr[i] == ',' {
					i++
				}
			}
			i++
		case '0' <= c && c <= '9' || c == '.':
			n := number.FindString(expr[i:])
			if n == "" {
				return nil, nil, fmt.Errorf("bad number at %d", i)
			}
			i += len(n)
		case c == '$': // a Grafana variable
			_, i = ident(i + 1)
		case isIdent(c, true):
			var w string
			w, i = ident(i)
			next := skipSpace(i)
			paren := next < len(expr) && expr[next] == '('
			switch {
			case promGrouping[w]:
				if !paren {
					if w == "group_left" || w == "group_right" {
						continue
					}
					return nil, nil, fmt.Errorf("%s without a label list", w)
				}
				end := strings.IndexByte(expr[next:], ')')
				if end < 0 {
					return nil, nil, fmt.Errorf("unterminated %s (", w)
				}
				for _, l := range strings.Split(expr[next+1:next+end], ",") {
					if l = strings.TrimSpace(l); l != "" {
						labels = append(labels, l)
					}
				}
				i = next + end + 1
			case w == "offset": // and its duration
				i = skipSpace(i)
				i += len(expr[i:]) - len(strings.TrimLeftFunc(expr[i:], func(r rune) bool { return r == '$' || r < 128 && isIdent(byte(r), false) }))
			case promAggregations[w], promKeywords[w]:
			case paren && !promFunctions[w]:
				return nil, nil, fmt.Errorf("unknown function %s", w)
			case paren:
			default:
				names = append(names, w)
			}
		default:
			i++
		}
	}
	return names, labels, nil
}

func TestPromqlRefs(t *testing.T) {
	names, labels, err := promqlRefs(`histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{route=~"/v1/.*", x!="}"}[$__rate_interval])))` +
		` / clamp_min(sum without(w) (b:rate5m offset 5m), 1e-9) > bool on (z) group_left c`)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names, " "); got != "a_bucket b:rate5m c" {
		t.Errorf("names %q", got)
	}
	if got := strings.Join(labels, " "); got != "le route route x w z" {
		t.Errorf("labels %q", got)
	}
	for _, bad := range []string{`rte(x[5m])`, `x{a="b}`, `sum by x`, `x{a}`} {
		if _, _, err := promqlRefs(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// operatorView lists the series an operator of a fleet needs on the
// dashboard (issue 13 §5); removing one of them from every panel fails.
var operatorView = []string{
	"vllm_router_requests_total",
	"vllm_router_request_duration_seconds_bucket",
	"vllm_router_cache_aware_decisions_total",
	"vllm_router_prefix_tokens_served_total",
	"vllm_router_prefix_tokens_predicted_total",
	"vllm_router_running_requests",
	"vllm_router_worker_fleet_load",
	"vllm_router_worker_health",
	"vllm_router_circuit_breaker_state",
	"vllm_router_ttft_queue_seconds",
	"vllm_router_ttft_prefill_seconds_per_token",
	"vllm_router_saar_selections_total",
	"vllm_router_saar_switches_total",
	"vllm_router_saar_hard_locks_total",
	"vllm_router_saar_lock_breaks_total",
	"vllm_router_saar_continuity_violations_total",
	"warmroute_redis_up",
	"warmroute_redis_outages_total",
	"vllm_router_lock_write_wait_seconds_sum",
	"vllm_router_lock_write_wait_seconds_count",
}

// TestDashboardCoversTheFleet: every query parses and the operator's view
// is complete. It needs no router.
func TestDashboardCoversTheFleet(t *testing.T) {
	used := map[string]bool{}
	for _, q := range dashboardQueries(t) {
		names, _, err := promqlRefs(q.expr)
		if err != nil {
			t.Errorf("panel %q: %s: %v", q.panel, q.expr, err)
		}
		if len(names) == 0 {
			t.Errorf("panel %q: %s names no series", q.panel, q.expr)
		}
		for _, n := range names {
			used[n] = true
		}
	}
	for _, n := range operatorView {
		if !used[n] {
			t.Errorf("no panel shows %s", n)
		}
	}
}

// TestDashboardSeriesExported runs the router (demo workers, a real Redis),
// sends the requests that create its lazily made series, and checks every
// query of the dashboard against its /metrics: each series name exported,
// each label in a matcher, a grouping or a legend carried by one of the
// query's series (or added by Prometheus at scrape: instance, job), and
// histogram_quantile only over histograms with le buckets (the router's
// VictoriaMetrics histograms have vmrange buckets instead).
func TestDashboardSeriesExported(t *testing.T) {
	qs := dashboardQueries(t)
	r := startRouter(t)
	r.traffic(t)

	var all []string
	for _, q := range qs {
		names, _, _ := promqlRefs(q.expr)
		all = append(all, names...)
	}
	var exp map[string]map[string]bool
	var missing []string
	// The lock write is observed before the last byte; the series are read
	// until every name is there, or the wait says which are not.
	testwait.Until(t, "every series the dashboard queries to be exported", func() bool {
		var err error
		if exp, err = exposition(r.get(t, r.metrics+"/metrics")); err != nil {
			t.Fatal(err)
		}
		missing = slices.DeleteFunc(slices.Clone(all), func(n string) bool { return exp[n] != nil })
		return len(missing) == 0
	}, func() string {
		slices.Sort(missing)
		return fmt.Sprintf("the router does not export %v", slices.Compact(missing))
	})

	legendLabel := regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	for _, q := range qs {
		names, labels, _ := promqlRefs(q.expr)
		have := map[string]bool{"instance": true, "job": true}
		for _, n := range names {
			for l := range exp[n] {
				have[l] = true
			}
		}
		for _, m := range legendLabel.FindAllStringSubmatch(q.legend, -1) {
			labels = append(labels, m[1])
		}
		for _, l := range labels {
			if !have[l] {
				t.Errorf("panel %q: label %q is on none of %v", q.panel, l, names)
			}
		}
		if strings.Contains(q.expr, "histogram_quantile") {
			for _, n := range names {
				if strings.HasSuffix(n, "_bucket") && !exp[n]["le"] {
					t.Errorf("panel %q: histogram_quantile over %s, which has no le buckets (labels %v)", q.panel, n, keys(exp[n]))
				}
			}
		}
	}
}

func keys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
