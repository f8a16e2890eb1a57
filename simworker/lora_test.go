package simworker

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// loraError decodes vLLM's adapter-endpoint error and checks its shape.
func checkLoRAError(t *testing.T, code int, b []byte, wantStatus int, wantType string) {
	t.Helper()
	m := decodeJSON(t, b)
	if code != wantStatus || path(m, "error", "type") != wantType || num(path(m, "error", "code")) != wantStatus ||
		path(m, "error", "message") == "" {
		t.Fatalf("status %d %s, want %d %s", code, b, wantStatus, wantType)
	}
}

// modelCards returns /v1/models' cards by id.
func modelCards(t *testing.T, url string) map[string]map[string]any {
	t.Helper()
	code, b := get(t, http.MethodGet, url+"/v1/models")
	if code != 200 {
		t.Fatalf("models %d %s", code, b)
	}
	out := map[string]map[string]any{}
	for _, c := range decodeJSON(t, b)["data"].([]any) {
		c := c.(map[string]any)
		out[c["id"].(string)] = c
	}
	return out
}

func TestLoRALoadServeUnload(t *testing.T) {
	w, url := startWorker(t, Config{Models: []string{"base", "other"}, MaxModelLen: 4096, TimeScale: 0})
	chat := func(model, content string) (int, map[string]any) {
		code, b := post(t, url+"/v1/chat/completions", msg{"model": model, "messages": []any{user(content)}, "max_tokens": 2})
		return code, decodeJSON(t, b)
	}
	if code, m := chat("ad1", "x"); code != 404 || path(m, "error", "code") != "model_not_found" {
		t.Fatalf("before load: %d %v", code, m)
	}

	code, b := post(t, url+"/v1/load_lora_adapter", msg{"lora_name": "ad1", "lora_path": "/adapters/ad1"})
	if code != 200 || string(b) != "Success: LoRA adapter 'ad1' added successfully." {
		t.Fatalf("load: %d %s", code, b)
	}
	code, b = post(t, url+"/v1/load_lora_adapter", msg{"lora_name": "ad1", "lora_path": "/adapters/ad1"})
	checkLoRAError(t, code, b, 400, "InvalidUserInput")
	code, b = post(t, url+"/v1/load_lora_adapter", msg{"lora_name": "ad2"})
	checkLoRAError(t, code, b, 400, "InvalidUserInput")
	code, b = post(t, url+"/v1/load_lora_adapter", []byte(`{"lora_name":`))
	checkLoRAError(t, code, b, 400, "InvalidUserInput")
	code, b = post(t, url+"/v1/load_lora_adapter", msg{"lora_name": "other", "lora_path": "/p"})
	checkLoRAError(t, code, b, 400, "InvalidUserInput")
	if code, b := get(t, http.MethodGet, url+"/v1/load_lora_adapter"); code != 405 {
		t.Fatalf("GET load: %d %s", code, b)
	}

	// Listed as vLLM lists it; base models carry max_model_len and no parent.
	cards := modelCards(t, url)
	if len(cards) != 3 {
		t.Fatalf("cards %v", cards)
	}
	ad, base := cards["ad1"], cards["base"]
	if ad["object"] != "model" || ad["root"] != "/adapters/ad1" || ad["parent"] != "base" || ad["max_model_len"] != nil || num(ad["created"]) == 0 {
		t.Fatalf("adapter card %v", ad)
	}
	if num(base["max_model_len"]) != 4096 || base["parent"] != nil || base["root"] != "base" || num(base["created"]) == 0 {
		t.Fatalf("base card %v", base)
	}

	// Served under its own name, with its own prefix-cache namespace: the
	// base model's cached prompt is not a hit for the adapter, and back.
	prompt := strings.Repeat("shared system prompt ", 40)
	cached := func(m map[string]any) int { return num(path(m, "usage", "prompt_tokens_details", "cached_tokens")) }
	if code, m := chat("base", prompt); code != 200 || cached(m) != 0 {
		t.Fatalf("base cold: %d %v", code, m)
	}
	code, m := chat("ad1", prompt)
	if code != 200 || m["model"] != "ad1" || cached(m) != 0 {
		t.Fatalf("adapter on the base's prompt: %d %v", code, m)
	}
	if code, m := chat("ad1", prompt); code != 200 || cached(m) == 0 {
		t.Fatalf("adapter warm: %d %v", code, m)
	}
	// Counted in the base model's metrics, as vLLM labels them.
	_, b = get(t, http.MethodGet, url+"/metrics")
	if v := metricValue(t, b, `vllm:request_success_total{finished_reason="length",model_name="base"}`); v != 3 {
		t.Fatalf("base successes = %v", v)
	}

	code, b = post(t, url+"/v1/unload_lora_adapter", msg{"lora_name": "ad1"})
	if code != 200 || string(b) != "Success: LoRA adapter 'ad1' removed successfully." {
		t.Fatalf("unload: %d %s", code, b)
	}
	code, b = post(t, url+"/v1/unload_lora_adapter", msg{"lora_name": "ad1"})
	checkLoRAError(t, code, b, 404, "NotFoundError")
	code, b = post(t, url+"/v1/unload_lora_adapter", msg{})
	checkLoRAError(t, code, b, 400, "InvalidUserInput")
	if _, ok := modelCards(t, url)["ad1"]; ok || len(w.Adapters()) != 0 {
		t.Fatalf("ad1 still listed: %v", w.Adapters())
	}
	if code, m := chat("ad1", "x"); code != 404 || path(m, "error", "code") != "model_not_found" {
		t.Fatalf("after unload: %d %v", code, m)
	}
	// Loadable again after unloading.
	if code, b := post(t, url+"/v1/load_lora_adapter", msg{"lora_name": "ad1", "lora_path": "/v2"}); code != 200 {
		t.Fatalf("reload: %d %s", code, b)
	}
}

