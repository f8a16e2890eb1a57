package fastproxy_test

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

// eventSims starts n simulated workers publishing their KV events, and a
// router following them (--kv-events with explicit endpoints).
func eventSims(t *testing.T, n int, cfg simworker.Config) ([]*simworker.Worker, *testRouter) {
	t.Helper()
	cfg.KVEventsEndpoint = "tcp://127.0.0.1:0"
	ws, urls := startSims(t, n, cfg)
	tr := startRouter(t, urls, "cache_aware", func(_ *fastproxy.Config, l *loadview.Config) {
		kv := &loadview.KVEventsConfig{Endpoints: map[string]loadview.KVEndpoints{}}
		for i, w := range ws {
			kv.Endpoints[urls[i]] = loadview.KVEndpoints{Endpoint: w.KVEventsAddr()}
		}
		l.KVEvents = kv
	})
	t.Cleanup(tr.reg.StopKVEvents)
	testwait.Until(t, "every worker's event stream connected", func() bool {
		var b bytes.Buffer
		tr.reg.WriteMetrics(&b)
		return connected(b.String()) == n
	}, nil)
	return ws, tr
}

// connected counts the event streams the registry's metrics show connected.
func connected(metrics string) int {
	n := 0
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "vllm_router_kv_events_connects_total{") && !strings.HasSuffix(line, " 0") {
			n++
		}
	}
	return n
}

// policyCounter reads a counter the policy writes on /metrics.
func policyCounter(t *testing.T, tr *testRouter, name string) int {
	t.Helper()
	var b bytes.Buffer
	tr.policy.(route.MetricsWriter).WriteMetrics(&b)
	for _, line := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// workerTree is the router's picture of worker url's cache, in characters.
func workerTree(tr *testRouter, url string) int {
	n := 0
	for _, s := range tr.policy.(*route.CacheAware).Summaries(0) {
		for _, w := range s.Workers {
			if w.Worker == url {
				n += w.TreeChars
			}
		}
	}
	return n
}

// A worker's /reset_prefix_cache (sent to the worker, not through the
// router) empties its part of the router's tree with the one batch that
// says so; its evictions drop the histories it evicted.
func TestKVEventsKeepTheTreeTrue(t *testing.T) {
	small := fastSim()
	small.CacheBlocks = 64 // 1,024 tokens: two long conversations do not fit
	ws, tr := eventSims(t, 1, small)
	url := tr.reg.Workers()[0].URL()
	send := func(text string) {
		t.Helper()
		if resp, body := do(t, "POST", tr.url+"/v1/chat/completions", chatBody("m", text, false), nil); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	send(longText("first conversation"))
	if workerTree(tr, url) == 0 {
		t.Fatal("the tree learned nothing")
	}
	if resp, _ := do(t, "POST", url+"/reset_prefix_cache", "", nil); resp.StatusCode != 200 {
		t.Fatalf("reset: %d", resp.StatusCode)
	}
	testwait.Until(t, "the worker's part of the tree emptied by its AllBlocksCleared", func() bool {
		return workerTree(tr, url) == 0 && policyCounter(t, tr, "vllm_router_tree_kv_clears_total") == 1
	}, func() string { return fmt.Sprintf("tree %d chars", workerTree(tr, url)) })

	// Each conversation is about 400 tokens; the cache holds 1,024. The
	// tree drops an evicted history once a later removal's stamp passes it
	// (the stamps are lower bounds), so conversations go on until it holds
	// no more than the cache does: without events it would keep them all
	// (no capacity is scraped here).
	one := len(longText("conversation 0"))
	i := 0
	testwait.Until(t, "the engine's evictions made in the tree", func() bool {
		send(longText(fmt.Sprintf("conversation %d", i)))
		i++
		return policyCounter(t, tr, "vllm_router_tree_kv_evictions_total") > 0 && workerTree(tr, url) <= 3*one
	}, func() string {
		return fmt.Sprintf("tree %d chars (a conversation %d) after %d; %+v", workerTree(tr, url), one, i, ws[0].Stats())
	})
}
