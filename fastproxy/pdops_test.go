package fastproxy_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// The operator surface of a disaggregated fleet (docs/design.md §9,
// "Disaggregated fleets"): roles through the admin API, readiness per
// role, the models list, the fleet-wide calls and the operator's page.

// startRoleRouter runs a router over loopback with an empty fleet; with pd
// it is in PD mode, its decode policy round_robin.
func startRoleRouter(t *testing.T, pd bool) *testRouter {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tr := &testRouter{reg: loadview.NewRegistry(loadview.Config{HealthTimeout: time.Second, Logger: quiet})}
	var err error
	if tr.policy, err = route.New("cache_aware", tr.reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()}); err != nil {
		t.Fatal(err)
	}
	fc := fastproxy.Config{Registry: tr.reg, Policy: tr.policy, RetryMaxRetries: 3, RetryBackoff: time.Millisecond,
		RequestTimeout: 10 * time.Second, Logger: quiet}
	if pd {
		dp, err := route.New("round_robin", tr.reg, route.Options{})
		if err != nil {
			t.Fatal(err)
		}
		fc.PD = &fastproxy.PDConfig{DecodePolicy: dp}
	}
	tr.serve(t, fc)
	return tr
}

// addAs registers u (models fixed) in role, healthy or not, without HTTP.
func (tr *testRouter) addAs(t *testing.T, u string, role loadview.Role, healthy bool, models ...string) *loadview.Worker {
	t.Helper()
	ws, err := tr.reg.AddRole(context.Background(), u, models, role)
	if err != nil {
		t.Fatal(err)
	}
	tr.reg.SetHealthy(ws[0], healthy)
	return ws[0]
}

