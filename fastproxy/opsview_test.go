package fastproxy_test

import (
	"context"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/examples"
	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/simworker"
)

// The operator's page (docs/design.md §8.4) over loopback: a real router
// and its metrics listener in front of simulated workers.

const injection = "<script>alert(1)</script>"

// hitRate matches a worker row's prefix-cache hit rate cell (the one before
// the cached tokens served).
var hitRate = regexp.MustCompile(`<td class="n">([0-9.]+)%</td><td class="n">[0-9.k]+ <span class="dim">of`)

// opsFleet is a router with its loopback metrics listener in front of
// simulated workers, one per model; with logical, the models are the demo
// config's and the logical model "auto" goes through the model step.
type opsFleet struct {
	*testRouter
	admin     string
	urls      []string
	decisions map[string]int // decision label → requests answered with it
}

func startOpsFleet(t *testing.T, logical bool, sim simworker.Config, mod func(*fastproxy.Config, *loadview.Config)) *opsFleet {
	t.Helper()
	f := &opsFleet{decisions: map[string]int{}}
	models := []string{"m", "m", "m"}
	var cfg *saar.Config
	if logical {
		var err error
		if cfg, err = saar.ParseConfig(examples.Demo); err != nil {
			t.Fatal(err)
		}
		models = models[:0]
		for _, m := range cfg.Models {
			models = append(models, m.Name)
		}
	}
	for i, m := range models {
		sc := sim
		sc.Models = []string{m}
		_, urls := startSims(t, 1, sc)
		f.urls = append(f.urls, urls[0])
		if cfg != nil {
			cfg.Models[i].Workers = urls
		}
	}
	f.testRouter = startRouter(t, nil, "cache_aware", func(c *fastproxy.Config, l *loadview.Config) {
		l.LoadScrapeInterval = time.Hour // scraped by hand (ScrapeLoadOnce); reports stay fresh
		if cfg != nil {
			c.Models = saar.NewRouter(cfg, saar.Options{})
		}
		if mod != nil {
			mod(c, l)
		}
	})
	for i, u := range f.urls {
		if _, err := f.reg.Add(context.Background(), u, []string{models[i]}); err != nil {
			t.Fatal(err)
		}
	}
	f.admin = f.adminURL(t)
	return f
}

// chat sends one chat turn and counts its decision label.
func (f *opsFleet) chat(t *testing.T, model, session, text string) {
	t.Helper()
	resp, b := do(t, "POST", f.url+chatPath, chatBody(model, text, false), map[string]string{"X-Session-ID": session})
	if resp.StatusCode != 200 {
		t.Fatalf("chat %s/%s: %d %s", model, session, resp.StatusCode, b)
	}
	f.decisions[resp.Header.Get("x-vllm-router-decision")]++
}

// page GETs the operator's page at path and checks its security headers.
func (f *opsFleet) page(t *testing.T, path string) string {
	t.Helper()
	resp, b := do(t, "GET", f.admin+path, "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	for h, want := range map[string]string{
		"Content-Type":           "text/html; charset=utf-8",
		"Cache-Control":          "no-store",
		"X-Content-Type-Options": "nosniff",
	} {
		if got := resp.Header.Get(h); got != want {
			t.Errorf("GET %s: %s = %q, want %q", path, h, got, want)
		}
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "default-src 'none'; style-src 'unsafe-inline'") {
		t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
	}
	return string(b)
}

// section returns the table of id in page ("" when absent).
func section(page, id string) string {
	i := strings.Index(page, `<table id="`+id+`">`)
	if i < 0 {
		return ""
	}
	j := strings.Index(page[i:], "</table>")
	return page[i : i+j]
}

// TestOperatorPage: the page lists every worker with its scraped load, the
// decision labels served with their counts, the sessions (a hostile session
// id escaped) and nothing executable; / and /ui serve it, other methods
// are refused, and the inference port does not serve it.
// treeBudget is a tree cell with its budget: "12.3k of 524.3k (…)".
var treeBudget = regexp.MustCompile(`<td class="n">[0-9.]+[kMG]? <span class="dim">of [0-9.]+[kMG]?</span>`)

