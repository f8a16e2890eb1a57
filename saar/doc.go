// Package saar is the model step of warmroute (docs/design.md §1, §5): for a
// logical model such as `auto`, it chooses the physical model of each turn
// with session memory — Session-Aware Agentic Routing. It is free of HTTP:
// the front end builds a Turn, calls Router.Select, proxies to a worker of
// Selection.Model (Selection.PinnedWorker when set), then calls
// Router.Observe with what the response taught.
//
// Order of a decision (Decide, a pure function of config, policy, inputs,
// memory snapshot and time). Policy.Version selects the selector and the
// economics (PolicyVersion, 3, by default; a record replays under the
// version that made it, one without a version under 1). Each version is one
// function (decideV1, decideV2, decideV3) over the steps they share
// (decision.go) and their own formulas (economics.go).
//
//  1. Base selector. The first decision whose signals all match wins (a
//     decision without signals matches every turn). Complexity c in [0,1]:
//     the x-warmroute-complexity header wins; else reasoning_effort
//     (minimal .1, low .2, medium .5, high .9, xhigh 1); else keyword tiers
//     + history length + tools offered (see complexity). Versions 2 and 3:
//     the turn demands quality c, and (scoreV2)
//
//     U = min(quality, c) − price_sensitivity · blended_price / max_blended_price
//
//     the highest U wins, ties to the cheaper: the cheapest candidate that
//     meets the demand as price_sensitivity → 0. Version 3 prices the turn
//     itself on each candidate's warm cache (scoreV3) and, where the
//     session is free to choose, adds two following turns (aheadModel).
//     Version 1: base = c·quality − (1−c)·normalized_price (scoreV1).
//     blended = (3·prompt + completion)/4 per 1M.
//
//  2. Hard locks, applied even when the locked model is not a candidate:
//     tool loop (tool results → the model that issued those tool_call_ids:
//     the session's ids, then the global id index, then structurally the
//     session's last model; ids of two models → tool_loop:conflict,
//     counted); provider state (previous_response_id → the model and worker
//     that created it; opaque reasoning → the model and worker that
//     produced its last artifact, by the artifact's id
//     (reqview.ReasoningID), else the session's last model and worker).
//     Locked model down: lock_broken (explicit, counted). Pinned worker
//     down, model up: hard_lock with worker_failover (state lost, counted).
//
//  3. Reset boundaries: idle longer than idle_timeout_seconds since the end
//     of the previous response (reset_idle); the matched decision changed
//     (reset_drift). Both reselect freely, as a session's first turn does.
//
//  4. Switch economics. Versions 2 and 3 price a switch in money — the lost
//     warm cache of the old model, handoff and continuity, and under
//     version 2 the re-prefill of the warm history on the new model (version
//     3 has it in the turn's price), all proportional to the history —
//     convert it to quality points at the selector's own rate κ and weigh it
//     against the utility gained on this turn and two following turns at
//     the session's demand (priceSwitches has the formula). Version 1: stay
//     = base + stay_bias + cache_value against challenger base −
//     switch_margin − handoff_penalty (switchTargetV1). All wait
//     min_turns_before_switch turns on a model.
//
//  5. Overflow (overflow.go, every version): an unlocked turn whose chosen
//     model's pool is saturated (Health.Pool) goes this once to another
//     candidate with room that serves its demand as well, when the
//     expected wait exceeds the prefill the move adds (overflow, reason
//     queue_overflow); the session keeps its model.
//
// Several replicas (Options.Shared, docs/design.md §8.3): a tool-call id,
// previous_response_id or session memory unknown here is read from Redis
// before the decision; a lookup Redis cannot answer gives the turn a
// redis_down reason (Reason*Down, counted), never a silent switch. Memory
// changes are written asynchronously; the proxy writes each response's
// locks with ShareLocks before forwarding its last byte.
//
// Memory is per (logical model, session) (sessionshard.MemoryKey). The
// global id indexes are bounded in ids, bytes and time (Options.IndexCapacity,
// IndexBytes, IndexTTL).
//
// Every Select emits a Record (inputs, memory before, scores with every
// bonus and penalty, outcome) into a ring bounded in records and bytes
// (client text cut, see Options.RingTextBytes) and, optionally, a JSONL
// writer fed through a bounded queue by one goroutine (Options.Replay;
// Router.Close drains it at shutdown); Replay re-runs records through
// Decide and reports differences.
//
// Metrics live in the Router's own *metrics.Set (Options.Metrics); the
// server writes them with Router.WriteMetrics.
package saar
