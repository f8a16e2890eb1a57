package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmroute/warmroute/simworker"
)

// Probes of streams that outlive their worker and of the waits that bound
// every request (docs/design.md §8.2, "Stream continuation").

// chatStream is a chat completions stream as its client read it.
type chatStream struct {
	status   int
	worker   atomic.Pointer[string] // X-Sim-Worker of the first answer
	chunks   atomic.Int64           // content deltas read so far
	text     strings.Builder        // choice 0's content, concatenated
	roles    int                    // deltas carrying a role
	ids      map[string]bool        // chunk ids
	finishes int                    // non-null finish_reason
	usage    *streamUsage
	usages   int
	done     int    // data: [DONE] lines
	errCode  string // the code of an error event ("" when none)
	afterEnd bool   // data after [DONE] or an error event
	bad      int    // data lines that are not JSON
	err      error  // transport or read error
}

type streamUsage struct {
	Prompt     int `json:"prompt_tokens"`
	Completion int `json:"completion_tokens"`
}

// ended reports whether the stream ended one of the two allowed ways.
func (s *chatStream) ended() bool { return s.done == 1 || s.errCode != "" }

// add takes one SSE line.
func (s *chatStream) add(line string) {
	data, ok := strings.CutPrefix(line, "data: ")
	if !ok {
		return
	}
	if s.done > 0 || s.errCode != "" {
		s.afterEnd = true
	}
	if data == "[DONE]" {
		s.done++
		return
	}
	var ev struct {
		ID      string `json:"id"`
		Choices []struct {
			Index int `json:"index"`
			Delta struct {
				Role    *string `json:"role"`
				Content *string `json:"content"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *streamUsage `json:"usage"`
		Error *struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(data), &ev); err != nil {
		s.bad++
		return
	}
	if ev.Error != nil {
		s.errCode = fmt.Sprint(ev.Error.Code)
		return
	}
	if s.ids == nil {
		s.ids = map[string]bool{}
	}
	s.ids[ev.ID] = true
	if ev.Usage != nil {
		s.usage = ev.Usage
		s.usages++
	}
	for _, c := range ev.Choices {
		if c.Index != 0 {
			continue
		}
		if c.Delta.Role != nil {
			s.roles++
		}
		if c.Delta.Content != nil {
			s.text.WriteString(*c.Delta.Content)
			s.chunks.Add(1)
		}
		if c.FinishReason != nil {
			s.finishes++
		}
	}
}

// stream posts body to url (a chat completions stream) on its own
// connection and reads it into s until it ends, ctx ends or the peer
// closes. base is the router's when e counts it as a request sent.
func (e *env) stream(ctx context.Context, url string, body []byte, hdr map[string]string, s *chatStream) {
	if e != nil {
		e.count(1)
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{DisableKeepAlives: true, DisableCompression: true} // its own connection: the probe may leave it
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		s.err = err
		return
	}
	defer res.Body.Close()
	s.status = res.StatusCode
	w := res.Header.Get("X-Sim-Worker")
	s.worker.Store(&w)
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		s.add(sc.Text())
	}
	s.err = sc.Err()
}

// streamBody is a streaming chat request that asks for usage; extra fields
// are added to it.
func streamBody(content string, maxTokens int, extra map[string]any) []byte {
	v := map[string]any{"model": model, "stream": true, "stream_options": map[string]any{"include_usage": true},
		"max_tokens": maxTokens, "messages": []map[string]string{{"role": "user", "content": content}}}
	for k, x := range extra {
		v[k] = x
	}
	b, _ := json.Marshal(v)
	return b
}

// references answers requests uninterrupted: each body sent once, straight
// to a simulated worker with no fault and no latency, whose answer is the
// one a cut-and-continued stream must equal (the simulated worker's answer
// is a function of the request).
type references struct {
	url string
	mu  sync.Mutex
	m   map[string]*chatStream
}

func (e *env) references() *references {
	w, url, err := simworker.Start(simConfig(0))
	if err != nil {
		e.failf("reference simworker: %v", err)
		return nil
	}
	e.defer_(func() { w.Close() })
	return &references{url: url + "/v1/chat/completions", m: map[string]*chatStream{}}
}

// of returns the uninterrupted answer to body.
func (r *references) of(body []byte) (*chatStream, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.m[string(body)]; ok {
		return s, nil
	}
	s := &chatStream{}
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	(*env)(nil).stream(ctx, r.url, body, nil, s)
	if s.err != nil || s.status != 200 || s.done != 1 || s.usage == nil {
		return nil, fmt.Errorf("reference answer: status %d, %d [DONE], usage %v: %v", s.status, s.done, s.usage != nil, s.err)
	}
	r.m[string(body)] = s
	return s, nil
}

// wellFormed checks a stream that ended with [DONE] against its
// uninterrupted answer ref: the same text, one role, one id, one finish,
// one usage chunk with ref's prompt and completion tokens, nothing after
// [DONE]. It returns "" when all hold, else what does not.
func wellFormed(s, ref *chatStream) string {
	var bad []string
	got, want := s.text.String(), ref.text.String()
	switch {
	case got == want:
	case len(got) > len(want):
		bad = append(bad, fmt.Sprintf("text %d bytes longer than the uninterrupted answer (duplicated)", len(got)-len(want)))
	case len(got) < len(want):
		bad = append(bad, fmt.Sprintf("text %d bytes shorter than the uninterrupted answer (missing)", len(want)-len(got)))
	default:
		bad = append(bad, "text differs from the uninterrupted answer")
	}
	if s.roles != 1 || len(s.ids) != 1 || s.finishes != 1 || s.done != 1 || s.afterEnd || s.bad > 0 {
		bad = append(bad, fmt.Sprintf("%d roles, %d ids, %d finishes, %d [DONE], data after the end %v, %d non-JSON events",
			s.roles, len(s.ids), s.finishes, s.done, s.afterEnd, s.bad))
	}
	switch {
	case s.usages != 1 || s.usage == nil:
		bad = append(bad, fmt.Sprintf("%d usage chunks, want 1", s.usages))
	case *s.usage != *ref.usage:
		bad = append(bad, fmt.Sprintf("usage %d prompt + %d completion tokens, uninterrupted %d + %d",
			s.usage.Prompt, s.usage.Completion, ref.usage.Prompt, ref.usage.Completion))
	}
	return strings.Join(bad, "; ")
}

var continuedRE = regexp.MustCompile(`msg="stream continued on another worker" request_id=(\S+)`)

// continued counts the router's "stream continued" log lines per request
// id, from log line mark on.
func (e *env) continued(mark int) map[string]int { return e.logCounts(mark, continuedRE) }

// logCounts counts the router's log lines from mark on that re matches, by
// the value its first group captures (quotes trimmed).
func (e *env) logCounts(mark int, re *regexp.Regexp) map[string]int {
	m := map[string]int{}
	for _, l := range e.r.logs.since(mark) {
		if sm := re.FindStringSubmatch(l); sm != nil {
			m[strings.Trim(sm[1], `"`)]++
		}
	}
	return m
}

// resumes is vllm_router_stream_resumes_total for one outcome (-1 when
// /metrics has no such sample).
func (e *env) resumes(outcome string) int {
	text, err := e.r.metrics()
	if err != nil {
		return -1
	}
	for _, s := range metricSamples(text, "vllm_router_stream_resumes_total") {
		if strings.Contains(s, `outcome="`+outcome+`"`) {
			var v float64
			fmt.Sscan(s[strings.LastIndexByte(s, ' ')+1:], &v)
			return int(v)
		}
	}
	return -1
}

// flight is one stream of probeStreamResume.
type flight struct {
	rid     string
	nc      string // why the request is not continuable ("" when it is)
	body    []byte
	s       chatStream
	started time.Time
}

func probeStreamResume(e *env) {
	const fleet, kills = 4, 20
	inFlight := 50 // STREAM_RESUME_IN_FLIGHT=200 runs it with the workers' queues full
	if n, err := strconv.Atoi(os.Getenv("STREAM_RESUME_IN_FLIGHT")); err == nil && n > 0 {
		inFlight = n
	}
	const scale = 1.0 // ~7 ms a token: a 120–210 token answer streams for 1–1.5 s
	ws, urls := e.sims(fleet, scale)
	refs := e.references()
	// A continuation may itself be served by the next victim: three
	// attempts make every cut of a continuable stream continuable.
	if len(ws) < fleet || refs == nil || !e.start(urls, "--stream-resume-attempts", "3") {
		return
	}
	mark := e.r.logs.mark()
	var mu sync.Mutex
	cur := append([]*simworker.Worker(nil), ws...)
	live := map[*flight]bool{}
	var all []*flight
	stop := make(chan struct{})
	var next atomic.Int64
	var wg sync.WaitGroup
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := int(next.Add(1)) - 1
				f := &flight{rid: fmt.Sprintf("resume-%d", i), started: time.Now()}
				var extra map[string]any
				switch i % 10 { // a tenth each cannot be continued
				case 3:
					extra, f.nc = map[string]any{"logprobs": true}, "logprobs"
				case 7:
					extra, f.nc = map[string]any{"n": 2}, "n=2"
				}
				f.body = streamBody(fmt.Sprintf("session %d asks for a long answer", i%16), 120+30*(i%4), extra)
				mu.Lock()
				live[f] = true
				all = append(all, f)
				mu.Unlock()
				ctx, cancel := context.WithTimeout(bg, 60*time.Second)
				e.stream(ctx, e.r.base+"/v1/chat/completions", f.body,
					map[string]string{"X-Request-ID": f.rid, "X-Session-ID": fmt.Sprintf("sess-%d", i%16)}, &f.s)
				cancel()
				mu.Lock()
				delete(live, f)
				mu.Unlock()
			}
		}()
	}
	// The killer: every 1.2 s, close the worker that streams to the most
	// clients past their 5th chunk (the router may keep a worker that cut
	// many streams out of service a while) and serve a fresh worker on its
	// port.
	index := map[string]int{}
	for i, u := range urls {
		index[strings.TrimPrefix(u, "http://")] = i
	}
	midStream, landed := 0, 0
	for range kills {
		time.Sleep(1200 * time.Millisecond)
		v, most := 0, 0
		for t0 := time.Now(); time.Since(t0) < 3*time.Second && most == 0; time.Sleep(10 * time.Millisecond) {
			on := make([]int, fleet)
			mu.Lock()
			for f := range live {
				if w := f.s.worker.Load(); w != nil && f.s.chunks.Load() >= 5 {
					if i, ok := index[*w]; ok {
						on[i]++
					}
				}
			}
			mu.Unlock()
			for i, n := range on {
				if n > most {
					v, most = i, n
				}
			}
		}
		if most > 0 {
			midStream += most
			landed++
		}
		addr := strings.TrimPrefix(urls[v], "http://")
		mu.Lock()
		victim := cur[v]
		mu.Unlock()
		victim.Close()
		w, err := restartSim(addr, scale)
		if err != nil {
			e.failf("restart on %s: %v", addr, err)
			break
		}
		e.defer_(func() { w.Close() })
		mu.Lock()
		cur[v] = w
		mu.Unlock()
	}
	close(stop)
	wg.Wait()

	cont := e.continued(mark)
	var streams, ncStreams, cut, contErr, identical, dup, missing, ncCut, ncDone int
	var firstBad string
	malformed := 0 // continuable streams that ended with [DONE] but not as one well-formed answer
	for _, f := range all {
		streams++
		s := &f.s
		if s.status != 200 || (s.err != nil && !s.ended()) {
			e.unexpected("stream %s: status %d: %v", f.rid, s.status, s.err)
			continue
		}
		ref, err := refs.of(f.body)
		if err != nil {
			e.failf("%v", err)
			return
		}
		if f.nc != "" {
			ncStreams++
			switch {
			case s.errCode == "stream_cut":
				ncCut++
				e.explain("stream_cut error event ending a cut stream that cannot be continued (" + f.nc + ", intended)")
				if s.done != 0 || !strings.HasPrefix(ref.text.String(), s.text.String()) {
					e.failf("cut non-continuable stream %s: %d [DONE], text not a prefix of the uninterrupted answer", f.rid, s.done)
				}
			case s.errCode != "":
				e.unexpected("non-continuable stream %s ended with error %q, want stream_cut", f.rid, s.errCode)
			case s.done == 1:
				ncDone++
				if why := wellFormed(s, ref); why != "" {
					e.failf("uncut non-continuable stream %s: %s", f.rid, why)
				}
			default:
				e.unexpected("non-continuable stream %s ended with neither [DONE] nor the stream_cut event", f.rid)
			}
			continue
		}
		wasCut := cont[f.rid] > 0 || s.errCode != ""
		if wasCut {
			cut++
		}
		if s.errCode != "" {
			contErr++
			e.unexpected("continuable stream %s ended with the %s error event", f.rid, s.errCode)
			continue
		}
		if s.done != 1 {
			e.unexpected("continuable stream %s ended without [DONE] (%v)", f.rid, s.err)
			continue
		}
		got, want := s.text.String(), ref.text.String()
		switch {
		case got == want:
			if wasCut {
				identical++
			}
		case len(got) > len(want):
			dup++
		default:
			missing++
		}
		if why := wellFormed(s, ref); why != "" {
			malformed++
			if firstBad == "" {
				firstBad = f.rid + ": " + why
			}
		}
	}
	contLines := 0
	for _, n := range cont {
		contLines += n
	}
	resumed := e.resumes("resumed")
	e.notef("%d streams (%d not continuable), %d kills (%d mid-stream; %d streams answered first by the victim past their 5th chunk), "+
		"%d continuable streams cut, %d continued identical to the uninterrupted answer, %d duplicated, %d missing, %d error events; "+
		"%d non-continuable cut with stream_cut, %d completed; resumes_total{resumed} %d, %d continuation log lines",
		streams, ncStreams, kills, landed, midStream, cut, identical, dup, missing, contErr, ncCut, ncDone, resumed, contLines)
	switch {
	case landed < kills:
		e.failf("only %d of %d kills found the victim streaming to a client", landed, kills)
	case cut == 0:
		e.failf("no continuable stream was cut")
	case float64(identical) < 0.99*float64(cut):
		e.failf("%d of %d cut continuable streams identical to the uninterrupted answer, want >= 99%%", identical, cut)
	}
	if malformed > 0 {
		e.failf("%d continuable streams not one well-formed answer, e.g. %s", malformed, firstBad)
	}
	if ncCut == 0 {
		e.failf("no non-continuable stream was cut: the probe did not exercise the stream_cut event")
	}
	if resumed != contLines || resumed < 1 {
		e.failf("vllm_router_stream_resumes_total{outcome=\"resumed\"} %d, continuation log lines %d", resumed, contLines)
	}
	if nc := e.resumes("not_continuable"); nc < ncCut {
		e.failf("vllm_router_stream_resumes_total{outcome=\"not_continuable\"} %d < %d stream_cut events", nc, ncCut)
	}
	mu.Lock()
	for _, w := range cur {
		for t0 := time.Now(); w.Stats().Running > 0 && time.Since(t0) < 3*time.Second; {
			time.Sleep(20 * time.Millisecond)
		}
		if n := w.Stats().Running; n > 0 {
			e.failf("a worker still runs %d sequences after every stream ended", n)
		}
	}
	mu.Unlock()
}

