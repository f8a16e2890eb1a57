package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/bench"
)

// runSpec is one run: a router configuration at one session arrival rate.
type runSpec struct {
	config routerConfig
	load   float64 // × capacity; 0 in the capacity search
	rate   float64 // sessions per simulated second
	span   float64 // simulated seconds during which sessions arrive and send
}

// runResult is what one run measured.
type runResult struct {
	spec       runSpec
	arrivals   []arrival
	records    []record // every request, in send order
	violations int      // breaches of the one-outcome rule (ledger.check)
	examples   []string // the first of them
	idle       cpuIdle
	wall       time.Duration
}

// client drives the sessions of one run against one router.
type client struct {
	o        *options
	bopt     bench.Options // request shape and time scale (bench.TurnRequest)
	hc       *http.Client
	base     string
	led      *ledger
	tag      string // request ids: tag-session-turn
	start    time.Time
	stopSend time.Time // no turn starts after it
	runCtx   context.Context

	sessions sync.WaitGroup
	active   atomic.Int64
	sent     atomic.Int64
	outs     [numOutcomes]atomic.Int64
}

// real converts simulated seconds to a real duration.
func (c *client) real(sim float64) time.Duration {
	return time.Duration(sim * c.o.timeScale * float64(time.Second))
}

// sim converts a real duration to simulated seconds.
func (c *client) sim(d time.Duration) float64 { return d.Seconds() / c.o.timeScale }

// session replays one arrival's turns in order, each after the previous
// answer and a think time; it stops at the first turn not served (the
// client gives up on the conversation) and sends nothing after stopSend.
func (c *client) session(a *arrival) {
	defer c.sessions.Done()
	c.active.Add(1)
	defer c.active.Add(-1)
	s, err := personalize(a.src, fmt.Sprintf("%s-s%d", c.tag, a.index))
	if err != nil {
		panic("overload: pools are checked at load: " + err.Error())
	}
	var body bytes.Buffer
	for ti := range s.Turns {
		if ti > 0 && !bench.SleepCtx(c.runCtx, bench.ThinkTime(&c.bopt, c.o.seed, a.index, ti)) {
			return
		}
		if c.runCtx.Err() != nil || !time.Now().Before(c.stopSend) {
			return
		}
		if c.turn(a, &s, ti, &body) != outServed {
			return
		}
	}
}

// turn sends turn ti of s and records its one outcome. The client waits
// o.patience simulated seconds for the first token, then hangs up.
func (c *client) turn(a *arrival, s *bench.Session, ti int, body *bytes.Buffer) outcome {
	id := fmt.Sprintf("%s-%d-%d", c.tag, a.index, ti)
	rec := record{session: a.index, turn: ti, tenant: a.tenant, class: a.class, queueMS: -1}
	ctx, cancel := context.WithCancel(c.runCtx)
	defer cancel()
	req, err := bench.TurnRequest(ctx, c.base, &c.bopt, s, ti, body)
	if err != nil {
		panic("overload: building a request: " + err.Error())
	}
	req.Header.Set("Authorization", "Bearer "+tenantKey(a.tenant))
	req.Header.Set("X-Request-Id", id)
	req.Header.Set("x-request-priority", strconv.Itoa(classPriority[a.class]))
	var first, gone atomic.Bool
	patience := time.AfterFunc(c.real(c.o.patience), func() {
		if !first.Load() {
			gone.Store(true)
			cancel()
		}
	})
	defer patience.Stop()
	c.led.send(id)
	c.sent.Add(1)
	t0 := time.Now()
	rec.sent = c.sim(t0.Sub(c.start))
	resp, err := c.hc.Do(req)
	if err != nil {
		rec.out, rec.detail = c.failure(&gone, err.Error())
	} else {
		c.read(resp, t0, &rec, &first, &gone)
	}
	c.led.record(id, rec)
	c.outs[rec.out].Add(1)
	return rec.out
}

