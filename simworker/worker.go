package simworker

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"
)

// Worker is one simulated inference worker. Its methods are safe for
// concurrent use. Many Workers may live in one process: each has its own
// cache, counters and metrics.Set.
type Worker struct {
	cfg    Config
	models map[string]*modelStats
	start  time.Time
	name   atomic.Pointer[string]
	cache  *prefixCache  // legacy model
	sem    chan struct{} // MaxNumSeqs slots, legacy model
	eng    *engine       // engine model; nil in the legacy model and in zero-work mode
	done   chan struct{} // closed by Close: unblocks queued, sleeping and hanging requests
	closed sync.Once

	healthy    atomic.Bool
	down       atomic.Bool // SetUnavailable: every inference request and /health answer 503
	asleep     atomic.Bool // POST /sleep until POST /wake_up: inference answers 503 (sleep.go)
	sleepLevel atomic.Int32
	rng        atomic.Uint64 // splitmix64 state
	ids        atomic.Uint64 // id counter (tool calls, responses, completions)

	running, waiting                    atomic.Int64
	requests, errs, dropped, successful atomic.Uint64
	promptTokens, completionTokens      atomic.Uint64
	prefixHits, prefixQueries           atomic.Uint64

	set *metrics.Set // this worker's metrics only: many workers may share a process

	respMu    sync.Mutex
	responses map[string]*storedResponse
	respOrder []string // FIFO of stored ids, oldest first

	lora adapters // runtime LoRA adapters (lora.go)

	srvMu   sync.Mutex
	servers []*fasthttp.Server

	zeroBody []byte // ZeroWork's fixed answer; nil unless ZeroWork

	defaultFaults faults // Config.DefaultFaults, parsed

	// Disaggregated prefill/decode (pd.go).
	engineID                           string
	pdClient                           fasthttp.Client // decode legs' pulls
	kvTransferred, kvFailed, kvExpired atomic.Uint64

	// KV-cache events (kvpublish.go): nil unless Config.KVEventsEndpoint;
	// kvErr is why binding it failed (Serve and Start return it).
	kv    *kvPublisher
	kvErr error
}

// Stats is a snapshot of a Worker's counters.
type Stats struct {
	Requests         uint64 // inference requests received (chat, completions, generate, responses, embeddings)
	Errors           uint64 // requests answered with an error status, dropped or hung
	Dropped          uint64 // connections closed on purpose (drop faults)
	Successful       uint64 // requests that completed generation
	PrefixQueries    uint64 // prompt tokens looked up in the prefix cache
	PrefixHits       uint64 // prompt tokens found in the prefix cache
	PromptTokens     uint64
	CompletionTokens uint64
	Running          int64 // requests holding one of the MaxNumSeqs slots
	Waiting          int64 // requests queued for a slot
	CacheBlocksUsed  int   // blocks in use: cached, or held by running sequences
	CacheBlocksHeld  int   // blocks held by running sequences and for KV pulls (engine model; what vllm:kv_cache_usage_perc reports)
	CacheBlocks      int

	// Disaggregated prefill/decode (engine model; docs/design.md §6).
	KVTransferredTokens uint64 // prompt tokens decode legs pulled from prefill workers
	KVFailedTransfers   uint64 // decode legs whose pull failed, so recomputed
	KVExpiredHolds      uint64 // prefill legs whose blocks no decode leg pulled within KVHoldTimeout
	KVHeldBlocks        int    // blocks held now for decode legs to pull (within CacheBlocksHeld)
}