// probeWorkerDiesMidStream: with one worker a cut stream has nowhere to go
// on and ends with the error event; with two it goes on from the other.
func probeWorkerDiesMidStream(e *env) {
	die := e.bad(modeDieStream)
	if die == nil || !e.start([]string{die.url}) {
		return
	}
	mark := e.r.logs.mark()
	st, _, lines, err := e.streamChat(bg, chatBody(model, "die", true, 0), map[string]string{"X-Request-ID": "rid-die-1"}, nil)
	if st != 200 {
		e.unexpected("one worker: stream: status %d: %v", st, err)
		return
	}
	e.explain("stream cut by the only worker (nothing to continue on: unavoidable once bytes reached the client)")
	if !strings.HasPrefix(last(lines), `data: {"error"`) || !strings.Contains(last(lines), `"stream_cut"`) {
		e.failf("one worker: cut stream ends with %q, want the data: {\"error\":{…\"code\":\"stream_cut\"}} event", clip(last(lines), 60))
	}
	if n := e.resumes("resumed"); n > 0 {
		e.failf("one worker: %d streams counted as continued", n)
	}
	time.Sleep(300 * time.Millisecond)
	logged := false
	for _, l := range e.r.logs.since(mark) {
		if (strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR")) && strings.Contains(l, "rid-die-1") {
			logged = true
		}
	}
	if !logged {
		e.failf("one worker: the cut stream was not logged (no WARN/ERROR line with its request id)")
	}

	// Two workers, one of which resets every stream after 5 chunks.
	e.r.kill()
	cfg := simConfig(0.05)
	cfg.DefaultFaults = "reset=5"
	faulty, furl, err := simworker.Start(cfg)
	if err != nil {
		e.failf("simworker: %v", err)
		return
	}
	e.defer_(func() { faulty.Close() })
	e.workerAddr = append(e.workerAddr, strings.TrimPrefix(furl, "http://"))
	_, urls := e.sims(1, 0.05)
	refs := e.references()
	if len(urls) == 0 || refs == nil || !e.start(append(urls, furl), "--policy", "round_robin") {
		return
	}
	mark = e.r.logs.mark()
	for i := range 4 {
		body := streamBody("die and go on", 40, nil)
		var s chatStream
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		e.stream(ctx, e.r.base+"/v1/chat/completions", body, map[string]string{"X-Request-ID": fmt.Sprintf("rid-go-on-%d", i)}, &s)
		cancel()
		ref, err := refs.of(body)
		if err != nil {
			e.failf("%v", err)
			return
		}
		switch {
		case s.status != 200:
			e.unexpected("two workers: stream %d: status %d: %v", i, s.status, s.err)
		case s.errCode != "":
			e.unexpected("two workers: stream %d ended with the %s error event, want it continued", i, s.errCode)
		default:
			if why := wellFormed(&s, ref); why != "" {
				e.failf("two workers: stream %d: %s", i, why)
			}
		}
	}
	cont := e.continued(mark)
	if faulty.Stats().Dropped == 0 || len(cont) == 0 || e.resumes("resumed") < len(cont) {
		e.failf("two workers: %d resets, %d streams continued per the log, resumes_total{resumed} %d",
			faulty.Stats().Dropped, len(cont), e.resumes("resumed"))
	}
}

