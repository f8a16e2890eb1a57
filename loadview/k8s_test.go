package loadview

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/k8stest"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/k8swatch"
)

var (
	regularLabels = map[string]string{"app.kubernetes.io/name": "vllm-worker"}
	prefillLabels = map[string]string{"app.kubernetes.io/name": "vllm-worker", "vllm.ai/role": "prefill"}
	decodeLabels  = map[string]string{"app.kubernetes.io/name": "vllm-worker", "vllm.ai/role": "decode"}
)

func k8sPod(name, ip string, ready bool, labels map[string]string) k8stest.Pod {
	return k8stest.Pod{Namespace: "inference", Name: name, IP: ip, Ready: ready, Labels: labels,
		Annotations: map[string]string{BootstrapPortAnnotation: "8998"}}
}

// k8sFleet is a registry, fake vLLM workers on ips (one port), a fake API
// server and a running discovery of selectors (one source each, in the
// roles given) over in-cluster credentials.
func k8sFleet(t *testing.T, handler http.HandlerFunc, sources map[Role]map[string]string, ips ...string) (*Registry, *K8sDiscovery, *k8stest.Server, int, *lockedBuffer) {
	t.Helper()
	port := dnsWorkers(t, handler, ips...)
	api := k8stest.New(t, "sa-token")
	logs := &lockedBuffer{}
	r := NewRegistry(Config{Logger: slogTo(logs)})
	dir, host, p := api.ServiceAccountDir(t, "inference")
	c, err := k8swatch.InCluster(host, p, dir)
	if err != nil {
		t.Fatal(err)
	}
	var d *K8sDiscovery
	notify := func() { d.Notify() }
	cfg := K8sConfig{Port: port}
	for _, role := range []Role{Regular, Prefill, Decode} {
		sel, ok := sources[role]
		if !ok {
			continue
		}
		w, err := k8swatch.New(c, k8swatch.Config{Namespace: c.Namespace(), Selector: sel, Annotations: []string{BootstrapPortAnnotation},
			MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, OnChange: func() { notify() }, Logger: slogTo(logs)})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Sources = append(cfg.Sources, K8sSource{Watcher: w, Role: role})
	}
	if d, err = NewK8sDiscovery(r, cfg); err != nil {
		t.Fatal(err)
	}
	return r, d, api, port, logs
}

func runK8s(t *testing.T, d *K8sDiscovery) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); d.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// k8sFleetState is the registry's workers as "URL/role/healthy", sorted.
func k8sFleetState(r *Registry) string {
	var out []string
	for _, w := range r.Workers() {
		h := "-"
		if w.Healthy() {
			h = "healthy"
		}
		out = append(out, w.URL()+"/"+w.Role().String()+"/"+h)
	}
	sort.Strings(out) // parallel adds join in any order
	return strings.Join(out, " ")
}

func waitFleet(t *testing.T, r *Registry, want string) {
	t.Helper()
	testwait.Until(t, "fleet "+want, func() bool { return k8sFleetState(r) == want }, func() string { return k8sFleetState(r) })
}

