// Package k8swatch follows the pods a label selector picks through the
// Kubernetes API's list and watch calls, over plain HTTPS with the
// standard library: no client library (docs/design.md §8, §8.3
// "Kubernetes discovery"). Credentials are the pod's service account
// (in-cluster) or a kubeconfig file; exec and auth-provider plugins are
// not supported.
package k8swatch

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Client calls one API server with one identity.
type Client struct {
	server    string // https://host:port, no trailing slash
	hc        *http.Client
	token     *tokenSource // nil: no bearer token (a client certificate, or none)
	namespace string       // the credentials' namespace: the service account's, or the kubeconfig context's
}

// Namespace is the namespace the credentials name ("" when they name none).
func (c *Client) Namespace() string { return c.namespace }

// Server is the API server's base URL.
func (c *Client) Server() string { return c.server }

// The in-cluster service account's files and environment (the Kubernetes
// documentation, "Accessing the Kubernetes API from a Pod").
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// tokenReread is how long a token read from a file is used before the
// file is read again: a projected service account token rotates (hourly by
// default); client-go re-reads it every minute too.
var tokenReread = time.Minute

// ErrNoCredentials: no kubeconfig was given or found and the process does
// not run in a pod.
var ErrNoCredentials = errors.New("no Kubernetes credentials: not in a pod (KUBERNETES_SERVICE_HOST unset) and no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config)")

// Load returns a client from, in order: the kubeconfig file named (the
// --kubeconfig flag), the pod's service account when in a pod, the first
// file of $KUBECONFIG, ~/.kube/config.
func Load(kubeconfig string) (*Client, error) {
	if kubeconfig != "" {
		return FromKubeconfig(kubeconfig)
	}
	if host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"); host != "" && port != "" {
		return InCluster(host, port, serviceAccountDir)
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		for _, p := range filepath.SplitList(env) {
			if p != "" {
				return FromKubeconfig(p)
			}
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".kube", "config")
		if _, err := os.Stat(p); err == nil {
			return FromKubeconfig(p)
		}
	}
	return nil, ErrNoCredentials
}

// InCluster returns a client of the API server at host:port (the
// KUBERNETES_SERVICE_HOST and _PORT a pod is given) authenticated by the
// service account token in dir (re-read every minute: it rotates),
// verifying the server by dir's ca.crt; its namespace is dir's namespace.
func InCluster(host, port, dir string) (*Client, error) {
	pem, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("in-cluster credentials: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("in-cluster credentials: ca.crt holds no PEM certificate")
	}
	ts := &tokenSource{path: filepath.Join(dir, "token")}
	if _, err := ts.get(); err != nil {
		return nil, fmt.Errorf("in-cluster credentials: %w", err)
	}
	ns, _ := os.ReadFile(filepath.Join(dir, "namespace"))
	return newClient("https://"+net.JoinHostPort(host, port), &tls.Config{RootCAs: pool}, ts, strings.TrimSpace(string(ns))), nil
}

func newClient(server string, tc *tls.Config, ts *tokenSource, ns string) *Client {
	tc.MinVersion = tls.VersionTLS12
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	return &Client{server: strings.TrimRight(server, "/"), hc: &http.Client{Transport: tr}, token: ts, namespace: ns}
}

// get issues GET path?query with the credentials' bearer token.
func (c *Client) get(ctx context.Context, pathQuery string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.server+pathQuery, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "warmroute")
	if c.token != nil {
		tok, err := c.token.get()
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	return c.hc.Do(req)
}

// tokenSource is a bearer token: fixed, or read from a file and re-read
// every tokenReread (a projected service account token rotates).
type tokenSource struct {
	path string // "": fixed

	mu     sync.Mutex
	tok    string
	readAt time.Time
}

func (t *tokenSource) get() (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.path == "" || (t.tok != "" && time.Since(t.readAt) < tokenReread) {
		return t.tok, nil
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		if t.tok != "" {
			return t.tok, nil // keep the last one: the file is being replaced
		}
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		if t.tok != "" {
			return t.tok, nil
		}
		return "", errors.New("token file is empty")
	}
	t.tok, t.readAt = tok, time.Now()
	return tok, nil
}
