package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/bench"
)

// Probes of a disaggregated prefill/decode fleet (docs/design.md §9,
// "Disaggregated fleets"): workers that die or fail on either side of the
// two legs. The workers the probes kill are cmd/simworker processes, so
// that a kill is a SIGKILL: every socket of the worker goes at once.

// simProc is one cmd/simworker process on a loopback port.
type simProc struct {
	cmd  *exec.Cmd
	addr string // 127.0.0.1:port, also its name (X-Sim-Worker)
	url  string
	done chan struct{}
}

// simBinary builds ./cmd/simworker for this probe (removed with it).
func (e *env) simBinary() string {
	dir, err := os.MkdirTemp("", "warmroute-chaos-sim-")
	if err != nil {
		e.failf("simworker build: %v", err)
		return ""
	}
	e.defer_(func() { os.RemoveAll(dir) })
	root, err := bench.RepoRoot()
	if err != nil {
		e.failf("simworker build: %v", err)
		return ""
	}
	bin := filepath.Join(dir, "simworker")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/simworker")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		e.failf("go build ./cmd/simworker: %v: %s", err, oneLine(string(out)))
		return ""
	}
	return bin
}

// simProcs starts n simulated workers as processes of bin (TimeScale
// scale, the harness's configuration otherwise) and waits until each
// answers /health (10 s).
func (e *env) simProcs(bin string, n int, scale float64) []*simProc {
	if bin == "" {
		return nil
	}
	var ps []*simProc
	for range n {
		port := mustFreePort()
		p := &simProc{addr: fmt.Sprintf("127.0.0.1:%d", port), done: make(chan struct{})}
		p.url = "http://" + p.addr
		p.cmd = exec.Command(bin, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "--model", model,
			"--time-scale", strconv.FormatFloat(scale, 'f', -1, 64), "--hang-limit", "20s", "--log-level", "warn")
		logs := &logBuf{}
		stderr, err := p.cmd.StderrPipe()
		if err == nil {
			err = p.cmd.Start()
		}
		if err != nil {
			e.failf("simworker process: %v", err)
			return ps
		}
		go func() {
			b, _ := io.ReadAll(stderr)
			logs.add(string(b))
			p.cmd.Wait()
			close(p.done)
		}()
		e.defer_(p.kill)
		e.workerAddr = append(e.workerAddr, p.addr)
		c := &http.Client{Timeout: time.Second}
		for t0 := time.Now(); !ok(c, p.url+"/health"); time.Sleep(20 * time.Millisecond) {
			if p.exited() || time.Since(t0) > 10*time.Second {
				p.kill()
				e.failf("simworker process on %s did not come up: %s", p.addr, oneLine(logs.tail(3)))
				return ps
			}
		}
		ps = append(ps, p)
	}
	return ps
}

func (p *simProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *simProc) kill() {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

// metric sums one metric's samples on the worker's /metrics (-1 when
// unavailable).
func (p *simProc) metric(name string) int {
	resp, err := obsClient.Get(p.url + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	v, found := sumMetric(string(b), name)
	if !found {
		return -1
	}
	return int(v)
}

func urlsOf(ps []*simProc) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.url
	}
	return out
}

// startPD runs the router in PD mode, the vLLM router's command line:
// --prefill URL none for each prefill worker, --decode URL for each decode
// worker.
func (e *env) startPD(prefill, decode []string, args ...string) bool {
	a := []string{"--vllm-pd-disaggregation"}
	for _, u := range prefill {
		a = append(a, "--prefill", u, "none")
	}
	for _, u := range decode {
		a = append(a, "--decode", u)
	}
	return e.start(nil, append(a, args...)...)
}

// sample is the value of the router's metric name whose labels contain
// labels (all samples summed; 0 when none).
func (e *env) sample(name, labels string) int {
	text, err := e.r.metrics()
	if err != nil {
		return -1
	}
	sum := 0.0
	for _, s := range metricSamples(text, name) {
		if labels == "" || strings.Contains(s, labels) {
			v, _ := strconv.ParseFloat(s[strings.LastIndexByte(s, ' ')+1:], 64)
			sum += v
		}
	}
	return int(sum)
}