// workerRoles reads GET /workers as URL → role.
func workerRoles(t *testing.T, admin string) map[string]string {
	t.Helper()
	resp, b := do(t, "GET", admin+"/workers", "", nil)
	var v struct {
		Workers []struct {
			URL  string `json:"url"`
			Role string `json:"role"`
		} `json:"workers"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil {
		t.Fatalf("GET /workers: %d %s", resp.StatusCode, b)
	}
	out := map[string]string{}
	for _, w := range v.Workers {
		out[w.URL] = w.Role
	}
	return out
}

func urlsOf(ws []*loadview.Worker) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.URL())
	}
	sort.Strings(out)
	return out
}

// TestAdminAddsWorkersInTheirRoles: in PD mode POST /workers takes a role
// (or the vLLM router's worker_type) and /add_worker a ?role=; the worker
// lands on its side of the fleet, every listing names its role, a URL
// keeps its one role, and removal works as for any worker.
func TestAdminAddsWorkersInTheirRoles(t *testing.T) {
	_, urls := startSims(t, 4, fastSim())
	p, d, r, d2 := urls[0], urls[1], urls[2], urls[3]
	tr := startRoleRouter(t, true)
	admin := tr.adminURL(t)
	for _, c := range []struct{ method, path, body, role string }{
		{"POST", "/workers", `{"url":"` + p + `","role":"prefill"}`, "prefill"},
		{"POST", "/add_worker?role=decode&url=" + url.QueryEscape(d), "", "decode"},
		{"POST", "/workers", `{"url":"` + r + `"}`, "regular"},
		{"POST", "/workers", `{"url":"` + d2 + `","worker_type":"decode"}`, "decode"},
	} {
		resp, b := do(t, c.method, admin+c.path, c.body, nil)
		var v struct {
			Added []struct {
				Role string `json:"role"`
			} `json:"added"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil || len(v.Added) != 1 || v.Added[0].Role != c.role {
			t.Fatalf("%s %s %s: %d %s, want one %s worker added", c.method, c.path, c.body, resp.StatusCode, b, c.role)
		}
	}
	want := map[string]string{p: "prefill", d: "decode", r: "regular", d2: "decode"}
	if got := workerRoles(t, admin); len(got) != 4 || got[p] != "prefill" || got[d] != "decode" || got[r] != "regular" || got[d2] != "decode" {
		t.Fatalf("GET /workers roles %v, want %v", got, want)
	}
	_, b := do(t, "GET", admin+"/list_workers", "", nil)
	var list struct {
		URLs  []string          `json:"urls"`
		Roles map[string]string `json:"roles"`
	}
	if json.Unmarshal(b, &list) != nil || len(list.URLs) != 4 || len(list.Roles) != 4 || list.Roles[p] != "prefill" || list.Roles[d] != "decode" || list.Roles[r] != "regular" {
		t.Fatalf("GET /list_workers: %s", b)
	}
	entry, _ := tr.reg.ForModel([]byte("m"))
	decode, _ := tr.reg.DecodeWorkers([]byte("m"))
	if got := urlsOf(entry); strings.Join(got, " ") != strings.Join(sorted([]string{p, r}), " ") {
		t.Fatalf("entry side %v", got)
	}
	if got := urlsOf(decode); strings.Join(got, " ") != strings.Join(sorted([]string{d, d2}), " ") {
		t.Fatalf("decode side %v", got)
	}
	for _, c := range []struct {
		path, body string
		status     int
	}{
		{"/workers", `{"url":"` + d + `","role":"prefill"}`, 409}, // one URL, one role
		{"/add_worker?role=regular&url=" + url.QueryEscape(p), "", 409},
		{"/workers", `{"url":"http://127.0.0.1:9","role":"leader"}`, 400},
		{"/add_worker?role=Prefill&url=http://127.0.0.1:9", "", 400},
		{"/workers", `{"url":"http://127.0.0.1:9","role":"prefill","worker_type":"decode"}`, 400},
	} {
		if resp, b := do(t, "POST", admin+c.path, c.body, nil); resp.StatusCode != c.status {
			t.Errorf("POST %s %s: %d %s, want %d", c.path, c.body, resp.StatusCode, b, c.status)
		}
	}
	if resp, b := do(t, "DELETE", admin+"/workers/"+url.PathEscape(d), "", nil); resp.StatusCode != 200 {
		t.Fatalf("DELETE decode worker: %d %s", resp.StatusCode, b)
	}
	if decode, _ := tr.reg.DecodeWorkers([]byte("m")); len(decode) != 1 || decode[0].URL() != d2 {
		t.Fatalf("decode side after removal: %v", urlsOf(decode))
	}
	if got := workerRoles(t, admin); len(got) != 3 || got[d] != "" {
		t.Fatalf("GET /workers after removal: %v", got)
	}
}

// TestAdminRefusesRolesOutsidePDMode: a router not in PD mode adds regular
// workers only; a prefill or decode role is 400 with a message that says
// why, and nothing is added.
func TestAdminRefusesRolesOutsidePDMode(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	tr := startRoleRouter(t, false)
	admin := tr.adminURL(t)
	for _, c := range []struct{ path, body string }{
		{"/workers", `{"url":"` + urls[0] + `","role":"prefill"}`},
		{"/workers", `{"url":"` + urls[0] + `","worker_type":"decode"}`},
		{"/add_worker?role=decode&url=" + url.QueryEscape(urls[0]), ""},
	} {
		resp, b := do(t, "POST", admin+c.path, c.body, nil)
		if resp.StatusCode != 400 || !strings.Contains(string(b), "not in PD mode (--vllm-pd-disaggregation)") {
			t.Errorf("POST %s %s: %d %s, want 400 naming PD mode", c.path, c.body, resp.StatusCode, b)
		}
	}
	if n := len(tr.reg.Workers()); n != 0 {
		t.Fatalf("%d workers added by refused calls", n)
	}
	if resp, b := do(t, "POST", admin+"/workers", `{"url":"`+urls[0]+`","role":"regular"}`, nil); resp.StatusCode != 200 {
		t.Fatalf("regular worker: %d %s", resp.StatusCode, b)
	}
	if got := workerRoles(t, admin); got[urls[0]] != "regular" {
		t.Fatalf("GET /workers: %v", got)
	}
}

