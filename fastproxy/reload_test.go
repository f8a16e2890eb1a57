package fastproxy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
)

// syncBuffer is an io.Writer the test can read while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("audit line is not one JSON object: %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// Every admin call is one audit line naming who (the admin key's name,
// "loopback" on the loopback listener, "" when refused), what (method,
// path, worker, model) and the status; a scrape of /metrics and inference
// are not audited.
func TestAuditLinesNameTheAdminKey(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	var audit syncBuffer
	r := startRouter(t, nil, "round_robin", func(c *fastproxy.Config, l *loadview.Config) {
		c.AdminAPIKey = "single"
		c.AdminAPIKeys = []string{"ops:k-ops", "k-bare"}
		c.Audit = &audit
		l.AllowedWorkers = []string{"127.0.0.0/8"}
	})
	bearer := func(k string) map[string]string { return map[string]string{"Authorization": "Bearer " + k} }
	if resp, b := do(t, "POST", r.url+"/add_worker?url="+urls[0], "", bearer("k-ops")); resp.StatusCode != 200 {
		t.Fatalf("add: %d %s", resp.StatusCode, b)
	}
	do(t, "POST", r.url+"/workers", `{"url":"http://evil.example:8000"}`, bearer("single"))
	do(t, "GET", r.url+"/workers", "", bearer("wrong"))
	do(t, "GET", r.url+"/metrics", "", bearer("single"))
	do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), nil)
	do(t, "DELETE", r.url+"/workers/"+url.PathEscape(urls[0]), "", bearer("k-bare"))
	do(t, "GET", r.adminURL(t)+"/list_workers", "", nil)
	got := audit.lines(t)
	want := []struct {
		who, method, path, worker string
		status                    float64
	}{
		{"ops", "POST", "/add_worker", urls[0], 200},
		{"admin", "POST", "/workers", "http://evil.example:8000", 403},
		{"", "GET", "/workers", "", 401},
		{"key-", "DELETE", "/workers/", urls[0], 200},
		{"loopback", "GET", "/list_workers", "", 200},
	}
	if len(got) != len(want) {
		t.Fatalf("%d audit lines, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		who, _ := g["who"].(string)
		path, _ := g["path"].(string)
		worker, _ := g["worker"].(string)
		if !strings.HasPrefix(who, w.who) || (w.who == "" && who != "") || g["method"] != w.method ||
			!strings.HasPrefix(path, w.path) || worker != w.worker || g["status"] != w.status ||
			g["time"] == nil || g["request_id"] == "" {
			t.Errorf("line %d: %v, want %+v", i, g, w)
		}
	}
	for _, l := range got {
		for _, secret := range []string{"single", "k-ops", "k-bare", "wrong"} {
			if b, _ := json.Marshal(l); bytes.Contains(b, []byte(secret)) {
				t.Errorf("an audit line carries the key %q: %s", secret, b)
			}
		}
	}
}

// POST /reload runs Config.Reload and counts it; a rejected reload
// answers 422 and changes nothing; SetAuth swaps the keys for the requests
// that follow, while requests with a key both tables hold never fail.
func TestReloadEndpointAndSetAuthUnderLoad(t *testing.T) {
	_, urls := startSims(t, 2, fastSim())
	var r *testRouter
	var fail atomic.Bool
	var swaps atomic.Int64
	r = startRouter(t, urls, "round_robin", func(c *fastproxy.Config, _ *loadview.Config) {
		c.AdminAPIKey = "adm"
		c.ClientAPIKeys = []string{"t1:ka"}
		c.Reload = func() error {
			if fail.Load() {
				return errors.New("keys: no keys in /etc/keys")
			}
			n := swaps.Add(1)
			keys := []string{"t1:ka", "t2:kb"}
			if n%2 == 0 {
				keys = []string{"t1:ka", "t3:kc"}
			}
			r.srv.SetAuth(fastproxy.Auth{ClientAPIKeys: keys, AdminAPIKey: "adm"})
			return nil
		}
	})
	admin := map[string]string{"Authorization": "Bearer adm"}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed, served atomic.Int64
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody("m", "hello", g%2 == 0)))
				req.Header.Set("Authorization", "Bearer ka")
				resp, err := http.DefaultClient.Do(req) // not do: t.Fatal belongs to the test's goroutine
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != 200 {
					failed.Add(1)
				}
				served.Add(1)
			}
		}()
	}
	for i := 0; i < 20; i++ {
		at := served.Load()
		testwait.Until(t, "requests between reloads", func() bool { return served.Load() > at+2 })
		if resp, b := do(t, "POST", r.url+"/reload", "", admin); resp.StatusCode != 200 {
			t.Fatalf("reload %d: %d %s", i, resp.StatusCode, b)
		}
	}
	close(stop)
	wg.Wait()
	if failed.Load() != 0 || served.Load() == 0 {
		t.Fatalf("%d of %d requests failed across 20 key swaps", failed.Load(), served.Load())
	}
	// 20 swaps: the last table is {ka, kc}.
	if resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "x", false), map[string]string{"Authorization": "Bearer kc"}); resp.StatusCode != 200 {
		t.Fatalf("a key of the new table: %d", resp.StatusCode)
	}
	if resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "x", false), map[string]string{"Authorization": "Bearer kb"}); resp.StatusCode != 401 {
		t.Fatalf("a key the reload dropped: %d, want 401", resp.StatusCode)
	}
	fail.Store(true)
	resp, b := do(t, "POST", r.url+"/reload", "", admin)
	if resp.StatusCode != 422 || !strings.Contains(string(b), "reload_rejected") {
		t.Fatalf("a failed reload: %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "x", false), map[string]string{"Authorization": "Bearer kc"}); resp.StatusCode != 200 {
		t.Fatalf("after a rejected reload the keys changed: %d", resp.StatusCode)
	}
	if ok, bad := r.counter(`vllm_router_config_reloads_total{result="ok"}`), r.counter(`vllm_router_config_reloads_total{result="error"}`); ok != 20 || bad != 1 {
		t.Fatalf("reloads ok=%d error=%d, want 20 and 1", ok, bad)
	}
	if resp, _ := do(t, "GET", r.url+"/reload", "", admin); resp.StatusCode != 405 {
		t.Fatalf("GET /reload: %d, want 405", resp.StatusCode)
	}
	if resp, _ := do(t, "POST", r.url+"/reload", "", nil); resp.StatusCode != 401 {
		t.Fatalf("POST /reload without the admin key: %d, want 401", resp.StatusCode)
	}
}

// Without Config.Reload there is no /reload; Reload says so.
func TestNoReloadConfigured(t *testing.T) {
	r := startRouter(t, nil, "round_robin", nil)
	if resp, _ := do(t, "POST", r.adminURL(t)+"/reload", "", nil); resp.StatusCode != 404 {
		t.Fatalf("POST /reload without Config.Reload: %d, want 404", resp.StatusCode)
	}
	if err := r.srv.Reload(); err == nil {
		t.Fatal("Reload without Config.Reload succeeded")
	}
}
