package fastproxy

import (
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/loadview"
)

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

// listModels answers GET /v1/models with the logical models (owned by
// warmroute) and the physical ones, each merged across the workers that
// list it (docs/design.md §8.4). In PD mode a physical model is one the
// entry workers (regular or prefill) serve: one only decode workers serve
// cannot be requested.
func (s *Server) listModels(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		methodNotAllowed(ctx, "GET")
		return
	}
	data := []any{}
	seen := map[string]bool{}
	for _, m := range s.models.logicalModels() {
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
	ws, _ := s.cfg.Registry.ForModel(bytesconv.S2B(m))
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

// roleCount is the healthy and registered workers of one role.
type roleCount struct {
	Healthy int `json:"healthy"`
	Total   int `json:"total"`
}

// readiness is 200 when at least one worker is healthy, 503 otherwise. In
// PD mode (docs/design.md §9, "Disaggregated fleets") it needs a healthy
// entry worker (regular or prefill): one serves every request, whole when
// no decode worker is healthy; the body then counts each role.
func (s *Server) readiness(ctx *fasthttp.RequestCtx) {
	var roles [3]roleCount // indexed by loadview.Role
	for _, w := range s.cfg.Registry.Workers() {
		c := &roles[w.Role()]
		c.Total++
		if w.Healthy() {
			c.Healthy++
		}
	}
	regular, prefill, decode := roles[loadview.Regular], roles[loadview.Prefill], roles[loadview.Decode]
	healthy := regular.Healthy + prefill.Healthy + decode.Healthy
	body := map[string]any{"healthy_workers": healthy, "total_workers": regular.Total + prefill.Total + decode.Total}
	ready := healthy > 0
	if s.cfg.PD != nil {
		ready = regular.Healthy+prefill.Healthy > 0
		body["roles"] = struct {
			Regular roleCount `json:"regular"`
			Prefill roleCount `json:"prefill"`
			Decode  roleCount `json:"decode"`
		}{regular, prefill, decode}
	}
	body["ready"] = ready
	status := fasthttp.StatusOK
	if !ready {
		status = fasthttp.StatusServiceUnavailable
	}
	writeJSON(ctx, status, body)
}
