package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/bench"
	"github.com/warmroute/warmroute/simworker"
)

// Soak settings. The session cap is low enough that 32 clients reach it in
// the first minute (each opens a new session every few seconds).
const (
	soakClients     = 32
	soakMaxSessions = 64
	// soakMaxTreeBytes caps the prefix tree per worker low enough to be
	// reached early too, so that flat RSS means every store is at its bound.
	soakMaxTreeBytes = 4 << 20
	soakOutageEvery  = 2 * time.Minute
	soakOutageFirst  = 30 * time.Second
	soakOutageLen    = 20 * time.Second
	soakSampleEvery  = 10 * time.Second
	soakErrorRate    = 0.02 // requests sent with x-sim-fault: error
	soakDropRate     = 0.02 // requests sent with x-sim-fault: drop
	soakMaxRequests  = 2_000_000
)

// The client-visible result each injected fault is expected to have; any
// other failure is unexplained:
//
//   - x-sim-fault: error  — every worker answers 500 to this request: the
//     request's own fault, answered 500 with an OpenAI JSON error.
//   - x-sim-fault: drop, not streaming — every worker closes the connection
//     without an answer: 502 with an OpenAI JSON error.
//   - x-sim-fault: drop, streaming — the worker dies after the first chunk:
//     the stream ends with a `data: {"error":...}` event (or 502 JSON when
//     no byte had reached the client yet).
//   - worker outage (SetUnavailable, 503 to everything for 20 s): nothing —
//     the router fails over; no client-visible failure is explained by it.
var soakFaultExpectations = []string{
	"`x-sim-fault: error` → 500 with an OpenAI JSON error (the request fails the same way on every worker)",
	"`x-sim-fault: drop`, not streaming → 502 with an OpenAI JSON error (every worker closes without answering)",
	"`x-sim-fault: drop`, streaming → the stream ends with a `data: {\"error\":...}` event (or 502 JSON before the first byte)",
	"worker outage (one worker 503 on everything for 20 s every 2 min) → no client-visible failure",
}

type soakSample struct {
	at         time.Duration
	rssKB      int
	goroutines int
	fds        int
	sessions   float64
	requests   int64
	unexpl     int64
	outage     bool
}

type soakStats struct {
	requests, streams, toolTurns, sessions atomic.Int64
	injectedErr, injectedDrop              atomic.Int64
	explained                              sync.Map // reason -> *atomic.Int64
	unexplained                            atomic.Int64
	mu                                     sync.Mutex
	unexplSamples                          []string
	unexplKinds                            map[string]int // "fault, stream → outcome" -> count
}

