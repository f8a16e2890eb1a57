// Package simworker is a simulated GPU inference worker: an OpenAI-compatible
// HTTP server (as vLLM serves it) that models what routing changes — a block
// prefix cache with LRU eviction, a continuous-batching engine whose time to
// first token grows with the uncached prompt and with what else runs,
// queueing past MaxNumSeqs and the KV capacity, SSE streaming,
// tool calls, non-portable Responses API state, LoRA adapters loaded and
// unloaded at run time, the prefill and decode legs of disaggregated
// serving, vLLM's KV-cache events, and injected faults.
//
// Users run it (cmd/simworker) to try the router; the router's tests and
// benchmarks run fleets of Workers in one process over loopback, so a Worker
// keeps all its state, metrics included, to itself.
package simworker

import (
	"fmt"
	"strings"
	"time"
)

// Window is a time window measured from the worker's start: [Start, End).
type Window struct {
	Start, End time.Duration
}

// Contains reports whether uptime d lies in the window.
func (w Window) Contains(d time.Duration) bool { return d >= w.Start && d < w.End }

// String formats the window as the flag syntax "10s-20s".
func (w Window) String() string { return w.Start.String() + "-" + w.End.String() }

// ParseWindows parses the flag syntax "10s-20s,1m-1m30s" (empty → nil).
func ParseWindows(s string) ([]Window, error) {
	var ws []Window
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		a, b, ok := strings.Cut(part, "-")
		if !ok {
			return nil, fmt.Errorf("window %q: want START-END, e.g. 10s-20s", part)
		}
		start, err := time.ParseDuration(strings.TrimSpace(a))
		if err != nil {
			return nil, fmt.Errorf("window %q: %w", part, err)
		}
		end, err := time.ParseDuration(strings.TrimSpace(b))
		if err != nil {
			return nil, fmt.Errorf("window %q: %w", part, err)
		}
		if end <= start {
			return nil, fmt.Errorf("window %q: end must be after start", part)
		}
		ws = append(ws, Window{Start: start, End: end})
	}
	return ws, nil
}

// Config configures a Worker. The zero value of each field means its default;
// a negative duration means zero.
type Config struct {
	Models        []string      // model names served (default ["sim-model"])
	Name          string        // worker name used in ids and logs (default: the listen address at Serve)
	BlockTokens   int           // prefix-cache block size in tokens (default 16)
	CacheBlocks   int           // cache capacity in blocks, LRU (default 8192)
	CharsPerToken int           // tokenizer model: tokens = ceil(chars / CharsPerToken) (default 4)
	PerToken      time.Duration // prefill time per uncached prompt token, both models (default 50µs: 20k tokens/s)
	MaxNumSeqs    int           // sequences running at once; more wait (default 64)
	MaxTokens     int           // completion tokens when the request gives none (default 64)

	// LatencyModel is LatencyEngine (default: a continuous-batching engine
	// simulated step by step) or LatencyLegacy (per-request latency).
	// docs/design.md §6 names the real-engine figures behind the defaults.
	LatencyModel string

	// Engine model. A step takes StepBase + PerToken × prefill tokens in the
	// step + DecodePerSeq × sequences emitting a token in the step.
	StepBase            time.Duration // fixed time of every engine step (default 6ms)
	DecodePerSeq        time.Duration // step time per decoding sequence (default 100µs)
	MaxNumBatchedTokens int           // tokens per step: prefill chunks + one per decoding sequence (default 8192)

	// Legacy model only.
	Overhead   time.Duration // fixed per-request TTFT overhead (default 20ms)
	InterToken time.Duration // decode time per output token (default 10ms)

	// TimeScale multiplies every simulated duration (engine steps, Overhead,
	// PerToken, InterToken, SlowStartDelay, KV transfers). 0 sleeps not at all (zero-latency
	// mode for load tests); 1 is real time; tests use e.g. 0.01.
	TimeScale float64

	// OmitPromptTokensDetails leaves usage.prompt_tokens_details out of chat
	// and completions answers, as vLLM does without
	// --enable-prompt-tokens-details.
	OmitPromptTokensDetails bool

	// Faults.
	ErrorRate      float64       // fraction of inference requests answered 500
	Unavailable    []Window      // uptime windows answered 503 (real time, not scaled); /health too
	SlowStart      time.Duration // while uptime < SlowStart, add SlowStartDelay to every TTFT
	SlowStartDelay time.Duration // extra TTFT during SlowStart, scaled by TimeScale (default 1s)
	DropRate       float64       // fraction of streamed responses whose connection is closed after the first chunk
	StrictToolIDs  bool          // 400 on a tool result whose id was not issued for this model
	HangLimit      time.Duration // bound of the "timeout" and "stall" faults (default 60s, real time)
	// DefaultFaults, in FaultHeader's syntax (e.g. "cut=3"), applies to
	// every inference request that carries no FaultHeader.
	DefaultFaults string

	// SchedulingPolicy is "fcfs" (the default) or "priority": as vLLM's
	// --scheduling-policy, the engine's waiting requests are then taken
	// by the chat request's "priority" (lower first), then arrival, instead
	// of arrival alone. Running sequences are never preempted: their KV
	// blocks are reserved at admission (docs/design.md §6).
	SchedulingPolicy string

	// OnFirstToken, when set, is called with each request's x-request-id
	// as the engine model emits its first token, telling how it reached
	// it (an instrument for benchmarks: where a TTFT went). It runs on the
	// engine's loop with the engine locked, so it must return at once.
	OnFirstToken func(id string, t FirstToken)

	// ZeroWork answers every inference POST at once with one fixed chat
	// completion (about 346 bytes; fixed id and usage) without decoding the
	// body: no parsing, tokenizing, cache, latency, faults or metrics beyond
	// Stats.Requests. For proxy load tests (docs/design.md §6, §7).
	ZeroWork bool

	// MaxModelLen is the context length listed as max_model_len by
	// /v1/models; a longer request is answered 400 as vLLM does (default
	// 131072, Llama-3.1-8B's context).
	MaxModelLen int
	// MaxAdapters caps the LoRA adapters loaded at run time (default 64).
	MaxAdapters int

	// Disaggregated prefill/decode (docs/design.md §6, pd.go): every
	// worker serves both legs as vLLM's NIXL connector does with kv_both.
	// KVHoldTimeout bounds how long a prefill leg's blocks wait for a
	// decode worker to pull them (default 480s, vLLM's
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT; real time, not scaled). A pull of n
	// tokens takes KVTransferLatency + KVTransferPerToken × n (defaults
	// 2ms and 5µs, scaled by TimeScale), charged instead of prefilling them.
	KVHoldTimeout      time.Duration
	KVTransferLatency  time.Duration
	KVTransferPerToken time.Duration

	// KV-cache events (docs/design.md §6, kvpublish.go): the engine's
	// cache publishes BlockStored, BlockRemoved and AllBlocksCleared as
	// vLLM's ZmqEventPublisher does. KVEventsEndpoint is the PUB address
	// ("tcp://127.0.0.1:0" for any free port; "" for none, the default:
	// nothing of it runs). KVEventsReplayEndpoint is the replay ROUTER's
	// ("" for none). KVEventsBufferSteps is how many of the latest batches
	// replay keeps (default 10000, vLLM's buffer_steps). KVEventsAddr and
	// KVEventsReplayAddr say where they were bound. ZeroWork publishes
	// nothing: it has no cache.
	KVEventsEndpoint       string
	KVEventsReplayEndpoint string
	KVEventsBufferSteps    int

	MaxStoredResponses int // Responses API objects kept for previous_response_id and GET (default 4096)
	MaxBodySize        int // request body limit in bytes (default 64 MiB)

	Seed int64 // seeds fault decisions
}