func TestLoRABounded(t *testing.T) {
	w, url := startWorker(t, Config{MaxAdapters: 3})
	for i := range 3 {
		if err := w.LoadAdapter("a"+strconv.Itoa(i), "/p"); err != nil {
			t.Fatal(err)
		}
	}
	code, b := post(t, url+"/v1/load_lora_adapter", msg{"lora_name": "a3", "lora_path": "/p"})
	checkLoRAError(t, code, b, 400, "InvalidUserInput")
	code, b = post(t, url+"/v1/load_lora_adapter", msg{"lora_name": strings.Repeat("n", maxAdapterName+1), "lora_path": "/p"})
	checkLoRAError(t, code, b, 400, "InvalidUserInput")
	if got := w.Adapters(); strings.Join(got, ",") != "a0,a1,a2" {
		t.Fatalf("adapters %v", got)
	}
	if !w.UnloadAdapter("a1") || w.LoadAdapter("a3", "/p") != nil {
		t.Fatal("a freed slot is not reusable")
	}
	if got := w.Adapters(); strings.Join(got, ",") != "a0,a2,a3" {
		t.Fatalf("adapters %v", got)
	}
}

func TestMaxModelLen(t *testing.T) {
	_, url := startWorker(t, Config{MaxModelLen: 100, CharsPerToken: 1})
	code, b := post(t, url+"/v1/completions", msg{"model": "sim-model", "prompt": strings.Repeat("x", 100)})
	if m := decodeJSON(t, b); code != 400 || !strings.Contains(path(m, "error", "message").(string), "maximum context length is 100") {
		t.Fatalf("prompt of 100 tokens: %d %s", code, b)
	}
	code, b = post(t, url+"/v1/completions", msg{"model": "sim-model", "prompt": strings.Repeat("x", 60), "max_tokens": 50})
	if code != 400 {
		t.Fatalf("60 + 50 tokens: %d %s", code, b)
	}
	code, b = post(t, url+"/v1/completions", msg{"model": "sim-model", "prompt": strings.Repeat("x", 60), "max_tokens": 40})
	if code != 200 {
		t.Fatalf("60 + 40 tokens: %d %s", code, b)
	}
}