func (s *soakStats) explain(why string) {
	v, _ := s.explained.LoadOrStore(why, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (s *soakStats) unexpected(kind, what string) {
	s.unexplained.Add(1)
	s.mu.Lock()
	if s.unexplKinds == nil {
		s.unexplKinds = map[string]int{}
	}
	s.unexplKinds[kind]++
	if len(s.unexplSamples) < 10 {
		s.unexplSamples = append(s.unexplSamples, what)
	}
	s.mu.Unlock()
}

// runSoak runs the soak for d and writes the report to path; it returns
// whether the verdict is good.
func runSoak(bin string, d time.Duration, path string, logw io.Writer) (bool, error) {
	var ws []*simworker.Worker
	var urls []string
	for range 3 {
		w, u, err := startSim(0.2)
		if err != nil {
			return false, err
		}
		defer w.Close()
		ws, urls = append(ws, w), append(urls, u)
	}
	var notes []string
	args := []string{"--health-check-interval-secs", "5", "--retry-initial-backoff-ms", "10", "--retry-max-backoff-ms", "200",
		"--max-sessions", fmt.Sprint(soakMaxSessions), "--max-tree-size", fmt.Sprint(soakMaxTreeBytes)}
	r, err := startRouter(bin, routerOpts{workers: urls, args: args})
	capped := true
	if err != nil && strings.Contains(err.Error(), "max-sessions") {
		notes = append(notes, "the router rejected `--max-sessions`: ran without it, so the session cap is not enforced (verdict FAIL)")
		capped = false
		r, err = startRouter(bin, routerOpts{workers: urls, args: args[:len(args)-2]})
	}
	if err != nil {
		return false, err
	}
	defer r.kill()
	fmt.Fprintf(logw, "soak: %s, %d clients, 3 workers, router pid %d\n", d, soakClients, r.pid)

	st := &soakStats{}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: soakClients * 2, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}

	var outage atomic.Bool
	origin := time.Now()
	go func() { // the fault schedule: worker 0 unavailable 20 s every 2 min
		for k := 0; ; k++ {
			at := soakOutageFirst + time.Duration(k)*soakOutageEvery
			if !bench.SleepCtx(ctx, time.Until(origin.Add(at))) {
				return
			}
			ws[0].SetUnavailable(true)
			outage.Store(true)
			fmt.Fprintf(logw, "soak: outage of %s for %s\n", urls[0], soakOutageLen)
			ok := bench.SleepCtx(ctx, soakOutageLen)
			ws[0].SetUnavailable(false)
			outage.Store(false)
			if !ok {
				return
			}
		}
	}()

	t0 := time.Now()
	var samples []soakSample
	var smu sync.Mutex
	sample := func() {
		sess, _ := r.metricSum("vllm_router_sessions")
		s := soakSample{at: time.Since(t0), rssKB: r.rssKB(), goroutines: r.goroutines(), fds: r.fds(), sessions: sess,
			requests: st.requests.Load(), unexpl: st.unexplained.Load(), outage: outage.Load()}
		smu.Lock()
		samples = append(samples, s)
		smu.Unlock()
		fmt.Fprintf(logw, "soak: %5.0fs rss %.1f MB goroutines %d fds %d sessions %.0f requests %d unexplained %d\n",
			s.at.Seconds(), float64(s.rssKB)/1024, s.goroutines, s.fds, s.sessions, s.requests, s.unexpl)
	}
	sample()
	go func() {
		t := time.NewTicker(soakSampleEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				sample()
			}
		}
	}()

	var wg sync.WaitGroup
	for c := range soakClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			soakClient(ctx, client, r.base, c, st)
		}()
	}
	wg.Wait()
	took := time.Since(t0)
	time.Sleep(500 * time.Millisecond)
	loadAfter := r.settleLoad(5 * time.Second)
	alive := !r.exited()
	if alive {
		sample()
	}
	good, verdict := soakVerdict(samples, capped, alive, loadAfter, st)
	rep := soakReport(samples, st, d, took, capped, alive, loadAfter, good, verdict, notes)
	if err := os.WriteFile(path, []byte(rep), 0o644); err != nil {
		return false, err
	}
	fmt.Fprintf(logw, "soak: verdict %s -> %s\n", map[bool]string{true: "GOOD", false: "BAD"}[good], path)
	for _, v := range verdict {
		fmt.Fprintln(logw, "soak:  ", v)
	}
	return good, nil
}

type msg map[string]any

var soakTools = []any{
	map[string]any{"type": "function", "function": map[string]any{"name": "search_flights", "description": "search flights",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"from": map[string]any{"type": "string"}}}}},
	map[string]any{"type": "function", "function": map[string]any{"name": "book", "description": "book a seat",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{}}}},
}

// soakClient runs agent sessions one after another until ctx ends: 2–8
// turns each, history growing, 70 % with X-Session-ID, 30 % with tools
// (a user turn then gets a tool call, answered by a tool result turn),
// half the turns streamed, 2 % with an error fault and 2 % with a drop.
func soakClient(ctx context.Context, c *http.Client, base string, id int, st *soakStats) {
	rng := rand.New(rand.NewPCG(uint64(id), 42))
	for n := 0; ctx.Err() == nil; n++ {
		st.sessions.Add(1)
		sid := fmt.Sprintf("soak-%d-%d", id, n)
		withSID := rng.Float64() < 0.7
		tools := rng.Float64() < 0.3
		history := []msg{{"role": "system", "content": "You are agent " + sid + ". " + strings.Repeat("Be careful with tools. ", 20)}}
		turns := 2 + rng.IntN(7)
		for t := 0; t < turns && ctx.Err() == nil; t++ {
			if st.requests.Load() >= soakMaxRequests {
				return
			}
			if len(history) == 0 || history[len(history)-1]["role"] != "tool" {
				history = append(history, msg{"role": "user", "content": fmt.Sprintf("turn %d of %s: %s", t, sid, strings.Repeat("words ", 10+rng.IntN(60)))})
			}
			body := map[string]any{"model": model, "messages": history, "max_tokens": 16 + rng.IntN(48)}
			if tools {
				body["tools"] = soakTools
			}
			stream := rng.Float64() < 0.5
			if stream {
				body["stream"] = true
				st.streams.Add(1)
			}
			fault := ""
			switch x := rng.Float64(); {
			case x < soakErrorRate:
				fault = "error"
				st.injectedErr.Add(1)
			case x < soakErrorRate+soakDropRate:
				fault = "drop"
				st.injectedDrop.Add(1)
			}
			b, _ := json.Marshal(body)
			hdr := map[string]string{}
			if withSID {
				hdr["X-Session-ID"] = sid
			}
			if fault != "" {
				hdr["x-sim-fault"] = fault
			}
			st.requests.Add(1)
			reply, outcome := soakRequest(ctx, c, base, b, hdr, stream)
			if ctx.Err() != nil {
				return // the run ended mid-request: not a failure
			}
			switch classify(fault, stream, outcome) {
			case "ok":
				if reply != nil {
					history = append(history, reply)
					if _, ok := reply["tool_calls"]; ok {
						st.toolTurns.Add(1)
						calls := reply["tool_calls"].([]any)
						cid, _ := calls[0].(map[string]any)["id"].(string)
						history = append(history, msg{"role": "tool", "tool_call_id": cid, "content": `{"result":"ok"}`})
					}
				}
			case "":
				st.unexpected(fmt.Sprintf("fault %q, stream %v → %s", fault, stream, outcome.kind()),
					fmt.Sprintf("fault=%q stream=%v: %s", fault, stream, outcome.String()))
			default:
				st.explain(classify(fault, stream, outcome))
			}
		}
	}
}

