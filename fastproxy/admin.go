package fastproxy

import (
	"cmp"
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
)

// writeJSON answers status with v encoded by sonic.
func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := sonic.Marshal(v)
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, "internal_error", "encode_failed", "cannot encode the response")
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// workerInfo is one row of GET /workers.
type workerInfo struct {
	URL      string   `json:"url"`
	BaseURL  string   `json:"base_url"`
	DPRank   *int     `json:"dp_rank,omitempty"`
	Healthy  bool     `json:"healthy"`
	Load     int64    `json:"load"`
	Models   []string `json:"models"`
	WorkerID uint32   `json:"id"`
	Breaker  string   `json:"circuit_breaker"`
	Role     string   `json:"role"` // regular, prefill or decode (docs/design.md §9, "Disaggregated fleets")
}

func infoOf(w *loadview.Worker) workerInfo {
	i := workerInfo{URL: w.URL(), BaseURL: w.BaseURL(), Healthy: w.Healthy(), Load: w.Load(), Models: w.Models(), WorkerID: w.ID(),
		Breaker: w.BreakerState().String(), Role: w.Role().String()}
	if r := w.Rank(); r >= 0 {
		i.DPRank = &r
	}
	return i
}

// adminEndpoint serves an admin surface to a caller already admitted.
func (s *Server) adminEndpoint(ctx *fasthttp.RequestCtx, path string, ep endpoint) {
	switch {
	case ep == epFleetAdmin:
		s.fleetAdmin(ctx)
	case path == "/v1/router_replay":
		s.routerReplay(ctx)
	case path == "/reload":
		s.reload(ctx)
	case path == "/debug/sessions":
		s.debugSessions(ctx)
	case strings.HasPrefix(path, "/debug/pprof/"):
		pprofhandler.PprofHandler(ctx)
	case strings.HasPrefix(path, "/debug/"):
		noRoute(ctx)
	default:
		s.admin(ctx, path)
	}
}

// admin serves the worker-management endpoints:
// GET|POST /workers, DELETE /workers/{url}, POST /add_worker?url=&role=,
// POST /remove_worker?url=, GET /list_workers. Every listing names each
// worker's role.
func (s *Server) admin(ctx *fasthttp.RequestCtx, path string) {
	switch {
	case path == "/workers" && ctx.IsGet():
		out := []workerInfo{}
		for _, w := range s.cfg.Registry.Workers() {
			out = append(out, infoOf(w))
		}
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"workers": out, "total": len(out)})
	case path == "/workers" && ctx.IsPost():
		var body struct {
			URL        string   `json:"url"`
			Models     []string `json:"models"`
			Role       string   `json:"role"`
			WorkerType string   `json:"worker_type"` // the vLLM router's name of role
		}
		if err := sonic.Unmarshal(ctx.PostBody(), &body); err != nil || body.URL == "" {
			badRequest(ctx, `want a JSON body {"url": "http://host:port", "models": [optional], "role": "regular"|"prefill"|"decode" (optional)}`)
			return
		}
		if body.Role != "" && body.WorkerType != "" && body.Role != body.WorkerType {
			badRequest(ctx, "role and worker_type differ: give one")
			return
		}
		s.addWorker(ctx, body.URL, body.Models, cmp.Or(body.Role, body.WorkerType))
	case path == "/workers":
		methodNotAllowed(ctx, "GET, POST")
	case strings.HasPrefix(path, "/workers/"):
		if !ctx.IsDelete() {
			methodNotAllowed(ctx, "DELETE")
			return
		}
		// The normalized path collapses the "//" of "http://": use the original.
		orig := string(ctx.Request.URI().PathOriginal())
		raw, err := url.PathUnescape(orig[strings.Index(orig, "/workers/")+len("/workers/"):])
		if err != nil {
			badRequest(ctx, "worker url in the path is not valid percent-encoding")
			return
		}
		s.removeWorker(ctx, raw)
	case path == "/list_workers":
		if !ctx.IsGet() {
			methodNotAllowed(ctx, "GET")
			return
		}
		urls, roles := []string{}, map[string]string{}
		for _, w := range s.cfg.Registry.Workers() {
			urls = append(urls, w.URL())
			roles[w.URL()] = w.Role().String()
		}
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"urls": urls, "roles": roles})
	case path == "/add_worker" || path == "/remove_worker":
		if !ctx.IsPost() {
			methodNotAllowed(ctx, "POST")
			return
		}
		u := string(ctx.QueryArgs().Peek("url"))
		if u == "" {
			badRequest(ctx, "missing ?url=")
			return
		}
		if path == "/add_worker" {
			s.addWorker(ctx, u, nil, string(ctx.QueryArgs().Peek("role")))
		} else {
			s.removeWorker(ctx, u)
		}
	default:
		noRoute(ctx)
	}
}

