// Package saarlive is the SAAR live check: multi-turn, tool-using agent
// sessions through the real router (fastproxy over loopback) to simulated
// workers serving three models, with continuity judged from the response
// headers alone; then an outage of one model's workers, after which every
// affected session must complete a later turn without an unsafe switch.
package saarlive

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/warmroute/warmroute/examples"
	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/simworker"
)

// Options sizes the check.
type Options struct {
	Sessions      int   // concurrent agent sessions (default 60)
	Turns         int   // turns per session before the outage (default 30: about half are tool results)
	OutageTurns   int   // turns per session after the outage starts (default 6)
	WorkersPerMod int   // simulated workers per model (default 2)
	Seed          int64 // user text, complexity and streaming draws
}

func (o *Options) defaults() {
	if o.Sessions <= 0 {
		o.Sessions = 60
	}
	if o.Turns <= 0 {
		o.Turns = 30
	}
	if o.OutageTurns <= 0 {
		o.OutageTurns = 6
	}
	if o.WorkersPerMod <= 0 {
		o.WorkersPerMod = 2
	}
}

// Report is what the check counted.
type Report struct {
	Requests          int            // requests sent in all
	Failed            int            // non-200 answers
	ToolLoopTurns     int            // turns carrying tool results
	Switches          int            // turns served by another model than the session's previous turn
	UnsafeSwitches    int            // switches on a tool-loop turn without an explicit lock_broken
	Violations        int            // tool-loop turns not served by the issuing model, unexplained
	RouterViolations  uint64         // continuity violations the router itself counted (its metric)
	LockBroken        int            // explicit lock breaks (locked model down)
	Actions           map[string]int // x-vsr-session-action mix
	Models            map[string]int // x-vsr-selected-model mix
	OutageModel       string         // the model taken down
	Affected          int            // sessions on the outage model when it went down
	AffectedRecovered int            // of those, sessions that completed a later turn
	OutageRequests    int            // requests sent during the outage
	OutageFailed      int            // of those, non-200 answers
}

// Passed reports whether the check holds: no continuity violation, no
// unsafe switch, every affected session recovered, at least 2,000 requests.
func (r *Report) Passed() bool {
	return r.Violations == 0 && r.RouterViolations == 0 && r.UnsafeSwitches == 0 && r.Affected > 0 &&
		r.AffectedRecovered == r.Affected && r.Requests >= 2000
}

// String renders the report as a Markdown table.
func (r *Report) String() string {
	var b strings.Builder
	row := func(k string, v any) { fmt.Fprintf(&b, "| %s | %v |\n", k, v) }
	b.WriteString("| measure | value |\n|---|---:|\n")
	row("requests", r.Requests)
	row("non-200 answers", r.Failed)
	row("tool-loop turns", r.ToolLoopTurns)
	row("model switches", r.Switches)
	row("unsafe switches", r.UnsafeSwitches)
	row("continuity violations (from headers)", r.Violations)
	row("continuity violations (router metric)", r.RouterViolations)
	row("explicit lock breaks", r.LockBroken)
	row("outage model", r.OutageModel)
	row("sessions on it when it went down", r.Affected)
	row("of those, completed a later turn", r.AffectedRecovered)
	row("requests during the outage", r.OutageRequests)
	row("non-200 during the outage", r.OutageFailed)
	fmt.Fprintf(&b, "\nactions: %v\n\nmodels: %v\n", r.Actions, r.Models)
	return b.String()
}

// Run performs the check and returns what it counted.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	cfg, err := saar.ParseConfig(examples.Demo)
	if err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sims := map[string][]*simworker.Worker{}
	var all []*simworker.Worker
	defer func() {
		for _, w := range all {
			w.Close()
		}
	}()
	for i := range cfg.Models {
		m := &cfg.Models[i]
		for j := 0; j < o.WorkersPerMod; j++ {
			w, url, err := simworker.Start(simworker.Config{Models: []string{m.Name}, TimeScale: 0.002, MaxTokens: 12, Seed: int64(len(all) + 1)})
			if err != nil {
				return nil, err
			}
			all = append(all, w)
			sims[m.Name] = append(sims[m.Name], w)
			m.Workers = append(m.Workers, url)
		}
	}
	reg := loadview.NewRegistry(loadview.Config{Logger: quiet, HealthInterval: 100 * time.Millisecond,
		FailureThreshold: 1, SuccessThreshold: 1, CBFailureThreshold: 2})
	policy, _ := route.New("cache_aware", reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()})
	for _, m := range cfg.Models {
		for _, u := range m.Workers {
			if _, err := reg.Add(ctx, u, []string{m.Name}); err != nil {
				return nil, err
			}
		}
	}
	models := saar.NewRouter(cfg, saar.Options{})
	srv, err := fastproxy.New(fastproxy.Config{Registry: reg, Policy: policy, Models: models,
		RetryMaxRetries: 3, RetryBackoff: time.Millisecond, Logger: quiet})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go srv.Serve(ln)                         //nolint:errcheck
	defer srv.Shutdown(context.Background()) //nolint:errcheck
	hctx, stop := context.WithCancel(ctx)
	defer stop()
	go reg.RunHealthChecks(hctx)

	c := &checker{url: "http://" + ln.Addr().String(), rep: &Report{Actions: map[string]int{}, Models: map[string]int{}},
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	sessions := make([]*session, o.Sessions)
	for i := range sessions {
		sessions[i] = &session{id: fmt.Sprintf("live-%d", i), rnd: rand.New(rand.NewPCG(uint64(o.Seed), uint64(i)))}
	}
	c.phase(sessions, o.Turns)

	// Outage: the model most sessions are on goes down.
	count := map[string]int{}
	for _, s := range sessions {
		count[s.model]++
	}
	for m, n := range count {
		if n > count[c.rep.OutageModel] || (n == count[c.rep.OutageModel] && m < c.rep.OutageModel) {
			c.rep.OutageModel = m
		}
	}
	var affected []*session
	for _, s := range sessions {
		if s.model == c.rep.OutageModel {
			affected = append(affected, s)
			s.okAfter = 0
		}
	}
	c.rep.Affected = len(affected)
	for _, w := range sims[c.rep.OutageModel] {
		w.SetUnavailable(true)
	}
	before := c.rep.Requests
	beforeFailed := c.rep.Failed
	c.phase(sessions, o.OutageTurns)
	c.rep.OutageRequests = c.rep.Requests - before
	c.rep.OutageFailed = c.rep.Failed - beforeFailed
	for _, s := range affected {
		if s.okAfter > 0 {
			c.rep.AffectedRecovered++
		}
	}
	for _, w := range sims[c.rep.OutageModel] {
		w.SetUnavailable(false)
	}
	c.rep.RouterViolations = models.Stats().ContinuityViolations
	return c.rep, nil
}