// pdCounts is what the router's /metrics say of its PD requests.
type pdCounts struct{ decoded, whole, failed, prefillErr, retries, resumed int }

func (e *env) pdCounts() pdCounts {
	o := func(s string) int { return e.sample("vllm_router_pd_requests_total", `outcome="`+s+`"`) }
	return pdCounts{decoded: o("decoded"), whole: o("whole"), failed: o("failed"), prefillErr: o("prefill_error"),
		retries: e.sample("vllm_router_pd_decode_retries_total", ""), resumed: e.resumes("resumed")}
}

func (c pdCounts) String() string {
	return fmt.Sprintf("pd_requests_total decoded %d, whole %d, failed %d, prefill_error %d; decode_retries %d; resumes{resumed} %d",
		c.decoded, c.whole, c.failed, c.prefillErr, c.retries, c.resumed)
}

var continuedToRE = regexp.MustCompile(`msg="stream continued on another worker" .*\bworker=(\S+)`)

// continuedTo counts the router's continuation log lines from mark on by
// the worker that took the continuation.
func (e *env) continuedTo(mark int) map[string]int { return e.logCounts(mark, continuedToRE) }

// failedAttempts counts the router's "upstream attempt failed" log lines
// from mark on that name worker url.
func (e *env) failedAttempts(mark int, url string) int {
	n := 0
	for _, l := range e.r.logs.since(mark) {
		if strings.Contains(l, `msg="upstream attempt failed"`) && strings.Contains(l, "worker="+url) {
			n++
		}
	}
	return n
}

// attemptsOf counts the router's "upstream attempt failed" log lines of
// one request id.
func (e *env) attemptsOf(rid string) int {
	n := 0
	for _, l := range e.r.logs.since(0) {
		if strings.Contains(l, `msg="upstream attempt failed"`) && strings.Contains(l, "request_id="+rid+" ") {
			n++
		}
	}
	return n
}

// checkStream checks one PD stream against its uninterrupted answer: 200,
// [DONE], no error event, one well-formed answer. It reports whether all
// hold.
func (e *env) checkStream(what string, s *chatStream, refs *references, body []byte) bool {
	if s.status != 200 || (s.err != nil && !s.ended()) {
		e.unexpected("%s: status %d: %v", what, s.status, s.err)
		return false
	}
	if s.errCode != "" {
		e.unexpected("%s ended with the %s error event", what, s.errCode)
		return false
	}
	if s.done != 1 {
		e.unexpected("%s ended without [DONE] (%v)", what, s.err)
		return false
	}
	ref, err := refs.of(body)
	if err != nil {
		e.failf("%v", err)
		return false
	}
	if why := wellFormed(s, ref); why != "" {
		e.failf("%s: %s", what, why)
		return false
	}
	return true
}

// checkBuffered checks one PD buffered answer: 200, a chat completion with
// content.
func (e *env) checkBuffered(what string, r resp) bool {
	if r.err != nil || r.status != 200 {
		e.unexpected("%s: %s", what, r)
		if r.err == nil {
			e.checkError(what, r, 200)
		}
		return false
	}
	var v struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.body, &v); err != nil || len(v.Choices) == 0 || v.Choices[0].Message.Content == "" {
		e.failf("%s: 200 without a chat completion: %q", what, clip(string(r.body), 120))
		return false
	}
	return true
}

