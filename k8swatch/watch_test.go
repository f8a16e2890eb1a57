package k8swatch

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/k8stest"
	"github.com/warmroute/warmroute/internal/testwait"
)

var workerLabels = map[string]string{"app.kubernetes.io/name": "vllm-worker", "vllm.ai/role": "prefill"}

func pod(name, ip string, ready bool) k8stest.Pod {
	return k8stest.Pod{Namespace: "inference", Name: name, Labels: workerLabels, IP: ip, Ready: ready,
		Annotations: map[string]string{bootstrapKey: "8998", "kubectl.kubernetes.io/last-applied-configuration": "{}"}}
}

// start runs a watcher of the prefill selector in namespace inference with
// in-cluster credentials for srv until the test ends.
func start(t *testing.T, srv *k8stest.Server, mod func(*Config)) *Watcher {
	t.Helper()
	dir, host, port := srv.ServiceAccountDir(t, "inference")
	c, err := InCluster(host, port, dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Namespace() != "inference" {
		t.Fatalf("namespace %q", c.Namespace())
	}
	cfg := Config{Namespace: c.Namespace(), Selector: Selector(workerLabels), Annotations: []string{bootstrapKey},
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, PageSize: 2, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	return w
}

func run(t *testing.T, w *Watcher) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// state is the pods held, as "name=IP/ready" sorted, and whether synced.
func state(w *Watcher) string {
	ps, synced := w.Pods()
	var out []string
	for _, p := range ps {
		r := "-"
		if p.Ready {
			r = "ready"
		}
		out = append(out, p.Name+"="+p.IP+"/"+r)
	}
	if !synced {
		return "unsynced"
	}
	return strings.Join(out, " ")
}

func waitState(t *testing.T, w *Watcher, want string) {
	t.Helper()
	testwait.Until(t, "pods "+want, func() bool { return state(w) == want }, func() string { return state(w) })
}

// TestListThenWatch: the paginated list fills the set (other selectors'
// and namespaces' pods left out), the watch from the list's version
// follows adds, readiness, termination and deletion, with the service
// account's token, the namespace's path, the selector and bookmarks asked.
func TestListThenWatch(t *testing.T) {
	srv := k8stest.New(t, "sa-token-1")
	srv.Set(pod("vllm-0", "10.0.0.1", true))
	srv.Set(pod("vllm-1", "10.0.0.2", false))
	srv.Set(pod("vllm-2", "10.0.0.3", true))
	other := pod("other", "10.0.0.9", true)
	other.Labels = map[string]string{"app.kubernetes.io/name": "vllm-worker", "vllm.ai/role": "decode"}
	srv.Set(other)
	elsewhere := pod("vllm-9", "10.0.0.8", true)
	elsewhere.Namespace = "default"
	srv.Set(elsewhere)
	w := start(t, srv, nil)
	waitState(t, w, "vllm-0=10.0.0.1/ready vllm-1=10.0.0.2/- vllm-2=10.0.0.3/ready")
	ps, _ := w.Pods()
	if ps[0].Annotations[bootstrapKey] != "8998" || len(ps[0].Annotations) != 1 {
		t.Errorf("annotations kept %v, want the bootstrap port alone", ps[0].Annotations)
	}
	testwait.Until(t, "a watch", func() bool { return srv.Watches() == 1 })

	srv.Set(pod("vllm-1", "10.0.0.2", true))
	srv.Set(pod("vllm-3", "10.0.0.4", true))
	terminating := pod("vllm-0", "10.0.0.1", true)
	terminating.Deleting = true
	srv.Set(terminating)
	srv.Delete("inference", "vllm-2")
	waitState(t, w, "vllm-0=10.0.0.1/- vllm-1=10.0.0.2/ready vllm-3=10.0.0.4/ready")

	paths := srv.Paths()
	if len(paths) < 3 {
		t.Fatalf("requests %v", paths)
	}
	sel := "labelSelector=app.kubernetes.io%2Fname%3Dvllm-worker%2Cvllm.ai%2Frole%3Dprefill"
	for i, want := range []string{"/api/v1/namespaces/inference/pods?" + sel + "&limit=2", "continue=2&", "allowWatchBookmarks=true&"} {
		if !strings.Contains(paths[i], want) {
			t.Errorf("request %d %s lacks %s", i, paths[i], want)
		}
	}
	if !strings.Contains(paths[2], "resourceVersion=1005&") || !strings.Contains(paths[2], "watch=1") {
		t.Errorf("watch %s: want it from the list's version 1005", paths[2])
	}
	for _, tok := range srv.Tokens() {
		if tok != "sa-token-1" {
			t.Fatalf("tokens sent %v", srv.Tokens())
		}
	}
	if w.Lists() != 1 || w.Failures() != 0 {
		t.Errorf("lists %d failures %d, want 1 and 0", w.Lists(), w.Failures())
	}
}

// TestDroppedWatchResumesFromLastVersion: a watch cut mid-event is a
// failure; the pods stay while the API server answers 500; the watch
// resumes from the last version seen (a bookmark's), without a relist,
// and catches up on what changed meanwhile.
func TestDroppedWatchResumesFromLastVersion(t *testing.T) {
	srv := k8stest.New(t, "tok")
	srv.Set(pod("vllm-0", "10.0.0.1", true))
	w := start(t, srv, nil)
	waitState(t, w, "vllm-0=10.0.0.1/ready")
	testwait.Until(t, "a watch", func() bool { return srv.Watches() == 1 })
	srv.Bookmark() // version 1002
	testwait.Until(t, "the bookmark", func() bool { return w.Events() == 1 })

	srv.FailNext(3)
	srv.DropWatches()
	testwait.Until(t, "three failed reconnects", func() bool { return w.Failures() >= 4 })
	if got := state(w); got != "vllm-0=10.0.0.1/ready" {
		t.Fatalf("pods during the outage %q: an outage must change nothing", got)
	}
	srv.Set(pod("vllm-1", "10.0.0.2", true)) // version 1003, while no watch is open
	waitState(t, w, "vllm-0=10.0.0.1/ready vllm-1=10.0.0.2/ready")
	if w.Lists() != 1 {
		t.Errorf("lists %d: a dropped watch resumes, it does not relist", w.Lists())
	}
	var resumed bool
	for _, p := range srv.Paths() {
		resumed = resumed || strings.Contains(p, "resourceVersion=1002&") && strings.Contains(p, "watch=1")
	}
	if !resumed {
		t.Errorf("no watch resumed from the bookmark's version 1002: %v", srv.Paths())
	}
}

// TestGoneRelists: a resource version gone, answered as an HTTP 410 or as
// an ERROR event with code 410, makes the watcher list again; the new list
// replaces the set (a pod deleted meanwhile leaves it).
func TestGoneRelists(t *testing.T) {
	for _, how := range []string{"status", "event"} {
		t.Run(how, func(t *testing.T) {
			srv := k8stest.New(t, "tok")
			srv.Gone410(how)
			srv.Set(pod("vllm-0", "10.0.0.1", true))
			srv.Set(pod("vllm-1", "10.0.0.2", true))
			w := start(t, srv, nil)
			waitState(t, w, "vllm-0=10.0.0.1/ready vllm-1=10.0.0.2/ready")
			testwait.Until(t, "a watch", func() bool { return srv.Watches() == 1 })
			srv.FailNext(1)
			srv.DropWatches()
			// While the watcher reconnects, history is compacted past its
			// version and a pod goes.
			srv.Compact()
			srv.Delete("inference", "vllm-0")
			waitState(t, w, "vllm-1=10.0.0.2/ready")
			if w.Lists() != 2 {
				t.Errorf("lists %d, want 2 (one after the 410)", w.Lists())
			}
		})
	}
	t.Run("event on an open watch", func(t *testing.T) {
		srv := k8stest.New(t, "tok")
		srv.Set(pod("vllm-0", "10.0.0.1", true))
		w := start(t, srv, nil)
		waitState(t, w, "vllm-0=10.0.0.1/ready")
		testwait.Until(t, "a watch", func() bool { return srv.Watches() == 1 })
		srv.SendError(410, "Expired")
		testwait.Until(t, "a relist", func() bool { return w.Lists() == 2 })
		if w.Failures() != 0 {
			t.Errorf("failures %d: a 410 is a relist, not a failure", w.Failures())
		}
	})
}

// TestMaxPods: pods past MaxPods are ignored and counted, in the list and
// in the watch.
func TestMaxPods(t *testing.T) {
	srv := k8stest.New(t, "tok")
	srv.Set(pod("vllm-0", "10.0.0.1", true))
	srv.Set(pod("vllm-1", "10.0.0.2", true))
	srv.Set(pod("vllm-2", "10.0.0.3", true))
	w := start(t, srv, func(c *Config) { c.MaxPods = 2 })
	waitState(t, w, "vllm-0=10.0.0.1/ready vllm-1=10.0.0.2/ready")
	testwait.Until(t, "a watch", func() bool { return srv.Watches() == 1 })
	srv.Set(pod("vllm-3", "10.0.0.4", true))
	srv.Delete("inference", "vllm-0")
	waitState(t, w, "vllm-1=10.0.0.2/ready")
	if w.Ignored() != 2 {
		t.Errorf("ignored %d, want 2", w.Ignored())
	}
}

// TestTokenReread: the service account token is read again (it rotates):
// the calls after the file changed carry the new token.
func TestTokenReread(t *testing.T) {
	old := tokenReread
	tokenReread = 0
	t.Cleanup(func() { tokenReread = old })
	srv := k8stest.New(t, "tok-1")
	dir, host, port := srv.ServiceAccountDir(t, "inference")
	c, err := InCluster(host, port, dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(c, Config{Namespace: "inference", Selector: Selector(workerLabels), MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.list(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Token = "tok-2" // not read by the server concurrently: no call is in flight
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("tok-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := w.list(context.Background()); err != nil {
		t.Fatalf("after the rotation: %v", err)
	}
	if got := fmt.Sprint(srv.Tokens()); got != "[tok-1 tok-2]" {
		t.Errorf("tokens %s", got)
	}
}

// TestKubeconfig: the current context's cluster (CA data), user (token
// file, relative to the file) and namespace reach the API server; a
// client certificate loads; exec plugins and insecure-skip-tls-verify are
// refused by name.
func TestKubeconfig(t *testing.T) {
	srv := k8stest.New(t, "kc-token")
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("tok", "kc-token\n")
	ca := base64.StdEncoding.EncodeToString(k8stest.CertPEM(srv.TLS))
	n := 0
	cfg := func(cluster, user string) string {
		n++
		return write(fmt.Sprintf("config-%d", n), `apiVersion: v1
kind: Config
current-context: work
contexts:
- name: other
  context: {cluster: c0, user: u0}
- name: work
  context: {cluster: c1, user: u1, namespace: inference}
clusters:
- name: c0
  cluster: {server: "https://192.0.2.1:6443"}
- name: c1
  cluster:
    `+cluster+`
users:
- name: u1
  user:
    `+user+"\n")
	}
	c, err := FromKubeconfig(cfg(`server: `+srv.TLS.URL+`
    certificate-authority-data: `+ca, `tokenFile: tok`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Namespace() != "inference" || c.Server() != srv.TLS.URL {
		t.Fatalf("namespace %q server %q", c.Namespace(), c.Server())
	}
	w, _ := New(c, Config{Namespace: c.Namespace(), Selector: Selector(workerLabels)})
	srv.Set(pod("vllm-0", "10.0.0.1", true))
	if err := w.list(context.Background()); err != nil || state(w) != "vllm-0=10.0.0.1/ready" {
		t.Fatalf("list through the kubeconfig: %v %q", err, state(w))
	}

	certPEM, keyPEM := k8stest.ClientCert(t)
	if c, err := FromKubeconfig(cfg(`server: `+srv.TLS.URL+`
    certificate-authority-data: `+ca, `client-certificate-data: `+base64.StdEncoding.EncodeToString(certPEM)+`
    client-key: `+write("key.pem", string(keyPEM)))); err != nil || c.token != nil {
		t.Errorf("client certificate: %v", err)
	}
	for want, kc := range map[string]string{
		"exec and auth-provider credential plugins are not supported": cfg(`server: `+srv.TLS.URL, `exec: {command: aws, apiVersion: client.authentication.k8s.io/v1beta1}`),
		"insecure-skip-tls-verify is not supported":                   cfg(`server: `+srv.TLS.URL+"\n    insecure-skip-tls-verify: true", `token: x`),
		"want https://host[:port]":                                    cfg(`server: http://127.0.0.1:8001`, `token: x`),
		"needs its key":                                               cfg(`server: `+srv.TLS.URL, `client-certificate-data: `+base64.StdEncoding.EncodeToString(certPEM)),
	} {
		if _, err := FromKubeconfig(kc); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err %v, want %q", err, want)
		}
	}
}

// TestSelector: the vLLM router's key=value items, ANDed, checked as the
// API checks label keys and values.
func TestSelector(t *testing.T) {
	s, err := ParseSelector([]string{"vllm.ai/role=prefill", "app=vllm"})
	if err != nil || s.String() != "app=vllm,vllm.ai/role=prefill" {
		t.Fatalf("%v %q", err, s)
	}
	if !s.Matches(map[string]string{"app": "vllm", "vllm.ai/role": "prefill", "x": "y"}) || s.Matches(map[string]string{"app": "vllm"}) {
		t.Error("Matches is not an AND of the terms")
	}
	for _, bad := range []string{"app", "app==x", "=x", "app=x,y", "-a=b", "a/b/c=d", "app=" + strings.Repeat("x", 64), "Bad_Prefix.io/x=y"} {
		if _, err := ParseSelector([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := ParseSelector([]string{"a=1", "a=2"}); err == nil {
		t.Error("a key given twice accepted")
	}
	if _, err := New(&Client{}, Config{}); err == nil {
		t.Error("an empty selector accepted")
	}
}