func TestOperatorPage(t *testing.T) {
	f := startOpsFleet(t, false, fastSim(), nil)
	f.chat(t, "m", injection, "hello from a hostile client")
	for turn := 0; turn < 2; turn++ {
		for _, s := range []string{"alpha-1", "bravo-2", "charlie-3"} {
			f.chat(t, "m", s, "plan a trip for "+s+strings.Repeat(" with many details", 20))
		}
	}
	waitIdle(t, f.reg)
	f.reg.ScrapeLoadOnce(context.Background())
	f.policy.(route.Sweeper).Sweep() // the capacities scraped budget the tree
	page := f.page(t, "/ui")
	if root := f.page(t, "/"); !strings.Contains(root, `<table id="workers">`) {
		t.Fatalf("GET / is not the page:\n%s", root)
	}
	workers := section(page, "workers")
	for _, u := range f.urls {
		if !strings.Contains(workers, `<td class="m">`+u+`</td>`) {
			t.Errorf("worker %s not listed:\n%s", u, workers)
		}
	}
	// Scraped: idle workers, KV cache empty, the capacity each states
	// (the simulated worker's 8,192 blocks of 16 tokens).
	if strings.Count(workers, `<td class="n">0.0% <span class="dim">of 131.1k tokens</span></td>`) < len(f.urls) {
		t.Errorf("scraped KV cache usage and capacity not shown:\n%s", workers)
	}
	if !treeBudget.MatchString(workers) { // that capacity budgets each worker's part of the tree
		t.Errorf("no worker's tree shows its budget:\n%s", workers)
	}
	// Every session's second turn finds its first in the worker's cache.
	warm := 0
	for _, m := range hitRate.FindAllStringSubmatch(workers, -1) {
		if r, _ := strconv.ParseFloat(m[1], 64); r > 0 && r <= 100 {
			warm++
		}
	}
	if warm == 0 {
		t.Errorf("no worker shows a prefix-cache hit rate from cached_tokens:\n%s", workers)
	}
	decisions := section(page, "decisions")
	if len(f.decisions) == 0 {
		t.Fatal("no decision labels seen")
	}
	for label, n := range f.decisions {
		if !strings.Contains(decisions, `<td class="m">`+label+`</td><td class="n">`+strconv.Itoa(n)+`</td>`) {
			t.Errorf("decision %s × %d not shown:\n%s", label, n, decisions)
		}
	}
	sessions := section(page, "sessions")
	for _, s := range []string{"alpha-1", "bravo-2", "charlie-3", "&lt;script&gt;alert(1)&lt;/script&gt;"} {
		if !strings.Contains(sessions, `<td class="m">`+s+`</td>`) {
			t.Errorf("session %s not listed:\n%s", s, sessions)
		}
	}
	if strings.Contains(strings.ToLower(page), "<script") {
		t.Fatalf("the page carries a script:\n%s", page)
	}
	if resp, _ := do(t, "POST", f.admin+"/ui", "", nil); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /ui: %d, want 405", resp.StatusCode)
	}
	if resp, _ := do(t, "GET", f.url+"/ui", "", nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("inference port GET /ui: %d, want 404", resp.StatusCode)
	}
}

// TestOperatorPageShowsModelStepRecords: with a logical model, the page
// shows the model step's latest records with their reasons.
func TestOperatorPageShowsModelStepRecords(t *testing.T) {
	f := startOpsFleet(t, true, fastSim(), nil)
	f.chat(t, "auto", "agent-7", "prove this theorem step by step")
	f.chat(t, "auto", "agent-8", "hello there")
	f.chat(t, "sim-small", "direct-1", "hello")
	page := f.page(t, "/ui")
	records := section(page, "records")
	if records == "" {
		t.Fatalf("no model-step table:\n%s", page)
	}
	resp, b := do(t, "GET", f.admin+"/v1/router_replay?limit=10", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("router_replay: %d %s", resp.StatusCode, b)
	}
	for _, s := range []string{"agent-7", "agent-8"} {
		if !strings.Contains(records, `<td class="m">`+s+`</td>`) {
			t.Errorf("record of %s not shown:\n%s", s, records)
		}
	}
	for _, reason := range reasonsOf(string(b)) {
		if !strings.Contains(records, `<td class="m">`+reason+`</td>`) {
			t.Errorf("reason %s not shown:\n%s", reason, records)
		}
	}
	if !strings.Contains(page, "logical models <b>auto</b>") {
		t.Errorf("logical models not in the header")
	}
}