// addWorker adds u in the role named role ("" is regular). A prefill or
// decode worker needs a router in PD mode: elsewhere the worker step would
// send whole requests to a prefill worker, or never use a decode worker.
func (s *Server) addWorker(ctx *fasthttp.RequestCtx, u string, models []string, role string) {
	r, err := loadview.ParseRole(role)
	if err != nil {
		badRequest(ctx, "role: want regular, prefill or decode")
		return
	}
	if r != loadview.Regular && s.cfg.PD == nil {
		badRequest(ctx, "role "+r.String()+": the router is not in PD mode (--vllm-pd-disaggregation); only regular workers can be added")
		return
	}
	if err := s.cfg.Registry.Admit(u); err != nil {
		writeError(ctx, fasthttp.StatusForbidden, "invalid_request_error", "worker_not_allowed", err.Error())
		return
	}
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	added, err := s.cfg.Registry.AddRole(c, u, models, r)
	switch {
	case errors.Is(err, loadview.ErrTooManyWorkers):
		writeError(ctx, fasthttp.StatusConflict, "invalid_request_error", "too_many_workers", "the router already holds --max-workers workers")
	case errors.Is(err, loadview.ErrDuplicate):
		writeError(ctx, fasthttp.StatusConflict, "invalid_request_error", "worker_exists", err.Error())
	case err != nil:
		badRequest(ctx, err.Error())
	default:
		var out []workerInfo
		for _, w := range added {
			out = append(out, infoOf(w))
		}
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"added": out})
	}
}

func (s *Server) removeWorker(ctx *fasthttp.RequestCtx, u string) {
	gone := s.cfg.Registry.Remove(u)
	if len(gone) == 0 {
		notFound(ctx, "worker_not_found", "no worker "+u+" is registered")
		return
	}
	urls := make([]string, 0, len(gone))
	for _, w := range gone {
		urls = append(urls, w.URL())
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"removed": urls})
}

// routerReplay serves GET /v1/router_replay?session=&limit=: the model
// step's replay records, oldest first.
func (s *Server) routerReplay(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		methodNotAllowed(ctx, "GET")
		return
	}
	if s.cfg.Models == nil {
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"records": []saar.Record{}})
		return
	}
	limit := 100
	if l := ctx.QueryArgs().Peek("limit"); len(l) > 0 {
		n, err := strconv.Atoi(string(l))
		if err != nil || n < 0 {
			badRequest(ctx, "limit must be a non-negative integer")
			return
		}
		limit = n
	}
	recs := s.cfg.Models.Records(string(ctx.QueryArgs().Peek("session")), limit)
	if recs == nil {
		recs = []saar.Record{}
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"records": recs})
}

// debugSessions serves GET /debug/sessions?recent=&model=: the policy's
// routing memory, per model, with the most recently used sessions.
func (s *Server) debugSessions(ctx *fasthttp.RequestCtx) {
	mem, ok := s.cfg.Policy.(route.Summarizer)
	if !ok {
		notFound(ctx, "not_cache_aware", "session memory exists only with --policy cache_aware")
		return
	}
	recent, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("recent")))
	if recent <= 0 {
		recent = 20
	}
	all := mem.Summaries(min(recent, 1000))
	model := string(ctx.QueryArgs().Peek("model"))
	out := all[:0]
	for _, sm := range all {
		if model == "" || sm.Model == model {
			out = append(out, sm)
		}
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"models": out})
}
