package simworker

import (
	crand "crypto/rand"
	"encoding/hex"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"
)

// Disaggregated prefill/decode, as vLLM's NIXL connector and its proxy
// split a request (docs/design.md §6). Every worker serves both legs (vLLM's
// kv_both), in the engine model only:
//
//   - Prefill leg: a non-streamed request whose kv_transfer_params say
//     do_remote_decode and whose completion limit ends it ("length", as the
//     proxy's max_tokens 1 does) runs as usual; when it finishes, the engine
//     keeps its references on the prompt's full blocks (a hold) and the
//     answer carries kv_transfer_params naming this engine, the blocks and
//     the request. The hold ends when a decode worker pulls it or after
//     Config.KVHoldTimeout (vllm:nixl_num_kv_expired_reqs).
//   - Decode leg: a request whose kv_transfer_params say do_remote_prefill
//     reserves its blocks and finds its local prefix-cache hit, then pulls
//     the hold from the prefill worker (kvPullPath, a simulation-only call:
//     the real connector reads the blocks over NIXL), waits the transfer
//     time of the full blocks beyond its local hit and runs with them
//     computed and cached. A failed pull recomputes them
//     (vllm:nixl_num_failed_transfers).
//
// A worker with no such traffic pays a nil check per request.

// kvPullPath is the simulation-only side channel of the KV transfer: POST
// {"remote_request_id", "remote_engine_id"} frees the hold and answers 200
// {"tokens": n}, the tokens of the full blocks it held; 404 when this
// engine holds no such request (pulled, expired, another engine's).
const kvPullPath = "/sim/kv_pull"

// kvPullTimeout bounds a decode worker's pull.
const kvPullTimeout = 5 * time.Second