// probePDDecodeKilled: a decode worker SIGKILLed while it streams to many
// clients; each cut stream goes on, whole, on a prefill worker.
func probePDDecodeKilled(e *env) {
	const inFlight, after = 64, 16
	bin := e.simBinary()
	const scale = 1.0 // ~9 ms a token with 32 streams a worker: 150–200 token answers stream for ~2 s
	pre, dec := e.simProcs(bin, 2, scale), e.simProcs(bin, 2, scale)
	refs := e.references()
	if len(pre) < 2 || len(dec) < 2 || refs == nil || !e.startPD(urlsOf(pre), urlsOf(dec)) {
		return
	}
	mark := e.r.logs.mark()
	flights := make([]*flight, inFlight)
	var wg sync.WaitGroup
	for i := range flights {
		f := &flight{rid: fmt.Sprintf("pd-kill-%d", i), started: time.Now()}
		f.body = streamBody(fmt.Sprintf("pd session %d asks for a long answer", i), 150+10*(i%6), nil)
		flights[i] = f
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(bg, 60*time.Second)
			defer cancel()
			e.stream(ctx, e.r.base+"/v1/chat/completions", f.body, map[string]string{"X-Request-ID": f.rid}, &f.s)
		})
	}
	// The victim: the decode worker streaming to the most clients past
	// their 5th chunk, once that is a quarter of them (bounded).
	v, most := 0, 0
	for t0 := time.Now(); time.Since(t0) < 15*time.Second && most < inFlight/4; time.Sleep(10 * time.Millisecond) {
		on := make([]int, len(dec))
		for _, f := range flights {
			if w := f.s.worker.Load(); w != nil && f.s.chunks.Load() >= 5 {
				for i, d := range dec {
					if *w == d.addr {
						on[i]++
					}
				}
			}
		}
		v, most = 0, 0
		for i, n := range on {
			if n > most {
				v, most = i, n
			}
		}
	}
	victim, survivor := dec[v], dec[1-v]
	victim.kill()
	killed := time.Now()
	wg.Wait()
	drained := time.Since(killed)
	if most < inFlight/4 {
		e.failf("the kill found only %d streams past their 5th chunk on one decode worker, want >= %d", most, inFlight/4)
	}

	ok, onVictim := 0, 0
	for _, f := range flights {
		if w := f.s.worker.Load(); w != nil && *w == victim.addr {
			onVictim++
		}
		if e.checkStream("stream "+f.rid, &f.s, refs, f.body) {
			ok++
		}
	}
	cont := e.continued(mark)
	contTo := e.continuedTo(mark)
	contLines := 0
	for _, n := range cont {
		contLines += n
	}
	for w, n := range contTo {
		if w == victim.url || w == survivor.url {
			e.failf("%d cut streams continued on decode worker %s, want a prefill worker (the continuation goes whole to the entry side)", n, w)
		}
	}
	mid := e.pdCounts()

	// Later requests: decoded on the survivor.
	onSurvivor := 0
	for i := range after {
		body := streamBody(fmt.Sprintf("pd after the kill %d", i), 40, nil)
		var s chatStream
		ctx, cancel := context.WithTimeout(bg, 20*time.Second)
		e.stream(ctx, e.r.base+"/v1/chat/completions", body, map[string]string{"X-Request-ID": fmt.Sprintf("pd-after-%d", i)}, &s)
		cancel()
		if !e.checkStream(fmt.Sprintf("stream %d after the kill", i), &s, refs, body) {
			continue
		}
		if w := s.worker.Load(); w != nil && *w == survivor.addr {
			onSurvivor++
		} else if w != nil {
			e.failf("a stream after the kill was answered by %s, want the surviving decode worker %s", *w, survivor.addr)
		}
	}
	c := e.pdCounts()
	e.notef("%d streams, %d of them on the victim at first byte, %d past their 5th chunk there at the SIGKILL; %d well-formed and identical to the uninterrupted answer; "+
		"%d continued (to %v), all ended %s after the kill; %d of %d later streams decoded on the survivor; before the later ones %s; at the end %s",
		inFlight, onVictim, most, ok, len(cont), contTo, drained.Round(10*time.Millisecond), onSurvivor, after, mid, c)
	if len(cont) == 0 || mid.resumed != contLines {
		e.failf("%d streams continued per the log (%d lines), vllm_router_stream_resumes_total{outcome=\"resumed\"} %d", len(cont), contLines, mid.resumed)
	}
	if mid.decoded < inFlight {
		e.failf("pd_requests_total{outcome=\"decoded\"} %d after %d streams, want each decoded", mid.decoded, inFlight)
	}
}

