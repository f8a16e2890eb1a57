package fastproxy

import (
	"bytes"
	"strings"

	"github.com/valyala/fasthttp"
	"github.com/warmroute/warmroute/internal/bytesconv"
)

// endpoint is what the router does with a path (docs/design.md §8: only known
// paths are proxied; everything else is 404 without touching a worker).
type endpoint uint8

const (
	epUnknown        endpoint = iota
	epChat                    // routed inference, by kind
	epMessages                // Anthropic Messages: routed like chat (docs/design.md §8.4)
	epCompletions             //
	epResponses               //
	epEmbeddings              //
	epResponseByID            // GET|DELETE /v1/responses/{id}[/…]: to the worker that made it
	epModels                  // answered by the router
	epLiveness                //
	epReadiness               //
	epWorkerPath              // a worker endpoint that is not an admin surface: proxied to a policy-chosen worker
	epAdmin                   // worker management, replay records, debug views: admin key
	epFleetAdmin              // vLLM admin calls (sleep, wake_up, LoRA, reset_prefix_cache): admin key, every worker
	epMetrics                 // the router's own /metrics on the inference port: admin key
	epGenerateTokens          // /inference/v1/generate: routed inference on token ids (docs/design.md §8.4)
)

// workerPaths are the vLLM (and SGLang) worker endpoints that clients may
// reach through the router, beyond the routed inference endpoints. The
// engine's own admin calls are not here: they are fleet-wide admin
// surfaces (fleetAdminPaths). Extended by Config.ExtraWorkerPaths.
var workerPaths = []string{
	"/tokenize", "/detokenize", "/version",
	pathCountTokens,
	"/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
	"/v1/audio/transcriptions", "/v1/audio/translations",
	"/get_model_info", "/get_server_info",
}

// adminPaths are the router's own admin surfaces (exact paths; "/workers/"
// and "/debug/" also as prefixes).
var adminPaths = []string{"/workers", "/list_workers", "/add_worker", "/remove_worker", "/v1/router_replay", "/reload"}

// fleetAdminPaths are the vLLM engine admin calls: never proxied to one
// policy-chosen worker, always behind the admin key.
var fleetAdminPaths = []string{
	"/sleep", "/wake_up", "/is_sleeping",
	"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/reset_prefix_cache",
}

// newEndpointTable builds the exact-path table.
func newEndpointTable(extraWorkerPaths []string) map[string]endpoint {
	t := map[string]endpoint{
		pathChat:        epChat,
		pathCompletions: epCompletions,
		pathGenerate:    epCompletions,
		pathResponses:   epResponses,
		pathMessages:    epMessages,
		pathEmbeddings:  epEmbeddings,
		"/v1/models":    epModels,
		"/health":       epLiveness,
		"/liveness":     epLiveness,
		"/readiness":    epReadiness,
		// Kubernetes-style readiness, answered by the router: never a
		// worker's, never a routing decision (docs/design.md §3).
		"/health/ready": epReadiness,
		// The router's own metrics. On the inference port it is an admin
		// surface (the admin key, 404 without one, as every admin surface
		// there): request counts, worker URLs and session figures are not for
		// every client. The metrics listener serves it open (observe.go).
		"/metrics":         epMetrics,
		pathGenerateTokens: epGenerateTokens,
	}
	for _, p := range workerPaths {
		t[p] = epWorkerPath
	}
	for _, p := range extraWorkerPaths {
		if _, ok := t[p]; !ok {
			t[p] = epWorkerPath
		}
	}
	for _, p := range adminPaths {
		t[p] = epAdmin
	}
	for _, p := range fleetAdminPaths {
		t[p] = epFleetAdmin
	}
	return t
}

// ValidWorkerPath reports whether p may be added to the proxied worker
// paths: absolute, plain segments, no dot segments, no encoding.
func ValidWorkerPath(p string) bool {
	if !strings.HasPrefix(p, "/") || len(p) > 256 {
		return false
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
				return false
			}
		}
	}
	return true
}

// endpointOf returns the endpoint of the request's path, or epUnknown. The
// path the router routes is the path it forwards: a request whose path as
// sent differs from its normalized form (dot segments, percent-encoding,
// doubled slashes, backslashes) is refused, so that "/v1/chat/completions/../../workers"
// or "/%2e%2e%2fworkers" can neither reach an endpoint it does not name nor
// be forwarded in a form a worker would read differently. The one exception
// is the admin "/workers/{url-encoded worker url}".
func (s *Server) endpointOf(ctx *fasthttp.RequestCtx) (string, endpoint, bool) {
	uri := ctx.Request.URI()
	path := bytesconv.B2S(uri.Path())
	orig := uri.PathOriginal()
	if !bytes.Equal(orig, uri.Path()) {
		if bytes.HasPrefix(orig, []byte("/workers/")) && strings.HasPrefix(path, "/workers/") &&
			!bytes.Contains(orig, []byte("/..")) && !bytes.Contains(orig, []byte("/./")) {
			return path, epAdmin, true
		}
		return path, epUnknown, false
	}
	if ep, ok := s.paths[path]; ok {
		return path, ep, true
	}
	switch {
	case strings.HasPrefix(path, pathResponses+"/"):
		return path, epResponseByID, true
	case strings.HasPrefix(path, "/workers/"), strings.HasPrefix(path, "/debug/"):
		return path, epAdmin, true
	}
	return path, epUnknown, true
}
