package loadview

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"
)

// A simworker-style exposition (metadata, two models, other series around).
const vllmExposition = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="qwen"} 3
vllm:num_requests_running{model_name="llama"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="qwen"} 1
vllm:num_requests_waiting{model_name="llama"} 0
vllm:kv_cache_usage_perc{model_name="qwen"} 0.25
vllm:kv_cache_usage_perc{model_name="llama"} 0.25
vllm:num_requests_running_total 99
vllm:prefix_cache_hits_total{model_name="qwen"} 1234
vllm:time_to_first_token_seconds_bucket{model_name="qwen",le="+Inf"} 7
process_cpu_seconds_total 1.5
`

func parseOK(t *testing.T, body string, engines int) vllmLoad {
	t.Helper()
	ld := vllmLoad{byEngine: make([]engineLoad, engines)}
	if err := parseVLLMLoad([]byte(body), &ld); err != nil {
		t.Fatalf("parse %q: %v", body, err)
	}
	return ld
}

func TestParseVLLMLoadSumsModels(t *testing.T) {
	ld := parseOK(t, vllmExposition, 0)
	if got := ld.total; got.running != 5 || got.waiting != 1 || got.kv != 0.25 || got.seen != seenRunning|seenWaiting|seenKV || ld.engines {
		t.Fatalf("total %+v engines %v", got, ld.engines)
	}
	// Windows line ends, blanks, a timestamp, the old KV name, a label value
	// holding an escaped quote, a brace and a comma, a trailing comma.
	ld = parseOK(t, "\r\n  vllm:num_requests_running 7 1712345678000\r\n"+
		"vllm:gpu_cache_usage_perc 0.5\r\n"+
		`vllm:num_requests_waiting{model_name="a\"},b",} 4`+"\n\n"+
		"vllm:num_requests_waiting {model_name=\"c\"}\t1e0", 0)
	if got := ld.total; got.running != 7 || got.waiting != 5 || got.kv != 0.5 {
		t.Fatalf("total %+v", got)
	}
	if ld := parseOK(t, "# only comments\nother_metric 1\n", 0); ld.total.seen != 0 {
		t.Fatalf("seen %v without the series", ld.total.seen)
	}
}

func TestParseVLLMLoadEngines(t *testing.T) {
	ld := parseOK(t, `vllm:num_requests_running{engine="0",model_name="m"} 4
