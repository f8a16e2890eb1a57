package fastproxy_test

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/route"
)

// fleetAnswer is the router's summary of a fleet-wide admin call.
type fleetAnswer struct {
	Workers int `json:"workers"`
	Results []struct {
		Worker   string          `json:"worker"`
		Status   int             `json:"status"`
		Error    string          `json:"error"`
		Response json.RawMessage `json:"response"`
	} `json:"results"`
}

// fleetCall sends one admin call and decodes the summary; it fails the test
// unless the router answers want.
func fleetCall(t *testing.T, method, url string, want int) fleetAnswer {
	t.Helper()
	resp, body := do(t, method, url, "", nil)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, url, resp.StatusCode, body, want)
	}
	var a fleetAnswer
	if err := json.Unmarshal(body, &a); err != nil || a.Workers != len(a.Results) {
		t.Fatalf("%s %s: summary %s (%v)", method, url, body, err)
	}
	return a
}

func (a fleetAnswer) workers() []string {
	var ws []string
	for _, r := range a.Results {
		ws = append(ws, r.Worker)
	}
	sort.Strings(ws)
	return ws
}

func sorted(s []string) []string {
	s = append([]string(nil), s...)
	sort.Strings(s)
	return s
}

// sleeping reads every result's is_sleeping answer.
func (a fleetAnswer) sleeping(t *testing.T) map[string]bool {
	t.Helper()
	m := map[string]bool{}
	for _, r := range a.Results {
		var v struct {
			IsSleeping *bool `json:"is_sleeping"`
		}
		if r.Status != 200 || json.Unmarshal(r.Response, &v) != nil || v.IsSleeping == nil {
			t.Fatalf("is_sleeping result %+v (response %s)", r, r.Response)
		}
		m[r.Worker] = *v.IsSleeping
	}
	return m
}

// TestFleetSleepWakeUp: /sleep through the admin listener puts every
// worker to sleep (200, each worker 200), /is_sleeping carries each
// worker's answer, chat fails while the fleet sleeps and works again after
// /wake_up (docs/design.md §8.4).
func TestFleetSleepWakeUp(t *testing.T) {
	sims, urls := startSims(t, 2, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	admin := r.adminURL(t)
	chat := func() int {
		resp, _ := do(t, "POST", r.url+chatPath, chatBody("m", "hello", false), nil)
		return resp.StatusCode
	}
	if code := chat(); code != 200 {
		t.Fatalf("before sleeping: %d", code)
	}
	a := fleetCall(t, "POST", admin+"/sleep?level=1", 200)
	if got, want := a.workers(), sorted(urls); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("sleep went to %v, want %v", got, want)
	}
	for _, res := range a.Results {
		if res.Status != 200 || res.Error != "" || res.Response != nil {
			t.Fatalf("sleep result %+v", res)
		}
	}
	for w, on := range fleetCall(t, "GET", admin+"/is_sleeping", 200).sleeping(t) {
		if !on {
			t.Fatalf("%s is awake after /sleep", w)
		}
	}
	for i, s := range sims {
		if on, level := s.Sleeping(); !on || level != 1 {
			t.Fatalf("sim %d: sleeping %v level %d", i, on, level)
		}
	}
	if code := chat(); code == 200 {
		t.Fatal("chat succeeded while every worker sleeps")
	} else if code != http.StatusServiceUnavailable {
		t.Logf("chat while asleep: %d", code)
	}
	fleetCall(t, "POST", admin+"/wake_up", 200)
	for w, on := range fleetCall(t, "GET", admin+"/is_sleeping", 200).sleeping(t) {
		if on {
			t.Fatalf("%s still sleeps after /wake_up", w)
		}
	}
	if code := chat(); code != 200 {
		t.Fatalf("after wake_up: %d", code)
	}
}

