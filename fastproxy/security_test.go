package fastproxy_test

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
)

// TestAdminSurfacesNeedTheKey: on the inference port the admin surfaces do
// not exist without --admin-api-key, answer 401 to a missing or wrong key,
// and serve the right one; the loopback metrics listener serves them open.
func TestAdminSurfacesNeedTheKey(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	open := startRouter(t, urls, "cache_aware", nil)
	keyed := startRouter(t, urls, "cache_aware", func(c *fastproxy.Config, _ *loadview.Config) { c.AdminAPIKey = "s3cret" })
	paths := []string{"/workers", "/list_workers", "/v1/router_replay", "/debug/sessions", "/debug/pprof/"}
	for _, p := range paths {
		if resp, _ := do(t, "GET", open.url+p, "", nil); resp.StatusCode != 404 {
			t.Errorf("no admin key: GET %s = %d, want 404", p, resp.StatusCode)
		}
		for _, auth := range []string{"", "Bearer wrong", "Bearer s3cre", "s3cret"} {
			if resp, _ := do(t, "GET", keyed.url+p, "", map[string]string{"Authorization": auth}); resp.StatusCode != 401 {
				t.Errorf("GET %s with %q = %d, want 401", p, auth, resp.StatusCode)
			}
		}
		if resp, b := do(t, "GET", keyed.url+p, "", map[string]string{"Authorization": "Bearer s3cret"}); resp.StatusCode != 200 {
			t.Errorf("GET %s with the key = %d %s", p, resp.StatusCode, b)
		}
		if resp, _ := do(t, "GET", open.adminURL(t)+p, "", nil); resp.StatusCode != 200 {
			t.Errorf("loopback metrics listener: GET %s = %d", p, resp.StatusCode)
		}
	}
	// Without a key nobody on the inference port can add a worker.
	if resp, _ := do(t, "POST", open.url+"/add_worker?url=http://127.0.0.1:9", "", nil); resp.StatusCode != 404 || len(open.reg.Workers()) != 1 {
		t.Fatalf("unauthenticated add_worker: %d, %d workers", resp.StatusCode, len(open.reg.Workers()))
	}
}

func TestAdminAddHonoursTheAllowList(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, nil, "round_robin", func(_ *fastproxy.Config, l *loadview.Config) {
		l.AllowedWorkers = []string{"127.0.0.0/8"}
	})
	admin := r.adminURL(t)
	if resp, b := do(t, "POST", admin+"/add_worker?url=http://evil.example:8000", "", nil); resp.StatusCode != 403 {
		t.Fatalf("add outside the allow-list: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(t, "POST", admin+"/add_worker?url="+urls[0], "", nil); resp.StatusCode != 200 {
		t.Fatalf("add inside the allow-list: %d %s", resp.StatusCode, b)
	}
}

// TestErrorsCarryRequestIDsAndNoAddresses: every error is valid JSON with
// an x-request-id (the client's, or a generated one), and no worker address.
func TestErrorsCarryRequestIDsAndNoAddresses(t *testing.T) {
	dead := deadURL(t)
	r := startRouter(t, nil, "round_robin", nil)
	if _, err := r.reg.Add(t.Context(), dead, []string{"m"}); err != nil {
		t.Fatal(err)
	}
	r.reg.SetHealthy(r.reg.Workers()[0], true) // as if it had just died
	resp, b := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", "hi", false), map[string]string{"X-Correlation-ID": "corr-1"})
	if resp.StatusCode != 502 || resp.Header.Get("x-request-id") != "corr-1" {
		t.Fatalf("502: %d id %q %s", resp.StatusCode, resp.Header.Get("x-request-id"), b)
	}
	if strings.Contains(string(b), strings.TrimPrefix(dead, "http://")) {
		t.Fatalf("error names the worker: %s", b)
	}
	resp, b = do(t, "POST", r.url+"/v1/chat/completions", `{"model":"a\u0001b\"c","messages":[]}`, nil)
	var e struct{ Error struct{ Code string } }
	if resp.StatusCode != 404 || json.Unmarshal(b, &e) != nil || e.Error.Code != "model_not_found" || len(resp.Header.Get("x-request-id")) != 32 {
		t.Fatalf("unknown model with control bytes: %d %q %s", resp.StatusCode, resp.Header.Get("x-request-id"), b)
	}
	if status, head, _ := rawRequest(t, r.url, "GET", "/health", "X-Big: "+strings.Repeat("a", 24<<10)+"\r\n", ""); status != 200 {
		t.Fatalf("24 KiB of headers (the read buffer holds 32): %d\n%s", status, head)
	}
	status, head, body := rawRequest(t, r.url, "GET", "/health", "X-Big: "+strings.Repeat("a", 70<<10)+"\r\nAuthorization: Bearer SECRET-XYZ\r\n", "")
	if status != 431 || strings.Contains(head+body, "SECRET-XYZ") || !strings.Contains(strings.ToLower(head), "x-request-id:") {
		t.Fatalf("oversized headers: %d\n%s\n%s", status, head, body)
	}
}