// New returns a Worker for cfg (defaults filled in). It serves nothing until
// Serve or until Handler is mounted on a server. It panics on a Config that
// Validate rejects for its LatencyModel or DefaultFaults.
func New(cfg Config) *Worker {
	if cfg.LatencyModel != "" && cfg.LatencyModel != LatencyEngine && cfg.LatencyModel != LatencyLegacy {
		panic("simworker: " + cfg.Validate().Error())
	}
	defaultFaults, err := parseFaults([]byte(cfg.DefaultFaults))
	if err != nil {
		panic("simworker: default faults: " + err.Error())
	}
	cfg.setDefaults()
	cfg.Models = append([]string(nil), cfg.Models...)
	w := &Worker{
		cfg:       cfg,
		models:    make(map[string]*modelStats, len(cfg.Models)),
		start:     time.Now(),
		cache:     newPrefixCache(cfg.CacheBlocks),
		sem:       make(chan struct{}, cfg.MaxNumSeqs),
		done:      make(chan struct{}),
		set:       metrics.NewSet(),
		responses: make(map[string]*storedResponse),

		defaultFaults: defaultFaults,
		engineID:      newEngineID(),
	}
	w.newCacheConfigInfo()
	w.set.NewGauge(`simworker_kv_transfer_held_blocks`, func() float64 {
		if w.eng == nil {
			return 0
		}
		_, _, xfer := w.eng.kvStats()
		return float64(xfer)
	})
	for _, m := range cfg.Models {
		if w.models[m] == nil {
			w.models[m] = w.newModelStats(m)
		}
	}
	if cfg.KVEventsEndpoint != "" {
		w.kv, w.kvErr = newKVPublisher(&w.cfg)
	}
	switch {
	case cfg.ZeroWork:
		w.zeroBody = zeroWorkBody(cfg.Models[0])
	case cfg.LatencyModel == LatencyEngine:
		w.eng = newEngine(w)
	}
	if w.kv != nil {
		// The model's cache logs its changes for the publisher; ZeroWork
		// has none.
		switch {
		case w.eng != nil:
			w.eng.kv.log = &kvLog{}
		case !cfg.ZeroWork:
			w.cache.kv = w.kv
		}
	}
	w.healthy.Store(true)
	w.rng.Store(uint64(cfg.Seed))
	if cfg.Name != "" {
		w.setName(cfg.Name)
	}
	return w
}

// Config returns the worker's configuration with defaults filled in.
func (w *Worker) Config() Config { return w.cfg }

// Name returns the worker name: Config.Name, else the address of the first
// listener given to Serve, else "sim".
func (w *Worker) Name() string {
	if p := w.name.Load(); p != nil {
		return *p
	}
	return "sim"
}

func (w *Worker) setName(s string) { w.name.CompareAndSwap(nil, &s) }

// idTag is the worker name made safe for ids: [A-Za-z0-9-] only.
func (w *Worker) idTag() string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, w.Name())
}

// nextID returns prefix + worker tag + "_" + a worker-unique counter.
func (w *Worker) nextID(prefix string) string {
	return prefix + w.idTag() + "_" + strconv.FormatUint(w.ids.Add(1), 10)
}

// toolCallID returns a new tool-call id for model: call_<model>_<tag><n>.
// StrictToolIDs accepts exactly the ids with the prefix call_<model>_.
func (w *Worker) toolCallID(model string) string { return w.nextID("call_" + model + "_") }

// Uptime returns the time since New.
func (w *Worker) Uptime() time.Duration { return time.Since(w.start) }

// SetHealthy sets what /health answers: 200 when true, 503 when false.
func (w *Worker) SetHealthy(ok bool) { w.healthy.Store(ok) }

// SetUnavailable(true) answers 503 to every inference request and to
// /health until SetUnavailable(false): an outage injected at run time.
func (w *Worker) SetUnavailable(on bool) { w.down.Store(on) }

// ResetCache drops every cached block.
// In the engine model, blocks that running sequences hold stay.
func (w *Worker) ResetCache() {
	if w.eng != nil {
		w.eng.resetCache()
		return
	}
	w.cache.reset()
}

// Metrics returns the worker's own metrics set (what /metrics writes).
func (w *Worker) Metrics() *metrics.Set { return w.set }

