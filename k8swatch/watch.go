package k8swatch

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Config configures a Watcher.
type Config struct {
	Namespace   string   // "": every namespace (the vLLM router's default; needs a ClusterRole)
	Selector    Selector // the pods followed; must not be empty
	Annotations []string // annotations kept in Pod.Annotations

	MaxPods       int           // pods tracked at most, ready or not (more are ignored and counted); default 4096
	MaxEventBytes int           // largest watch event; default 4 MiB (a Pod is at most ~1.5 MiB in etcd)
	MaxListBytes  int64         // largest list page; default 64 MiB
	PageSize      int           // pods per list page; default 500
	MinBackoff    time.Duration // first wait after a failure; default 1 s
	MaxBackoff    time.Duration // longest wait after failures; default 30 s
	WatchTimeout  time.Duration // the server ends each watch after about this long (timeoutSeconds, jittered up to 2x); default 5 min

	// OnChange runs (from the watch goroutine; it must not block) after a
	// list and after each event that changes the pods.
	OnChange func()
	Logger   *slog.Logger
}

// Watcher follows the pods of one label selector: a list, then a watch
// from the list's resource version, resumed from the last version seen
// when it drops and relisted when that version is gone (410). The pods it
// holds are the last ones the API server stated: a failing API server
// changes none of them.
type Watcher struct {
	c    *Client
	cfg  Config
	path string // /api/v1/[namespaces/NS/]pods

	mu     sync.Mutex
	pods   map[string]Pod // by Key; under mu
	synced bool           // a list succeeded; under mu
	rv     string         // the resource version to resume from; "": list first; only Run's goroutine

	lists, failures, events, ignored atomic.Uint64
	overLogged                       atomic.Bool
}

// New returns a watcher of cfg's pods through c; Run starts it.
func New(c *Client, cfg Config) (*Watcher, error) {
	if len(cfg.Selector) == 0 {
		return nil, errors.New("k8swatch: an empty selector would follow every pod")
	}
	if cfg.MaxPods <= 0 {
		cfg.MaxPods = 4096
	}
	if cfg.MaxEventBytes <= 0 {
		cfg.MaxEventBytes = 4 << 20
	}
	if cfg.MaxListBytes <= 0 {
		cfg.MaxListBytes = 64 << 20
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 500
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(30*time.Second, cfg.MinBackoff)
	}
	if cfg.WatchTimeout <= 0 {
		cfg.WatchTimeout = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	path := "/api/v1/pods"
	if cfg.Namespace != "" {
		path = "/api/v1/namespaces/" + url.PathEscape(cfg.Namespace) + "/pods"
	}
	return &Watcher{c: c, cfg: cfg, path: path, pods: map[string]Pod{}}, nil
}

// Selector is the watcher's selector.
func (w *Watcher) Selector() Selector { return w.cfg.Selector }

// Pods returns the pods held, sorted by key, and whether a list has
// succeeded yet (before it, the set says nothing).
func (w *Watcher) Pods() ([]Pod, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Pod, 0, len(w.pods))
	for _, p := range w.pods {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key() < out[j].Key() })
	return out, w.synced
}

// Len is the number of pods held.
func (w *Watcher) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pods)
}

// Lists counts the lists (the first, and one after each 410 Gone).
func (w *Watcher) Lists() uint64 { return w.lists.Load() }

// Failures counts failed lists and watches: refused or failed calls,
// dropped or undecodable streams, ERROR events.
func (w *Watcher) Failures() uint64 { return w.failures.Load() }

// Events counts the watch events applied (bookmarks included).
func (w *Watcher) Events() uint64 { return w.events.Load() }

// Ignored counts pods not tracked because MaxPods were.
func (w *Watcher) Ignored() uint64 { return w.ignored.Load() }

// errGone: the resource version is too old (410): list again.
var errGone = errors.New("resource version gone (410)")

