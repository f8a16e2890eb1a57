// Package k8stest is a Kubernetes API server for tests: the pods
// resource's list and watch calls over TLS on loopback, their payloads
// written as the API reference gives them (Pod, PodList, WatchEvent,
// Status), with the faults a watcher must survive: a resource version
// gone (410, as an HTTP status or an ERROR event), a watch dropped
// mid-event, bookmarks.
package k8stest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Pod is a test pod.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	Annotations     map[string]string
	IP              string // "": none yet (Pending)
	Phase           string // default Running when IP is set, else Pending
	Ready           bool
	Deleting        bool // deletionTimestamp set (terminating)
}

// Server is a fake API server. Its zero resource version is 1000.
type Server struct {
	TLS   *httptest.Server
	Token string // the bearer token it requires

	mu        sync.Mutex
	rv        int
	compacted int                // a watch from a version below it is 410
	gone410   string             // "status" or "event": how a gone version is answered
	pods      map[string]Pod     // by namespace/name
	podRV     map[string]int     // their resource versions
	history   []event            // every event, in order
	watches   map[int]chan event // open watch streams
	nextWatch int
	tokens    []string // Authorization tokens seen
	paths     []string // request URIs seen
	failNext  int      // answer the next calls 500
}

type event struct {
	typ  string
	data []byte // BOOKMARK, ERROR: the event's JSON line
	pod  Pod    // ADDED, MODIFIED, DELETED: the pod after the change
	prev *Pod   // MODIFIED: the pod before it
	rv   int
	drop bool // drop the stream mid-event instead
}

// line is ev as a watch of match sees it, as the API server filters a
// watch: a pod that starts matching is ADDED, one that stops matching is
// DELETED; nil when the watch does not see it.
func (ev event) line(match func(Pod) bool) []byte {
	typ := ev.typ
	switch ev.typ {
	case "BOOKMARK", "ERROR":
		return ev.data
	case "MODIFIED":
		now, before := match(ev.pod), match(*ev.prev)
		switch {
		case now && !before:
			typ = "ADDED"
		case !now && before:
			typ = "DELETED"
		case !now:
			return nil
		}
	default:
		if !match(ev.pod) {
			return nil
		}
	}
	b, _ := json.Marshal(map[string]any{"type": typ, "object": json.RawMessage(PodJSON(ev.pod, ev.rv))})
	return append(b, '\n')
}

// New starts a server requiring token; it closes with t.
func New(t testing.TB, token string) *Server {
	s := &Server{Token: token, rv: 1000, pods: map[string]Pod{}, podRV: map[string]int{}, watches: map[int]chan event{}, gone410: "status"}
	s.TLS = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.TLS.Close)
	return s
}

// ServiceAccountDir writes a service account directory (token, ca.crt,
// namespace) for k8swatch.InCluster and returns it with the host and port.
func (s *Server) ServiceAccountDir(t testing.TB, namespace string) (dir, host, port string) {
	dir = t.TempDir()
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("token", []byte(s.Token+"\n"))
	write("namespace", []byte(namespace))
	write("ca.crt", CertPEM(s.TLS))
	h, p, _ := strings.Cut(strings.TrimPrefix(s.TLS.URL, "https://"), ":")
	return dir, h, p
}

// Gone410 sets how a gone resource version is answered: "status" (HTTP
// 410) or "event" (200 and an ERROR event with code 410).
func (s *Server) Gone410(how string) {
	s.mu.Lock()
	s.gone410 = how
	s.mu.Unlock()
}

// FailNext makes the next n calls answer 500.
func (s *Server) FailNext(n int) {
	s.mu.Lock()
	s.failNext = n
	s.mu.Unlock()
}

// Tokens returns the bearer tokens seen, in order.
func (s *Server) Tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.tokens...)
}

// Paths returns the request URIs seen, in order.
func (s *Server) Paths() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.paths...)
}

// Watches is the number of open watch streams.
func (s *Server) Watches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.watches)
}

// Set creates or updates a pod: an ADDED or MODIFIED event.
func (s *Server) Set(p Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, ok := s.pods[key(p)]
	s.rv++
	s.pods[key(p)], s.podRV[key(p)] = p, s.rv
	if ok {
		s.emit(event{typ: "MODIFIED", pod: p, prev: &prev, rv: s.rv})
	} else {
		s.emit(event{typ: "ADDED", pod: p, rv: s.rv})
	}
}