// probePDDecodeFailsFirstByte: a decode worker that answers 500, then
// resets, before any byte; each request is decoded on the other with the
// one prefill it had.
func probePDDecodeFailsFirstByte(e *env) {
	const perPhase = 24
	ws, pre := e.sims(2, 0.05)
	good, gurl := e.sims(1, 0.05)
	bad := e.bad(mode500)
	refs := e.references()
	if len(pre) < 2 || len(gurl) < 1 || bad == nil || refs == nil ||
		!e.startPD(pre, []string{gurl[0], bad.url}, "--decode-policy", "round_robin", "--cb-failure-threshold", "0") {
		return
	}
	// No breaker: the failing worker keeps getting every other decode leg,
	// in each of its two ways of failing.
	mark := e.r.logs.mark()
	sent := 0
	var legs []int
	for _, mode := range []string{mode500, modeReset} {
		bad.setMode(mode)
		legs0 := bad.inference.Load()
		var wg sync.WaitGroup
		var n atomic.Int64
		for i := range perPhase {
			wg.Go(func() {
				rid := fmt.Sprintf("pd-fb-%s-%d", mode, i)
				if i%2 == 0 {
					body := streamBody(fmt.Sprintf("decode fails %s %d", mode, i), 30, nil)
					var s chatStream
					ctx, cancel := context.WithTimeout(bg, 20*time.Second)
					e.stream(ctx, e.r.base+"/v1/chat/completions", body, map[string]string{"X-Request-ID": rid}, &s)
					cancel()
					if e.checkStream("stream "+rid, &s, refs, body) && *s.worker.Load() != good[0].Name() {
						e.failf("stream %s answered by %s, want the good decode worker", rid, *s.worker.Load())
					}
				} else {
					r := e.do(nil, "POST", "/v1/chat/completions", chatBody(model, fmt.Sprintf("decode fails %s %d", mode, i), false, 0), map[string]string{"X-Request-ID": rid})
					if e.checkBuffered("request "+rid, r) && r.header.Get("X-Vllm-Router-Decode-Worker") != gurl[0] {
						e.failf("request %s decoded on %q, want the good decode worker", rid, r.header.Get("X-Vllm-Router-Decode-Worker"))
					}
				}
				n.Add(1)
			})
			if i%4 == 3 {
				wg.Wait() // four at a time
			}
		}
		wg.Wait()
		sent += int(n.Load())
		legs = append(legs, int(bad.inference.Load()-legs0))
	}
	c := e.pdCounts()
	prefills := 0
	for _, w := range ws {
		prefills += int(w.Stats().Requests)
	}
	// A leg reset on a kept-alive connection is sent once more on a fresh
	// one to the same worker (the stale keep-alive rule): one failed leg
	// the router logs may be two requests the worker received.
	badLegs, failedLegs := int(bad.inference.Load()), e.failedAttempts(mark, bad.url)
	e.notef("%d requests (half streamed), the bad decode worker received %d legs (%d answered 500, %d reset), %d failed legs logged; %d prefill legs, %d decode legs on the good worker; %s",
		sent, badLegs, legs[0], legs[1], failedLegs, prefills, good[0].Stats().Requests, c)
	switch {
	case legs[0] < perPhase/4 || legs[1] < perPhase/4:
		e.failf("the failing decode worker got %d legs answered 500 and %d reset, want >= %d each", legs[0], legs[1], perPhase/4)
	case failedLegs == 0 || c.retries != failedLegs:
		e.failf("vllm_router_pd_decode_retries_total %d, want one per failed leg (%d logged)", c.retries, failedLegs)
	}
	if prefills != sent {
		e.failf("%d prefill legs for %d requests, want one each (the decode leg goes again with the same kv_transfer_params)", prefills, sent)
	}
	if int(good[0].Stats().Requests) != sent || c.decoded != sent || c.failed != 0 {
		e.failf("%d decode legs on the good worker, pd_requests_total decoded %d failed %d, for %d requests",
			good[0].Stats().Requests, c.decoded, c.failed, sent)
	}
}

