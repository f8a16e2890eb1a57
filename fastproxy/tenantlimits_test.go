package fastproxy_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/sharedstate"
)

// usageAnswer is a chat answer that reports 10 prompt and 15 completion tokens.
const usageAnswer = `{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":15,"total_tokens":25}}`

// textChunk is one streamed chat chunk delivering one token of text.
const textChunk = `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null}]}` + "\n\n"

// limitedRouter starts a router in front of up with the key lines keys,
// counting in shared when it is not nil.
func limitedRouter(t *testing.T, up string, keys []string, shared *sharedstate.Store) *testRouter {
	t.Helper()
	return startRouter(t, []string{up}, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) {
		c.ClientAPIKeys, c.Shared = keys, shared
	})
}

func chatAs(t *testing.T, url, key, body string) (*http.Response, []byte) {
	t.Helper()
	return do(t, "POST", url+"/v1/chat/completions", body, map[string]string{"Authorization": "Bearer " + key})
}

// wantLimitHeaders fails unless h carries kind's x-ratelimit-* headers with
// the limit and remaining given and a reset in Go's duration format.
func wantLimitHeaders(t *testing.T, h http.Header, kind string, limit, remaining int64) {
	t.Helper()
	if got := h.Get("x-ratelimit-limit-" + kind); got != strconv.FormatInt(limit, 10) {
		t.Fatalf("x-ratelimit-limit-%s %q, want %d", kind, got, limit)
	}
	if got := h.Get("x-ratelimit-remaining-" + kind); got != strconv.FormatInt(remaining, 10) {
		t.Fatalf("x-ratelimit-remaining-%s %q, want %d", kind, got, remaining)
	}
	d, err := time.ParseDuration(h.Get("x-ratelimit-reset-" + kind))
	if err != nil || d < 0 || d > time.Minute {
		t.Fatalf("x-ratelimit-reset-%s %q: want a duration within a minute", kind, h.Get("x-ratelimit-reset-"+kind))
	}
}

// TestTenantRequestLimit: a tenant past its requests per minute gets 429
// with Retry-After and OpenAI's rate-limit headers, which every answer of
// it carries (served, refused, and an error answer); a tenant without
// limits is unaffected and gets no such headers.
func TestTenantRequestLimit(t *testing.T) {
	up := startEcho(t, []byte(usageAnswer), nil, 0)
	r := limitedRouter(t, up.url, []string{"alpha:ka rpm=2", "", "# beta has no limit", "beta:kb"}, nil)
	body := chatBody("m", "hi", false)
	for i := int64(1); i <= 2; i++ {
		resp, b := chatAs(t, r.url, "ka", body)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		wantLimitHeaders(t, resp.Header, "requests", 2, 2-i)
		if resp.Header.Get("x-ratelimit-limit-tokens") != "" {
			t.Fatal("a tenant without a token limit got token headers")
		}
	}
	resp, b := chatAs(t, r.url, "ka", body)
	if resp.StatusCode != 429 || !strings.Contains(string(b), `"code":"rate_limit_exceeded"`) || !strings.Contains(string(b), `"type":"requests"`) {
		t.Fatalf("over the limit: %d %s", resp.StatusCode, b)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q", resp.Header.Get("Retry-After"))
	}
	wantLimitHeaders(t, resp.Header, "requests", 2, 0)
	for i := 0; i < 5; i++ {
		resp, b := chatAs(t, r.url, "kb", body)
		if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-limit-requests") != "" {
			t.Fatalf("the other tenant: %d %v %s", resp.StatusCode, resp.Header, b)
		}
	}
	if n := r.counter(`vllm_router_tenant_limited_total{tenant="alpha",limit="requests"}`); n != 1 {
		t.Fatalf("limited requests counted %d, want 1", n)
	}
	// An error answer of the limited tenant (here the limit's own) and a
	// 401 of a wrong key: only the tenant's carries the headers.
	resp, _ = chatAs(t, r.url, "wrong", body)
	if resp.StatusCode != 401 || resp.Header.Get("x-ratelimit-limit-requests") != "" {
		t.Fatalf("a wrong key: %d %v", resp.StatusCode, resp.Header)
	}
}

