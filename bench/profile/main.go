// Command profile (make profile) drives a real warmroute router over loopback
// with a realistic agent load and writes its CPU, allocation and mutex
// profiles, plus a short text summary:
//
//	go run ./bench/profile --duration 10s --out profiles
//
// Layout: the zero-latency simulated workers (simworker, TimeScale 0) run in a
// child process (this binary re-executed with -serve-workers), so that the
// profiles of this process hold only the router and the load generator. The
// router is started as fastproxy/helpers_test.go does (loadview.NewRegistry,
// route.New("cache_aware"), fastproxy.New, Serve on 127.0.0.1:0) and its
// goroutines carry the pprof label role=router; the load generator's carry
// role=client (go tool pprof -tagfocus=role=router profiles/cpu.pprof).
//
// Load: -sessions concurrent agent sessions, each a goroutine that sends one
// turn after another on /v1/chat/completions with an X-Session-ID header: a
// shared system prompt and tool schemas, then per-session user turns, tool
// calls, tool results full of escaped JSON and assistant replies, so the
// history grows turn by turn up to -history bytes, after which the session
// ends and a new one starts. A -stream fraction of the requests stream (SSE).
//
// Allocations per request of the router: the process-wide allocation counters
// (runtime.MemStats) over the measured run, minus the load generator's own
// allocations per request measured first against a worker directly.
//
// Output (under -out): cpu.pprof, allocs.pprof, mutex.pprof, block.pprof
// (gitignored) and SUMMARY.md (committed).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/simworker"
)

const model = "sample-model"

type options struct {
	duration, warmup, baseline time.Duration
	workers, sessions          int
	history, turn              int
	stream                     float64
	maxTokens                  int
	policy                     string
	out                        string
	mutexFraction              int
	blockRate                  int
	memRate                    int
	summary                    bool
}

func main() {
	var o options
	serveWorkers := flag.Int("serve-workers", 0, "internal: serve this many simulated workers and print their URLs")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured (profiled) run")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured warm-up through the router")
	flag.DurationVar(&o.baseline, "baseline", 2*time.Second, "load generator alone against one worker (its own allocations)")
	flag.IntVar(&o.workers, "workers", 4, "simulated workers (zero latency)")
	flag.IntVar(&o.sessions, "sessions", 64, "concurrent agent sessions (= client connections)")
	flag.IntVar(&o.history, "history", 64<<10, "a session ends when its body reaches this many bytes")
	flag.IntVar(&o.turn, "turn", 2<<10, "bytes a turn adds to the history (about)")
	flag.Float64Var(&o.stream, "stream", 0.5, "fraction of requests that stream (SSE)")
	flag.IntVar(&o.maxTokens, "max-tokens", 16, "completion tokens per request")
	flag.StringVar(&o.policy, "policy", "cache_aware", "router policy")
	flag.StringVar(&o.out, "out", "profiles", "output directory")
	flag.IntVar(&o.mutexFraction, "mutex-fraction", 5, "runtime.SetMutexProfileFraction during the measured run")
	flag.IntVar(&o.blockRate, "block-rate", 10000, "runtime.SetBlockProfileRate (ns) during the measured run")
	flag.IntVar(&o.memRate, "mem-rate", 512, "runtime.MemProfileRate during the measured run (bytes)")
	flag.BoolVar(&o.summary, "summary", true, "write SUMMARY.md (runs go tool pprof)")
	flag.Parse()
	runtime.MemProfileRate = 0 // profile allocations of the measured run only
	if *serveWorkers > 0 {
		serveSims(*serveWorkers)
		return
	}
	if err := run(o); err != nil {
		log.Fatal("profile: ", err)
	}
}

// serveSims is the child process: n zero-latency simulated workers on
// loopback, their URLs on stdout (one line), until stdin closes.
func serveSims(n int) {
	var urls []string
	for i := range n {
		_, url, err := simworker.Start(simworker.Config{Models: []string{model}, TimeScale: 0, Seed: int64(i + 1), MaxTokens: 16})
		if err != nil {
			log.Fatal(err)
		}
		urls = append(urls, url)
	}
	fmt.Println(strings.Join(urls, " "))
	_, _ = io.Copy(io.Discard, os.Stdin) // the parent is gone when stdin closes
}