// probePDPrefillKilled: a prefill worker SIGKILLed while prefill legs run
// on it; they go to the other prefill worker, and nobody sees it.
func probePDPrefillKilled(e *env) {
	const clients = 24
	bin := e.simBinary()
	pre, dec := e.simProcs(bin, 2, 1.0), e.simProcs(bin, 2, 1.0)
	refs := e.references()
	if len(pre) < 2 || len(dec) < 2 || refs == nil || !e.startPD(urlsOf(pre), urlsOf(dec)) {
		return
	}
	mark := e.r.logs.mark()
	// ~2,000-token prompts, distinct from their first block: a prefill leg
	// computes them all (~100 ms), so that legs are in flight at the kill.
	long := strings.Repeat("lorem ipsum dolor sit amet ", 300)
	var killedAt atomic.Int64
	var survivorURL atomic.Pointer[string]
	var next atomic.Int64
	var total, afterKill, afterOnSurvivor atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := int(next.Add(1)) - 1
				rid := fmt.Sprintf("pd-pk-%d", i)
				content := fmt.Sprintf("request %d: %s", i, long)
				t0 := time.Now().UnixNano()
				total.Add(1)
				if i%2 == 0 {
					body := streamBody(content, 40, nil)
					var s chatStream
					ctx, cancel := context.WithTimeout(bg, 30*time.Second)
					e.stream(ctx, e.r.base+"/v1/chat/completions", body, map[string]string{"X-Request-ID": rid}, &s)
					cancel()
					e.checkStream("stream "+rid, &s, refs, body)
					continue
				}
				r := e.do(nil, "POST", "/v1/chat/completions", chatBody(model, content, false, 40), map[string]string{"X-Request-ID": rid})
				if e.checkBuffered("request "+rid, r) {
					if k := killedAt.Load(); k != 0 && t0 > k {
						afterKill.Add(1)
						if s := survivorURL.Load(); s != nil && r.header.Get("X-Vllm-Router-Prefill-Worker") == *s {
							afterOnSurvivor.Add(1)
						}
					}
				}
			}
		})
	}
	// The victim: the prefill worker with the most legs in flight, once it
	// has two (bounded).
	time.Sleep(500 * time.Millisecond)
	v, most := 0, 0
	for t0 := time.Now(); time.Since(t0) < 10*time.Second && most < 2; time.Sleep(5 * time.Millisecond) {
		rows, err := e.r.workers(e.r.mbase, "")
		if err != nil {
			continue
		}
		v, most = 0, 0
		for _, row := range rows {
			for i, p := range pre {
				if row.URL == p.url && row.Load > most {
					v, most = i, row.Load
				}
			}
		}
	}
	victim, survivor := pre[v], pre[1-v]
	survivorURL.Store(&survivor.url)
	victim.kill()
	killedAt.Store(time.Now().UnixNano())
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	failedOver := e.failedAttempts(mark, victim.url)
	c := e.pdCounts()
	kvFailed := 0
	for _, d := range dec {
		kvFailed += max(d.metric("vllm:nixl_num_failed_transfers_total"), 0)
	}
	e.notef("%d requests (half streamed, ~2,000-token prompts) from %d clients; %d prefill legs in flight on the victim at the SIGKILL, %d failed attempts on it logged; "+
		"%d buffered requests after the kill, %d prefilled on the survivor; %d decode pulls from the dead worker recomputed; %s",
		total.Load(), clients, most, failedOver, afterKill.Load(), afterOnSurvivor.Load(), kvFailed, c)
	if most < 2 {
		e.failf("the kill found %d prefill legs in flight on the victim, want >= 2", most)
	}
	if failedOver == 0 {
		e.failf("no attempt on the killed prefill worker failed: nothing failed over")
	}
	if afterKill.Load() == 0 || afterOnSurvivor.Load() != afterKill.Load() {
		e.failf("%d of %d buffered requests sent after the kill prefilled on the surviving prefill worker", afterOnSurvivor.Load(), afterKill.Load())
	}
}

