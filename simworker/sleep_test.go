package simworker

import (
	"net/http"
	"strings"
	"testing"
)

// cachedTokens sends body to url's chat endpoint and returns the answer's
// cached_tokens; it fails the test unless the status is 200.
func cachedTokens(t *testing.T, url string, body msg) int {
	t.Helper()
	code, b := post(t, url+"/v1/chat/completions", body)
	if code != 200 {
		t.Fatalf("chat: %d %s", code, b)
	}
	return num(path(decodeJSON(t, b), "usage", "prompt_tokens_details", "cached_tokens"))
}

func isSleeping(t *testing.T, url string) bool {
	t.Helper()
	code, b := get(t, http.MethodGet, url+"/is_sleeping")
	if code != 200 {
		t.Fatalf("is_sleeping: %d %s", code, b)
	}
	v, ok := decodeJSON(t, b)["is_sleeping"].(bool)
	if !ok {
		t.Fatalf("is_sleeping body %s", b)
	}
	return v
}

// warmWorker starts a worker (the legacy latency model or the engine
// model) and sends it prompt until its prefix cache holds it: the second
// identical request must find tokens cached.
func warmWorker(t *testing.T, legacy bool, prompt string) (*Worker, string, msg) {
	t.Helper()
	cfg := Config{TimeScale: 0}
	if legacy {
		cfg.LatencyModel = LatencyLegacy
	}
	w, url := startWorker(t, cfg)
	body := msg{"model": "sim-model", "messages": []any{user(prompt)}}
	cachedTokens(t, url, body)
	if got := cachedTokens(t, url, body); got == 0 {
		t.Fatal("warm-up: second identical request found nothing cached")
	}
	return w, url, body
}

// TestSleepWakeUp: /sleep makes inference answer 503 (OpenAI-shaped, and
// Anthropic-shaped on /v1/messages) while health, models and /is_sleeping
// keep answering; /wake_up serves again, from a cold prefix cache, at either
// level (docs/design.md §6).
func TestSleepWakeUp(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		for _, level := range []string{"", "1", "2"} {
			w, url, body := warmWorker(t, legacy, strings.Repeat("a long shared system prompt ", 40))
			if isSleeping(t, url) {
				t.Fatal("awake worker says it sleeps")
			}
			q := ""
			if level != "" {
				q = "?level=" + level
			}
			if code, b := post(t, url+"/sleep"+q, []byte(nil)); code != 200 || len(b) != 0 {
				t.Fatalf("sleep%s: %d %q", q, code, b)
			}
			if !isSleeping(t, url) {
				t.Fatal("slept worker says it is awake")
			}
			if on, lv := w.Sleeping(); !on || (level == "2") != (lv == 2) {
				t.Fatalf("Sleeping() = %v, %d after level %q", on, lv, level)
			}
			code, b := post(t, url+"/v1/chat/completions", body)
			if code != 503 || path(decodeJSON(t, b), "error", "type") != "ModelSleepingError" {
				t.Fatalf("chat while asleep: %d %s", code, b)
			}
			code, b = post(t, url+"/v1/messages", msg{"model": "sim-model", "max_tokens": 4, "messages": []any{user("hi")}})
			if code != 503 || path(decodeJSON(t, b), "type") != "error" {
				t.Fatalf("messages while asleep: %d %s", code, b)
			}
			for _, p := range []string{"/health", "/v1/models", "/metrics"} {
				if code, _ := get(t, http.MethodGet, url+p); code != 200 {
					t.Fatalf("%s while asleep: %d", p, code)
				}
			}
			if code, b := post(t, url+"/wake_up?tags=weights", []byte(nil)); code != 200 || len(b) != 0 {
				t.Fatalf("wake_up: %d %q", code, b)
			}
			if isSleeping(t, url) {
				t.Fatal("woken worker says it sleeps")
			}
			if got := cachedTokens(t, url, body); got != 0 {
				t.Fatalf("first request after wake-up found %d tokens cached: sleep discards the KV cache", got)
			}
			if got := cachedTokens(t, url, body); got == 0 {
				t.Fatal("the cache does not fill again after wake-up")
			}
		}
	}
}

// TestSleepBadLevelAndMethods: a level other than 1 or 2 is 400 and leaves
// the worker awake; wrong methods are 405.
func TestSleepBadLevelAndMethods(t *testing.T) {
	_, url := startWorker(t, Config{TimeScale: 0})
	for _, q := range []string{"?level=0", "?level=3", "?level=x"} {
		if code, b := post(t, url+"/sleep"+q, []byte(nil)); code != 400 {
			t.Fatalf("sleep%s: %d %s", q, code, b)
		}
	}
	if isSleeping(t, url) {
		t.Fatal("a refused sleep call put the worker to sleep")
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/sleep"}, {http.MethodGet, "/wake_up"}, {http.MethodPost, "/is_sleeping"}, {http.MethodGet, "/reset_prefix_cache"},
	} {
		if code, _ := get(t, c.method, url+c.path); code != 405 {
			t.Fatalf("%s %s: %d, want 405", c.method, c.path, code)
		}
	}
	// Waking an awake worker is harmless, as in vLLM.
	if code, _ := post(t, url+"/wake_up", []byte(nil)); code != 200 {
		t.Fatalf("wake_up while awake: %d", code)
	}
}

// TestResetPrefixCache: POST /reset_prefix_cache answers 200 with an empty
// body, as vLLM does, and the next identical prompt finds nothing cached.
func TestResetPrefixCache(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		w, url, body := warmWorker(t, legacy, strings.Repeat("cache me if you can ", 50))
		if code, b := post(t, url+"/reset_prefix_cache", []byte(nil)); code != 200 || len(b) != 0 {
			t.Fatalf("reset_prefix_cache: %d %q", code, b)
		}
		if st := w.Stats(); st.CacheBlocksUsed != 0 {
			t.Fatalf("blocks still in use after the reset: %+v", st)
		}
		if got := cachedTokens(t, url, body); got != 0 {
			t.Fatalf("after the reset: cached_tokens %d, want 0", got)
		}
	}
}

// TestZeroWorkSleeps: zero-work mode answers 503 while asleep too.
func TestZeroWorkSleeps(t *testing.T) {
	_, url := startWorker(t, Config{ZeroWork: true})
	post(t, url+"/sleep", []byte(nil))
	if code, _ := post(t, url+"/v1/chat/completions", []byte(`{}`)); code != 503 {
		t.Fatalf("zero-work while asleep: %d", code)
	}
	post(t, url+"/wake_up", []byte(nil))
	if code, _ := post(t, url+"/v1/chat/completions", []byte(`{}`)); code != 200 {
		t.Fatalf("zero-work after wake-up: %d", code)
	}
}
