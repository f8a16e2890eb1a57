package fastproxy

import (
	"context"
	"encoding/json"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// fleetResult is one worker's answer to a fleet-wide admin call.
type fleetResult struct {
	Worker string `json:"worker"`
	Role   string `json:"role"` // regular, prefill or decode
	Status int    `json:"status"`
	Error  string `json:"error,omitempty"`
	// Response is the worker's body when it is valid JSON of at most
	// maxFleetResponse bytes (is_sleeping's {"is_sleeping": …}); else absent.
	Response json.RawMessage `json:"response,omitempty"`
}

// maxFleetResponse bounds the worker body a fleet summary carries.
const maxFleetResponse = 4 << 10

// fleetAdmin sends a vLLM engine admin call (sleep, wake_up, is_sleeping,
// LoRA load/unload, reset_prefix_cache) to every worker once per base URL,
// ranks of one engine sharing it, and answers 200 with a per-worker
// summary when all succeeded, 502 with the same summary when any failed
// (docs/design.md §8.4). It never goes to one policy-chosen worker: that
// would leave the fleet in mixed states. ?model=NAME limits it to the
// engines serving NAME, of every role (404 model_not_found when none
// does); the call itself stays engine-wide on each, as vLLM's are.
func (s *Server) fleetAdmin(ctx *fasthttp.RequestCtx) {
	all := s.cfg.Registry.Workers()
	model := ctx.QueryArgs().Peek("model")
	if len(model) > 0 {
		entry, ok := s.cfg.Registry.ForModel(model)
		decode, dok := s.cfg.Registry.DecodeWorkers(model)
		if !ok && !dok {
			notFound(ctx, "model_not_found", "The model `"+clip(string(model), 256)+"` does not exist.")
			return
		}
		all = append(append([]*loadview.Worker(nil), entry...), decode...)
	}
	seen := map[string]bool{}
	var targets []*loadview.Worker
	for _, w := range all {
		if !seen[w.BaseURL()] {
			seen[w.BaseURL()] = true
			targets = append(targets, w)
		}
	}
	results := make([]fleetResult, len(targets))
	done := make(chan struct{}, len(targets))
	p := string(ctx.Path())
	adapters := p == "/v1/load_lora_adapter" || p == "/v1/unload_lora_adapter"
	// Both empty the engine's prefix cache: the router's tree forgets what
	// it predicted there (sleep at any level discards the KV cache; level
	// 0, newer vLLM's pause, keeps it).
	cacheGone := p == "/reset_prefix_cache" || (p == "/sleep" && string(ctx.QueryArgs().Peek("level")) != "0")
	for i, w := range targets {
		req := fasthttp.AcquireRequest()
		ctx.Request.CopyTo(req)
		req.URI().QueryArgs().Del("model") // the router's selector, not the worker's
		dropHopByHopRequest(&req.Header)
		req.Header.Del(fasthttp.HeaderAuthorization) // the admin key is ours, not the workers'
		if b := *s.fwd.bearer.Load(); b != "" {
			req.Header.Set(fasthttp.HeaderAuthorization, b)
		}
		req.URI().SetHost(w.Client().Addr)
		go func(i int, w *loadview.Worker, req *fasthttp.Request) {
			defer func() { done <- struct{}{} }()
			defer fasthttp.ReleaseRequest(req)
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			results[i].Worker, results[i].Role = w.BaseURL(), w.Role().String()
			if err := w.Client().DoTimeout(req, resp, 60*time.Second); err != nil {
				results[i].Error = "unreachable"
				s.cfg.Logger.Warn("fleet admin call failed", "request_id", string(req.Header.Peek(hdrRequestID)),
					"worker", w.BaseURL(), "path", string(req.URI().Path()), "err", err)
				return
			}
			results[i].Status = resp.StatusCode()
			if b := resp.Body(); len(b) > 0 && len(b) <= maxFleetResponse && json.Valid(b) {
				results[i].Response = append(json.RawMessage(nil), b...)
			}
			ok := resp.StatusCode() >= 200 && resp.StatusCode() <= 299
			if adapters {
				// The worker's models changed: rediscover them before
				// answering, so a loaded adapter is routable when the
				// client hears 200 (docs/design.md §8.4).
				rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = s.cfg.Registry.Rediscover(rctx, w)
				cancel()
			}
			if cacheGone && ok {
				s.forgetCache(w)
			}
		}(i, w, req)
	}
	for range targets {
		<-done
	}
	status := fasthttp.StatusOK
	for _, r := range results {
		if r.Status < 200 || r.Status > 299 {
			status = fasthttp.StatusBadGateway
		}
	}
	writeJSON(ctx, status, map[string]any{"results": results, "workers": len(results)})
}

// forgetCache tells the policy that chooses w (in PD mode the decode
// policy for a decode worker), when it predicts what caches hold, that the
// engine of w emptied its prefix cache: forgotten for each of its ranks,
// which share it.
func (s *Server) forgetCache(w *loadview.Worker) {
	p := s.cfg.Policy
	if s.cfg.PD != nil && w.Role() == loadview.Decode {
		p = s.cfg.PD.DecodePolicy
	}
	f, ok := p.(route.CacheForgetter)
	if !ok {
		return
	}
	for _, rw := range s.cfg.Registry.Workers() {
		if rw.BaseURL() == w.BaseURL() {
			f.ForgetCache(rw)
		}
	}
}