// Run lists and watches until ctx ends. A watch the server ended resumes
// at once; a 410 lists again at once (after a wait when the list itself
// was just made); a failure waits a backoff (jittered, doubling up to
// MaxBackoff, back to MinBackoff once a call makes progress) and resumes
// from the last resource version seen.
func (w *Watcher) Run(ctx context.Context) {
	backoff := w.cfg.MinBackoff
	failing := false
	for ctx.Err() == nil {
		var err error
		var n uint64
		listed := false
		if w.rv == "" {
			err = w.list(ctx)
			listed = err == nil
		}
		if err == nil {
			n, err = w.watch(ctx)
		}
		if ctx.Err() != nil {
			return
		}
		gone := errors.Is(err, errGone)
		if gone {
			w.rv = ""
		}
		progress := n > 0 || listed && !gone
		switch {
		case err != nil && !gone:
			w.failures.Add(1)
			if !failing {
				failing = true
				w.cfg.Logger.Warn("Kubernetes pod watch failed; keeping the pods, retrying", "selector", w.cfg.Selector.String(), "err", err)
			}
		case failing && progress:
			failing = false
			w.cfg.Logger.Info("Kubernetes pod watch works again", "selector", w.cfg.Selector.String())
		}
		if progress {
			backoff = w.cfg.MinBackoff
		}
		if err == nil && progress || gone && !listed {
			continue
		}
		d := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, w.cfg.MaxBackoff)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// query is the selector's query string with extra parameters.
func (w *Watcher) query(extra url.Values) string {
	extra.Set("labelSelector", w.cfg.Selector.String())
	return w.path + "?" + extra.Encode()
}

// list reads every page of the selector's pods and replaces the set.
func (w *Watcher) list(ctx context.Context) error {
	w.lists.Add(1)
	pods := map[string]Pod{}
	var rv, cont string
	for {
		q := url.Values{"limit": {strconv.Itoa(w.cfg.PageSize)}}
		if cont != "" {
			q.Set("continue", cont)
		}
		lctx, cancel := context.WithTimeout(ctx, time.Minute)
		page, err := w.listPage(lctx, w.query(q))
		cancel()
		if errors.Is(err, errGone) {
			// An expired continue token: a failure, listed again after
			// the backoff (never at once, which a server answering every
			// list 410 would turn into a busy loop).
			return errors.New("pod list answered 410 Gone")
		}
		if err != nil {
			return err
		}
		for i := range page.Items {
			p := page.Items[i].pod(w.cfg.Annotations)
			if !w.cfg.Selector.Matches(p.Labels) || p.Name == "" {
				continue
			}
			if _, ok := pods[p.Key()]; !ok && len(pods) >= w.cfg.MaxPods {
				w.overLimit()
				continue
			}
			p.Labels = nil // checked; not kept
			pods[p.Key()] = p
		}
		rv, cont = page.Metadata.ResourceVersion, page.Metadata.Continue
		if cont == "" {
			break
		}
	}
	if rv == "" {
		return errors.New("pod list without a resourceVersion")
	}
	w.mu.Lock()
	w.pods, w.synced = pods, true
	w.mu.Unlock()
	w.rv = rv
	w.changed()
	return nil
}

func (w *Watcher) listPage(ctx context.Context, pq string) (*podListJSON, error) {
	resp, err := w.c.get(ctx, pq)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(resp)
	}
	var page podListJSON
	lr := &io.LimitedReader{R: resp.Body, N: w.cfg.MaxListBytes + 1}
	if err := json.NewDecoder(lr).Decode(&page); err != nil {
		if lr.N <= 0 {
			return nil, fmt.Errorf("pod list page larger than %d bytes", w.cfg.MaxListBytes)
		}
		return nil, fmt.Errorf("pod list: %w", err)
	}
	return &page, nil
}

// statusError reads a failed call's Status (bounded) into an error: the
// code and the server's reason, nothing else.
func statusError(resp *http.Response) error {
	if resp.StatusCode == http.StatusGone {
		return errGone
	}
	var s statusJSON
	_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&s)
	if s.Reason != "" {
		return fmt.Errorf("API server answered %d (%s)", resp.StatusCode, s.Reason)
	}
	return fmt.Errorf("API server answered %d", resp.StatusCode)
}

// watch follows the events from w.rv until the stream ends: nil when the
// server ended it cleanly, errGone when the version is gone, another error
// otherwise. It returns the events applied.
func (w *Watcher) watch(ctx context.Context) (uint64, error) {
	timeout := w.cfg.WatchTimeout + rand.N(w.cfg.WatchTimeout+1)
	// The request's own deadline, past the server's timeoutSeconds: a
	// connection that silently died ends too.
	wctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	q := url.Values{
		"watch":               {"1"},
		"resourceVersion":     {w.rv},
		"allowWatchBookmarks": {"true"},
		"timeoutSeconds":      {strconv.Itoa(max(1, int(timeout/time.Second)))},
	}
	resp, err := w.c.get(wctx, w.query(q))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, statusError(resp)
	}
	br := bufio.NewReaderSize(resp.Body, 32<<10)
	var buf []byte
	var n uint64
	for {
		frame, err := readFrame(br, buf, w.cfg.MaxEventBytes)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		ev, err := decodeEvent(frame, w.cfg.Annotations)
		if cap(frame) <= 256<<10 {
			buf = frame // reused; a large one is let go
		} else {
			buf = nil
		}
		if err != nil {
			return n, err
		}
		if ev.Type == Error {
			if ev.Code == http.StatusGone {
				return n, errGone
			}
			return n, fmt.Errorf("watch ERROR event %d", ev.Code)
		}
		n++
		w.events.Add(1)
		w.apply(ev)
	}
}

// apply changes the set by one event and records its resource version.
func (w *Watcher) apply(ev Event) {
	if ev.ResourceVersion != "" {
		w.rv = ev.ResourceVersion
	}
	if ev.Type == Bookmark {
		return
	}
	p, key := ev.Pod, ev.Pod.Key()
	w.mu.Lock()
	old, had := w.pods[key]
	switch {
	case ev.Type == Deleted || !w.cfg.Selector.Matches(p.Labels):
		// A pod whose labels no longer match leaves the selection (the API
		// server sends it as a MODIFIED event).
		delete(w.pods, key)
	case !had && len(w.pods) >= w.cfg.MaxPods:
		w.mu.Unlock()
		w.overLimit()
		return
	default:
		p.Labels = nil // checked; not kept
		w.pods[key] = p
	}
	_, has := w.pods[key]
	same := had == has && (!has || old.IP == p.IP && old.Ready == p.Ready && equalMaps(old.Annotations, p.Annotations))
	w.mu.Unlock()
	if !same {
		w.changed()
	}
}

func (w *Watcher) overLimit() {
	w.ignored.Add(1)
	if !w.overLogged.Swap(true) {
		w.cfg.Logger.Warn("Kubernetes pod watch: more pods than tracked; ignoring the others", "selector", w.cfg.Selector.String(), "max", w.cfg.MaxPods)
	}
}

func (w *Watcher) changed() {
	if w.cfg.OnChange != nil {
		w.cfg.OnChange()
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}
