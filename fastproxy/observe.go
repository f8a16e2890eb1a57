package fastproxy

import (
	"io"
	"net/http"
	"net/http/pprof"
	"sort"
	"strconv"

	"github.com/VictoriaMetrics/metrics"
	"github.com/bytedance/sonic"

	"github.com/warmroute/warmroute/route"
)

// ObservabilityHandler serves the Prometheus listener: /metrics (Prometheus
// text), /debug/pprof/ (profiles) and /debug/sessions?model=&recent= (the
// cache-aware routing memory, when that policy is active).
func (s *Server) ObservabilityHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		metrics.WritePrometheus(w, true)
		s.cfg.Registry.WriteMetrics(w)
		s.writeDurations(w)
		if ca, ok := s.cfg.Policy.(*route.CacheAware); ok {
			ca.WriteMetrics(w)
		}
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/sessions", s.debugSessions)
	return mux
}

func (s *Server) debugSessions(w http.ResponseWriter, r *http.Request) {
	ca, ok := s.cfg.Policy.(*route.CacheAware)
	if !ok {
		http.Error(w, `{"error":{"message":"session memory exists only with --policy cache_aware","type":"invalid_request_error","param":null,"code":"not_cache_aware"}}`, http.StatusNotFound)
		return
	}
	recent, _ := strconv.Atoi(r.URL.Query().Get("recent"))
	if recent <= 0 {
		recent = 20
	}
	all := ca.Summaries(min(recent, 1000))
	model := r.URL.Query().Get("model")
	out := all[:0]
	for _, sm := range all {
		if model == "" || sm.Model == model {
			out = append(out, sm)
		}
	}
	b, err := sonic.Marshal(map[string]any{"models": out})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// writeDurations writes vllm_router_request_duration_seconds{route}.
func (s *Server) writeDurations(w io.Writer) {
	routes := make([]string, 0, len(s.rm)+1)
	for p := range s.rm {
		routes = append(routes, p)
	}
	sort.Strings(routes)
	for _, p := range routes {
		s.rm[p].duration.write(w, "vllm_router_request_duration_seconds", `route="`+p+`"`)
	}
	s.rmAll.duration.write(w, "vllm_router_request_duration_seconds", `route="other"`)
}