// TestFleetAdminByModel: ?model= limits the call to the workers serving
// that model; an unknown model is 404 model_not_found and touches nothing.
func TestFleetAdminByModel(t *testing.T) {
	cfgA, cfgB := fastSim(), fastSim()
	cfgA.Models, cfgB.Models = []string{"a"}, []string{"b"}
	simsA, urlsA := startSims(t, 2, cfgA)
	simsB, urlsB := startSims(t, 1, cfgB)
	r := startRouter(t, append(append([]string(nil), urlsA...), urlsB...), "cache_aware", nil)
	admin := r.adminURL(t)

	resp, body := do(t, "POST", admin+"/sleep?model=nope", "", nil)
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	if resp.StatusCode != 404 || json.Unmarshal(body, &e) != nil || e.Error.Code != "model_not_found" {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}

	a := fleetCall(t, "POST", admin+"/sleep?model=a", 200)
	if got, want := a.workers(), sorted(urlsA); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("sleep?model=a went to %v, want %v", got, want)
	}
	for i, s := range simsA {
		if on, _ := s.Sleeping(); !on {
			t.Fatalf("worker %d of model a is awake", i)
		}
	}
	if on, _ := simsB[0].Sleeping(); on {
		t.Fatal("the worker of model b went to sleep")
	}
	if m := fleetCall(t, "GET", admin+"/is_sleeping?model=b", 200).sleeping(t); len(m) != 1 || m[urlsB[0]] {
		t.Fatalf("is_sleeping?model=b: %v", m)
	}
	if resp, b := do(t, "POST", r.url+chatPath, chatBody("b", "hi", false), nil); resp.StatusCode != 200 {
		t.Fatalf("model b while a sleeps: %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(t, "POST", r.url+chatPath, chatBody("a", "hi", false), nil); resp.StatusCode == 200 {
		t.Fatal("model a answered while its workers sleep")
	}
}

// TestFleetAdminDeadWorker: a worker that cannot be reached makes the call
// 502, the summary naming it "unreachable" (nothing more) and the live
// workers 200.
func TestFleetAdminDeadWorker(t *testing.T) {
	_, urls := startSims(t, 2, fastSim())
	dead := deadURL(t)
	r := startRouter(t, append(append([]string(nil), urls...), dead), "cache_aware", nil)
	a := fleetCall(t, "POST", r.adminURL(t)+"/sleep", http.StatusBadGateway)
	if a.Workers != 3 {
		t.Fatalf("summary of %d workers, want 3", a.Workers)
	}
	for _, res := range a.Results {
		switch {
		case res.Worker == dead:
			if res.Error != "unreachable" || res.Status != 0 || res.Response != nil {
				t.Fatalf("dead worker result %+v", res)
			}
		case res.Status != 200 || res.Error != "":
			t.Fatalf("live worker result %+v", res)
		}
	}
}

// treeChars sums the cache-aware tree's characters held by the workers of
// base (any rank) in model.
func treeChars(ca route.Summarizer, model, base string) int {
	n := 0
	for _, s := range ca.Summaries(0) {
		if s.Model != model {
			continue
		}
		for _, w := range s.Workers {
			if w.Worker == base || strings.HasPrefix(w.Worker, base+"@") {
				n += w.TreeChars
			}
		}
	}
	return n
}