// Validate reports a configuration New cannot serve.
func (c Config) Validate() error {
	switch c.LatencyModel {
	case "", LatencyEngine, LatencyLegacy:
	default:
		return fmt.Errorf("latency model %q: want %q or %q", c.LatencyModel, LatencyEngine, LatencyLegacy)
	}
	switch c.SchedulingPolicy {
	case "", ScheduleFCFS, SchedulePriority:
	default:
		return fmt.Errorf("scheduling policy %q: want %q or %q", c.SchedulingPolicy, ScheduleFCFS, SchedulePriority)
	}
	if c.TimeScale < 0 || c.ErrorRate < 0 || c.ErrorRate > 1 || c.DropRate < 0 || c.DropRate > 1 {
		return fmt.Errorf("time scale must be >= 0; error and drop rates in [0, 1]")
	}
	if _, err := parseFaults([]byte(c.DefaultFaults)); err != nil {
		return fmt.Errorf("default faults: %w", err)
	}
	if c.KVEventsReplayEndpoint != "" && c.KVEventsEndpoint == "" {
		return fmt.Errorf("a KV events replay endpoint needs a KV events endpoint")
	}
	return nil
}

func (c *Config) setDefaults() {
	if len(c.Models) == 0 {
		c.Models = []string{"sim-model"}
	}
	if c.BlockTokens <= 0 {
		c.BlockTokens = 16
	}
	if c.CacheBlocks <= 0 {
		c.CacheBlocks = 8192
	}
	if c.CharsPerToken <= 0 {
		c.CharsPerToken = 4
	}
	if c.LatencyModel == "" {
		c.LatencyModel = LatencyEngine
	}
	c.StepBase = orDefault(c.StepBase, 6*time.Millisecond)
	c.DecodePerSeq = orDefault(c.DecodePerSeq, 100*time.Microsecond)
	if c.MaxNumBatchedTokens <= 0 {
		c.MaxNumBatchedTokens = 8192
	}
	c.Overhead = orDefault(c.Overhead, 20*time.Millisecond)
	c.PerToken = orDefault(c.PerToken, 50*time.Microsecond)
	c.InterToken = orDefault(c.InterToken, 10*time.Millisecond)
	c.SlowStartDelay = orDefault(c.SlowStartDelay, time.Second)
	c.KVHoldTimeout = orDefault(c.KVHoldTimeout, 480*time.Second)
	c.KVTransferLatency = orDefault(c.KVTransferLatency, 2*time.Millisecond)
	c.KVTransferPerToken = orDefault(c.KVTransferPerToken, 5*time.Microsecond)
	if c.MaxNumSeqs <= 0 {
		c.MaxNumSeqs = 64
	}
	if c.MaxTokens <= 0 {
		c.MaxTokens = 64
	}
	if c.TimeScale < 0 {
		c.TimeScale = 0
	}
	if c.HangLimit <= 0 {
		c.HangLimit = 60 * time.Second
	}
	if c.MaxModelLen <= 0 {
		c.MaxModelLen = 131072
	}
	if c.MaxAdapters <= 0 {
		c.MaxAdapters = 64
	}
	if c.MaxStoredResponses <= 0 {
		c.MaxStoredResponses = 4096
	}
	if c.MaxBodySize <= 0 {
		c.MaxBodySize = 64 << 20
	}
}

// orDefault maps 0 to def and a negative duration to 0 (an explicit "none").
func orDefault(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}