// kvTransferParams is the request's kv_transfer_params as the proxy sends
// them: on the prefill leg do_remote_decode; on the decode leg the prefill
// answer's. remote_block_ids is only counted (vLLM sends ints, possibly one
// list per KV cache group; llm-d-inference-sim sends strings).
type kvTransferParams struct {
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteBlockIDs  []any  `json:"remote_block_ids"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	RemoteRequestID string `json:"remote_request_id"`
}

// kvTransferAnswer is a prefill answer's kv_transfer_params, in the NIXL
// connector's shape.
type kvTransferAnswer struct {
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	RemoteEngineID  string `json:"remote_engine_id"`
	RemoteBlockIDs  []int  `json:"remote_block_ids"`
	RemoteHost      string `json:"remote_host"`
	RemotePort      int    `json:"remote_port"`
	RemoteRequestID string `json:"remote_request_id"`
	TPSize          int    `json:"tp_size"`
}

type kvPullRequest struct {
	RequestID string `json:"remote_request_id"`
	EngineID  string `json:"remote_engine_id"`
}

type kvPullAnswer struct {
	Tokens int `json:"tokens"`
}

// kvHold is a finished prefill leg's reference on its prompt's full blocks.
type kvHold struct {
	chain []uint64
	ms    *modelStats
	timer *time.Timer // KVHoldTimeout
}

// kvPull is a decode leg's KV transfer. admitted is closed by the engine
// once the seq's blocks are reserved and hit is set; done is set (e.mu
// held) when the seq is queued again to run.
type kvPull struct {
	admitted chan struct{}
	hit      int // blocks of the local prefix-cache hit
	done     bool
}

func newEngineID() string {
	var b [8]byte
	_, _ = crand.Read(b[:])
	return "sim-" + hex.EncodeToString(b[:])
}

// EngineID returns the id a prefill answer's kv_transfer_params give this
// worker (remote_engine_id): random, so a worker restarted on the same
// address is another engine.
func (w *Worker) EngineID() string { return w.engineID }

// pdLeg prepares j for the leg of a disaggregated request that p names
// (nil: a whole request): a decode leg pulls its KV; a non-streamed
// prefill leg with a completion limit holds its blocks once finished. It
// reports whether j is such a prefill leg; the caller sets j.holdID to
// the answer's id, and plans a text answer.
func (w *Worker) pdLeg(j *job, p *kvTransferParams, stream bool) bool {
	if p == nil || w.eng == nil {
		return false
	}
	if p.DoRemotePrefill && len(p.RemoteBlockIDs) > 0 {
		j.kv = p
		return false
	}
	return p.DoRemoteDecode && !stream && j.explicitMax
}

// kvAnswer is the kv_transfer_params of j's answer: a prefill leg's hold,
// reached at the address the request came in on; nil for any other job.
func (w *Worker) kvAnswer(ctx *fasthttp.RequestCtx, j *job) *kvTransferAnswer {
	if j.holdID == "" {
		return nil
	}
	a := &kvTransferAnswer{
		DoRemotePrefill: true,
		RemoteEngineID:  w.engineID,
		RemoteBlockIDs:  j.heldIDs,
		RemoteRequestID: j.holdID,
		TPSize:          1,
	}
	if a.RemoteBlockIDs == nil {
		a.RemoteBlockIDs = []int{}
	}
	if addr, ok := ctx.LocalAddr().(*net.TCPAddr); ok {
		a.RemoteHost, a.RemotePort = addr.IP.String(), addr.Port
	}
	return a
}

// hold keeps a finished prefill leg's references on its prompt's full
// blocks, chain[:refd], for a decode worker to pull, and frees the rest
// of its blocks and its running slot. j.heldIDs names the blocks by their
// cache slot. e.mu held.
func (e *engine) hold(s *seq) {
	j := s.j
	chain := s.chain[:s.refd]
	s.refd = 0 // release leaves chain referenced
	e.release(s)
	ids := make([]int, len(chain))
	for i, k := range chain {
		ids[i] = int(e.kv.index[k]) - 1
	}
	j.heldIDs = ids
	if len(chain) == 0 {
		return
	}
	h := &kvHold{chain: chain, ms: j.ms}
	if e.holds == nil {
		e.holds = make(map[string]*kvHold)
	}
	id := j.holdID
	e.holds[id] = h
	e.heldBlocks += len(chain)
	h.timer = time.AfterFunc(e.w.cfg.KVHoldTimeout, func() { e.expire(id, h) })
}

// drop ends hold h. e.mu held.
func (e *engine) drop(id string, h *kvHold) {
	h.timer.Stop()
	delete(e.holds, id)
	e.heldBlocks -= len(h.chain)
	e.kv.unref(h.chain)
}

// expire ends hold h when no decode worker pulled it in time.
func (e *engine) expire(id string, h *kvHold) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.holds[id] != h {
		return
	}
	e.drop(id, h)
	e.w.kvExpired.Add(1)
	h.ms.kvExpired.Inc()
}

// take ends the hold of request id for a decode worker that pulled it and
// returns the tokens of its blocks; false when there is none.
func (e *engine) take(id string) (tokens int, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.holds[id]
	if h == nil {
		return 0, false
	}
	e.drop(id, h)
	return len(h.chain) * e.w.cfg.BlockTokens, true
}

// dropHolds ends every hold: the worker closes, or sleeps and discards its
// KV cache.
func (e *engine) dropHolds() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for id, h := range e.holds {
		e.drop(id, h)
	}
}

// kvPullCall serves kvPullPath on the prefill worker. It answers without
// the Errors counter: the call is the simulation's, not a client's.
func (w *Worker) kvPullCall(ctx *fasthttp.RequestCtx) {
	var req kvPullRequest
	if err := api.Unmarshal(ctx.PostBody(), &req); err != nil {
		w.writeJSON(ctx, fasthttp.StatusBadRequest, &apiError{Error: apiErrorBody{Message: "malformed JSON body", Type: "invalid_request_error"}})
		return
	}
	tokens, ok := 0, false
	if w.eng != nil && req.EngineID == w.engineID {
		tokens, ok = w.eng.take(req.RequestID)
	}
	if !ok {
		w.writeJSON(ctx, fasthttp.StatusNotFound, &apiError{Error: apiErrorBody{
			Message: "engine " + w.engineID + " holds no KV for request " + strconv.Quote(req.RequestID), Type: "not_found_error"}})
		return
	}
	w.writeJSON(ctx, fasthttp.StatusOK, &kvPullAnswer{Tokens: tokens})
}

// transfer runs decode leg s's KV transfer, in its handler: once the
// engine reserved its blocks and found its local hit, it pulls the hold
// from the prefill worker (always, so that the prefill frees it), waits
// KVTransferLatency + KVTransferPerToken × the tokens of the held full
// blocks beyond the local hit, and queues s again at the head with those
// blocks computed and cached. A failed pull leaves them to prefill
// (vLLM's kv_load_failure_policy "recompute"), counted. False when the
// worker closed first.
func (w *Worker) transfer(s *seq) bool {
	p, j, bt := s.pull, s.j, w.cfg.BlockTokens
	select {
	case <-p.admitted:
	case <-w.done:
		return false
	}
	xfer := 0 // blocks transferred
	if tokens, ok := w.pullKV(j.kv); ok {
		xfer = max(0, min(tokens/bt, len(s.chain))-p.hit)
	} else {
		w.kvFailed.Add(1)
		j.ms.kvFailed.Inc()
	}
	if xfer > 0 && !w.sleep(w.scaled(w.cfg.KVTransferLatency+time.Duration(xfer*bt)*w.cfg.KVTransferPerToken)) {
		return false
	}
	e := w.eng
	e.mu.Lock()
	for range xfer {
		e.kv.insert(s)
	}
	j.externalTokens = xfer * bt
	p.done = true
	e.waiting = slices.Insert(e.waiting, 0, s) // as vLLM prepends a request whose KV arrived
	e.mu.Unlock()
	e.poke()
	if xfer > 0 {
		w.kvTransferred.Add(uint64(xfer * bt))
		j.ms.kvExternal.Add(xfer * bt)
	}
	return true
}

// pullKV asks the prefill worker that p names to free its hold, and
// returns the tokens of the blocks it held; false when it cannot be
// reached or holds no such request for this engine.
func (w *Worker) pullKV(p *kvTransferParams) (tokens int, ok bool) {
	if p.RemoteHost == "" || p.RemotePort <= 0 || p.RemoteRequestID == "" {
		return 0, false
	}
	body, err := sonic.Marshal(&kvPullRequest{RequestID: p.RemoteRequestID, EngineID: p.RemoteEngineID})
	if err != nil {
		return 0, false
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + net.JoinHostPort(p.RemoteHost, strconv.Itoa(p.RemotePort)) + kvPullPath)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	if err := w.pdClient.DoTimeout(req, resp, kvPullTimeout); err != nil || resp.StatusCode() != fasthttp.StatusOK {
		return 0, false
	}
	var a kvPullAnswer
	if api.Unmarshal(resp.Body(), &a) != nil {
		return 0, false
	}
	return a.Tokens, true
}