// Stats returns a snapshot of the counters; each field is read atomically,
// the snapshot as a whole is not.
func (w *Worker) Stats() Stats {
	used, held, xfer := w.cache.used(), 0, 0
	if w.eng != nil {
		used, held, xfer = w.eng.kvStats()
	}
	return Stats{
		Requests:         w.requests.Load(),
		Errors:           w.errs.Load(),
		Dropped:          w.dropped.Load(),
		Successful:       w.successful.Load(),
		PrefixQueries:    w.prefixQueries.Load(),
		PrefixHits:       w.prefixHits.Load(),
		PromptTokens:     w.promptTokens.Load(),
		CompletionTokens: w.completionTokens.Load(),
		Running:          w.running.Load(),
		Waiting:          w.waiting.Load(),
		CacheBlocksUsed:  used,
		CacheBlocksHeld:  held,
		CacheBlocks:      w.cfg.CacheBlocks,

		KVTransferredTokens: w.kvTransferred.Load(),
		KVFailedTransfers:   w.kvFailed.Load(),
		KVExpiredHolds:      w.kvExpired.Load(),
		KVHeldBlocks:        xfer,
	}
}

// Serve serves the worker's HTTP surface over ln until Close. The first
// listener's address names the worker when Config.Name is empty. It returns
// at once, ln closed, when Config.KVEventsEndpoint could not be bound.
func (w *Worker) Serve(ln net.Listener) error {
	if w.kvErr != nil {
		ln.Close()
		return w.kvErr
	}
	w.setName(ln.Addr().String())
	s := &fasthttp.Server{
		Handler:            w.Handler,
		Name:               "simworker",
		MaxRequestBodySize: w.cfg.MaxBodySize,
		IdleTimeout:        30 * time.Second,
		CloseOnShutdown:    true,
	}
	w.srvMu.Lock()
	select {
	case <-w.done:
		w.srvMu.Unlock()
		return errClosed
	default:
	}
	w.servers = append(w.servers, s)
	w.srvMu.Unlock()
	return s.Serve(ln)
}

var (
	errClosed = errors.New("simworker: closed")
)

// Close stops every server started by Serve and unblocks queued, sleeping and
// hanging requests. It waits up to 5 s for connections to finish.
func (w *Worker) Close() error {
	w.closed.Do(func() { close(w.done) })
	if w.eng != nil {
		w.eng.dropHolds()
	}
	w.srvMu.Lock()
	servers := w.servers
	w.servers = nil
	w.srvMu.Unlock()
	var first error
	for _, s := range servers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := s.ShutdownWithContext(ctx); err != nil && first == nil {
			first = err
		}
		cancel()
	}
	w.pdClient.CloseIdleConnections()
	if w.kv != nil {
		w.kv.pub.Close()
	}
	return first
}

// scaled multiplies a simulated duration by TimeScale.
func (w *Worker) scaled(d time.Duration) time.Duration {
	if w.cfg.TimeScale == 0 || d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * w.cfg.TimeScale)
}

// unscaled is the simulated duration of a real one (0 when nothing sleeps).
func (w *Worker) unscaled(d time.Duration) time.Duration {
	if w.cfg.TimeScale == 0 {
		return 0
	}
	return time.Duration(float64(d) / w.cfg.TimeScale)
}

