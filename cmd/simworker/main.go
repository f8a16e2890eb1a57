// Command simworker runs simulated vLLM-like inference workers: OpenAI
// compatible servers with a block prefix cache, modelled latency, queueing and
// injected faults, for trying warmroute and testing setups without a GPU.
//
//	simworker --port 8001 --model small
//	simworker --port 8001 --count 4 --model small,large --time-scale 0.1
//
// Per-request faults: header x-sim-fault: error | unavailable | drop |
// slow=<ms> | timeout (comma-separated).
//
// Every worker serves both legs of a disaggregated prefill/decode request
// (kv_transfer_params, as vLLM's NIXL connector): --kv-hold-timeout,
// --kv-transfer-latency and --kv-transfer-per-token set what they cost.
//
// --kv-events-endpoint tcp://*:5557 publishes each worker's KV-cache events
// as vLLM's --kv-events-config does (ZMQ PUB, msgpack batches), with
// --kv-events-replay-endpoint for its replay socket; with --count N the
// workers take consecutive ports from these.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/warmroute/warmroute/simworker"
)

// listFlag is a repeatable flag that also splits comma lists.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l = append(*l, part)
		}
	}
	return nil
}

type windowsFlag []simworker.Window

func (w *windowsFlag) String() string {
	parts := make([]string, len(*w))
	for i, win := range *w {
		parts[i] = win.String()
	}
	return strings.Join(parts, ",")
}