// TestK8sDiscoveryFollowsPods: ready pods join in order of readiness with
// their models; a pod that stops being ready drains (its request in flight
// finishes, it is offered no more); a terminating pod drains although its
// Ready condition is still True; a deleted pod is gone; a worker another
// source registered at a pod's address is never touched.
func TestK8sDiscoveryFollowsPods(t *testing.T) {
	arrived, finish := make(chan struct{}), make(chan struct{})
	slow := func(w http.ResponseWriter, _ *http.Request) {
		close(arrived)
		<-finish
		io.WriteString(w, `{"ok":true}`) //nolint:errcheck
	}
	r, d, api, port, _ := k8sFleet(t, slow, map[Role]map[string]string{Regular: regularLabels}, "127.0.0.1", "127.0.0.2", "127.0.0.3")
	a, b, c := fmt.Sprintf("http://127.0.0.1:%d", port), fmt.Sprintf("http://127.0.0.2:%d", port), fmt.Sprintf("http://127.0.0.3:%d", port)
	api.Set(k8sPod("vllm-0", "127.0.0.1", true, regularLabels))
	api.Set(k8sPod("vllm-1", "127.0.0.2", false, regularLabels))
	api.Set(k8stest.Pod{Namespace: "inference", Name: "vllm-pending", Labels: regularLabels}) // no IP yet
	if _, err := r.Add(context.Background(), c, nil); err != nil {                            // another source's worker
		t.Fatal(err)
	}
	api.Set(k8sPod("vllm-2", "127.0.0.3", true, regularLabels))
	runK8s(t, d)
	if !d.WaitFirstSync(context.Background(), testwait.Timeout) {
		t.Fatal("no first sync")
	}
	if got := k8sFleetState(r); got != a+"/regular/healthy "+c+"/regular/healthy" {
		t.Fatalf("after the first sync %q", got)
	}
	if ws := r.ByURL(a).Models(); fmt.Sprint(ws) != "[m]" {
		t.Fatalf("models %v: discovered as for any worker", ws)
	}

	api.Set(k8sPod("vllm-1", "127.0.0.2", true, regularLabels))
	waitFleet(t, r, a+"/regular/healthy "+b+"/regular/healthy "+c+"/regular/healthy")

	// vllm-0 stops being ready while a request is in flight on it.
	w := r.ByURL(a)
	w.Acquire()
	done := make(chan error, 1)
	go func() {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(a + "/v1/chat/completions")
		req.Header.SetMethod(fasthttp.MethodPost)
		err := w.Client().Do(req, resp)
		w.Release()
		if err == nil && (resp.StatusCode() != 200 || string(resp.Body()) != `{"ok":true}`) {
			err = fmt.Errorf("%d %s", resp.StatusCode(), resp.Body())
		}
		done <- err
	}()
	<-arrived
	api.Set(k8sPod("vllm-0", "127.0.0.1", false, regularLabels))
	waitFleet(t, r, b+"/regular/healthy "+c+"/regular/healthy")
	if ws, _ := r.ForModel([]byte("m")); len(ws) != 2 || ws[0] == w || ws[1] == w {
		t.Fatal("the drained worker is still offered")
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatalf("the request in flight on the drained worker: %v", err)
	}

	terminating := k8sPod("vllm-1", "127.0.0.2", true, regularLabels)
	terminating.Deleting = true
	api.Set(terminating)
	waitFleet(t, r, c+"/regular/healthy")
	api.Set(k8sPod("vllm-0", "127.0.0.1", true, regularLabels))
	waitFleet(t, r, a+"/regular/healthy "+c+"/regular/healthy")
	api.Delete("inference", "vllm-0")
	api.Delete("inference", "vllm-2") // its address is the other source's worker: kept
	waitFleet(t, r, c+"/regular/healthy")
	if got := d.Workers(); len(got) != 0 {
		t.Fatalf("discovery holds %v", got)
	}
}

// TestK8sDiscoverySurvivesDroppedWatch: a watch cut mid-event and an API
// server answering 500 change no worker; once it answers, the watch
// resumes and what changed meanwhile (a pod added, one deleted) is
// followed; after a 410 the relist's pods are the fleet.
func TestK8sDiscoverySurvivesDroppedWatch(t *testing.T) {
	r, d, api, port, _ := k8sFleet(t, nil, map[Role]map[string]string{Regular: regularLabels}, "127.0.0.1", "127.0.0.2", "127.0.0.3")
	a, b, c := fmt.Sprintf("http://127.0.0.1:%d", port), fmt.Sprintf("http://127.0.0.2:%d", port), fmt.Sprintf("http://127.0.0.3:%d", port)
	api.Set(k8sPod("vllm-0", "127.0.0.1", true, regularLabels))
	api.Set(k8sPod("vllm-1", "127.0.0.2", true, regularLabels))
	runK8s(t, d)
	waitFleet(t, r, a+"/regular/healthy "+b+"/regular/healthy")
	testwait.Until(t, "a watch", func() bool { return api.Watches() == 1 })

	api.FailNext(5)
	api.DropWatches()
	src := d.cfg.Sources[0].Watcher
	testwait.Until(t, "failed reconnects", func() bool { return src.Failures() >= 5 })
	if got := k8sFleetState(r); got != a+"/regular/healthy "+b+"/regular/healthy" {
		t.Fatalf("during the outage %q: an outage must change nothing", got)
	}
	api.Set(k8sPod("vllm-2", "127.0.0.3", true, regularLabels))
	api.Delete("inference", "vllm-0")
	waitFleet(t, r, b+"/regular/healthy "+c+"/regular/healthy")
	if src.Lists() != 1 {
		t.Errorf("lists %d: the dropped watch resumed, no relist", src.Lists())
	}

	api.FailNext(1)
	api.DropWatches()
	api.Compact()
	api.Delete("inference", "vllm-1")
	waitFleet(t, r, c+"/regular/healthy")
	if src.Lists() != 2 {
		t.Errorf("lists %d, want 2 (one after the 410)", src.Lists())
	}
	var m bytes.Buffer
	r.WriteMetrics(&m)
	for _, want := range []string{
		`vllm_router_k8s_discovery_workers{selector="app.kubernetes.io/name=vllm-worker",role="regular"} 1`,
		`vllm_router_k8s_discovery_relists_total{selector="app.kubernetes.io/name=vllm-worker",role="regular"} 2`,
		`vllm_router_k8s_discovery_pods{selector="app.kubernetes.io/name=vllm-worker",role="regular"} 1`,
	} {
		if !strings.Contains(m.String(), want) {
			t.Errorf("metrics lack %s:\n%s", want, m.String())
		}
	}
	if !strings.Contains(m.String(), `vllm_router_k8s_discovery_failures_total{selector="app.kubernetes.io/name=vllm-worker",role="regular"} `) {
		t.Error("no failures series")
	}
}