// probeStreamFirstByte: a worker that accepts a stream and never answers
// holds it for --first-byte-timeout-secs only (default 300 s).
func probeStreamFirstByte(e *env) {
	_, urls := e.sims(2, 0.05)
	hang := e.bad(modeHang)
	refs := e.references()
	if hang == nil || refs == nil || !e.start(append(urls, hang.url), "--policy", "round_robin", "--first-byte-timeout-secs", "1") {
		return
	}
	body := streamBody("first byte", 20, nil)
	ref, err := refs.of(body)
	if err != nil {
		e.failf("%v", err)
		return
	}
	for i := range 6 {
		var s chatStream
		ctx, cancel := context.WithTimeout(bg, 5*time.Second)
		t0 := time.Now()
		e.stream(ctx, e.r.base+"/v1/chat/completions", body, nil, &s)
		d := time.Since(t0)
		cancel()
		switch {
		case s.status != 200 || s.done != 1:
			e.unexpected("stream %d with a worker that never answers: status %d, %d [DONE] after %s: %v", i, s.status, s.done, d.Round(time.Millisecond), s.err)
		case d > 2500*time.Millisecond:
			e.failf("a stream took %s past a worker that never answers, want ~1 s", d.Round(time.Millisecond))
		default:
			if why := wellFormed(&s, ref); why != "" {
				e.failf("stream %d: %s", i, why)
			}
		}
	}
	if hang.inference.Load() == 0 {
		e.failf("the worker that never answers was never tried")
	}
	// The default: read from -h, the flag's own statement of it.
	out, _ := exec.Command(e.bin, "-h").CombinedOutput()
	_, after, _ := strings.Cut(string(out), "-first-byte-timeout-secs")
	if line := strings.SplitN(after, "\n", 3); len(line) < 2 || !strings.Contains(line[1], "(default 300)") {
		e.failf("warmroute -h: --first-byte-timeout-secs does not default to 300 s: %q", clip(strings.TrimSpace(strings.Join(line, " ")), 160))
	}
}