// readiness reads /readiness: its status and body.
func readiness(t *testing.T, tr *testRouter) (int, map[string]json.RawMessage) {
	t.Helper()
	resp, b := do(t, "GET", tr.url+"/readiness", "", nil)
	var v map[string]json.RawMessage
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("/readiness body %s: %v", b, err)
	}
	return resp.StatusCode, v
}

// TestReadinessPerRole: in PD mode the router is ready with a healthy
// entry worker (a prefill worker with no decode worker serves requests
// whole); the body counts each role. Outside PD mode nothing changes.
func TestReadinessPerRole(t *testing.T) {
	tr := startRoleRouter(t, true)
	step := func(want int, roles string) {
		t.Helper()
		status, body := readiness(t, tr)
		if status != want || string(body["ready"]) != map[int]string{200: "true", 503: "false"}[want] || string(body["roles"]) != roles {
			t.Fatalf("/readiness %d %s, want %d with roles %s", status, body, want, roles)
		}
	}
	step(503, `{"regular":{"healthy":0,"total":0},"prefill":{"healthy":0,"total":0},"decode":{"healthy":0,"total":0}}`)
	pw := tr.addAs(t, deadURL(t), loadview.Prefill, true, "m")
	step(200, `{"regular":{"healthy":0,"total":0},"prefill":{"healthy":1,"total":1},"decode":{"healthy":0,"total":0}}`)
	dw := tr.addAs(t, deadURL(t), loadview.Decode, true, "m")
	step(200, `{"regular":{"healthy":0,"total":0},"prefill":{"healthy":1,"total":1},"decode":{"healthy":1,"total":1}}`)
	tr.reg.SetHealthy(dw, false) // a prefill worker with nowhere to decode serves whole
	step(200, `{"regular":{"healthy":0,"total":0},"prefill":{"healthy":1,"total":1},"decode":{"healthy":0,"total":1}}`)
	tr.reg.SetHealthy(pw, false) // decode workers alone serve nothing
	step(503, `{"regular":{"healthy":0,"total":0},"prefill":{"healthy":0,"total":1},"decode":{"healthy":0,"total":1}}`)
	tr.addAs(t, deadURL(t), loadview.Regular, true, "m")
	step(200, `{"regular":{"healthy":1,"total":1},"prefill":{"healthy":0,"total":1},"decode":{"healthy":0,"total":1}}`)
	tr.reg.Remove(pw.URL()) // regular workers alone serve whole requests
	step(200, `{"regular":{"healthy":1,"total":1},"prefill":{"healthy":0,"total":0},"decode":{"healthy":0,"total":1}}`)

	plain := startRoleRouter(t, false)
	plain.addAs(t, deadURL(t), loadview.Regular, true, "m")
	if status, body := readiness(t, plain); status != 200 || body["roles"] != nil || string(body["healthy_workers"]) != "1" {
		t.Fatalf("outside PD mode: %d %s", status, body)
	}
}

// TestModelsListTheEntrySide: in PD mode /v1/models lists the models the
// entry workers serve, in the usual shape; a model only decode workers
// serve is not one a client can request.
func TestModelsListTheEntrySide(t *testing.T) {
	tr := startRoleRouter(t, true)
	tr.addAs(t, deadURL(t), loadview.Prefill, true, "m")
	tr.addAs(t, deadURL(t), loadview.Regular, true, "r")
	tr.addAs(t, deadURL(t), loadview.Decode, true, "m", "decode-only")
	resp, b := do(t, "GET", tr.url+"/v1/models", "", nil)
	var v struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil || v.Object != "list" {
		t.Fatalf("/v1/models: %d %s", resp.StatusCode, b)
	}
	var ids []string
	for _, m := range v.Data {
		if m.Object != "model" {
			t.Fatalf("/v1/models entry %+v", m)
		}
		ids = append(ids, m.ID)
	}
	sort.Strings(ids)
	if strings.Join(ids, " ") != "m r" {
		t.Fatalf("/v1/models lists %v, want [m r]", ids)
	}
}

