// Package bench is warmroute's replay harness: it replays multi-turn agent
// sessions, closed loop, through the real router (fastproxy over loopback)
// to a fleet of simulated workers (simworker over loopback), once per routing
// policy and seed, and measures what routing changes — the prompt-cache hit
// rate seen by the client and by the workers, time to first token, latency,
// throughput and load balance.
//
// Every (policy, seed) run gets a fresh fleet and a fresh router, so caches
// start cold and no policy inherits another's state. Every policy of one seed
// replays byte-identical requests: the workload is generated (or loaded) once
// per seed and the assistant replies inside each request's history are the
// workload's own deterministic text, never what the simulated worker
// answered; the worker decodes exactly as many tokens as the recorded
// answer had (Turn.Answer; Options.MaxTokens fixes one length instead).
// cmd/warmbench is the command line.
//
// Besides the router's policies (route.Names) the harness adds three
// bench-only policies: sticky (session map, min-load fallback), pre_rfc (the
// vLLM router's cache_aware before the RFC of seed 000: the session id probed
// as text in a radix tree) and oracle (one worker with an unbounded cache: the
// hit-rate bound of a perfect router). RunMatrix runs the replay matrix of
// issue 10 (fleets × workloads × session ids × sessions in flight) with the
// cache_aware variants rfc_rule and cache_aware_32k beside cache_aware, and
// checks docs/design.md §7's bounds per cell (make bench-matrix).
package bench
