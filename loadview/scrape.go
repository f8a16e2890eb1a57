package loadview

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Worker-reported load (docs/design.md §8.3). Every LoadScrapeInterval the
// registry GETs each base URL's /metrics and reads vLLM's
// num_requests_running, num_requests_waiting and kv_cache_usage_perc, so that
// router replicas behind one load balancer see each other's requests.
//
// The blend. At a scrape the worker reports R = running + waiting, and this
// replica has L₀ requests in flight on it (the larger of its in-flight count
// just before the GET and just after the answer, so that our own requests in
// transit are never counted as someone else's). The others' load is
// O = max(0, R − L₀), held until the next scrape, and
//
//	FleetLoad = Load() + O
//
// which is max(Load(), R + (Load() − L₀)): the worker's report corrected by
// what this replica has started and finished since. With one replica R ≈ L₀,
// O = 0 and FleetLoad is the local count (exactly, except while the worker
// lags behind us, e.g. still aborting a request whose client left); with
// several it adds the requests the others sent. A report older than
// 3 × LoadScrapeInterval is ignored, so a worker that stops answering falls
// back to the local count rather than to a stale view.
//
// Data-parallel workers ("url@rank") read the series labelled engine="rank"
// when vLLM labels engines; otherwise the base URL's O is split evenly
// between its ranks and the Reported* values are the whole base URL's.

// loadReport is one worker's share of one scrape; immutable once stored.
type loadReport struct {
	running, waiting int64
	kv               float64 // -1: not reported
	others           int64   // O above, ≥ 0
	mine             int64   // this replica's requests in flight on the worker at the scrape
	at               int64   // unix nano (Config.Now) of the scrape
}

// LoadReport is what the last usable scrape said about a worker.
type LoadReport struct {
	// KVCapacityTokens is the KV cache capacity the engine states, in
	// tokens (see Worker.KVCapacityTokens); 0 when it states none.
	KVCapacityTokens int64
	Running, Waiting int64     // vllm:num_requests_running and _waiting, summed over models
	KVCacheUsage     float64   // vllm:kv_cache_usage_perc (0..1); -1 when the worker does not report it
	Others           int64     // requests of other replicas: FleetLoad() − Load()
	At               time.Time // when it was scraped
}

// maxEngines bounds the data-parallel ranks whose engine-labelled series are
// read separately.
const maxEngines = 4096

// fresh returns w's report when there is one younger than three scrape
// intervals, else nil.
func (w *Worker) fresh() *loadReport {
	p := w.report.Load()
	if p == nil || w.reg == nil {
		return nil
	}
	iv := int64(w.reg.cfg.LoadScrapeInterval)
	if iv <= 0 || w.reg.nowNano()-p.at > 3*iv {
		return nil
	}
	return p
}

// FleetLoad is the worker's load as seen by every router replica: Load()
// plus the other replicas' requests from the last fresh scrape
// (docs/design.md §8.3). It equals Load() when scraping is off, when the
// worker reports no load, when the report is stale, and with one replica.
// Lock-free and allocation-free; it reads the clock only when the last
// report counted others' requests.
func (w *Worker) FleetLoad() int64 {
	l := w.inflight.Load()
	if p := w.report.Load(); p == nil || p.others == 0 {
		return l
	}
	if p := w.fresh(); p != nil {
		return l + p.others
	}
	return l
}

// LoadReport returns the last scrape of w's load and true, or false when
// there is no report younger than 3 × LoadScrapeInterval.
func (w *Worker) LoadReport() (LoadReport, bool) {
	p := w.fresh()
	if p == nil {
		return LoadReport{}, false
	}
	return LoadReport{Running: p.running, Waiting: p.waiting, KVCacheUsage: p.kv, Others: p.others, At: time.Unix(0, p.at),
		KVCapacityTokens: w.kvCapacity.Load()}, true
}

// KVCapacityTokens is the KV cache capacity, in tokens, that the worker's
// engine states on its metrics endpoint (docs/design.md §4, "The tree's
// budget"): vLLM's vllm:cache_config_info num_gpu_blocks × block_size
// (summed over its engines, or the rank's own engine for "url@rank" when
// labelled engine="rank", else the URL's total split evenly between the
// ranks), else SGLang's sglang:max_total_num_tokens. 0 when the engine
// states none or no scrape has parsed yet. A stated capacity is kept
// until a later exposition parses: a failed scrape does not change it.
// Lock-free.
func (w *Worker) KVCapacityTokens() int64 { return w.kvCapacity.Load() }

// Backlog estimates the requests waiting in the worker's own queue now
// (docs/design.md §9): the last fresh report's running and waiting
// requests, moved by this replica's requests to the worker sent or
// answered since, less the worker's capacity. Negative: that many more
// would run at once. ok false: no fresh report, or the worker has not
// shown its capacity yet.
//
// The capacity is learned from the reports as a congestion window: what
// the worker ran when a report shows requests waiting, and one more at
// each report that shows it running that many with none waiting. A router
// that keeps the worker's own queue empty thus still finds out when the
// worker runs more at once (its KV cache freed, a shorter mix), one
// request per report. Lock-free.
func (w *Worker) Backlog() (n int64, ok bool) {
	c := w.capacity.Load()
	if c == 0 {
		return 0, false
	}
	p := w.fresh()
	if p == nil {
		return 0, false
	}
	return p.running + p.waiting + w.inflight.Load() - p.mine - c, true
}