// TestK8sDiscoveryRoles: the prefill and decode selectors' pods join in
// their roles; a prefill pod's vllm.ai/bootstrap-port annotation is read
// (a decode pod's is not); a pod both selectors pick is a prefill worker;
// a pod relabelled from prefill to decode is drained and joins as decode.
func TestK8sDiscoveryRoles(t *testing.T) {
	both := map[string]string{"app.kubernetes.io/name": "vllm-worker", "vllm.ai/role": "prefill", "pool": "p"}
	r, d, api, port, logs := k8sFleet(t, nil, map[Role]map[string]string{
		Prefill: prefillLabels, Decode: {"app.kubernetes.io/name": "vllm-worker", "pool": "p"},
	}, "127.0.0.1", "127.0.0.2", "127.0.0.3")
	a, b, c := fmt.Sprintf("http://127.0.0.1:%d", port), fmt.Sprintf("http://127.0.0.2:%d", port), fmt.Sprintf("http://127.0.0.3:%d", port)
	api.Set(k8sPod("prefill-0", "127.0.0.1", true, prefillLabels))
	api.Set(k8sPod("decode-0", "127.0.0.2", true, map[string]string{"app.kubernetes.io/name": "vllm-worker", "pool": "p"}))
	api.Set(k8sPod("both-0", "127.0.0.3", true, both))
	runK8s(t, d)
	if !d.WaitFirstSync(context.Background(), testwait.Timeout) {
		t.Fatal("no first sync")
	}
	if got := k8sFleetState(r); !strings.Contains(got, a+"/prefill/healthy") || !strings.Contains(got, b+"/decode/healthy") || !strings.Contains(got, c+"/prefill/healthy") {
		t.Fatalf("fleet %q", got)
	}
	ws := d.Workers()
	if len(ws) != 3 || ws[0].BootstrapPort != 8998 || ws[0].Pod != "inference/prefill-0" || ws[1].BootstrapPort != 0 {
		t.Fatalf("workers %+v: want the prefill pod's bootstrap port, none on the decode pod", ws)
	}
	if logs.count("is read and unused") != 2 {
		t.Errorf("bootstrap ports logged %d times, want once per prefill worker", logs.count("is read and unused"))
	}
	bad := k8sPod("prefill-0", "127.0.0.1", true, prefillLabels)
	bad.Annotations = map[string]string{BootstrapPortAnnotation: "70000"}
	api.Set(bad)
	testwait.Until(t, "the bad port dropped", func() bool { return d.Workers()[0].BootstrapPort == 0 })

	// both-0 loses its prefill label: the decode selector still picks it.
	api.Set(k8sPod("both-0", "127.0.0.3", true, map[string]string{"app.kubernetes.io/name": "vllm-worker", "pool": "p"}))
	testwait.Until(t, "both-0 as decode", func() bool { w := r.ByURL(c); return w != nil && w.Role() == Decode })
}
