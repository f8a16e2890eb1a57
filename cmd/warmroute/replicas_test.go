package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"

	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/simworker"
)

// replica is one router process (run, as main runs it) of a multi-replica
// test, with its metrics listener.
type replica struct {
	addr, metrics string
}

// startReplicas runs n routers on one Redis in front of the same workers,
// with the flags extra besides.
func startReplicas(t *testing.T, n int, redisURL string, workers []string, extra ...string) []replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var codes []chan int
	t.Cleanup(func() {
		cancel()
		for _, c := range codes {
			<-c
		}
	})
	rs := make([]replica, n)
	for i := range rs {
		mport := strconv.Itoa(redistest.FreePort(t))
		addr, code := startMain(t, ctx, append([]string{"--worker-urls", strings.Join(workers, ","), "--redis-url", redisURL,
			"--prometheus-port", mport, "--health-check-interval-secs", "3600"}, extra...)...)
		codes = append(codes, code)
		rs[i] = replica{addr: addr, metrics: "http://127.0.0.1:" + mport + "/metrics"}
	}
	return rs
}

// metric reads one series of the replica's /metrics (-1 when absent).
func (r replica) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(r.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// turn sends one chat turn to r and returns the worker that served it; any
// status but 200 fails the test.
func (r replica) turn(t *testing.T, session string, msgs []string) string {
	t.Helper()
	body := `{"model":"m","max_tokens":4,"messages":[` + strings.Join(msgs, ",") + `]}`
	req, _ := http.NewRequest("POST", "http://"+r.addr+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-ID", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("replica %s: %d %s", r.addr, resp.StatusCode, b)
	}
	return resp.Header.Get("x-vllm-router-worker") + " " + resp.Header.Get("x-vllm-router-decision")
}

// bindings counts the binding keys in Redis.
func bindings(t *testing.T, c rueidis.Client) int {
	t.Helper()
	keys, err := c.Do(context.Background(), c.B().Keys().Pattern("wr:v1:b:*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

// TestReplicasShareConversations: three routers on one Redis in front of
// three simulated workers. A conversation whose turns go round the replicas
// stays on one worker, with a session id and without; with Redis stopped
// every request is still served; after Redis returns the replicas agree on
// the bindings made during the outage.
func TestReplicasShareConversations(t *testing.T) {
	rd := redistest.Start(t, redistest.Options{})
	var workers []string
	for i := 0; i < 3; i++ {
		w, url, err := simworker.Start(simworker.Config{Models: []string{"m"}, TimeScale: 0.01, MaxTokens: 4, Seed: int64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		workers = append(workers, url)
	}
	rs := startReplicas(t, 3, rd.URL(), workers)
	raw, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{rd.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, r := range rs {
		testwait.Until(t, "replica up on redis", func() bool { return r.metric(t, "warmroute_redis_up") == 1 })
	}
	sys := `{"role":"system","content":"` + strings.Repeat("You are a travel agent. ", 60) + `"}`

	// worker of a "worker decision" string
	worker := func(s string) string { return strings.Fields(s)[0] }
	// conversation sends six turns of conversation name (its session id
	// when ids), round the replicas from first; outside an outage they must
	// all reach one worker. Bindings are published asynchronously: before
	// the next turn goes to another replica, the test waits until Redis
	// holds this turn's.
	conversation := func(name string, ids bool, first int, outage bool) {
		session := ""
		if ids {
			session = name
		}
		msgs := []string{sys, fmt.Sprintf(`{"role":"user","content":"%s turn 0"}`, name)}
		want := ""
		for i := 0; i < 6; i++ {
			n := 0
			if !outage {
				n = bindings(t, raw)
			}
			got := rs[(first+i)%3].turn(t, session, msgs)
			if want == "" {
				want = worker(got)
			} else if !outage && worker(got) != want {
				t.Fatalf("%s turn %d on replica %d: %s, want %s", name, i, (first+i)%3, got, want)
			}
			if !outage && (session == "" || i == 0) { // a session hit publishes nothing
				testwait.Until(t, "binding written", func() bool { return bindings(t, raw) > n })
			}
			msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":"answer %d"}`, i), fmt.Sprintf(`{"role":"user","content":"turn %d"}`, i+1))
		}
	}
	conversation("with-id", true, 0, false)
	conversation("no-id", false, 1, false)

	rd.Kill()
	for _, r := range rs {
		testwait.Until(t, "replica sees the outage", func() bool { return r.metric(t, "warmroute_redis_up") == 0 })
	}
	conversation("outage-id", true, 0, true)
	conversation("outage-no-id", false, 2, true)
	// A session started during the outage on two replicas, which may place
	// it on different workers.
	msgs := []string{sys, `{"role":"user","content":"split"}`}
	rs[0].turn(t, "split", msgs)
	rs[1].turn(t, "split", msgs)

	rd.Start()
	for _, r := range rs {
		testwait.Until(t, "replica resynced", func() bool {
			return r.metric(t, "warmroute_redis_up") == 1 && r.metric(t, "vllm_router_shared_resync_dropped_sessions_total") >= 1
		})
	}
	testwait.Until(t, "outage bindings replayed", func() bool {
		v, err := raw.Do(context.Background(), raw.B().Get().Key("wr:v1:b:1:m:split").Build()).ToString()
		return err == nil && v != ""
	})
	bound, _ := raw.Do(context.Background(), raw.B().Get().Key("wr:v1:b:1:m:split").Build()).ToString()
	for i, r := range rs {
		if got := r.turn(t, "split", msgs); worker(got) != bound {
			t.Fatalf("replica %d after the outage: %s, want the replayed binding %s", i, got, bound)
		}
	}
	conversation("after-outage-id", true, 2, false)
	conversation("after-outage-no-id", false, 1, false)
}