// Delete deletes a pod: a DELETED event.
func (s *Server) Delete(namespace, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := namespace + "/" + name
	p, ok := s.pods[k]
	if !ok {
		return
	}
	s.rv++
	delete(s.pods, k)
	delete(s.podRV, k)
	s.emit(event{typ: "DELETED", pod: p, rv: s.rv})
}

// Compact forgets the history: a watch from any version seen so far is
// then answered 410.
func (s *Server) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	s.compacted = s.rv
	s.history = nil
}

// Bookmark sends a BOOKMARK with the current version to the open watches.
func (s *Server) Bookmark() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	line := fmt.Sprintf(`{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"%d","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", s.rv)
	for _, c := range s.watches {
		c <- event{typ: "BOOKMARK", data: []byte(line), rv: s.rv}
	}
}

// DropWatches cuts every open watch stream in the middle of an event, as
// a lost connection does.
func (s *Server) DropWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.watches {
		c <- event{drop: true}
	}
}

// SendError sends an ERROR event with code to the open watches.
func (s *Server) SendError(code int, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	line := errorEvent(code, reason)
	for _, c := range s.watches {
		c <- event{typ: "ERROR", data: line}
	}
}

func errorEvent(code int, reason string) []byte {
	return []byte(fmt.Sprintf(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (%d)","reason":%q,"code":%d}}`+"\n", code, reason, code))
}

func key(p Pod) string { return p.Namespace + "/" + p.Name }

// emit records an event and sends it to the open watches; under mu.
func (s *Server) emit(ev event) {
	s.history = append(s.history, ev)
	for _, c := range s.watches {
		c <- ev
	}
}

// PodJSON is p as the API server writes a Pod (v1) at resource version rv.
func PodJSON(p Pod, rv int) []byte {
	phase := p.Phase
	if phase == "" {
		phase = "Pending"
		if p.IP != "" {
			phase = "Running"
		}
	}
	ready := "False"
	if p.Ready {
		ready = "True"
	}
	meta := map[string]any{
		"name": p.Name, "namespace": p.Namespace, "uid": "6f1c2b9e-" + fmt.Sprintf("%04x", len(p.Name)) + "-4c1e-9a2b-" + fmt.Sprintf("%012x", rv),
		"resourceVersion": strconv.Itoa(rv), "creationTimestamp": "2026-12-03T19:00:00Z",
		"generateName": "vllm-", "labels": p.Labels,
		"ownerReferences": []any{map[string]any{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "vllm-5d9c7b", "uid": "0b7e", "controller": true, "blockOwnerDeletion": true}},
		"managedFields": []any{map[string]any{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1", "time": "2026-12-03T19:00:00Z",
			"fieldsType": "FieldsV1", "fieldsV1": map[string]any{"f:metadata": map[string]any{"f:labels": map[string]any{".": map[string]any{}}}}}},
	}
	if len(p.Annotations) > 0 {
		meta["annotations"] = p.Annotations
	}
	if p.Deleting {
		meta["deletionTimestamp"] = "2026-12-03T19:30:00Z"
		meta["deletionGracePeriodSeconds"] = 30
	}
	status := map[string]any{
		"phase": phase, "hostIP": "10.0.0.7", "hostIPs": []any{map[string]any{"ip": "10.0.0.7"}}, "qosClass": "Burstable", "startTime": "2026-12-03T19:00:01Z",
		"conditions": []any{
			map[string]any{"type": "PodReadyToStartContainers", "status": "True", "lastProbeTime": nil, "lastTransitionTime": "2026-12-03T19:00:03Z"},
			map[string]any{"type": "Initialized", "status": "True", "lastProbeTime": nil, "lastTransitionTime": "2026-12-03T19:00:01Z"},
			map[string]any{"type": "Ready", "status": ready, "lastProbeTime": nil, "lastTransitionTime": "2026-12-03T19:02:00Z"},
			map[string]any{"type": "ContainersReady", "status": ready, "lastProbeTime": nil, "lastTransitionTime": "2026-12-03T19:02:00Z"},
			map[string]any{"type": "PodScheduled", "status": "True", "lastProbeTime": nil, "lastTransitionTime": "2026-12-03T19:00:01Z"},
		},
		"containerStatuses": []any{map[string]any{"name": "vllm", "ready": p.Ready, "restartCount": 0, "image": "vllm/vllm-openai:v0.11.0",
			"imageID": "docker.io/vllm/vllm-openai@sha256:00", "containerID": "containerd://ab", "started": true,
			"state": map[string]any{"running": map[string]any{"startedAt": "2026-12-03T19:00:05Z"}}}},
	}
	if p.IP != "" {
		status["podIP"] = p.IP
		status["podIPs"] = []any{map[string]any{"ip": p.IP}}
	}
	b, _ := json.Marshal(map[string]any{
		"kind": "Pod", "apiVersion": "v1", "metadata": meta,
		"spec": map[string]any{"containers": []any{map[string]any{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
			"args": []string{"--model", "m", "--port", "8000"}, "ports": []any{map[string]any{"containerPort": 8000, "protocol": "TCP", "name": "http"}},
			"readinessProbe": map[string]any{"httpGet": map[string]any{"path": "/health", "port": 8000, "scheme": "HTTP"}, "periodSeconds": 5}}},
			"restartPolicy": "Always", "serviceAccountName": "default", "nodeName": "gpu-node-1", "schedulerName": "default-scheduler"},
		"status": status,
	})
	return b
}

