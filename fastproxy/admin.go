package fastproxy

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"

	"github.com/warmroute/warmroute/loadview"
)

// writeJSON answers 200 with v encoded by sonic.
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

// modelEntry is a model the router knows only by name: a logical model, or
// one given in config that no worker described.
type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// modelCard is a model as the workers' /v1/models described it, in vLLM's
// shape: parent is null for a base model, max_model_len null when unknown.
type modelCard struct {
	modelEntry
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
}

// models answers GET /v1/models with the logical models (owned by
// warmroute) and the physical ones, each merged across the workers that
// list it (docs/design.md §8.4).
func (s *Server) models(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		methodNotAllowed(ctx, "GET")
		return
	}
	data := []any{}
	seen := map[string]bool{}
	for _, m := range s.logicalModels() {
		if !seen[m] {
			seen[m] = true
			data = append(data, modelEntry{ID: m, Object: "model", OwnedBy: "warmroute"})
		}
	}
	for _, m := range s.cfg.Registry.Models() {
		if !seen[m] {
			seen[m] = true
			data = append(data, s.modelCard(m))
		}
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"object": "list", "data": data})
}

// modelCard merges what the workers serving m said of it: the first
// worker's root, parent, created and owner, and the largest context any of
// them reports, since the router sends a prompt to a worker it fits
// (contextfit.go). An adapter's context is its parent's, the one it runs
// in. A model no worker described keeps the minimal entry.
func (s *Server) modelCard(m string) any {
	ws, _ := s.cfg.Registry.ForModel(s2b(m))
	var card modelCard
	found, maxLen := false, 0
	for _, w := range ws {
		info, ok := w.ModelInfo(m)
		if !ok || info == (loadview.ModelInfo{ID: m}) { // a name given in config says nothing
			continue
		}
		if !found {
			found = true
			card.Root, card.Created, card.OwnedBy = info.Root, info.Created, info.OwnedBy
			if info.Parent != "" {
				card.Parent = &info.Parent
			}
		}
		maxLen = max(maxLen, w.MaxModelLen(m))
	}
	if !found {
		return modelEntry{ID: m, Object: "model", OwnedBy: "vllm"}
	}
	card.ID, card.Object = m, "model"
	if card.OwnedBy == "" {
		card.OwnedBy = "vllm"
	}
	if maxLen > 0 {
		card.MaxModelLen = &maxLen
	}
	return card
}

func (s *Server) liveness(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain")
	ctx.SetBodyString("OK")
}

// readiness is 200 when at least one worker is healthy, 503 otherwise.
func (s *Server) readiness(ctx *fasthttp.RequestCtx) {
	healthy, total := 0, 0
	for _, w := range s.cfg.Registry.Workers() {
		total++
		if w.Healthy() {
			healthy++
		}
	}
	status := fasthttp.StatusOK
	if healthy == 0 {
		status = fasthttp.StatusServiceUnavailable
	}
	writeJSON(ctx, status, map[string]any{"ready": healthy > 0, "healthy_workers": healthy, "total_workers": total})
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
}

func infoOf(w *loadview.Worker) workerInfo {
	i := workerInfo{URL: w.URL(), BaseURL: w.BaseURL(), Healthy: w.Healthy(), Load: w.Load(), Models: w.Models(), WorkerID: w.ID(), Breaker: w.BreakerState().String()}
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
// GET|POST /workers, DELETE /workers/{url}, POST /add_worker?url=,
// POST /remove_worker?url=, GET /list_workers.
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
			URL    string   `json:"url"`
			Models []string `json:"models"`
		}
		if err := sonic.Unmarshal(ctx.PostBody(), &body); err != nil || body.URL == "" {
			badRequest(ctx, `want a JSON body {"url": "http://host:port", "models": [optional]}`)
			return
		}
		s.addWorker(ctx, body.URL, body.Models)
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
		urls := []string{}
		for _, w := range s.cfg.Registry.Workers() {
			urls = append(urls, w.URL())
		}
		writeJSON(ctx, fasthttp.StatusOK, map[string]any{"urls": urls})
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
			s.addWorker(ctx, u, nil)
		} else {
			s.removeWorker(ctx, u)
		}
	default:
		noRoute(ctx)
	}
}

func (s *Server) addWorker(ctx *fasthttp.RequestCtx, u string, models []string) {
	if err := s.cfg.Registry.Admit(u); err != nil {
		writeError(ctx, fasthttp.StatusForbidden, "invalid_request_error", "worker_not_allowed", err.Error())
		return
	}
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	added, err := s.cfg.Registry.Add(c, u, models)
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