func run(o options) error {
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	// --- workers (child process) ---
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self, "-serve-workers", strconv.Itoa(o.workers))
	stdin, err := child.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		return err
	}
	defer func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { child.Wait(); close(done) }() //nolint:errcheck
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			child.Process.Kill() //nolint:errcheck
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return fmt.Errorf("workers: %w", err)
	}
	urls := strings.Fields(line)

	// --- baseline: the load generator alone, against one worker ---
	gen := newGenerator(o)
	clientOnly := gen.phase(strings.TrimPrefix(urls[0], "http://"), o.baseline)
	log.Printf("baseline (client -> 1 worker): %d requests, %.1f allocs/req, %.0f B/req (load generator's own)",
		clientOnly.requests, clientOnly.allocsPerReq(), clientOnly.bytesPerReq())

	// --- router ---
	addr, stop, err := startRouter(urls, o.policy)
	if err != nil {
		return err
	}
	defer stop()
	gen.phase(addr, o.warmup)

	// --- measured run, profiled ---
	cpuF, err := os.Create(filepath.Join(o.out, "cpu.pprof"))
	if err != nil {
		return err
	}
	runtime.MemProfileRate = o.memRate
	runtime.SetMutexProfileFraction(o.mutexFraction)
	runtime.SetBlockProfileRate(o.blockRate)
	if err := pprof.StartCPUProfile(cpuF); err != nil {
		return err
	}
	routed := gen.phase(addr, o.duration)
	pprof.StopCPUProfile()
	cpuF.Close()
	runtime.SetMutexProfileFraction(0)
	runtime.SetBlockProfileRate(0)
	for _, p := range []string{"allocs", "mutex", "block"} {
		if err := writeProfile(p, filepath.Join(o.out, p+".pprof")); err != nil {
			return err
		}
	}
	runtime.MemProfileRate = 0
	log.Printf("routed: %d requests in %v (%.0f req/s), %d errors, %.1f allocs/req, %.0f B/req (client included)",
		routed.requests, routed.elapsed.Round(time.Millisecond), routed.rps(), routed.errors, routed.allocsPerReq(), routed.bytesPerReq())
	if o.summary {
		return writeSummary(o, clientOnly, routed)
	}
	return nil
}

func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup(name).WriteTo(f, 0)
}

// startRouter starts the router as fastproxy/helpers_test.go does, its
// goroutines labelled role=router. It returns the listen address.
func startRouter(urls []string, policy string) (string, func(), error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{HealthTimeout: time.Second, Logger: quiet})
	p, err := route.New(policy, reg, route.Options{CacheAware: route.DefaultCacheAwareConfig()})
	if err != nil {
		return "", nil, err
	}
	for _, u := range urls {
		if _, err := reg.Add(context.Background(), u, nil); err != nil {
			return "", nil, err
		}
	}
	srv, err := fastproxy.New(fastproxy.Config{Registry: reg, Policy: p, RetryMaxRetries: 3, RetryBackoff: time.Millisecond,
		RequestTimeout: 30 * time.Second, Logger: quiet})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	// Goroutines inherit the labels of the goroutine that starts them: every
	// fasthttp worker goroutine started by Serve is role=router.
	go pprof.Do(context.Background(), pprof.Labels("role", "router"), func(context.Context) {
		srv.Serve(ln) //nolint:errcheck
	})
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx) //nolint:errcheck
	}
	return ln.Addr().String(), stop, nil
}

// result of one load phase.
type result struct {
	requests, errors int64
	elapsed          time.Duration
	mallocs, bytes   uint64
}

func (r result) rps() float64 { return float64(r.requests) / r.elapsed.Seconds() }
func (r result) allocsPerReq() float64 {
	return float64(r.mallocs) / float64(max(r.requests, 1))
}
func (r result) bytesPerReq() float64 { return float64(r.bytes) / float64(max(r.requests, 1)) }

// generator is the agent load: sessions goroutines, each an agent whose
// history grows turn by turn.
type generator struct {
	o    options
	head []byte // {"model":...,"max_tokens":...,"tools":[...],"messages":[<system>
	gen  atomic.Int64
}

func newGenerator(o options) *generator {
	g := &generator{o: o}
	g.head = fmt.Appendf(nil, `{"model":%q,"max_tokens":%d,"tools":[`, model, o.maxTokens)
	for i, name := range []string{"read_file", "search", "run_shell"} {
		if i > 0 {
			g.head = append(g.head, ',')
		}
		g.head = fmt.Appendf(g.head, `{"type":"function","function":{"name":%q,"description":%q,"parameters":{"type":"object","properties":{"arg":{"type":"string","description":%q}},"required":["arg"]}}}`,
			name, text(uint64(i+100), 300), text(uint64(i+200), 120))
	}
	g.head = append(g.head, `],"messages":[{"role":"system","content":"`...)
	g.head = append(g.head, text(7, 6<<10)...)
	g.head = append(g.head, `"}`...)
	return g
}

