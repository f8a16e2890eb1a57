// Package saar is the model step of warmroute (docs/design.md §1, §5): for a
// logical model such as `auto`, it chooses the physical model of each turn
// with session memory — Session-Aware Agentic Routing. It is free of HTTP:
// the front end builds a Turn, calls Router.Select, proxies to a worker of
// Selection.Model (Selection.PinnedWorker when set), then calls
// Router.Observe with what the response taught.
//
// Order of a decision (Decide, a pure function of config, policy, inputs,
// memory snapshot and time):
//
//  1. Base selector. The first decision whose signals all match wins (a
//     decision without signals matches every turn). Complexity c in [0,1]:
//     the x-warmroute-complexity header wins; else reasoning_effort
//     (minimal .1, low .2, medium .5, high .9, xhigh 1); else keyword tiers
//     + history length + tools offered (see complexity). Each candidate:
//
//     base = c·quality − (1−c)·blended_price / max_blended_price
//     blended_price = (3·prompt_per_1m + completion_per_1m) / 4
//
//     Best = highest base among candidates whose model is up (ties: the
//     first listed).
//
//  2. Hard locks, applied even when the locked model is not a candidate:
//     tool loop (tool results → the model that issued those tool_call_ids:
//     global id index, then the session's ids, then structurally the
//     session's last model); provider state (previous_response_id → the
//     model and worker that created it; opaque reasoning → the session's
//     last model and worker). Locked model down: lock_broken (explicit,
//     counted). Pinned worker down, model up: hard_lock with
//     worker_failover (state lost, counted).
//
//  3. Reset boundaries: idle longer than idle_timeout_seconds since the end
//     of the previous response (reset_idle); the matched decision changed
//     (reset_drift). Both reselect freely (Best).
//
//  4. Switch economics. The current model's stay score is
//
//     stay = base(cur) + stay_bias + cache_value
//     cache_value = prefix_cache_weight · history_tokens · (prompt − cached_input)(cur) · warmth
//     / (economics_ref_tokens · max prompt_per_1m)
//     warmth = (cached_seen + cache_warmth_prior·4096) / (prompt_seen + 4096)
//
//     and a challenger's score is base − switch_margin − handoff_penalty.
//     Switch when the best challenger's score beats the stay score and the
//     session has spent min_turns_before_switch turns on its model. The
//     cache value is linear in history tokens: longer sessions are harder
//     to move, more so on expensive models.
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