// TestTenantRequestLimitErrorAnswers: a limited tenant's error answers
// (a malformed body, an unknown model) carry the headers too.
func TestTenantRequestLimitErrorAnswers(t *testing.T) {
	up := startEcho(t, []byte(usageAnswer), nil, 0)
	r := limitedRouter(t, up.url, []string{"alpha:ka rpm=10 tpm=1000"}, nil)
	resp, _ := chatAs(t, r.url, "ka", `{"model":`)
	if resp.StatusCode != 400 {
		t.Fatalf("malformed body: %d", resp.StatusCode)
	}
	wantLimitHeaders(t, resp.Header, "requests", 10, 9)
	if resp.Header.Get("x-ratelimit-limit-tokens") != "1000" || resp.Header.Get("x-ratelimit-remaining-tokens") != "1000" ||
		resp.Header.Get("x-ratelimit-reset-tokens") != "0s" {
		t.Fatalf("token headers before any token was spent: %v", resp.Header)
	}
}

// TestTenantTokenLimitFromUsage: an answer's usage (prompt + completion)
// is charged once it is done; the tenant is refused once its tokens
// reached the limit, having overshot it by the answer that crossed it.
func TestTenantTokenLimitFromUsage(t *testing.T) {
	up := startEcho(t, []byte(usageAnswer), nil, 0)
	r := limitedRouter(t, up.url, []string{"alpha:ka tpm=40", "beta:kb tpm=40"}, nil)
	body := chatBody("m", "hi", false)
	resp, b := chatAs(t, r.url, "ka", body)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	wantLimitHeaders(t, resp.Header, "tokens", 40, 15) // 25 charged before the headers of a whole answer
	resp, _ = chatAs(t, r.url, "ka", body)
	if resp.StatusCode != 200 {
		t.Fatalf("second request under the limit: %d", resp.StatusCode)
	}
	wantLimitHeaders(t, resp.Header, "tokens", 40, 0) // 50: one answer over
	resp, b = chatAs(t, r.url, "ka", body)
	if resp.StatusCode != 429 || !strings.Contains(string(b), `"type":"tokens"`) {
		t.Fatalf("over the token limit: %d %s", resp.StatusCode, b)
	}
	wantLimitHeaders(t, resp.Header, "tokens", 40, 0)
	if resp, _ := chatAs(t, r.url, "kb", body); resp.StatusCode != 200 {
		t.Fatalf("the other tenant: %d", resp.StatusCode)
	}
	if n := r.counter(`vllm_router_tenant_limited_total{tenant="alpha",limit="tokens"}`); n != 1 {
		t.Fatalf("limited counted %d", n)
	}
}

// remainingTokens reads the tenant's remaining tokens from a /v1/models
// answer, which spends none.
func remainingTokens(t *testing.T, url, key string) string {
	resp, _ := do(t, "GET", url+"/v1/models", "", map[string]string{"Authorization": "Bearer " + key})
	return resp.Header.Get("x-ratelimit-remaining-tokens")
}

// TestTenantTokenLimitFromStream: a stream is charged when it ends, from
// its usage when it reports one, else one token per text event delivered
// plus the request's bytes over 4 for the prompt.
func TestTenantTokenLimitFromStream(t *testing.T) {
	chunks := [][]byte{[]byte(textChunk), []byte(textChunk + textChunk), []byte(textChunk[:40]), []byte(textChunk[40:] + textChunk)}
	body := chatBody("m", "hi", false)
	body = body[:len(body)-1] + `,"stream":true}`
	t.Run("without usage", func(t *testing.T) {
		up := startEcho(t, nil, append(chunks, []byte("data: [DONE]\n\n")), 0)
		r := limitedRouter(t, up.url, []string{"alpha:ka tpm=1000"}, nil)
		resp, b := chatAs(t, r.url, "ka", body)
		if resp.StatusCode != 200 || strings.Count(string(b), `"content":"x"`) != 5 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		want := strconv.Itoa(1000 - 5 - (len(body)+3)/4)
		testwait.Until(t, "the stream's tokens charged", func() bool { return remainingTokens(t, r.url, "ka") == want },
			func() string { return "remaining " + remainingTokens(t, r.url, "ka") + ", want " + want })
	})
	t.Run("with usage", func(t *testing.T) {
		usage := `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":70,"completion_tokens":30,"total_tokens":100}}` + "\n\n"
		up := startEcho(t, nil, append(chunks, []byte(usage), []byte("data: [DONE]\n\n")), 0)
		r := limitedRouter(t, up.url, []string{"alpha:ka tpm=1000"}, nil)
		if resp, b := chatAs(t, r.url, "ka", body); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		testwait.Until(t, "the stream's usage charged", func() bool { return remainingTokens(t, r.url, "ka") == "900" },
			func() string { return "remaining " + remainingTokens(t, r.url, "ka") })
	})
}