// CertPEM is the PEM of a TLS test server's certificate.
func CertPEM(srv *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.paths = append(s.paths, r.URL.RequestURI())
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	s.tokens = append(s.tokens, tok)
	fail := s.failNext > 0
	if fail {
		s.failNext--
	}
	s.mu.Unlock()
	if tok != s.Token {
		writeStatus(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	if fail {
		writeStatus(w, http.StatusInternalServerError, "InternalError")
		return
	}
	ns := ""
	switch {
	case r.URL.Path == "/api/v1/pods":
	case strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/") && strings.HasSuffix(r.URL.Path, "/pods"):
		ns = strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/"), "/pods")
	default:
		writeStatus(w, http.StatusNotFound, "NotFound")
		return
	}
	sel, ok := parseSelector(r.URL.Query().Get("labelSelector"))
	if !ok {
		writeStatus(w, http.StatusBadRequest, "BadRequest")
		return
	}
	match := func(p Pod) bool {
		if ns != "" && p.Namespace != ns {
			return false
		}
		for k, v := range sel {
			if p.Labels[k] != v {
				return false
			}
		}
		return true
	}
	if r.URL.Query().Get("watch") == "1" || r.URL.Query().Get("watch") == "true" {
		s.watch(w, r, match)
		return
	}
	s.list(w, r, match)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, match func(Pod) bool) {
	s.mu.Lock()
	var keys []string
	for k, p := range s.pods {
		if match(p) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	start, _ := strconv.Atoi(r.URL.Query().Get("continue"))
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	end := len(keys)
	if limit > 0 && start+limit < end {
		end = start + limit
	}
	start = min(start, end)
	items := make([]json.RawMessage, 0, end-start)
	for _, k := range keys[start:end] {
		items = append(items, PodJSON(s.pods[k], s.podRV[k]))
	}
	meta := map[string]any{"resourceVersion": strconv.Itoa(s.rv)}
	if end < len(keys) {
		meta["continue"] = strconv.Itoa(end)
		meta["remainingItemCount"] = len(keys) - end
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request, match func(Pod) bool) {
	from, err := strconv.Atoi(r.URL.Query().Get("resourceVersion"))
	s.mu.Lock()
	if err != nil || from < s.compacted {
		how := s.gone410
		s.mu.Unlock()
		if how == "event" {
			w.Header().Set("Content-Type", "application/json")
			w.Write(errorEvent(http.StatusGone, "Expired")) //nolint:errcheck
			return
		}
		writeStatus(w, http.StatusGone, "Expired")
		return
	}
	c := make(chan event, 1024)
	for _, ev := range s.history {
		if ev.rv > from {
			c <- ev
		}
	}
	id := s.nextWatch
	s.nextWatch++
	s.watches[id] = c
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watches, id)
		s.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	fl := w.(http.Flusher)
	fl.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev := <-c:
			if ev.drop {
				w.Write([]byte(`{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"x`)) //nolint:errcheck
				fl.Flush()
				panic(http.ErrAbortHandler) // the connection is cut mid-event
			}
			line := ev.line(match)
			if line == nil {
				continue
			}
			w.Write(line) //nolint:errcheck
			fl.Flush()
			if ev.typ == "ERROR" {
				return
			}
		}
	}
}

func parseSelector(s string) (map[string]string, bool) {
	out := map[string]string{}
	if s == "" {
		return out, true
	}
	for _, term := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(term, "=")
		if !ok || k == "" {
			return nil, false
		}
		out[k] = v
	}
	return out, true
}

func writeStatus(w http.ResponseWriter, code int, reason string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"%s","reason":%q,"code":%d}`, strings.ToLower(reason), reason, code)
}

// ClientCert returns a self-signed client certificate and its key (PEM).
func ClientCert(t testing.TB) (certPEM, keyPEM []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "warmroute"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}
