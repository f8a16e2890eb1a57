package fastproxy

import (
	"errors"
	"time"

	"github.com/valyala/fasthttp"
)

// errNoReload is Reload's error on a server built without Config.Reload.
var errNoReload = errors.New("fastproxy: no reload configured")

// Reload runs Config.Reload, one at a time: SIGHUP and POST /reload both
// call it (docs/design.md §8, "Reload and audit"). A reload that fails
// changed nothing (Config.Reload validates every file before it applies
// any): it is logged and counted as vllm_router_config_reloads_total
// {result="error"}; a successful one as {result="ok"}, with
// vllm_router_config_last_reload_success_timestamp_seconds.
func (s *Server) Reload() error {
	if s.cfg.Reload == nil {
		return errNoReload
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if err := s.cfg.Reload(); err != nil {
		s.metrics.reloadErrors.Inc()
		s.cfg.Logger.Error("reload rejected: the running configuration is kept", "err", err)
		return err
	}
	s.metrics.reloadOK.Inc()
	s.metrics.reloadLast.Set(float64(time.Now().UnixNano()) / 1e9)
	s.cfg.Logger.Info("reloaded")
	return nil
}

// reload serves POST /reload: 200 when the files were reloaded, 422
// reload_rejected (naming the file and the fault) when they were not.
func (s *Server) reload(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	if s.cfg.Reload == nil {
		noRoute(ctx)
		return
	}
	if err := s.Reload(); err != nil {
		writeError(ctx, fasthttp.StatusUnprocessableEntity, "invalid_request_error", "reload_rejected",
			"reload rejected, the running configuration is kept: "+clip(err.Error(), 1024))
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"reloaded": true})
}