func (w *windowsFlag) Set(s string) error {
	ws, err := simworker.ParseWindows(s)
	if err != nil {
		return err
	}
	*w = append(*w, ws...)
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "simworker:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("simworker", flag.ContinueOnError)
	var (
		cfg     simworker.Config
		models  listFlag
		windows windowsFlag
	)
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 8000, "port to listen on (with --count N, ports port..port+N-1)")
	count := fs.Int("count", 1, "number of workers to run, on consecutive ports")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	fs.Var(&models, "model", "model name served (repeatable or comma list; default sim-model)")
	fs.StringVar(&cfg.Name, "name", "", "worker name used in ids and logs (default: listen address)")
	fs.IntVar(&cfg.BlockTokens, "block-tokens", 16, "prefix-cache block size in tokens")
	fs.IntVar(&cfg.CacheBlocks, "cache-blocks", 8192, "prefix-cache capacity in blocks (LRU)")
	fs.IntVar(&cfg.CharsPerToken, "chars-per-token", 4, "tokenizer model: tokens = ceil(chars / this)")
	fs.StringVar(&cfg.LatencyModel, "latency-model", simworker.LatencyEngine, "engine (continuous batching, step by step) or legacy (per-request latency)")
	fs.StringVar(&cfg.SchedulingPolicy, "scheduling-policy", simworker.ScheduleFCFS, `engine model: the order of waiting requests, fcfs or priority (a chat request's "priority", lower first, then arrival), as vLLM's --scheduling-policy`)
	fs.DurationVar(&cfg.PerToken, "per-token", 0, "prefill time per uncached prompt token (default 50µs; negative: none)")
	fs.DurationVar(&cfg.StepBase, "step-base", 0, "engine: fixed time of every step (default 6ms; negative: none)")
	fs.DurationVar(&cfg.DecodePerSeq, "decode-per-seq", 0, "engine: step time per sequence decoding in the step (default 100µs; negative: none)")
	fs.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", 8192, "engine: token budget of a step (prefill chunks + one per decoding sequence)")
	fs.DurationVar(&cfg.Overhead, "overhead", 0, "legacy: fixed time to first token (default 20ms; negative: none)")
	fs.DurationVar(&cfg.InterToken, "inter-token", 0, "legacy: decode time per output token (default 10ms; negative: none)")
	fs.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", 64, "sequences running at once; more wait")
	fs.BoolVar(&cfg.OmitPromptTokensDetails, "no-prompt-tokens-details", false, "leave usage.prompt_tokens_details out (vLLM without --enable-prompt-tokens-details)")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", 64, "completion tokens when a request gives no limit")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 1, "multiply every simulated duration (0: no sleeping at all)")
	fs.Float64Var(&cfg.ErrorRate, "error-rate", 0, "fraction of requests answered 500")
	fs.Var(&windows, "unavailable", "uptime windows answered 503, e.g. 10s-20s,1m-2m")
	fs.DurationVar(&cfg.SlowStart, "slow-start", 0, "while uptime is below this, add --slow-start-delay to every TTFT")
	fs.DurationVar(&cfg.SlowStartDelay, "slow-start-delay", 0, "extra TTFT during --slow-start (default 1s, scaled)")
	fs.Float64Var(&cfg.DropRate, "drop-rate", 0, "fraction of streamed responses cut after the first chunk")
	fs.BoolVar(&cfg.StrictToolIDs, "strict-tool-ids", false, "reject (400) tool results whose id this model did not issue")
	fs.DurationVar(&cfg.HangLimit, "hang-limit", 0, "bound of the timeout fault (default 60s)")
	fs.BoolVar(&cfg.ZeroWork, "zero-work", false, "answer every inference POST at once with one fixed chat completion, body not decoded (proxy load tests)")
	fs.IntVar(&cfg.MaxModelLen, "max-model-len", 131072, "context length listed by /v1/models; longer requests are answered 400")
	fs.IntVar(&cfg.MaxAdapters, "max-lora-adapters", 64, "LoRA adapters that /v1/load_lora_adapter may load")
	fs.DurationVar(&cfg.KVHoldTimeout, "kv-hold-timeout", 0, "disaggregated prefill: how long a prefill leg's blocks wait for a decode worker's pull (default 480s, real time)")
	fs.DurationVar(&cfg.KVTransferLatency, "kv-transfer-latency", 0, "disaggregated decode: fixed time of a KV pull (default 2ms, scaled; negative: none)")
	fs.DurationVar(&cfg.KVTransferPerToken, "kv-transfer-per-token", 0, "disaggregated decode: KV pull time per transferred token (default 5µs, scaled; negative: none)")
	fs.StringVar(&cfg.KVEventsEndpoint, "kv-events-endpoint", "", "publish KV-cache events on this ZMQ PUB endpoint, as vLLM's --kv-events-config: tcp://host:port or ipc://path (port 0: any free one; default: none)")
	fs.StringVar(&cfg.KVEventsReplayEndpoint, "kv-events-replay-endpoint", "", "the KV events' replay ROUTER endpoint (default: none)")
	fs.IntVar(&cfg.KVEventsBufferSteps, "kv-events-buffer-steps", 10000, "KV event batches kept for replay (vLLM's buffer_steps)")
	fs.IntVar(&cfg.MaxStoredResponses, "max-stored-responses", 4096, "Responses API objects kept")
	fs.IntVar(&cfg.MaxBodySize, "max-body-size", 64<<20, "request body limit in bytes")
	fs.Int64Var(&cfg.Seed, "seed", 0, "seed of the fault decisions")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg.Models = models
	cfg.Unavailable = windows
	if *count < 1 {
		return fmt.Errorf("--count must be at least 1")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("--latency-model, --scheduling-policy, --time-scale, --error-rate, --drop-rate, --kv-events-replay-endpoint: %w", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var (
		workers []*simworker.Worker
		wg      sync.WaitGroup
		errc    = make(chan error, *count)
	)
	for i := range *count {
		addr := net.JoinHostPort(*host, strconv.Itoa(*port+i))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, w := range workers {
				w.Close()
			}
			return err
		}
		c := cfg
		switch {
		case c.Name == "":
			c.Name = ln.Addr().String()
		case *count > 1:
			c.Name = fmt.Sprintf("%s-%d", cfg.Name, i)
		}
		if c.KVEventsEndpoint, err = nthEndpoint(cfg.KVEventsEndpoint, i); err == nil {
			c.KVEventsReplayEndpoint, err = nthEndpoint(cfg.KVEventsReplayEndpoint, i)
		}
		if err != nil {
			ln.Close()
			for _, w := range workers {
				w.Close()
			}
			return err
		}
		w := simworker.New(c)
		if c.KVEventsEndpoint != "" && w.KVEventsAddr() == "" { // not bound: Serve says why at once
			ln.Close()
			for _, w := range workers {
				w.Close()
			}
			return fmt.Errorf("--kv-events-endpoint %s: %w", c.KVEventsEndpoint, w.Serve(ln))
		}
		workers = append(workers, w)
		wg.Go(func() {
			if err := w.Serve(ln); err != nil {
				errc <- fmt.Errorf("%s: %w", addr, err)
			}
		})
		eff := w.Config()
		log.Info("simworker listening", "addr", "http://"+ln.Addr().String(), "name", w.Name(), "models", eff.Models,
			"block_tokens", eff.BlockTokens, "cache_blocks", eff.CacheBlocks, "latency_model", eff.LatencyModel,
			"per_token", eff.PerToken, "step_base", eff.StepBase, "decode_per_seq", eff.DecodePerSeq,
			"max_num_batched_tokens", eff.MaxNumBatchedTokens, "overhead", eff.Overhead, "inter_token", eff.InterToken,
			"max_num_seqs", eff.MaxNumSeqs, "zero_work", eff.ZeroWork, "engine_id", w.EngineID(),
			"kv_hold_timeout", eff.KVHoldTimeout, "kv_transfer_latency", eff.KVTransferLatency, "kv_transfer_per_token", eff.KVTransferPerToken,
			"time_scale", eff.TimeScale, "error_rate", eff.ErrorRate, "drop_rate", eff.DropRate,
			"unavailable", windows.String(), "strict_tool_ids", eff.StrictToolIDs,
			"kv_events", w.KVEventsAddr(), "kv_events_replay", w.KVEventsReplayAddr())
	}

	var err error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "signal", context.Cause(ctx))
	case err = <-errc:
		log.Error("serve failed", "err", err)
	}
	for _, w := range workers {
		st := w.Stats()
		if cerr := w.Close(); cerr != nil {
			log.Warn("close", "name", w.Name(), "err", cerr)
		}
		log.Info("worker stopped", "name", w.Name(), "requests", st.Requests, "errors", st.Errors,
			"prefix_hits", st.PrefixHits, "prefix_queries", st.PrefixQueries)
	}
	wg.Wait()
	return err
}

// nthEndpoint is the ZMQ endpoint of the i-th of --count workers: ep with
// its TCP port moved up by i (port 0 stays 0: each binds a free one), an
// IPC path suffixed with -i from the second on; "" stays "".
func nthEndpoint(ep string, i int) (string, error) {
	if ep == "" || i == 0 {
		return ep, nil
	}
	if path, ok := strings.CutPrefix(ep, "ipc://"); ok {
		return "ipc://" + path + "-" + strconv.Itoa(i), nil
	}
	addr, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", fmt.Errorf("endpoint %q: want tcp://host:port or ipc://path", ep)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", ep, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p+i > 65535 {
		return "", fmt.Errorf("endpoint %q: bad port", ep)
	}
	if p == 0 {
		return ep, nil
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(p+i)), nil
}