// reasonsOf extracts the "reason" values of a /v1/router_replay answer.
func reasonsOf(body string) []string {
	var out []string
	for _, part := range strings.Split(body, `"reason":"`)[1:] {
		out = append(out, part[:strings.IndexByte(part, '"')])
	}
	return out
}

// TestOperatorPageIsBounded: a fleet past the row caps renders the first
// rows and says how many more there are.
func TestOperatorPageIsBounded(t *testing.T) {
	f := startOpsFleet(t, false, fastSim(), nil)
	for i := 0; i < 60; i++ {
		f.chat(t, "m", "user-"+strconv.Itoa(i), "hi")
	}
	big := startRouter(t, nil, "cache_aware", func(_ *fastproxy.Config, l *loadview.Config) { l.DPSize = 210 })
	if _, err := big.reg.Add(context.Background(), deadURL(t), []string{"m"}); err != nil {
		t.Fatal(err)
	}
	page := f.page(t, "/ui")
	if n := strings.Count(section(page, "sessions"), "<tr><td"); n != 50 || !strings.Contains(page, "and 10 more (see /debug/sessions)") {
		t.Errorf("%d session rows (want 50, and 10 more)", n)
	}
	bigPage := (&opsFleet{admin: big.adminURL(t)}).page(t, "/ui")
	if n := strings.Count(section(bigPage, "workers"), "<tr><td"); n != 200 || !strings.Contains(bigPage, "and 10 more workers") {
		t.Errorf("%d worker rows (want 200, and 10 more)", n)
	}
}

// TestOperatorPageAdmission: on a listener not bound to loopback the page
// is an admin surface like the others: absent without an admin key (404),
// 401 without the key, served with it.
func TestOperatorPageAdmission(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	open := startRouter(t, urls, "cache_aware", nil)
	keyed := startRouter(t, urls, "cache_aware", func(c *fastproxy.Config, _ *loadview.Config) { c.AdminAPIKey = "s3cret" })
	for _, p := range []string{"/", "/ui"} {
		if resp, _ := do(t, "GET", serveNonLoopback(t, open.srv)+p, "", nil); resp.StatusCode != 404 {
			t.Errorf("no admin key: GET %s = %d, want 404", p, resp.StatusCode)
		}
		base := serveNonLoopback(t, keyed.srv)
		for _, auth := range []string{"", "Bearer wrong"} {
			if resp, b := do(t, "GET", base+p, "", map[string]string{"Authorization": auth}); resp.StatusCode != 401 || strings.Contains(string(b), "<table") {
				t.Errorf("GET %s with %q = %d, want 401", p, auth, resp.StatusCode)
			}
		}
		if resp, b := do(t, "GET", base+p, "", map[string]string{"Authorization": "Bearer s3cret"}); resp.StatusCode != 200 || !strings.Contains(string(b), `<table id="workers">`) {
			t.Errorf("GET %s with the key = %d", p, resp.StatusCode)
		}
	}
}

// serveNonLoopback serves srv's metrics listener handler as if bound to a
// non-loopback address (it listens on loopback for the test).
func serveNonLoopback(t *testing.T, srv *fastproxy.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fasthttp.Server{Handler: srv.ObservabilityHandler(false)}
	go s.Serve(ln)                     //nolint:errcheck
	t.Cleanup(func() { s.Shutdown() }) //nolint:errcheck
	return "http://" + ln.Addr().String()
}