// soakOutcome is what the client saw of one request.
type soakOutcome struct {
	status    int
	err       error
	errorJSON bool // the body is an OpenAI JSON error
	errEvent  bool // the stream ended with a data: {"error":...} event
	done      bool // the stream ended with data: [DONE]
	body      string
}

func (o soakOutcome) String() string {
	if o.err != nil {
		return "transport error: " + o.err.Error()
	}
	return fmt.Sprintf("status %d done=%v errorEvent=%v %s", o.status, o.done, o.errEvent, clip(oneLine(o.body), 160))
}

// kind summarizes the outcome for grouping failures.
func (o soakOutcome) kind() string {
	switch {
	case o.err != nil && strings.Contains(o.err.Error(), "EOF"):
		return "transport error (connection closed mid-response)"
	case o.err != nil:
		return "transport error"
	case o.status != 200:
		return fmt.Sprintf("status %d", o.status)
	case o.errEvent:
		return "stream with an error event"
	default:
		return "stream ended without [DONE]"
	}
}

// classify returns "ok" for a success, the explanation for an expected
// fault result, "" for an unexplained failure.
func classify(fault string, stream bool, o soakOutcome) string {
	okResult := o.err == nil && o.status == 200 && (!stream || o.done) && !o.errEvent
	switch {
	case fault == "" && okResult:
		return "ok"
	case fault == "error" && o.status == 500 && o.errorJSON:
		return "500 for a request every worker fails (x-sim-fault: error)"
	case fault == "drop" && !stream && o.status == 502 && o.errorJSON:
		return "502 for a request every worker drops (x-sim-fault: drop)"
	case fault == "drop" && stream && o.status == 200 && o.errEvent:
		return "stream cut by a dropping worker, ended with an error event (x-sim-fault: drop)"
	case fault == "drop" && stream && o.status == 502 && o.errorJSON:
		return "502 for a stream every worker drops before its first byte (x-sim-fault: drop)"
	}
	return ""
}