// probePDNoDecodeLeft: both decode workers SIGKILLed; the prefill workers
// serve requests whole once the router has marked the decode side down.
func probePDNoDecodeLeft(e *env) {
	const after = 20
	bin := e.simBinary()
	pre, dec := e.simProcs(bin, 2, 0.05), e.simProcs(bin, 2, 0.05)
	refs := e.references()
	if len(pre) < 2 || len(dec) < 2 || refs == nil || !e.startPD(urlsOf(pre), urlsOf(dec)) {
		return
	}
	for i := range 4 { // warm: decoded
		r := e.do(nil, "POST", "/v1/chat/completions", chatBody(model, fmt.Sprintf("warm %d", i), false, 0), nil)
		if e.checkBuffered("warm request", r) && r.header.Get("X-Vllm-Router-Decode-Worker") == "" {
			e.failf("a request before the kill was not decoded (no x-vllm-router-decode-worker)")
		}
	}
	c0 := e.pdCounts()
	for _, d := range dec {
		d.kill()
	}
	killed := time.Now()
	// Until the router has marked both decode workers down (bounded):
	// requests one at a time, the failures counted.
	down := func() bool {
		for _, d := range dec {
			if h, ok := e.r.healthOf(d.url); !ok || h {
				return false
			}
		}
		return true
	}
	var noticed time.Duration
	before, beforeFailed := 0, 0
	firstFail := "none"
	for i := 0; noticed == 0 && time.Since(killed) < 15*time.Second; i++ {
		if down() {
			noticed = time.Since(killed)
			break
		}
		before++
		rid := fmt.Sprintf("pd-noticing-%d", i)
		r := e.do(nil, "POST", "/v1/chat/completions", chatBody(model, fmt.Sprintf("noticing %d", i), false, 0), map[string]string{"X-Request-ID": rid})
		if r.status != 200 {
			if beforeFailed == 0 {
				firstFail = fmt.Sprintf("%s, after %d failed legs logged", clip(r.String(), 160), e.attemptsOf(rid))
			}
			beforeFailed++
			e.failf("a request before the router noticed failed (every decode leg refused: the prefill worker should have served it whole): %s", clip(r.String(), 160))
			continue
		}
		e.checkBuffered("request before the router noticed", r)
		time.Sleep(50 * time.Millisecond)
	}
	if noticed == 0 {
		e.failf("the router did not mark both killed decode workers down within 15 s")
		return
	}
	c1 := e.pdCounts()
	whole := 0
	for i := range after {
		rid := fmt.Sprintf("pd-whole-%d", i)
		var w string
		if i%2 == 0 {
			body := streamBody(fmt.Sprintf("no decode left %d", i), 30, nil)
			var s chatStream
			ctx, cancel := context.WithTimeout(bg, 20*time.Second)
			e.stream(ctx, e.r.base+"/v1/chat/completions", body, map[string]string{"X-Request-ID": rid}, &s)
			cancel()
			if !e.checkStream("stream "+rid, &s, refs, body) {
				continue
			}
			w = *s.worker.Load()
		} else {
			r := e.do(nil, "POST", "/v1/chat/completions", chatBody(model, fmt.Sprintf("no decode left %d", i), false, 0), map[string]string{"X-Request-ID": rid})
			if !e.checkBuffered("request "+rid, r) {
				continue
			}
			w = r.header.Get("X-Sim-Worker")
		}
		if w == pre[0].addr || w == pre[1].addr {
			whole++
		} else {
			e.failf("%s answered by %q, want a prefill worker serving it whole", rid, w)
		}
	}
	c2 := e.pdCounts()
	e.notef("both decode workers marked down %s after the SIGKILL; %d requests before that, %d failed (first: %s); then %d of %d served whole by the prefill workers; "+
		"before the kill %s; when noticed %s; at the end %s",
		noticed.Round(10*time.Millisecond), before, beforeFailed, firstFail, whole, after, c0, c1, c2)
	if c2.whole-c1.whole < after {
		e.failf("pd_requests_total{outcome=\"whole\"} rose by %d over %d requests, want each", c2.whole-c1.whole, after)
	}
}