// TestRequestIDPrecedence: the request id is the first configured header
// (x-request-id, x-correlation-id, x-trace-id, request-id) whose first value
// is 1–128 printable ASCII bytes, whatever order the client sends them in,
// else a generated one; the worker and the client both see it as
// X-Request-Id, once.
func TestRequestIDPrecedence(t *testing.T) {
	up := startEcho(t, []byte(`{}`), nil, 0)
	r := startRouter(t, []string{up.url}, "round_robin", nil)
	long := strings.Repeat("x", 129)
	for _, c := range []struct{ headers, want string }{
		{"Request-Id: d\r\nX-Trace-Id: c\r\nX-Correlation-ID: b\r\nx-request-id: a\r\n", "a"},
		{"Request-Id: d\r\nX-Trace-Id: c\r\n", "c"},
		{"X-Correlation-Id: b\r\nRequest-Id: d\r\n", "b"},
		{"X-Request-Id: " + long + "\r\nX-Correlation-Id: b\r\n", "b"},        // too long: the next name
		{"X-Request-Id: bad id\r\nX-Request-Id: a\r\nRequest-Id: d\r\n", "d"}, // a name's first value counts
		{"X-Request-Id: a\r\nX-Request-Id: b\r\n", "a"},                       // forwarded once
		{"X-Request-Id: " + long + "\r\n", ""},                                // generated
		{"", ""},
	} {
		status, head, _ := rawRequest(t, r.url, "POST", "/v1/chat/completions", c.headers, chatBody("m", "hi", false))
		if status != 200 {
			t.Fatalf("%q: status %d\n%s", c.headers, status, head)
		}
		got := strings.ToLower(<-up.gotHdr)
		var id string
		for line := range strings.SplitSeq(head, "\r\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(k, "x-request-id") {
				id = strings.TrimSpace(v)
			}
		}
		if status != 200 || strings.Count(strings.ToLower(head), "x-request-id:") != 1 || strings.Count(got, "x-request-id:") != 1 ||
			!strings.Contains(got, "x-request-id: "+strings.ToLower(id)+"\r\n") {
			t.Fatalf("%q: status %d, the worker saw\n%s\nthe client got\n%s", c.headers, status, got, head)
		}
		if c.want != "" && id != c.want || c.want == "" && len(id) != 32 {
			t.Errorf("%q: request id %q, want %q", c.headers, id, c.want)
		}
	}
}

// TestClientLeavingCancelsTheUpstream: a non-streaming request whose client
// hangs up closes its worker connection (vLLM aborts on that) and releases
// the worker's load at once, long before the worker would have answered.
func TestClientLeavingCancelsTheUpstream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan struct{})
	go func() { // a worker that reads the request and never answers
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		if _, err := br.ReadByte(); err != nil { // EOF: the router closed the connection
			close(closed)
		}
	}()
	r := startRouter(t, nil, "round_robin", nil)
	if _, err := r.reg.Add(t.Context(), "http://"+ln.Addr().String(), []string{"m"}); err != nil {
		t.Fatal(err)
	}
	r.reg.SetHealthy(r.reg.Workers()[0], true)
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := chatBody("m", "hi", false)
	conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)) //nolint:errcheck
	w := r.reg.Workers()[0]
	testwait.Until(t, "the request at the worker", func() bool { return w.Load() == 1 })
	conn.Close()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the worker's connection stayed open after the client left")
	}
	waitIdle(t, r.reg)
}