// Full reports whether a request sent to the worker now would wait for a
// sequence slot, by what the worker last showed: its requests, counted as
// Backlog counts them, reach what it ran at the last report that showed
// requests waiting, or more where a later report ran more with none
// waiting (a queue seen while its KV cache was short does not make it
// full at that count for good). Unlike Backlog it does not count the one
// request more the congestion window probes with. False when unknown.
// Lock-free.
func (w *Worker) Full() bool {
	c := w.shown.Load()
	if c == 0 {
		return false
	}
	p := w.fresh()
	return p != nil && p.running+p.waiting+w.inflight.Load()-p.mine >= c
}

// ReportedRunning is the worker's vllm:num_requests_running from a fresh
// scrape, or -1 when there is none.
func (w *Worker) ReportedRunning() int64 {
	if p := w.fresh(); p != nil {
		return p.running
	}
	return -1
}

// ReportedWaiting is the worker's vllm:num_requests_waiting from a fresh
// scrape, or -1 when there is none.
func (w *Worker) ReportedWaiting() int64 {
	if p := w.fresh(); p != nil {
		return p.waiting
	}
	return -1
}

// KVCacheUsage is the worker's vllm:kv_cache_usage_perc (0..1) from a fresh
// scrape, or -1 when there is none.
func (w *Worker) KVCacheUsage() float64 {
	if p := w.fresh(); p != nil {
		return p.kv
	}
	return -1
}

// LoadScrapeFailures counts the scrapes of w's load that failed: no answer,
// a non-2xx status, a body over 1 MiB, or no usable vLLM series.
func (w *Worker) LoadScrapeFailures() uint64 { return w.scrapeFails.Load() }