// sharedStore opens a store on redis with bounds generous for -race on
// shared cores.
func sharedStore(t *testing.T, redis *redistest.Server) *sharedstate.Store {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: redis.URL(), Logger: quiet,
		ReadTimeout: 2 * time.Second, PingTimeout: 2 * time.Second, HealthInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// TestTenantLimitAcrossReplicas: two routers on one Redis count a tenant's
// requests together: its limit holds across them, and another tenant is
// unaffected on both.
func TestTenantLimitAcrossReplicas(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	up := startEcho(t, []byte(usageAnswer), nil, 0)
	keys := []string{"alpha:ka rpm=3", "beta:kb rpm=3"}
	reps := [2]*testRouter{limitedRouter(t, up.url, keys, sharedStore(t, redis)), limitedRouter(t, up.url, keys, sharedStore(t, redis))}
	body := chatBody("m", "hi", false)
	for i := int64(0); i < 3; i++ {
		resp, b := chatAs(t, reps[i%2].url, "ka", body)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		wantLimitHeaders(t, resp.Header, "requests", 3, 2-i)
	}
	for i, rep := range reps {
		resp, b := chatAs(t, rep.url, "ka", body)
		if resp.StatusCode != 429 {
			t.Fatalf("replica %d over the shared limit: %d %s", i, resp.StatusCode, b)
		}
		wantLimitHeaders(t, resp.Header, "requests", 3, 0)
		if n := rep.counter(`vllm_router_tenant_limited_total{tenant="alpha",limit="requests"}`); n != 1 {
			t.Fatalf("replica %d counted %d limited", i, n)
		}
	}
	for i, rep := range reps {
		resp, _ := chatAs(t, rep.url, "kb", body)
		if resp.StatusCode != 200 {
			t.Fatalf("the other tenant on replica %d: %d", i, resp.StatusCode)
		}
		wantLimitHeaders(t, resp.Header, "requests", 3, 2-int64(i))
		if n := rep.counter("vllm_router_tenant_limit_store_errors_total"); n != 0 {
			t.Fatalf("replica %d: %d store errors", i, n)
		}
	}
}

// TestTenantLimitRedisDownFailsOpen: with Redis gone the limits admit
// (fail open), each failure counted; the answers still name the limits.
func TestTenantLimitRedisDownFailsOpen(t *testing.T) {
	redis := redistest.Start(t, redistest.Options{})
	up := startEcho(t, []byte(usageAnswer), nil, 0)
	st := sharedStore(t, redis)
	r := limitedRouter(t, up.url, []string{"alpha:ka rpm=1 tpm=10"}, st)
	body := chatBody("m", "hi", false)
	if resp, _ := chatAs(t, r.url, "ka", body); resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	if resp, _ := chatAs(t, r.url, "ka", body); resp.StatusCode != 429 {
		t.Fatalf("over the limit with redis up: %d", resp.StatusCode)
	}
	redis.Kill()
	testwait.Until(t, "the store sees redis down", func() bool { return !st.Up() })
	for i := 0; i < 3; i++ {
		resp, b := chatAs(t, r.url, "ka", body)
		if resp.StatusCode != 200 {
			t.Fatalf("redis down, request %d: %d %s", i, resp.StatusCode, b)
		}
		if resp.Header.Get("x-ratelimit-limit-requests") != "1" || resp.Header.Get("x-ratelimit-remaining-requests") != "" {
			t.Fatalf("redis down: headers %v", resp.Header)
		}
	}
	if n := r.counter("vllm_router_tenant_limit_store_errors_total"); n < 3 {
		t.Fatalf("store errors counted %d, want ≥ 3 (each check; charges too)", n)
	}
}

// TestClientKeyInXAPIKey: a client key in x-api-key admits a request
// without Authorization and is not forwarded; next to a bearer token it
// is not read.
func TestClientKeyInXAPIKey(t *testing.T) {
	up := startEcho(t, []byte(usageAnswer), nil, 0)
	r := limitedRouter(t, up.url, []string{"claude:sk-ant-k"}, nil)
	body := chatBody("m", "hi", false)
	resp, b := do(t, "POST", r.url+"/v1/messages", body, map[string]string{"x-api-key": "sk-ant-k"})
	if resp.StatusCode != 200 {
		t.Fatalf("x-api-key: %d %s", resp.StatusCode, b)
	}
	if h := strings.ToLower(<-up.gotHdr); strings.Contains(h, "x-api-key") || strings.Contains(h, "sk-ant-k") {
		t.Fatalf("the client's key reached the worker:\n%s", h)
	}
	<-up.got
	resp, _ = do(t, "POST", r.url+"/v1/messages", body, map[string]string{"x-api-key": "sk-ant-k", "Authorization": "Bearer wrong"})
	if resp.StatusCode != 401 {
		t.Fatalf("a wrong bearer beside a right x-api-key: %d", resp.StatusCode)
	}
}