// phase runs the load against addr for d and returns its counts.
func (g *generator) phase(addr string, d time.Duration) result {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: g.o.sessions * 2, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
		MaxResponseBodySize: 64 << 20}
	var reqs, errs atomic.Int64
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for i := range g.o.sessions {
		wg.Go(func() {
			pprof.Do(context.Background(), pprof.Labels("role", "client"), func(context.Context) {
				g.agent(hc, uint64(i), deadline, &reqs, &errs)
			})
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms1)
	hc.CloseIdleConnections()
	return result{requests: reqs.Load(), errors: errs.Load(), elapsed: elapsed,
		mallocs: ms1.Mallocs - ms0.Mallocs, bytes: ms1.TotalAlloc - ms0.TotalAlloc}
}

// agent runs sessions one after another until deadline. Each turn appends a
// user message, an assistant tool call, its tool result and an assistant
// reply to the history, then sends the whole conversation.
func (g *generator) agent(hc *fasthttp.HostClient, id uint64, deadline time.Time, reqs, errs *atomic.Int64) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	rng := id*0x9E3779B97F4A7C15 + 1
	var msgs, body []byte
	var sid string
	turn := 0
	for time.Now().Before(deadline) {
		if turn == 0 || len(g.head)+len(msgs) > g.o.history {
			sid = "agent-" + strconv.FormatUint(id, 10) + "-" + strconv.FormatInt(g.gen.Add(1), 10)
			msgs, turn = msgs[:0], 0
			// start part-way through, so the sessions' histories are spread over the range
			for k := xorshift(&rng) % uint64(g.o.history/g.o.turn/2+1); k > 0; k-- {
				msgs = g.appendTurn(msgs, &rng, turn)
				turn++
			}
		}
		msgs = g.appendTurn(msgs, &rng, turn)
		turn++
		stream := float64(xorshift(&rng)%1000) < g.o.stream*1000
		body = append(append(append(body[:0], g.head...), msgs...), `],"stream":`...)
		body = strconv.AppendBool(body, stream)
		body = append(body, '}')

		req.Reset()
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://" + hc.Addr + "/v1/chat/completions")
		req.Header.SetContentType("application/json")
		req.Header.Set("X-Session-ID", sid)
		req.SetBodyRaw(body)
		err := hc.Do(req, resp)
		reqs.Add(1)
		if err != nil || resp.StatusCode() != fasthttp.StatusOK {
			errs.Add(1)
		}
	}
}

// appendTurn appends one agent turn (4 messages, about o.turn bytes).
func (g *generator) appendTurn(msgs []byte, rng *uint64, turn int) []byte {
	n := g.o.turn
	tool := []string{"read_file", "search", "run_shell"}[xorshift(rng)%3]
	call := "call_" + strconv.FormatUint(xorshift(rng), 36)
	msgs = append(msgs, `,{"role":"user","content":"`...)
	msgs = append(msgs, text(xorshift(rng), n*3/10)...)
	msgs = fmt.Appendf(msgs, `"},{"role":"assistant","content":null,"tool_calls":[{"id":%q,"type":"function","function":{"name":%q,"arguments":"{\"arg\":\"%s\"}"}}]}`,
		call, tool, text(xorshift(rng), 40))
	msgs = fmt.Appendf(msgs, `,{"role":"tool","tool_call_id":%q,"content":"{\"turn\":%d,\"output\":\"`, call, turn)
	msgs = append(msgs, text(xorshift(rng), n*5/10)...)
	msgs = append(msgs, `\"}"},{"role":"assistant","content":"`...)
	msgs = append(msgs, text(xorshift(rng), n*2/10)...)
	return append(msgs, `"}`...)
}

var words = []string{"the", "router", "keeps", "sessions", "warm", "on", "one", "worker", "so", "that",
	"prefix", "cache", "hits", "stay", "high", "while", "load", "is", "balanced", "across",
	"a", "fleet", "of", "GPUs", "serving", "models", "with", "long", "system", "prompts",
	"tool", "calls", "and", "results", "naïve", "café", "日本語", "path/to/file.go:42", "func", "return"}

// text returns about n bytes of deterministic JSON-safe prose for seed.
func text(seed uint64, n int) string {
	x := seed*0x9E3779B97F4A7C15 + 1
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[xorshift(&x)%uint64(len(words))])
	}
	return b.String()
}

func xorshift(x *uint64) uint64 {
	*x ^= *x << 13
	*x ^= *x >> 7
	*x ^= *x << 17
	return *x
}