// RunLoadScrapes scrapes every base URL's load every LoadScrapeInterval
// until ctx ends, then waits for the scrapes in flight; it returns at once
// when the interval is 0. Scrapes run asynchronously, at most one per base
// URL at a time, each bounded by min(HealthTimeout, 2 × interval). A failed
// scrape never changes a worker's health. Run it once per registry.
func (r *Registry) RunLoadScrapes(ctx context.Context) {
	iv := r.cfg.LoadScrapeInterval
	if iv <= 0 {
		return
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		bases, byBase := groupByBase(r.Workers())
		for _, b := range bases {
			ws := byBase[b]
			up := ws[0].up
			if up == nil || !up.scraping.CompareAndSwap(false, true) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer up.scraping.Store(false)
				r.scrapeBase(ctx, b, ws)
			}()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ScrapeLoadOnce scrapes every base URL's load once and returns when all are
// done, regardless of scrapes in flight from RunLoadScrapes.
func (r *Registry) ScrapeLoadOnce(ctx context.Context) {
	bases, byBase := groupByBase(r.Workers())
	var wg sync.WaitGroup
	for _, b := range bases {
		wg.Add(1)
		go func(base string, ws []*Worker) {
			defer wg.Done()
			r.scrapeBase(ctx, base, ws)
		}(b, byBase[b])
	}
	wg.Wait()
}

// errNoLoadSeries: the exposition parsed but holds neither running nor
// waiting counts (not a vLLM worker).
var errNoLoadSeries = errors.New("no vllm:num_requests_running or vllm:num_requests_waiting series")

// scrapeBase scrapes base once and stores each of its workers' share.
func (r *Registry) scrapeBase(ctx context.Context, base string, ws []*Worker) {
	before := make([]int64, len(ws))
	maxRank := -1
	for i, w := range ws {
		before[i] = w.inflight.Load()
		maxRank = max(maxRank, w.rank)
	}
	ld := vllmLoad{byEngine: make([]engineLoad, min(maxRank+1, maxEngines))}
	definitive, err := r.fetchLoad(ctx, base, &ld)
	if err == nil || errors.Is(err, errNoLoadSeries) {
		storeCapacity(ws, &ld) // an engine that reports no load may still state its capacity
	}
	if err != nil {
		if ctx.Err() != nil {
			return // shutting down: not the worker's failure
		}
		for _, w := range ws {
			r.scrapeFailed(w, err, definitive)
		}
		return
	}
	at := r.nowNano()
	// The base URL's share: workers that read the whole exposition.
	var whole []int
	var local int64
	for i, w := range ws {
		l0 := max(before[i], w.inflight.Load())
		if w.rank < 0 || !ld.engines {
			whole = append(whole, i)
			local += l0
			continue
		}
		var e engineLoad
		if w.rank < len(ld.byEngine) {
			e = ld.byEngine[w.rank]
		}
		if e.seen&(seenRunning|seenWaiting) == 0 {
			r.scrapeFailed(w, fmt.Errorf("no series labelled engine=%q", w.rankS), true)
			continue
		}
		r.scrapeOK(w, e, max(0, count(e.running)+count(e.waiting)-l0), at)
	}
	if len(whole) == 0 {
		return
	}
	others := max(0, count(ld.total.running)+count(ld.total.waiting)-local)
	n := int64(len(whole))
	for k, i := range whole {
		share := others / n
		if int64(k) < others%n {
			share++
		}
		r.scrapeOK(ws[i], ld.total, share, at)
	}
}

func count(v float64) int64 { return int64(math.Round(v)) }

// storeCapacity sets each worker's stated KV capacity from one parsed
// exposition (see Worker.KVCapacityTokens).
func storeCapacity(ws []*Worker, ld *vllmLoad) {
	ranks := int64(0)
	for _, w := range ws {
		if w.rank >= 0 {
			ranks++
		}
	}
	total := ld.total.capacityTokens()
	for _, w := range ws {
		c := total
		if w.rank >= 0 {
			if w.rank < len(ld.byEngine) && ld.byEngine[w.rank].seen&(seenCapVLLM|seenCapSGL) != 0 {
				c = ld.byEngine[w.rank].capacityTokens()
			} else {
				c = total / ranks
			}
		}
		w.kvCapacity.Store(c)
		// The failed KV loads: the rank's own engine's when labelled, else
		// the URL's on its first worker only, so that a sum counts each once.
		f := ld.total.kvFails
		switch {
		case w.rank >= 0 && w.rank < len(ld.byEngine) && ld.byEngine[w.rank].seen&seenKVFails != 0:
			f = ld.byEngine[w.rank].kvFails
		case w.rank > 0:
			f = 0
		}
		w.kvLoadFails.Store(uint64(f))
	}
}

// KVLoadFailures is the worker's vllm:nixl_num_failed_transfers_total at
// its last parsed scrape: in a disaggregated fleet, the decode legs whose
// KV blocks it could not pull and recomputed (docs/design.md §9). 0 when
// it reports none.
func (w *Worker) KVLoadFailures() uint64 { return w.kvLoadFails.Load() }

// fetchLoad GETs base's LoadMetricsEndpoint and parses it into ld without
// copying the body. definitive is true when the worker answered but the
// answer is unusable (status, size, content), false for transport errors.
func (r *Registry) fetchLoad(ctx context.Context, base string, ld *vllmLoad) (definitive bool, err error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(base + r.cfg.LoadMetricsEndpoint)
	req.Header.SetMethod(fasthttp.MethodGet)
	if k := *r.apiKey.Load(); k != "" {
		req.Header.Set("Authorization", "Bearer "+k)
	}
	timeout := r.cfg.HealthTimeout
	if iv := r.cfg.LoadScrapeInterval; iv > 0 {
		timeout = min(timeout, 2*iv)
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	if err := r.probeHC.DoTimeout(req, resp, timeout); err != nil {
		return errors.Is(err, fasthttp.ErrBodyTooLarge), err
	}
	if c := resp.StatusCode(); c < 200 || c > 299 {
		return true, fmt.Errorf("status %d", c)
	}
	if err := parseVLLMLoad(resp.Body(), ld); err != nil {
		return true, err
	}
	if ld.total.seen&(seenRunning|seenWaiting) == 0 {
		return true, errNoLoadSeries
	}
	return false, nil
}

func (r *Registry) scrapeOK(w *Worker, e engineLoad, others int64, at int64) {
	kv := -1.0
	if e.seen&seenKV != 0 {
		kv = e.kv
	}
	running, waiting := count(e.running), count(e.waiting)
	switch c := w.capacity.Load(); {
	case waiting > 0:
		w.capacity.Store(running) // others waited: this is as many as it runs at once now
		w.shown.Store(running)
	case c > 0 && running >= c:
		w.capacity.Store(running + 1) // full at the capacity it showed, none waiting: it may run one more
	}
	if s := w.shown.Load(); waiting == 0 && s > 0 && running > s {
		w.shown.Store(running) // it runs more than it showed with a queue: full no sooner
	}
	w.report.Store(&loadReport{running: running, waiting: waiting, kv: kv, others: others, mine: w.inflight.Load(), at: at})
	if w.scrapeFailing.CompareAndSwap(true, false) {
		r.cfg.Logger.Info("worker load scrape works again", "worker", w.url)
	}
}

// scrapeFailed counts a failed scrape and logs the first of a run of them.
// An unusable answer drops the report at once; a transport error keeps it
// until it goes stale (one timeout should not hide the others' load).
func (r *Registry) scrapeFailed(w *Worker, err error, definitive bool) {
	w.scrapeFails.Add(1)
	if definitive {
		w.report.Store(nil)
	}
	if w.scrapeFailing.CompareAndSwap(false, true) {
		r.cfg.Logger.Warn("worker load scrape failed; routing on this replica's load alone until it works",
			"worker", w.url, "endpoint", r.cfg.LoadMetricsEndpoint, "err", err)
	}
}