// TestFleetResetPrefixCache: after a conversation warmed a worker, a
// fleet-wide /reset_prefix_cache?model= empties that engine's prefix cache
// and the router's tree for every rank of it, while the other model's
// worker keeps both; the session binding stays, so the next identical turn
// goes to the same engine and finds nothing cached (docs/design.md §8.4).
func TestFleetResetPrefixCache(t *testing.T) {
	cfgA, cfgB := fastSim(), fastSim()
	cfgA.Models, cfgB.Models = []string{"a"}, []string{"b"}
	_, urlsA := startSims(t, 1, cfgA)
	_, urlsB := startSims(t, 1, cfgB)
	baseA, baseB := urlsA[0], urlsB[0]
	r := startRouter(t, []string{baseA + "@0", baseA + "@1", baseB}, "cache_aware", nil)
	ca, ok := r.policy.(route.Summarizer)
	if !ok {
		t.Fatal("policy is not cache-aware")
	}
	system := strings.Repeat("You are a careful assistant with a long shared system prompt. ", 30)
	turn := func(model string) (worker string, cached int) {
		body := `{"model":"` + model + `","messages":[{"role":"system","content":"` + system +
			`"},{"role":"user","content":"Plan a trip to Oslo."}]}`
		resp, b := do(t, "POST", r.url+chatPath, body, map[string]string{"X-Session-Id": "conv-" + model})
		if resp.StatusCode != 200 {
			t.Fatalf("chat %s: %d %s", model, resp.StatusCode, b)
		}
		var out struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return resp.Header.Get("x-vllm-router-worker"), out.Usage.Details.Cached
	}
	for _, m := range []string{"a", "b"} {
		turn(m)
		if _, cached := turn(m); cached == 0 {
			t.Fatalf("model %s: the second identical turn found nothing cached", m)
		}
	}
	if treeChars(ca, "a", baseA) == 0 || treeChars(ca, "b", baseB) == 0 {
		t.Fatalf("the tree holds nothing after warming: %+v", ca.Summaries(0))
	}

	a := fleetCall(t, "POST", r.adminURL(t)+"/reset_prefix_cache?model=a", 200)
	if len(a.Results) != 1 || a.Results[0].Worker != baseA || a.Results[0].Status != 200 {
		t.Fatalf("reset went to %+v, want %s once", a.Results, baseA)
	}
	if n := treeChars(ca, "a", baseA); n != 0 {
		t.Fatalf("the tree still holds %d chars for the reset engine: %+v", n, ca.Summaries(0))
	}
	if treeChars(ca, "b", baseB) == 0 {
		t.Fatal("the other model's worker lost its tree entries")
	}
	for _, s := range ca.Summaries(0) {
		if s.Model == "a" && s.Sessions != 1 {
			t.Fatalf("model a sessions %d after the reset, want the binding kept", s.Sessions)
		}
	}
	w, cached := turn("a")
	if !strings.HasPrefix(w, baseA) || cached != 0 {
		t.Fatalf("after the reset: worker %s cached_tokens %d, want %s… and 0", w, cached, baseA)
	}
	if _, cached := turn("b"); cached == 0 {
		t.Fatal("the other model's engine lost its cache")
	}
}

// TestFleetSleepForgetsTree: a successful /sleep empties the engine's KV
// cache, so the router's tree forgets that engine too.
func TestFleetSleepForgetsTree(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "cache_aware", nil)
	ca := r.policy.(route.Summarizer)
	body := chatBody("m", strings.Repeat("a prompt long enough to fill blocks ", 20), false)
	if resp, b := do(t, "POST", r.url+chatPath, body, nil); resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	if treeChars(ca, "m", urls[0]) == 0 {
		t.Fatal("the tree holds nothing after a request")
	}
	admin := r.adminURL(t)
	fleetCall(t, "POST", admin+"/sleep", 200)
	if n := treeChars(ca, "m", urls[0]); n != 0 {
		t.Fatalf("the tree still holds %d chars for a sleeping engine", n)
	}
	fleetCall(t, "POST", admin+"/wake_up", 200)
}

// TestFleetAdminForwarding: ?model= is the router's selector and is not
// forwarded (the worker sees the rest of the query); a worker body that is
// not JSON, or is over 4 KiB, stays out of the summary.
func TestFleetAdminForwarding(t *testing.T) {
	big := startEcho(t, []byte(`{"pad":"`+strings.Repeat("x", 5000)+`"}`), nil, 0)
	text := startEcho(t, []byte("OK"), nil, 0)
	r := startRouter(t, []string{big.url, text.url}, "cache_aware", nil)
	a := fleetCall(t, "POST", r.adminURL(t)+"/sleep?model=m&level=2", 200)
	for _, res := range a.Results {
		if res.Status != 200 || res.Response != nil {
			t.Fatalf("result %+v carries %q", res, res.Response)
		}
	}
	for _, e := range []*echoUpstream{big, text} {
		<-e.got
		line, _, _ := strings.Cut(<-e.gotHdr, "\r\n")
		if line != "POST /sleep?level=2 HTTP/1.1" {
			t.Fatalf("worker got %q", line)
		}
	}
}