// sleep waits d; false when the worker closed first.
func (w *Worker) sleep(d time.Duration) bool {
	if d <= 0 {
		select {
		case <-w.done:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.done:
		return false
	}
}

// rand returns a uniform float in [0, 1) from the seeded splitmix64 sequence.
func (w *Worker) rand() float64 {
	z := w.rng.Add(0x9e3779b97f4a7c15)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

func (w *Worker) chance(p float64) bool { return p > 0 && (p >= 1 || w.rand() < p) }

// job is one generation request, decoded and rendered: everything the
// scheduler needs, none of it aliasing the request.
type job struct {
	ms           *modelStats
	model        string
	salt         uint64   // prefix-cache namespace: the model's or the adapter's
	lora         *adapter // the adapter served, nil for a base model (KV events)
	prompt       []byte
	promptTokens int
	maxTokens    int  // completion tokens to generate
	explicitMax  bool // the request set the limit: finish_reason "length"
	first        int  // the answer's first output token: the prompt ends with tokens 0 … first-1 (resume)
	extraTTFT    time.Duration
	arrived      time.Time
	id           string // x-request-id, for Config.OnFirstToken
	priority     int    // the request's "priority" (chat): its place in the engine's queue under SchedulingPolicy "priority"

	cachedTokens int // set by admit

	// Disaggregated prefill/decode (pd.go), engine model only.
	kv             *kvTransferParams // decode leg: the prefill answer's kv_transfer_params
	holdID         string            // prefill leg: hold the prompt's blocks under this request id
	externalTokens int               // decode leg: prompt tokens pulled from the prefill worker (set before admission)
	heldIDs        []int             // prefill leg: ids of the blocks held (set by the engine when it finishes)
}

func (w *Worker) tokens(nbytes int) int {
	return (nbytes + w.cfg.CharsPerToken - 1) / w.cfg.CharsPerToken
}

func (w *Worker) newJob(t target, prompt []byte, maxTokens *int, f faults) *job {
	j := &job{
		ms:           t.ms,
		model:        t.name,
		salt:         t.salt,
		lora:         t.lora,
		prompt:       prompt,
		promptTokens: w.tokens(len(prompt)),
		maxTokens:    w.cfg.MaxTokens,
		extraTTFT:    f.slow,
		arrived:      time.Now(),
		id:           f.id,
	}
	if maxTokens != nil && *maxTokens > 0 {
		j.maxTokens = *maxTokens
		j.explicitMax = true
	}
	if w.cfg.SlowStart > 0 && w.Uptime() < w.cfg.SlowStart {
		j.extraTTFT += w.scaled(w.cfg.SlowStartDelay)
	}
	return j
}

// resume makes j continue an answer whose first k output tokens end its
// prompt (docs/design.md §6): the reply starts at token k; those k count as
// one prompt token each, the rest of the prompt as usual, so the prompt
// counts k more tokens than without them; and without a limit from the
// request the reply is what remains of the default length, so that with
// or without the cut the answer has the same tokens.
func (w *Worker) resume(j *job, k int) {
	if k <= 0 {
		return
	}
	j.first = k
	j.promptTokens = w.tokens(len(j.prompt)-fillerLen(k)) + k
	if !j.explicitMax {
		j.maxTokens = max(w.cfg.MaxTokens-k, 0)
	}
}

// admit (legacy model) queues j for one of the MaxNumSeqs slots, looks its
// prompt up in the prefix cache (inserting its full blocks), and sleeps its
// time to first token. On true the caller holds a slot and must call release exactly once;
// on false (worker closed) it holds none.
func (w *Worker) admit(j *job) bool {
	ms := j.ms
	if !w.acquire(ms) {
		return false
	}
	bb := w.cfg.BlockTokens * w.cfg.CharsPerToken
	var buf [64]uint64
	chain := blockHashes(buf[:0], j.salt, j.prompt, bb)
	cached := w.cache.lookupInsert(chain, j)
	j.cachedTokens = min(cached*w.cfg.BlockTokens, j.promptTokens)
	w.countPrompt(j)

	uncached := j.promptTokens - j.cachedTokens
	ttft := w.scaled(w.cfg.Overhead+time.Duration(uncached)*w.cfg.PerToken) + j.extraTTFT
	if !w.sleep(ttft) {
		w.release(ms)
		return false
	}
	ms.ttft.Update(time.Since(j.arrived).Seconds())
	return true
}

// decodeStep sleeps one inter-token latency; false when the worker closed.
func (w *Worker) decodeStep() bool { return w.sleep(w.scaled(w.cfg.InterToken)) }

// startStream answers ctx with a text/event-stream whose body run writes,
// flushing with flush; run reports whether it stopped for the stream fault
// sf, which then acts. Without a fault, and for truncate, fasthttp frames
// the body, so returning ends it properly. For cut, reset and stall the
// connection is hijacked and the response written by hand, so that the
// fault leaves the chunked body unterminated. run must not touch ctx: it
// runs after the handler returns.
func (w *Worker) startStream(ctx *fasthttp.RequestCtx, sf streamFault, run func(bw *bufio.Writer, flush func() error) bool) {
	if sf.kind == faultNone || sf.kind == faultTruncate {
		ctx.SetContentType("text/event-stream")
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		ctx.SetBodyStreamWriter(func(bw *bufio.Writer) { run(bw, bw.Flush) })
		return
	}
	name := w.Name()
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		_, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nServer: simworker\r\nContent-Type: text/event-stream\r\n"+
			"Cache-Control: no-cache\r\nX-Sim-Worker: "+name+"\r\nTransfer-Encoding: chunked\r\n\r\n")
		if err != nil {
			return
		}
		bw := bufio.NewWriter(chunkWriter{c})
		if run(bw, bw.Flush) {
			w.connFault(c, sf.kind)
		}
	})
}