type checker struct {
	url    string
	client *http.Client
	mu     sync.Mutex
	rep    *Report
}

// session is one agent conversation, driven turn by turn.
type session struct {
	id       string
	rnd      *rand.Rand
	msgs     []string // JSON messages so far
	pending  string   // tool-call id awaiting its result
	model    string   // model of the previous turn
	okAfter  int      // successful turns since the outage began
	failures int
}

// phase drives every session for turns turns, one more for every other
// session, so that the next phase catches half of them inside a tool loop.
func (c *checker) phase(sessions []*session, turns int) {
	var wg sync.WaitGroup
	for i, s := range sessions {
		wg.Add(1)
		go func(s *session, turns int) {
			defer wg.Done()
			for t := 0; t < turns; t++ {
				c.turn(s)
			}
		}(s, turns+i%2)
	}
	wg.Wait()
}

var (
	texts = []string{"book a flight to Lisbon", "what is my baggage allowance", "prove that the refund is correct step by step",
		"debug this python stack trace", "change my seat", "derive the fare rule rigorously", "cancel the reservation"}
	callRe = regexp.MustCompile(`"id":"(call_[^"]+)"`)
)

const toolsJSON = `"tools":[{"type":"function","function":{"name":"get_reservation","parameters":{"type":"object","properties":{}}}}]`

func (c *checker) turn(s *session) {
	toolTurn := s.pending != ""
	if len(s.msgs) == 0 {
		s.msgs = append(s.msgs, `{"role":"system","content":"`+strings.Repeat("You are an airline agent with tools. ", 30)+`"}`)
	}
	if toolTurn {
		s.msgs = append(s.msgs,
			`{"role":"assistant","tool_calls":[{"id":"`+s.pending+`","type":"function","function":{"name":"get_reservation","arguments":"{}"}}]}`,
			`{"role":"tool","tool_call_id":"`+s.pending+`","content":"reservation found: seat 12A"}`)
	} else {
		s.msgs = append(s.msgs, `{"role":"user","content":"`+texts[s.rnd.IntN(len(texts))]+`"}`)
	}
	stream := s.rnd.IntN(2) == 0
	body := `{"model":"auto","max_tokens":12,"stream":` + fmt.Sprint(stream) + `,` + toolsJSON + `,"messages":[` + strings.Join(s.msgs, ",") + `]}`
	req, _ := http.NewRequest("POST", c.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", s.id)
	req.Header.Set("x-warmroute-complexity", fmt.Sprintf("%.2f", s.rnd.Float64()))
	resp, err := c.client.Do(req)
	var out []byte
	status := 0
	if err == nil {
		out, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		status = resp.StatusCode
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.rep
	r.Requests++
	if toolTurn {
		r.ToolLoopTurns++
	}
	if status != http.StatusOK {
		r.Failed++
		s.failures++
		// The turn did not happen: take it back, the agent retries later.
		if toolTurn {
			s.msgs = s.msgs[:len(s.msgs)-2]
		} else {
			s.msgs = s.msgs[:len(s.msgs)-1]
		}
		return
	}
	model := resp.Header.Get("x-vsr-selected-model")
	action := resp.Header.Get("x-vsr-session-action")
	r.Actions[action]++
	r.Models[model]++
	if action == "lock_broken" {
		r.LockBroken++
	}
	if s.model != "" && model != s.model {
		r.Switches++
		if toolTurn && action != "lock_broken" {
			r.UnsafeSwitches++
		}
	}
	if toolTurn && model != s.model && action != "lock_broken" {
		r.Violations++
	}
	s.model = model
	s.okAfter++
	s.pending = ""
	if m := callRe.FindSubmatch(out); m != nil {
		s.pending = string(m[1])
	} else {
		s.msgs = append(s.msgs, `{"role":"assistant","content":"done"}`)
	}
}