// soakRequest sends one turn and returns the assistant message to append
// (nil on failure).
func soakRequest(ctx context.Context, c *http.Client, base string, body []byte, hdr map[string]string, stream bool) (msg, soakOutcome) {
	req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := c.Do(req)
	if err != nil {
		return nil, soakOutcome{err: err}
	}
	defer res.Body.Close()
	o := soakOutcome{status: res.StatusCode}
	if !stream || res.StatusCode != 200 {
		b, err := io.ReadAll(res.Body)
		o.body, o.err = string(b), err
		if res.StatusCode != 200 {
			o.errorJSON = errorShape(b) == nil
			return nil, o
		}
		var v struct {
			Choices []struct {
				Message msg `json:"message"`
			} `json:"choices"`
		}
		if json.Unmarshal(b, &v) != nil || len(v.Choices) == 0 {
			o.err = fmt.Errorf("undecodable completion")
			return nil, o
		}
		m := v.Choices[0].Message
		if m["content"] == nil {
			delete(m, "content")
		}
		return m, o
	}
	var content strings.Builder
	var toolID, toolName string
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var lastLine string
	for sc.Scan() {
		l := sc.Text()
		if l == "" {
			continue
		}
		lastLine = l
		data, ok := strings.CutPrefix(l, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			o.done = true
			continue
		}
		if strings.HasPrefix(data, `{"error"`) {
			o.errEvent = true
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						ID       string `json:"id"`
						Function struct {
							Name string `json:"name"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(data), &ch) == nil && len(ch.Choices) > 0 {
			d := ch.Choices[0].Delta
			if d.Content != nil {
				content.WriteString(*d.Content)
			}
			for _, tc := range d.ToolCalls {
				if tc.ID != "" {
					toolID, toolName = tc.ID, tc.Function.Name
				}
			}
		}
	}
	o.err = sc.Err()
	o.body = lastLine
	if !o.done || o.errEvent || o.err != nil {
		return nil, o
	}
	if toolID != "" {
		return msg{"role": "assistant", "tool_calls": []any{map[string]any{"id": toolID, "type": "function",
			"function": map[string]any{"name": toolName, "arguments": "{}"}}}}, o
	}
	return msg{"role": "assistant", "content": content.String()}, o
}

// soakVerdict: flat = over the samples after the session cap was reached,
// split in thirds, max(last third) ≤ 1.10 × max(first third) for RSS and
// for goroutines (+5 slack for goroutines); 0 unexplained errors; the
// router alive with load 0 at the end.
func soakVerdict(samples []soakSample, capped, alive bool, loadAfter int, st *soakStats) (bool, []string) {
	var v []string
	good := true
	bad := func(format string, args ...any) {
		good = false
		v = append(v, "BAD: "+fmt.Sprintf(format, args...))
	}
	capAt := -1
	for i, s := range samples {
		if capped && s.sessions >= soakMaxSessions {
			capAt = i
			break
		}
	}
	if !capped {
		bad("--max-sessions is not supported by the router (flatness judged after the first sixth of the run instead of after the cap)")
	}
	if capAt < 0 {
		if capped {
			bad("the session gauge never reached the cap of %d", soakMaxSessions)
		}
		capAt = max(1, len(samples)/6) // judge flatness after a warm-up anyway
	} else {
		v = append(v, fmt.Sprintf("session cap %d reached at %.0f s", soakMaxSessions, samples[capAt].at.Seconds()))
	}
	maxSess := 0.0
	for _, s := range samples {
		maxSess = max(maxSess, s.sessions)
	}
	// The session map drops in LRU batches of max(cap/8, 64) and holds at
	// most cap + 2 batches between drops (docs/reference.md, --max-sessions).
	if bound := soakMaxSessions + 2*max(soakMaxSessions/8, 64); capped && maxSess > float64(bound) {
		bad("sessions gauge reached %.0f, above --max-sessions %d plus two eviction batches (%d)", maxSess, soakMaxSessions, bound)
	}
	post := samples[capAt:]
	if len(post) < 3 {
		bad("only %d samples after the cap: run longer to judge flatness", len(post))
	} else {
		third := len(post) / 3
		firstT, lastT := post[:third], post[len(post)-third:]
		mx := func(ss []soakSample, f func(soakSample) int) int {
			m := 0
			for _, s := range ss {
				m = max(m, f(s))
			}
			return m
		}
		rss := func(s soakSample) int { return s.rssKB }
		gor := func(s soakSample) int { return s.goroutines }
		r0, r1 := mx(firstT, rss), mx(lastT, rss)
		g0, g1 := mx(firstT, gor), mx(lastT, gor)
		if float64(r1) > 1.10*float64(r0) {
			bad("RSS not flat: last-third max %.1f MB > 1.10 × first-third max %.1f MB", float64(r1)/1024, float64(r0)/1024)
		} else {
			v = append(v, fmt.Sprintf("RSS flat: last-third max %.1f MB ≤ 1.10 × first-third max %.1f MB", float64(r1)/1024, float64(r0)/1024))
		}
		if float64(g1) > 1.10*float64(g0)+5 {
			bad("goroutines not flat: last-third max %d > 1.10 × first-third max %d + 5", g1, g0)
		} else {
			v = append(v, fmt.Sprintf("goroutines flat: last-third max %d ≤ 1.10 × first-third max %d + 5", g1, g0))
		}
	}
	if n := st.unexplained.Load(); n > 0 {
		bad("%d unexplained client-visible errors", n)
	} else {
		v = append(v, "0 unexplained client-visible errors")
	}
	if !alive {
		bad("the router exited during the soak")
	} else if loadAfter != 0 {
		bad("load counter %d after the traffic stopped, want 0", loadAfter)
	}
	return good, v
}

func soakReport(samples []soakSample, st *soakStats, d, took time.Duration, capped, alive bool, loadAfter int, good bool, verdict, notes []string) string {
	var b strings.Builder
	b.WriteString(header("Soak: mixed agent traffic under scheduled faults", "go run ./bench/chaos "+strings.Join(os.Args[1:], " ")))
	word := "**GOOD**"
	if !good {
		word = "**BAD**"
	}
	fmt.Fprintf(&b, "- duration: %s (ran %s)\n- verdict: %s\n\n", d, took.Round(time.Second), word)
	fmt.Fprintf(&b, "Setup: the router binary as a subprocess, 3 in-process simulated workers (TimeScale 0.2), "+
		"%d clients running agent sessions back to back (2–8 turns, growing history, 70 %% with `X-Session-ID`, "+
		"30 %% with tools so a user turn gets a tool call answered by a tool-result turn, half the turns streamed), "+
		"`--max-sessions %d`, `--health-check-interval-secs 5`. Faults: worker 0 unavailable (503 to everything) "+
		"for %s every %s from t=%s; %.0f %% of requests with `x-sim-fault: error`, %.0f %% with `x-sim-fault: drop`. "+
		"Samples every %s: RSS (/proc VmRSS), goroutines (`go_goroutines`), open fds (/proc/PID/fd), "+
		"sessions (sum of `vllm_router_sessions`).\n\n",
		soakClients, soakMaxSessions, soakOutageLen, soakOutageEvery, soakOutageFirst, soakErrorRate*100, soakDropRate*100, soakSampleEvery)
	b.WriteString("Flat means: over the samples taken after the session gauge first reached the cap, split in thirds, " +
		"the last third's max is within 10 % of the first third's max (goroutines: + 5 slack).\n\n")
	b.WriteString("Expected client-visible result of each fault (anything else is unexplained):\n\n")
	for _, e := range soakFaultExpectations {
		b.WriteString("- " + e + "\n")
	}
	for _, n := range notes {
		b.WriteString("\nNote: " + n + "\n")
	}
	b.WriteString("\n## Verdict\n\n")
	for _, v := range verdict {
		b.WriteString("- " + v + "\n")
	}
	fmt.Fprintf(&b, "\n## Traffic\n\n| requests | streamed | tool-call turns | sessions started | injected error | injected drop | unexplained |\n|---:|---:|---:|---:|---:|---:|---:|\n| %d | %d | %d | %d | %d | %d | %d |\n\n",
		st.requests.Load(), st.streams.Load(), st.toolTurns.Load(), st.sessions.Load(), st.injectedErr.Load(), st.injectedDrop.Load(), st.unexplained.Load())
	var keys []string
	st.explained.Range(func(k, _ any) bool { keys = append(keys, k.(string)); return true })
	sort.Strings(keys)
	if len(keys) > 0 {
		b.WriteString("Explained client-visible failures:\n\n")
		for _, k := range keys {
			v, _ := st.explained.Load(k)
			fmt.Fprintf(&b, "- %d× %s\n", v.(*atomic.Int64).Load(), k)
		}
		b.WriteString("\n")
	}
	if len(st.unexplKinds) > 0 {
		b.WriteString("Unexplained client-visible failures by kind:\n\n")
		var ks []string
		for k := range st.unexplKinds {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		for _, k := range ks {
			fmt.Fprintf(&b, "- %d× %s\n", st.unexplKinds[k], k)
		}
		b.WriteString("\n")
	}
	if len(st.unexplSamples) > 0 {
		b.WriteString("Unexplained failures, first 10 in full:\n\n")
		for _, s := range st.unexplSamples {
			b.WriteString("- " + mdCell(s) + "\n")
		}
		b.WriteString("\n")
	}
	b.WriteString("## Samples\n\n| t (s) | RSS MB | goroutines | fds | sessions | requests | unexplained | outage |\n|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, s := range samples {
		o := ""
		if s.outage {
			o = "worker 0 down"
		}
		fmt.Fprintf(&b, "| %.0f | %.1f | %d | %d | %.0f | %d | %d | %s |\n", s.at.Seconds(), float64(s.rssKB)/1024, s.goroutines, s.fds, s.sessions, s.requests, s.unexpl, o)
	}
	return b.String()
}