// connFault applies a cut, reset or stall to the hijacked connection c;
// fasthttp closes c when the hijack handler returns.
func (w *Worker) connFault(c net.Conn, kind faultKind) {
	switch kind {
	case faultReset:
		if tc, ok := rawConn(c).(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // the close sends RST
		}
	case faultStall:
		w.stall(c)
	}
}

// stall holds c, sending nothing, until the client closes it, the worker
// closes or HangLimit passes. It returns only once its reader has, so
// nothing reads c after the hijack handler returns.
func (w *Worker) stall(c net.Conn) {
	raw := rawConn(c)
	_ = raw.SetReadDeadline(time.Time{})
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		_, _ = io.Copy(io.Discard, c) // ends at the client's close (EOF) or the deadline below
	}()
	t := time.NewTimer(w.cfg.HangLimit)
	defer t.Stop()
	select {
	case <-gone:
		return
	case <-t.C:
	case <-w.done:
	}
	_ = raw.SetReadDeadline(time.Now())
	<-gone
}

// rawConn is the network connection under fasthttp's hijacked connection.
func rawConn(c net.Conn) net.Conn {
	if u, ok := c.(interface{ UnsafeConn() net.Conn }); ok {
		return u.UnsafeConn()
	}
	return c
}

// chunkWriter frames each Write as one HTTP/1.1 chunk.
type chunkWriter struct{ w io.Writer }

func (c chunkWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	b := make([]byte, 0, len(p)+16)
	b = strconv.AppendInt(b, int64(len(p)), 16)
	b = append(b, "\r\n"...)
	b = append(b, p...)
	b = append(b, "\r\n"...)
	if _, err := c.w.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// hangUp answers a buffered request with a fault instead of a response:
// the connection closes (cut), is reset, or stalls, then closes.
func (w *Worker) hangUp(ctx *fasthttp.RequestCtx, kind faultKind) {
	w.errs.Add(1)
	if kind != faultStall {
		w.dropped.Add(1)
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) { w.connFault(c, kind) })
}

// bufferedFault answers a buffered request with f's connection fault, if
// it has one (drop, cut, reset, stall), and reports whether it did.
func (w *Worker) bufferedFault(ctx *fasthttp.RequestCtx, f faults) bool {
	switch k := f.stream.kind; {
	case k == faultCut || k == faultReset || k == faultStall:
		w.hangUp(ctx, k)
	case f.drop:
		w.hangUp(ctx, faultCut)
	default:
		return false
	}
	return true
}

// Start runs a new worker on a free loopback port in the background and
// returns it with its base URL ("http://127.0.0.1:port"); Close stops it.
func Start(cfg Config) (*Worker, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	w := New(cfg)
	if w.kvErr != nil {
		ln.Close()
		return nil, "", w.kvErr
	}
	go w.Serve(ln) //nolint:errcheck // returns when Close stops it
	return w, "http://" + ln.Addr().String(), nil
}