// TestFleetAdminCallsEveryRole: a fleet-wide engine call reaches the
// decode workers too, with ?model= as without, and its summary names each
// worker's role.
func TestFleetAdminCallsEveryRole(t *testing.T) {
	_, urls := startSims(t, 3, fastSim())
	tr := startRoleRouter(t, true)
	tr.addAs(t, urls[0], loadview.Prefill, true, "m")
	tr.addAs(t, urls[1], loadview.Decode, true, "m")
	tr.addAs(t, urls[2], loadview.Regular, true, "other")
	admin := tr.adminURL(t)
	for _, c := range []struct {
		path string
		want map[string]string
	}{
		{"/is_sleeping", map[string]string{urls[0]: "prefill", urls[1]: "decode", urls[2]: "regular"}},
		{"/is_sleeping?model=m", map[string]string{urls[0]: "prefill", urls[1]: "decode"}},
	} {
		resp, b := do(t, "GET", admin+c.path, "", nil)
		var v struct {
			Results []struct {
				Worker string `json:"worker"`
				Role   string `json:"role"`
				Status int    `json:"status"`
			} `json:"results"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &v) != nil || len(v.Results) != len(c.want) {
			t.Fatalf("GET %s: %d %s, want %d results", c.path, resp.StatusCode, b, len(c.want))
		}
		for _, r := range v.Results {
			if r.Status != 200 || c.want[r.Worker] != r.Role {
				t.Errorf("GET %s: result %+v, want role %q", c.path, r, c.want[r.Worker])
			}
		}
	}
	if resp, _ := do(t, "GET", admin+"/is_sleeping?model=nope", "", nil); resp.StatusCode != 404 {
		t.Fatalf("unknown model: %d, want 404", resp.StatusCode)
	}
}

// TestOperatorPageShowsRoles: the workers table has a role column, and in
// PD mode the header shows the policies, the KV hold and each side's
// health.
func TestOperatorPageShowsRoles(t *testing.T) {
	tr := startRoleRouter(t, true)
	p := tr.addAs(t, deadURL(t), loadview.Prefill, true, "m")
	d := tr.addAs(t, deadURL(t), loadview.Decode, false, "m")
	f := &opsFleet{testRouter: tr, admin: tr.adminURL(t)}
	page := f.page(t, "/ui?refresh=0")
	workers := section(page, "workers")
	for _, c := range []struct{ url, role string }{{p.URL(), "prefill"}, {d.URL(), "decode"}} {
		if !strings.Contains(workers, `<td class="m">`+c.url+`</td><td>`+c.role+`</td>`) {
			t.Errorf("worker %s not shown as %s:\n%s", c.url, c.role, workers)
		}
	}
	if !strings.Contains(workers, "<th>Role</th>") {
		t.Errorf("no role column:\n%s", workers)
	}
	for _, want := range []string{
		"prefill policy <b>cache_aware</b>", "decode policy <b>round_robin</b>", "KV hold <b>8m0s</b>",
		`prefill <b class="ok">1/1</b> healthy`, `decode <b class="bad">0/1</b> healthy`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("header lacks %q", want)
		}
	}
	plain := startRoleRouter(t, false)
	plain.addAs(t, deadURL(t), loadview.Regular, true, "m")
	pf := &opsFleet{testRouter: plain, admin: plain.adminURL(t)}
	pp := pf.page(t, "/ui?refresh=0")
	if strings.Contains(pp, "decode policy") || !strings.Contains(pp, "policy <b>cache_aware</b>") || !strings.Contains(section(pp, "workers"), "<td>regular</td>") {
		t.Errorf("outside PD mode the header shows PD settings or the row no role:\n%s", pp)
	}
}
