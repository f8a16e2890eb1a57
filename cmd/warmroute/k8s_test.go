package main

import (
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/internal/k8stest"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/simworker"
)

// TestDiscoveryFlags: the vLLM router's forms (--selector k1=v1 k2=v2,
// the port and namespace) parse; every refusal says what is wrong.
func TestDiscoveryFlags(t *testing.T) {
	o, err := parseFlags([]string{"--service-discovery", "--selector", "app=vllm", "vllm.ai/pool=a", "--service-discovery-port", "8000",
		"--service-discovery-namespace", "inference", "--policy", "round_robin"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.sdSelectors) != 1 || o.sdSelectors[0].selector.String() != "app=vllm,vllm.ai/pool=a" || o.sdPort != 8000 || o.sdNamespace != "inference" || o.policy != "round_robin" {
		t.Fatalf("parsed %+v port %d namespace %q", o.sdSelectors, o.sdPort, o.sdNamespace)
	}
	if err := needWorkers(o, &saar.Config{}); err != nil {
		t.Errorf("--service-discovery is a source of workers: %v", err)
	}
	o, err = parseFlags([]string{"--service-discovery", "--selector=app=vllm"}, io.Discard)
	if err != nil || o.sdPort != 80 || o.sdNamespace != "" {
		t.Fatalf("defaults: %v port %d namespace %q (the vLLM router's: 80, every namespace)", err, o.sdPort, o.sdNamespace)
	}
	pd := func(args ...string) []string {
		return append([]string{"--vllm-pd-disaggregation", "--service-discovery"}, args...)
	}
	o, err = parseFlags(pd("--prefill-selector", "role=prefill", "--decode-selector", "role=decode"), io.Discard)
	if err != nil || len(o.sdSelectors) != 2 || o.sdSelectors[0].flag != "--prefill-selector" || o.sdSelectors[1].flag != "--decode-selector" {
		t.Fatalf("PD selectors: %v %+v", err, o)
	}
	if err := needWorkers(o, &saar.Config{}); err != nil {
		t.Errorf("PD with both selectors: %v", err)
	}
	o, _ = parseFlags(pd("--prefill-selector", "role=prefill"), io.Discard)
	if err := needWorkers(o, &saar.Config{}); err != errNoDecode {
		t.Errorf("PD with a prefill selector alone: %v, want errNoDecode", err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--selector", "app=vllm"}, "--selector: only with --service-discovery"},
		{[]string{"--kubeconfig", "x", "--service-discovery-port", "8000"}, "--kubeconfig, --service-discovery-port: only with --service-discovery"},
		{[]string{"--service-discovery", "--prefill-selector", "a=b"}, "--prefill-selector: only with --vllm-pd-disaggregation"},
		{[]string{"--service-discovery"}, "give --selector"},
		{pd(), "give --prefill-selector and --decode-selector"},
		{[]string{"--service-discovery", "--selector", "app"}, "want key=value"},
		{[]string{"--service-discovery", "--selector", "app=a b"}, "want key=value"},
		{[]string{"--service-discovery", "--selector", "app=vllm", "--service-discovery-port", "0"}, "want 1-65535"},
		{[]string{"--service-discovery", "--selector", "app=vllm", "--service-discovery-namespace", "Bad_NS"}, "not a namespace name"},
		{pd("--prefill-selector", "r=x", "--decode-selector", "r=x"), "the same selector"},
	} {
		_, err := parseFlags(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// TestServiceDiscoveryServes: the router started with --service-discovery
// and a kubeconfig registers the ready pod's worker before it listens,
// serves through it, and drains it when the pod stops being ready.
func TestServiceDiscoveryServes(t *testing.T) {
	w, wu, err := simworker.Start(simworker.Config{Models: []string{"m"}, TimeScale: 0.01, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	u, _ := url.Parse(wu)
	api := k8stest.New(t, "kc-token")
	labels := map[string]string{"app.kubernetes.io/name": "vllm-worker"}
	api.Set(k8stest.Pod{Namespace: "inference", Name: "vllm-0", IP: u.Hostname(), Ready: true, Labels: labels})
	api.Set(k8stest.Pod{Namespace: "inference", Name: "vllm-1", IP: "127.0.0.1", Ready: false, Labels: labels})
	kc := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(kc, []byte(`apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "`+api.TLS.URL+`", certificate-authority-data: `+base64.StdEncoding.EncodeToString(k8stest.CertPEM(api.TLS))+`}}]
users: [{name: u, user: {token: kc-token}}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	addr, code := startMain(t, ctx, "--admin-api-key", "k", "--service-discovery", "--selector", "app.kubernetes.io/name=vllm-worker",
		"--service-discovery-namespace", "inference", "--service-discovery-port", u.Port(), "--kubeconfig", kc)
	defer func() {
		cancel()
		waitExit0(t, code)
	}()
	if got := getAdmin(t, addr, "/workers", 200); !strings.Contains(got, `"url":"`+wu+`"`) || strings.Count(got, `"url"`) != 1 {
		t.Fatalf("/workers before the first request %s: want the ready pod's worker alone", got)
	}
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("chat through the discovered worker: %d %s", resp.StatusCode, b)
	}
	metrics := getAdmin(t, addr, "/metrics", 200)
	if !strings.Contains(metrics, `vllm_router_k8s_discovery_workers{selector="app.kubernetes.io/name=vllm-worker",role="regular"} 1`) {
		t.Errorf("/metrics lacks the discovery's workers series")
	}
	api.Set(k8stest.Pod{Namespace: "inference", Name: "vllm-0", IP: u.Hostname(), Ready: false, Labels: labels})
	testwait.Until(t, "the worker drained", func() bool {
		return !strings.Contains(getAdmin(t, addr, "/workers", 200), wu)
	})
	if tok := api.Tokens(); len(tok) == 0 || tok[0] != "kc-token" {
		t.Errorf("tokens %v", tok)
	}
}
