package simworker

import (
	"strconv"

	"github.com/valyala/fasthttp"
)

// The engine admin calls vLLM serves in development mode
// (VLLM_SERVER_DEV_MODE=1; docs/design.md §6, §8.4), with vLLM's shapes:
//
//	POST /sleep?level=1|2      200, empty body; 400 another level
//	POST /wake_up[?tags=...]   200, empty body (tags ignored: everything wakes)
//	GET  /is_sleeping          200 {"is_sleeping": bool}
//	POST /reset_prefix_cache   200, empty body
//
// While asleep every inference endpoint answers 503 (sleepingError);
// /health, /v1/models, /metrics and the admin calls keep answering, as in
// vLLM.

// sleepCall serves POST /sleep?level=N (default 1). Sleeping at any level
// discards the KV cache (level 1 offloads the weights to CPU memory, level
// 2 discards them too), so the prefix cache is dropped and a wake-up
// starts cold. Level 0 (newer vLLM's pause) and anything else is 400.
func (w *Worker) sleepCall(ctx *fasthttp.RequestCtx) {
	level := 1
	if v := ctx.QueryArgs().Peek("level"); len(v) > 0 {
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 1 || n > 2 {
			w.badRequest(ctx, "level must be 1 or 2")
			return
		}
		level = n
	}
	w.sleepLevel.Store(int32(level))
	w.asleep.Store(true)
	if w.eng != nil {
		w.eng.dropHolds() // held for decode workers, they were in the KV cache too
	}
	w.ResetCache()
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// wakeUp serves POST /wake_up (the tags query, which wakes the weights or
// the KV cache alone in vLLM, is ignored: everything wakes). Blocks that
// sequences running at sleep time released since are dropped as well: the
// KV cache they lived in was discarded.
func (w *Worker) wakeUp(ctx *fasthttp.RequestCtx) {
	if w.asleep.Swap(false) {
		w.ResetCache()
	}
	w.sleepLevel.Store(0)
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// isSleeping serves GET /is_sleeping.
func (w *Worker) isSleeping(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	if w.asleep.Load() {
		ctx.SetBodyString(`{"is_sleeping":true}`)
	} else {
		ctx.SetBodyString(`{"is_sleeping":false}`)
	}
}

// resetPrefixCache serves POST /reset_prefix_cache: every cached block no
// running sequence holds is dropped. vLLM resets all or nothing (nothing,
// with a logged warning, while any request holds blocks) and answers 200
// either way; reset_running_requests and reset_external are ignored here.
func (w *Worker) resetPrefixCache(ctx *fasthttp.RequestCtx) {
	w.ResetCache()
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// Sleeping reports whether the worker was put to sleep (POST /sleep) and
// not woken since, and at which level (0 when awake).
func (w *Worker) Sleeping() (bool, int) {
	if !w.asleep.Load() {
		return false, 0
	}
	return true, int(w.sleepLevel.Load())
}

// sleepingError answers an inference request made while the worker sleeps:
// 503 ModelSleepingError, OpenAI-shaped (Anthropic-shaped on /v1/messages).
// Real vLLM has no such guard: a request to a sleeping engine crashed V0 and
// waits in V1's queue until /wake_up; the 503 is the shape vLLM's sleep-mode
// docs once proposed, and the router treats it as back pressure, failing
// over to an awake worker (docs/design.md §6).
func (w *Worker) sleepingError(ctx *fasthttp.RequestCtx) {
	w.fail(ctx, fasthttp.StatusServiceUnavailable, "ModelSleepingError", "model_sleeping",
		"Model is currently in sleep mode. Please wake it up first with a POST request to /wake_up")
}