vllm:num_requests_running{engine="1",model_name="m"} 1
vllm:num_requests_waiting{model_name="m",engine="1"} 2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:num_requests_running{engine="7",model_name="m"} 10
vllm:num_requests_running{engine="x",model_name="m"} 100
`, 2)
	if !ld.engines || ld.total.running != 115 || ld.total.waiting != 2 {
		t.Fatalf("total %+v engines %v", ld.total, ld.engines)
	}
	if e := ld.byEngine[0]; e.running != 4 || e.waiting != 0 || e.seen != seenRunning {
		t.Fatalf("engine 0 %+v", e)
	}
	if e := ld.byEngine[1]; e.running != 1 || e.waiting != 2 || e.kv != 0.75 {
		t.Fatalf("engine 1 %+v", e)
	}
}

func TestParseCapacity(t *testing.T) {
	for _, c := range []struct {
		body string
		want int64
	}{
		{vllmExposition, 0},
		{`vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="661",num_cpu_blocks="None"} 1`, 16 * 661},
		// One series per engine: the engines' pools add up.
		{"vllm:cache_config_info{engine=\"0\",block_size=\"16\",num_gpu_blocks=\"10\"} 1\n" +
			"vllm:cache_config_info{engine=\"1\",block_size=\"16\",num_gpu_blocks=\"20\"} 1.0", 16 * 30},
		{`vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1`, 0},
		{`vllm:cache_config_info{num_gpu_blocks="100"} 1`, 0},
		{`vllm:cache_config_info{block_size="16",num_gpu_blocks="-5"} 1`, 0},
		{`vllm:cache_config_info 1`, 0},
		// SGLang: ranks of one pool repeat it; vLLM's wins when both state one.
		{"sglang:max_total_num_tokens{model_name=\"m\",tp_rank=\"0\"} 161721.0\nsglang:max_total_num_tokens{model_name=\"m\",tp_rank=\"1\"} 161721.0", 161721},
		{"sglang:max_total_num_tokens 500\n" + `vllm:cache_config_info{block_size="2",num_gpu_blocks="3"} 1`, 6},
	} {
		ld := parseOK(t, c.body, 2)
		if got := ld.total.capacityTokens(); got != c.want {
			t.Errorf("capacity %d from %q, want %d", got, c.body, c.want)
		}
		if ld.engines {
			t.Errorf("capacity series split the load by engine: %q", c.body)
		}
	}
	ld := parseOK(t, "vllm:cache_config_info{engine=\"1\",block_size=\"16\",num_gpu_blocks=\"20\"} 1", 2)
	if ld.byEngine[1].capacityTokens() != 320 || ld.byEngine[0].capacityTokens() != 0 {
		t.Fatalf("per engine %+v", ld.byEngine)
	}
}

func TestParseVLLMLoadRejectsGarbage(t *testing.T) {
	for _, body := range []string{
		"vllm:num_requests_running NaN",
		"vllm:num_requests_running +Inf",
		"vllm:num_requests_waiting -Inf",
		"vllm:num_requests_running -1",
		"vllm:num_requests_running abc",
		"vllm:num_requests_running",
		"vllm:num_requests_running{model_name=\"m\"}",
		"vllm:num_requests_running{model_name=\"m\" 3",
		"vllm:num_requests_running{model_name=\"m} 3",
		"vllm:num_requests_running{model_name=m} 3",
		"vllm:num_requests_running{=\"m\"} 3",
		"vllm:num_requests_running{a=\"1\" b=\"2\"} 3",
		"vllm:num_requests_running 1e300",
		"vllm:kv_cache_usage_perc 1.5",
		"vllm:num_requests_running 600000000\nvllm:num_requests_running 600000000",
		"vllm:num_requests_running 1\nvllm:num_requests_waiting NaN\n",
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="5"} NaN`,
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="5"`,
		`vllm:cache_config_info{block_size="100000",num_gpu_blocks="5"} 1`,
		`vllm:cache_config_info{block_size="16",num_gpu_blocks="999999999999"} 1`,
		strings.Repeat(`vllm:cache_config_info{block_size="65536",num_gpu_blocks="4294967296"} 1`+"\n", 2),
		"sglang:max_total_num_tokens 1e300",
		"sglang:max_total_num_tokens -1",
	} {
		ld := vllmLoad{}
		if err := parseVLLMLoad([]byte(body), &ld); err == nil {
			t.Errorf("parse %q: no error, got %+v", body, ld.total)
		}
	}
}

// The exposition as VictoriaMetrics/metrics writes it (the library the
// simulated worker uses), metadata included.
func TestParseVLLMLoadVictoriaMetricsFormat(t *testing.T) {
	s := metrics.NewSet()
	s.NewGauge(`vllm:num_requests_running{model_name="a"}`, func() float64 { return 3 })
	s.NewGauge(`vllm:num_requests_running{model_name="b"}`, func() float64 { return 4 })
	s.NewGauge(`vllm:num_requests_waiting{model_name="a"}`, func() float64 { return 2 })
	s.NewGauge(`vllm:kv_cache_usage_perc{model_name="a"}`, func() float64 { return 0.125 })
	s.NewCounter(`vllm:prompt_tokens_total{model_name="a"}`).Add(10)
	metrics.ExposeMetadata(true)
	defer metrics.ExposeMetadata(false)
	var buf bytes.Buffer
	s.WritePrometheus(&buf)
	ld := parseOK(t, buf.String(), 0)
	if ld.total.running != 7 || ld.total.waiting != 2 || ld.total.kv != 0.125 {
		t.Fatalf("total %+v from\n%s", ld.total, buf.String())
	}
}

func FuzzParseVLLMLoad(f *testing.F) {
	f.Add([]byte(vllmExposition))
	f.Add([]byte(`vllm:num_requests_running{engine="1",model_name="a\"b"} 4 123`))
	f.Add([]byte("vllm:kv_cache_usage_perc 0x1p-2\nvllm:num_requests_waiting{} 1"))
	f.Add([]byte("vllm:num_requests_running{engine=\"0\"\n} 1"))
	f.Add([]byte(`vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="661"} 1`))
	f.Add([]byte("sglang:max_total_num_tokens{model_name=\"m\"} 161721.0\nvllm:num_requests_waiting 2"))
	f.Fuzz(func(t *testing.T, body []byte) {
		ld := vllmLoad{byEngine: make([]engineLoad, 3)}
		if err := parseVLLMLoad(body, &ld); err != nil {
			return
		}
		for _, e := range append([]engineLoad{ld.total}, ld.byEngine...) {
			for _, v := range []float64{e.running, e.waiting, e.kv} {
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					t.Fatalf("accepted %v from %q", v, body)
				}
			}
			if e.kv > 1 || e.running > maxReportedRequests || e.waiting > maxReportedRequests {
				t.Fatalf("accepted %+v from %q", e, body)
			}
			if c := e.capacityTokens(); c < 0 || c > maxCapacityTokens || math.IsNaN(e.capSGL) || math.IsNaN(e.capVLLM) {
				t.Fatalf("accepted capacity %d (%+v) from %q", c, e, body)
			}
		}
		// Comments and other series change nothing.
		again := vllmLoad{byEngine: make([]engineLoad, 3)}
		noise := "# HELP x\nother{a=\"}\"} NaN\n" + string(body)
		if err := parseVLLMLoad([]byte(noise), &again); err != nil || again.total != ld.total {
			t.Fatalf("noise changed the result: %v %+v vs %+v", err, again.total, ld.total)
		}
		if strings.Count(string(body), "vllm:")+strings.Count(string(body), "sglang:") == 0 && ld.total.seen != 0 {
			t.Fatalf("seen series in %q", body)
		}
	})
}

// A decode worker's failed KV loads are vLLM's NIXL counter, summed over
// engines and kept per engine; garbage in it fails the exposition.
func TestParseKVLoadFailures(t *testing.T) {
	ld := parseOK(t, `# TYPE vllm:nixl_num_failed_transfers_total counter
vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 2.0
vllm:nixl_num_failed_transfers_total{engine="1",model_name="m"} 3.0
vllm:nixl_num_failed_notifications_total{engine="0",model_name="m"} 9.0
vllm:num_requests_running{model_name="m"} 1
`, 2)
	if ld.total.kvFails != 5 || ld.byEngine[1].kvFails != 3 || ld.engines {
		t.Fatalf("total %+v, engine 1 %+v, engines %v", ld.total, ld.byEngine[1], ld.engines)
	}
	var bad vllmLoad
	if err := parseVLLMLoad([]byte("vllm:nixl_num_failed_transfers_total -1\n"), &bad); err == nil {
		t.Fatal("a negative count parsed")
	}
}