// read fills rec from the router's answer.
func (c *client) read(resp *http.Response, t0 time.Time, rec *record, first, gone *atomic.Bool) {
	defer resp.Body.Close()
	rec.echoedID = resp.Header.Get("X-Request-Id")
	rec.retryAfter = resp.Header.Get("Retry-After") != ""
	if v, err := strconv.ParseFloat(resp.Header.Get("x-vllm-router-queue-ms"), 64); err == nil {
		rec.queueMS = v
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		rec.out, rec.detail = classifyStatus(resp.StatusCode, b)
		return
	}
	tr := bench.ReadStream(resp.Body, t0, &c.bopt, func() { first.Store(true) })
	if tr.Err != "" {
		rec.out, rec.detail = c.failure(gone, tr.Err)
		return
	}
	rec.out, rec.ttft, rec.e2e, rec.prompt, rec.cached = outServed, tr.TTFT, tr.E2E, tr.Prompt, tr.Cached
}

// failure names a request that ended without an answer: the client's own
// patience, the run's end, or something else.
func (c *client) failure(gone *atomic.Bool, msg string) (outcome, string) {
	switch {
	case gone.Load():
		return outGone, ""
	case c.runCtx.Err() != nil:
		return outCut, ""
	}
	return outOther, msg
}

// classifyStatus names a non-200 answer by its status and error code.
func classifyStatus(status int, body []byte) (outcome, string) {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(body, &e) // a body without the shape leaves the code empty
	code := e.Error.Code
	switch {
	case status == http.StatusTooManyRequests && code == "router_busy":
		return outBusy, ""
	case status == http.StatusTooManyRequests:
		return outFull, code
	case status == http.StatusServiceUnavailable && code == "queue_timeout":
		return outTimeout, ""
	}
	return outOther, fmt.Sprintf("status %d: %.200s", status, bytes.TrimSpace(body))
}

// execute runs spec on a fresh fleet and router: the arrivals start at
// their times, send until span, and requests still in flight patience +
// 10 s after it are cut.
func execute(o *options, bin *binary, spec runSpec, pools []*pool, tag string, p *progress) (*runResult, error) {
	began, cpu0 := time.Now(), processCPU()
	led := newLedger()
	f, err := startFleet(o.workers, o.sim(), led)
	if err != nil {
		return nil, err
	}
	defer f.close()
	r, err := startRouter(bin.path, f.urls, spec.config.args)
	if err != nil {
		return nil, err
	}
	defer r.stop()
	res := &runResult{spec: spec, arrivals: arrivals(o.seed, spec.rate, spec.span, pools)}
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	c := &client{o: o, bopt: o.requestShape(), base: r.base, led: led, tag: tag, runCtx: runCtx,
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4096, DisableCompression: true}}}
	defer c.hc.CloseIdleConnections()
	idle := startIdleSampler()
	c.start = time.Now()
	c.stopSend = c.start.Add(c.real(spec.span))
	stopProgress := p.follow(spec, c)
	for i := range res.arrivals {
		a := &res.arrivals[i]
		if !bench.SleepCtx(runCtx, time.Until(c.start.Add(c.real(a.at)))) {
			break
		}
		c.sessions.Add(1)
		go c.session(a)
	}
	hard := time.AfterFunc(time.Until(c.stopSend.Add(c.real(o.patience)+10*time.Second)), cancelRun)
	c.sessions.Wait()
	hard.Stop()
	res.wall = time.Since(c.start)
	res.idle = idle.stop()
	stopProgress()
	if r.exited() {
		return nil, fmt.Errorf("the router exited during the run: %s", r.tail)
	}
	r.stop()
	f.close()
	res.idle.own = ownShare(processCPU()-cpu0+r.cpu(), time.Since(began))
	res.records = led.records()
	res.violations, res.examples = led.check(f.requests())
	return res, nil
}
