package simworker

import (
	"hash/maphash"
	"strconv"
	"sync/atomic"

	"github.com/VictoriaMetrics/metrics"
)

// modelStats are the per-model counters and the vLLM metrics of one served
// model, labelled model_name as vLLM labels them. The prefix cache and the
// MaxNumSeqs slots are shared by the worker's models, so
// vllm:kv_cache_usage_perc is the same for each.
type modelStats struct {
	name             string
	salt             uint64 // starts the block hash chain: models share no blocks
	running, waiting atomic.Int64

	hits, queries, prompt, gen *metrics.Counter
	successStop, successLength *metrics.Counter
	successTool                *metrics.Counter
	ttft                       *metrics.PrometheusHistogram

	kvExternal, kvFailed, kvExpired *metrics.Counter // disaggregated prefill/decode (pd.go)
}

func (w *Worker) newModelStats(model string) *modelStats {
	ms := &modelStats{name: model, salt: maphash.String(hashSeed, model)}
	q := strconv.Quote(model)
	lbl := `{model_name=` + q + `}`
	s := w.set
	s.NewGauge(`vllm:num_requests_running`+lbl, func() float64 { return float64(ms.running.Load()) })
	s.NewGauge(`vllm:num_requests_waiting`+lbl, func() float64 { return float64(ms.waiting.Load()) })
	// As vLLM computes it: blocks held by running sequences over capacity
	// (cached blocks no sequence holds count as free). The legacy model holds
	// nothing, so it reports its cached blocks.
	s.NewGauge(`vllm:kv_cache_usage_perc`+lbl, func() float64 {
		if w.eng != nil {
			_, held, _ := w.eng.kvStats()
			return float64(held) / float64(w.cfg.CacheBlocks)
		}
		return float64(w.cache.used()) / float64(w.cfg.CacheBlocks)
	})
	ms.hits = s.NewCounter(`vllm:prefix_cache_hits_total` + lbl)
	ms.queries = s.NewCounter(`vllm:prefix_cache_queries_total` + lbl)
	ms.prompt = s.NewCounter(`vllm:prompt_tokens_total` + lbl)
	ms.gen = s.NewCounter(`vllm:generation_tokens_total` + lbl)
	ms.successStop = s.NewCounter(`vllm:request_success_total{finished_reason="stop",model_name=` + q + `}`)
	ms.successLength = s.NewCounter(`vllm:request_success_total{finished_reason="length",model_name=` + q + `}`)
	ms.successTool = s.NewCounter(`vllm:request_success_total{finished_reason="tool_calls",model_name=` + q + `}`)
	ms.ttft = s.NewPrometheusHistogram(`vllm:time_to_first_token_seconds` + lbl)

	// Disaggregated prefill/decode, under vLLM's names: the prompt's tokens
	// by where their KV came from (the prefix cache, a prefill worker, or
	// computed here), failed pulls (on the decode worker) and holds that
	// expired unpulled (on the prefill worker).
	ms.kvExternal = s.NewCounter(`vllm:prompt_tokens_by_source_total{model_name=` + q + `,source="external_kv_transfer"}`)
	s.NewGauge(`vllm:prompt_tokens_by_source_total{model_name=`+q+`,source="local_cache_hit"}`, func() float64 { return float64(ms.hits.Get()) })
	s.NewGauge(`vllm:prompt_tokens_by_source_total{model_name=`+q+`,source="local_compute"}`, func() float64 {
		return float64(max(int64(ms.prompt.Get())-int64(ms.hits.Get())-int64(ms.kvExternal.Get()), 0))
	})
	ms.kvFailed = s.NewCounter(`vllm:nixl_num_failed_transfers_total` + lbl)
	ms.kvExpired = s.NewCounter(`vllm:nixl_num_kv_expired_reqs_total` + lbl)
	return ms
}

// newCacheConfigInfo exports vllm:cache_config_info as vLLM does: an info
// gauge of value 1 whose labels are the engine's cache configuration as
// text, num_gpu_blocks and block_size among them (their product is the KV
// capacity in tokens a router reads, docs/design.md §8.3). One engine,
// labelled engine="0" as vLLM labels its first; the labels that mean
// nothing here carry vLLM's defaults.
func (w *Worker) newCacheConfigInfo() {
	c := w.cfg
	w.set.NewGauge(`vllm:cache_config_info{block_size="`+strconv.Itoa(c.BlockTokens)+
		`",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0"`+
		`,gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="0",num_gpu_blocks="`+strconv.Itoa(c.CacheBlocks)+
		`",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="0"}`,
		func() float64 { return 1 })
}

// acquire waits for one of the MaxNumSeqs slots, counted as waiting
// meanwhile; false when the worker closed first. On true the caller must
// call release exactly once.
func (w *Worker) acquire(ms *modelStats) bool {
	w.waiting.Add(1)
	ms.waiting.Add(1)
	defer func() {
		w.waiting.Add(-1)
		ms.waiting.Add(-1)
	}()
	select {
	case w.sem <- struct{}{}:
		w.running.Add(1)
		ms.running.Add(1)
		return true
	case <-w.done:
		return false
	}
}

func (w *Worker) release(ms *modelStats) {
	w.running.Add(-1)
	ms.running.Add(-1)
	<-w.sem
}

// finish counts a completed generation.
func (w *Worker) finish(ms *modelStats, completion int, reason string) {
	w.successful.Add(1)
	w.completionTokens.Add(uint64(completion))
	ms.gen.Add(completion)
	switch reason {
	case "length":
		ms.successLength.Inc()
	case "tool_calls":
		ms.successTool.Inc()
	default:
		ms.successStop.Inc()
	}
}