// probeStreamClientLeaves: clients that leave streams whose worker stalls
// release the worker's load and connections at once.
func probeStreamClientLeaves(e *env) {
	const clients = 4
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.failf("listen: %v", err)
		return
	}
	cl := &countingListener{Listener: ln}
	cfg := simConfig(0.05)
	cfg.HangLimit = 90 * time.Second // the stall outlasts the probe unless the router lets go
	w := simworker.New(cfg)
	go w.Serve(cl) //nolint:errcheck // returns at Close
	e.defer_(func() { w.Close() })
	url := "http://" + ln.Addr().String()
	e.workerAddr = append(e.workerAddr, ln.Addr().String())
	if !e.start([]string{url}) {
		return
	}
	ready := make(chan struct{}, clients)
	leave := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			go func() { <-leave; cancel() }()
			var s chatStream
			var once sync.Once
			go func() { // ready once 3 chunks arrived (the worker stalls after them)
				for s.chunks.Load() < 3 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
				once.Do(func() { ready <- struct{}{} })
			}()
			e.stream(ctx, e.r.base+"/v1/chat/completions", streamBody(fmt.Sprintf("stall %d", i), 100, nil),
				map[string]string{"x-sim-fault": "stall=3"}, &s)
		}()
	}
	for range clients {
		select {
		case <-ready:
		case <-time.After(5 * time.Second):
			e.failf("the streams did not reach their stall within 5 s")
			close(leave)
			wg.Wait()
			return
		}
	}
	if n := e.r.load(); n != clients {
		e.failf("load %d with %d stalled streams, want %d", n, clients, clients)
	}
	closed0 := cl.closed.Load()
	close(leave)
	left := time.Now()
	wg.Wait()
	e.explain("stream the client left while its worker stalled (intended)")
	for range clients - 1 {
		e.explain("stream the client left while its worker stalled (intended)")
	}
	var loadAt, connsAt time.Duration
	for time.Since(left) < 3*time.Second && (loadAt == 0 || connsAt == 0) {
		if loadAt == 0 && e.r.load() == 0 {
			loadAt = time.Since(left)
		}
		if connsAt == 0 && cl.closed.Load()-closed0 >= clients {
			connsAt = time.Since(left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	switch {
	case loadAt == 0:
		e.failf("the worker's load is %d 3 s after %d clients left its stalled streams", e.r.load(), clients)
	case loadAt > time.Second:
		e.failf("the load was released %s after the clients left, want at once", loadAt.Round(time.Millisecond))
	}
	switch {
	case connsAt == 0:
		e.failf("the worker saw %d of %d stalled connections closed within 3 s of their clients leaving", cl.closed.Load()-closed0, clients)
	case connsAt > time.Second:
		e.failf("the stalled upstream connections were closed %s after the clients left, want at once", connsAt.Round(time.Millisecond))
	}
	if loadAt > 0 && connsAt > 0 {
		e.notef("load 0 after %s, %d upstream connections closed after %s", loadAt.Round(time.Millisecond), clients, connsAt.Round(time.Millisecond))
	}
}

// probeSingleWorker500: answers a model's only worker gives never eject it.
func probeSingleWorker500(e *env) {
	_, urls := e.sims(1, 0.05)
	if len(urls) == 0 || !e.start(urls) {
		return
	}
	statuses := map[int]int{}
	for range 12 { // past --cb-failure-threshold (10)
		r := e.chat(model, map[string]string{"x-sim-fault": "error"})
		// 500 passed through, or 502 upstream_failed: with one worker the
		// router cannot tell the request's fault from the worker's.
		e.checkError("request the only worker answers 500", r, 500, 502)
		if r.status == 500 || r.status == 502 {
			statuses[r.status]++
			e.explain(fmt.Sprintf("%d: the only worker fails the request (intended)", r.status))
		}
	}
	e.notef("the 12 failed requests answered %v (status: count)", statuses)
	for range 3 {
		if r := e.chat(model, nil); r.status != 200 {
			e.unexpected("normal request after 12 answered 500: %s (the model's only worker ejected)", r)
		}
	}
	if h, ok := e.r.healthOf(urls[0]); ok && !h {
		e.failf("the model's only worker was ejected for answers it gave")
	}
}

// probeIdleConns: connections that never send a byte neither starve new
// requests under a low fd limit nor outlive --client-header-timeout-secs.
func probeIdleConns(e *env) {
	const idle = 770 // past the connection cap of RLIMIT_NOFILE 1024 (768)
	_, urls := e.sims(2, 0.05)
	if len(urls) < 2 || !e.startOpts(routerOpts{workers: urls, nofile: 1024}) {
		return
	}
	var mu sync.Mutex
	var conns []net.Conn
	parallel(32, idle, func(int) {
		c, err := net.DialTimeout("tcp", e.r.addr, time.Second)
		if err != nil {
			return
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	})
	e.count(idle) // connections, each counted as one request sent
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	time.Sleep(300 * time.Millisecond) // let the router accept what it will
	var slowest time.Duration
	for i := range 5 {
		ctx, cancel := context.WithTimeout(bg, 5*time.Second)
		r := e.do(ctx, "POST", "/v1/chat/completions", chatBody(model, fmt.Sprintf("live %d", i), false, 0), map[string]string{"Connection": "close"})
		cancel()
		slowest = max(slowest, r.dur)
		if r.status != 200 {
			e.unexpected("request with %d idle connections open: %s after %s", len(conns), r, r.dur.Round(time.Millisecond))
		} else if r.dur > 2*time.Second {
			e.failf("a request took %s with %d idle connections open", r.dur.Round(time.Millisecond), len(conns))
		}
	}
	if e.r.exited() {
		e.failf("router exited with %d idle connections open (%s)", len(conns), e.r.exitReason)
		return
	}
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	conns = nil
	mu.Unlock()

	// Zero-byte connections are closed after --client-header-timeout-secs.
	e.r.kill()
	if !e.start(urls, "--client-header-timeout-secs", "1") {
		return
	}
	const quiet = 20
	var closedIn [quiet]time.Duration
	var wg sync.WaitGroup
	for i := range quiet {
		c, err := net.DialTimeout("tcp", e.r.addr, time.Second)
		if err != nil {
			e.failf("dial: %v", err)
			continue
		}
		e.count(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			t0 := time.Now()
			c.SetReadDeadline(t0.Add(5 * time.Second))
			var b [1]byte
			if _, err := c.Read(b[:]); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					return // still open after 5 s
				}
			}
			closedIn[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	var worst time.Duration
	open := 0
	for _, d := range closedIn {
		if d == 0 {
			open++
		}
		worst = max(worst, d)
	}
	if open > 0 {
		e.failf("%d of %d zero-byte connections still open 5 s after accept with --client-header-timeout-secs 1", open, quiet)
	} else if worst > 2500*time.Millisecond {
		e.failf("zero-byte connections closed after up to %s with --client-header-timeout-secs 1", worst.Round(time.Millisecond))
	}
	e.notef("slowest of 5 requests beside %d idle connections %s; %d zero-byte connections closed within %s (header timeout 1 s)",
		idle, slowest.Round(time.Millisecond), quiet, worst.Round(time.Millisecond))
}
