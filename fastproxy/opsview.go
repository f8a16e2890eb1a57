package fastproxy

import (
	"bytes"
	"html/template"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/admission"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
	"github.com/warmroute/warmroute/saar"
)

// Bounds of the operator's page: whatever the fleet, it renders at most
// these many rows per table (and says how many more there are).
const (
	opsMaxWorkers  = 200 // worker rows
	opsMaxSessions = 50  // most recently used sessions
	opsMaxRecords  = 20  // latest model-step records
	opsMaxModels   = 6   // model names shown per worker
	opsMaxText     = 120 // bytes shown of any worker- or client-supplied string
	opsRefresh     = 5   // default seconds between reloads (?refresh=0 turns it off)
	opsMaxRefresh  = 3600
	opsCSP         = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

// opsView serves the operator's page (GET / and GET /ui on the metrics
// listener, an admin surface: docs/design.md §8.1, §8.4): workers, the
// decision mix, live sessions, the latest model-step records. Rendered on
// the server with html/template (every worker- or client-supplied string
// escaped) and served with a policy that forbids scripts; the page has none.
type opsView struct {
	s       *Server
	tmpl    *template.Template
	started time.Time // when the listener's handler was built: the router's start in cmd/warmroute
	version string
}

func (s *Server) newOpsView() *opsView {
	return &opsView{
		s:       s,
		tmpl:    template.Must(template.New("ops").Funcs(template.FuncMap{"human": human, "bytes": humanBytes}).Parse(opsTemplate)),
		started: time.Now(),
		version: buildVersion(),
	}
}

// buildVersion is the module version and VCS revision the binary was built
// from, as far as the build recorded them.
func buildVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, dirty string
	for _, st := range bi.Settings {
		switch st.Key {
		case "vcs.revision":
			rev = st.Value[:min(len(st.Value), 12)]
		case "vcs.modified":
			if st.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if v == "" {
		v = "(devel)"
	}
	if rev != "" {
		v += " " + rev + dirty
	}
	return v
}

// opsPage is the data of one rendering.
type opsPage struct {
	Version, Policy, Uptime, Now string
	Refresh                      int
	Shared                       string // "" without a shared store, else "up" or "down"
	Healthy, Total               int
	InFlight                     int64
	Waiting                      int64             // requests in the router's queue
	Queue                        []admission.Depth // what waits, by model and priority
	Logical                      []string

	// Disaggregated prefill and decode (docs/design.md §9): set in PD mode.
	PD                 bool
	DecodePolicy       string
	KVHold             string
	PrefillOK, Prefill int // healthy and registered prefill workers
	DecodeOK, Decode   int // healthy and registered decode workers

	// Streams its workers cut, and what became of them (relay.go, resume.go).
	Cut, Resumed, NotContinuable, ResumeFailed uint64

	Workers     []opsWorker
	WorkersMore int

	Decisions      []opsDecision
	DecisionsTotal uint64

	Memory       bool // the policy keeps a routing memory (route.Summarizer)
	Sessions     int
	Recent       []opsSession
	SessionsMore int

	ModelStep bool
	Stats     saar.Stats
	Records   []opsRecord
}

type opsWorker struct {
	URL, Role, Models, Breaker string
	Healthy, HealthCheck       bool
	InFlight                   int64
	Reported                   bool // a fresh load scrape (docs/design.md §8.3)
	Running, Waiting           int64
	KV                         string
	KVCapacity                 int64 // tokens the engine states its KV cache holds; 0: it states none
	Sessions                   int
	TreeChars, TreeBytes       int
	TreeBudget                 int // the worker's part of the tree, at most (from KVCapacity); 0: none
	Predicted, Served          uint64
	HitRate                    string // served cached tokens ÷ prompt tokens (answers with cached_tokens)
	ServedRatio                string // served ÷ predicted cached tokens
}

type opsDecision struct {
	Label string
	Count uint64
	Pct   float64
}

type opsSession struct {
	Session, Model, Worker, Idle string
}

type opsRecord struct {
	Time, ID, Session, Logical, Model, Phase, Action, Reason, Pinned string
}

// serve answers GET or HEAD with the page; the caller has admitted it.
func (v *opsView) serve(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "GET, HEAD")
		return
	}
	refresh := opsRefresh
	if r := ctx.QueryArgs().Peek("refresh"); len(r) > 0 {
		if n, err := strconv.Atoi(string(r)); err == nil {
			refresh = min(max(n, 0), opsMaxRefresh)
		}
	}
	var buf bytes.Buffer
	if err := v.tmpl.Execute(&buf, v.page(refresh)); err != nil {
		v.s.cfg.Logger.Error("operator page", "err", err)
		writeError(ctx, fasthttp.StatusInternalServerError, "internal_error", "render_failed", "cannot render the page")
		return
	}
	h := &ctx.Response.Header
	h.Set(fasthttp.HeaderCacheControl, "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", opsCSP)
	h.Set("Referrer-Policy", "no-referrer")
	ctx.SetContentType("text/html; charset=utf-8")
	ctx.SetBody(buf.Bytes())
}

// page gathers the data of one rendering; every list is bounded.
func (v *opsView) page(refresh int) *opsPage {
	s := v.s
	now := time.Now()
	p := &opsPage{
		Version: v.version, Policy: s.cfg.Policy.Name(), Refresh: refresh,
		Uptime:   now.Sub(v.started).Truncate(time.Second).String(),
		Now:      now.UTC().Format("2006-01-02 15:04:05 UTC"),
		InFlight: s.admit.ctl.InFlight(),
		Waiting:  s.admit.ctl.Waiting(),

		Cut: s.metrics.streamsCut.Get(), Resumed: s.metrics.resumes[resumeDone].Get(),
		NotContinuable: s.metrics.resumes[resumeNot].Get(), ResumeFailed: s.metrics.resumes[resumeFailed].Get(),
	}
	for i, d := range s.admit.ctl.Depths() {
		if i == opsMaxWorkers {
			break
		}
		d.Model = clipText(d.Model)
		p.Queue = append(p.Queue, d)
	}
	if s.cfg.Shared != nil {
		p.Shared = "down"
		if s.cfg.Shared.Up() {
			p.Shared = "up"
		}
	}
	var mem route.MemoryView
	if sum, ok := s.cfg.Policy.(route.Summarizer); ok {
		p.Memory = true
		mem = sum.View(opsMaxSessions)
		p.Sessions = mem.Sessions
	}
	// In PD mode a decode worker's memory is the decode policy's.
	var decodeMem route.MemoryView
	if pd := s.cfg.PD; pd != nil {
		p.PD, p.DecodePolicy, p.KVHold = true, pd.DecodePolicy.Name(), pd.KVHold.String()
		if sum, ok := pd.DecodePolicy.(route.Summarizer); ok {
			decodeMem = sum.View(0)
		}
	}
	workers := s.cfg.Registry.Workers()
	p.Total = len(workers)
	for i, w := range workers {
		if w.Healthy() {
			p.Healthy++
		}
		switch w.Role() {
		case loadview.Prefill:
			p.Prefill++
			if w.Healthy() {
				p.PrefillOK++
			}
		case loadview.Decode:
			p.Decode++
			if w.Healthy() {
				p.DecodeOK++
			}
		}
		if i >= opsMaxWorkers {
			continue
		}
		wm := mem
		if w.Role() == loadview.Decode && p.PD {
			wm = decodeMem
		}
		row := opsWorker{URL: clipText(w.URL()), Role: w.Role().String(), Models: modelList(w.Models()), Breaker: w.BreakerState().String(),
			Healthy: w.Healthy(), HealthCheck: w.HealthCheckOK(), InFlight: w.Load(), KV: "n/a", KVCapacity: w.KVCapacityTokens()}
		if lr, ok := w.LoadReport(); ok {
			row.Reported, row.Running, row.Waiting = true, lr.Running, lr.Waiting
			if lr.KVCacheUsage >= 0 {
				row.KV = strconv.FormatFloat(lr.KVCacheUsage*100, 'f', 1, 64) + "%"
			}
		}
		if m, ok := wm.Workers[w.ID()]; ok {
			row.Sessions, row.TreeChars, row.TreeBytes, row.TreeBudget = m.Sessions, m.TreeChars, m.TreeBytes, m.TreeBudgetChars
			row.Predicted, row.Served = m.PredictedTokens, m.ServedTokens
		}
		row.HitRate, row.ServedRatio = "n/a", "n/a"
		if m := wm.Workers[w.ID()]; m.PromptTokens > 0 {
			row.HitRate = strconv.FormatFloat(float64(m.ServedTokens)*100/float64(m.PromptTokens), 'f', 1, 64) + "%"
		}
		if row.Predicted > 0 {
			row.ServedRatio = strconv.FormatFloat(float64(row.Served)*100/float64(row.Predicted), 'f', 0, 64) + "%"
		}
		p.Workers = append(p.Workers, row)
	}
	p.WorkersMore = max(len(workers)-opsMaxWorkers, 0)

	for label, c := range s.metrics.decisions {
		if n := c.Get(); n > 0 {
			p.Decisions = append(p.Decisions, opsDecision{Label: label, Count: n})
			p.DecisionsTotal += n
		}
	}
	sort.Slice(p.Decisions, func(i, j int) bool {
		a, b := p.Decisions[i], p.Decisions[j]
		return a.Count > b.Count || a.Count == b.Count && a.Label < b.Label
	})
	for i := range p.Decisions {
		p.Decisions[i].Pct = float64(p.Decisions[i].Count) * 100 / float64(p.DecisionsTotal)
	}

	for _, r := range mem.Recent {
		name := "gone#" + strconv.FormatUint(uint64(r.Worker), 10)
		if w := s.cfg.Registry.ByID(r.Worker); w != nil {
			name = w.URL()
		}
		p.Recent = append(p.Recent, opsSession{Session: clipText(r.Session), Model: clipText(r.Model),
			Worker: clipText(name), Idle: r.Idle.Truncate(time.Second).String()})
	}
	p.SessionsMore = max(p.Sessions-len(p.Recent), 0)

	if m := s.cfg.Models; m != nil {
		p.ModelStep, p.Stats, p.Logical = true, m.Stats(), m.LogicalModels()
		for i := range p.Logical {
			p.Logical[i] = clipText(p.Logical[i])
		}
		recs := m.Records("", opsMaxRecords)
		for i := len(recs) - 1; i >= 0; i-- { // newest first
			r := &recs[i]
			p.Records = append(p.Records, opsRecord{
				Time: time.Unix(0, r.Time).UTC().Format("15:04:05.000"), ID: clipText(r.ID), Session: clipText(r.Session),
				Logical: clipText(r.Inputs.Logical), Model: clipText(r.Outcome.Model), Phase: r.Outcome.Phase,
				Action: r.Outcome.Action, Reason: r.Outcome.Reason, Pinned: clipText(r.Outcome.PinnedWorker)})
		}
	}
	return p
}

// clipText is s as valid UTF-8, cut to opsMaxText bytes with an ellipsis.
func clipText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= opsMaxText {
		return s
	}
	n := opsMaxText
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// modelList is a worker's models for display: "any" when unknown, at most
// opsMaxModels names.
func modelList(ms []string) string {
	if ms == nil {
		return "any"
	}
	var b strings.Builder
	for i, m := range ms {
		if i == opsMaxModels {
			b.WriteString(" +" + strconv.Itoa(len(ms)-i) + " more")
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(clipText(m))
	}
	return b.String()
}

// human formats a count with k, M, G suffixes.
func human(v any) string {
	var n float64
	switch x := v.(type) {
	case int:
		n = float64(x)
	case int64:
		n = float64(x)
	case uint64:
		n = float64(x)
	}
	for _, u := range []struct {
		f float64
		s string
	}{{1e9, "G"}, {1e6, "M"}, {1e3, "k"}} {
		if n >= u.f {
			return strconv.FormatFloat(n/u.f, 'f', 1, 64) + u.s
		}
	}
	return strconv.FormatFloat(n, 'f', 0, 64)
}

// humanBytes formats a byte count in KiB, MiB, GiB.
func humanBytes(n int) string {
	for _, u := range []struct {
		f float64
		s string
	}{{1 << 30, " GiB"}, {1 << 20, " MiB"}, {1 << 10, " KiB"}} {
		if float64(n) >= u.f {
			return strconv.FormatFloat(float64(n)/u.f, 'f', 1, 64) + u.s
		}
	}
	return strconv.Itoa(n) + " B"
}

// opsTemplate is the page: no script, inline style only (the response's
// Content-Security-Policy forbids anything else).
const opsTemplate = `<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
{{- if .Refresh}}<meta http-equiv="refresh" content="{{.Refresh}}">{{end}}
<title>warmroute · {{.Policy}}</title>
<style>
body{font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:14px 20px 24px;color:#1d2330;background:#f5f6f8}
h1{font-size:19px;margin:0 0 6px}h1 span{font-weight:400;font-size:13px;color:#6b7385}
h2{font-size:13px;margin:20px 0 6px;color:#34405a;text-transform:uppercase;letter-spacing:.05em}
h2 span{text-transform:none;letter-spacing:0;font-weight:400;color:#6b7385}
.hdr{display:flex;flex-wrap:wrap;gap:4px 22px;padding:8px 12px;background:#fff;border:1px solid #d8dce3;border-radius:6px}
.hdr span{color:#56607a}.hdr b{color:#1d2330}
table{border-collapse:collapse;background:#fff;border:1px solid #d8dce3;width:100%}
th,td{padding:4px 8px;border-bottom:1px solid #eceef2;text-align:left;vertical-align:top}
th{background:#eef1f5;font-weight:600;color:#34405a;white-space:nowrap}
.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.m{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
.ok{color:#17803d;font-weight:600}.bad{color:#c0262d;font-weight:600}.warn{color:#b76e00;font-weight:600}
.dim{color:#8a91a1}.more{color:#6b7385;font-style:italic;padding:4px 2px}
.bar{display:inline-block;width:220px;height:9px;background:#e3e7ee;border-radius:4px;overflow:hidden;vertical-align:middle}
.bar i{display:block;height:100%;background:#3b6fd8}
.cols{display:flex;gap:20px;flex-wrap:wrap}.cols>div{flex:1 1 420px;min-width:0}
footer{margin-top:18px;color:#6b7385}footer a{color:#3b6fd8}
</style></head>
<body>
<h1>warmroute <span>{{.Version}}</span></h1>
<div class="hdr">
{{- if .PD}}
<span>prefill/decode <b>disaggregated</b> (NIXL)</span>
<span>prefill policy <b>{{.Policy}}</b></span>
<span>decode policy <b>{{.DecodePolicy}}</b></span>
<span>KV hold <b>{{.KVHold}}</b></span>
<span>prefill <b class="{{if eq .PrefillOK .Prefill}}ok{{else if .PrefillOK}}warn{{else}}bad{{end}}">{{.PrefillOK}}/{{.Prefill}}</b> healthy</span>
<span>decode <b class="{{if eq .DecodeOK .Decode}}ok{{else if .DecodeOK}}warn{{else}}bad{{end}}">{{.DecodeOK}}/{{.Decode}}</b> healthy</span>
{{- else}}
<span>policy <b>{{.Policy}}</b></span>
{{- end}}
<span>up <b>{{.Uptime}}</b></span>
<span>workers <b class="{{if eq .Healthy .Total}}ok{{else if .Healthy}}warn{{else}}bad{{end}}">{{.Healthy}}/{{.Total}}</b> healthy</span>
<span>in flight <b>{{.InFlight}}</b></span>
<span>queued <b>{{.Waiting}}</b></span>
{{- if .Shared}}
<span>shared state (Redis) <b class="{{if eq .Shared "up"}}ok{{else}}bad{{end}}">{{.Shared}}</b></span>
{{- end}}
{{- if .Logical}}
<span>logical models <b>{{range $i, $m := .Logical}}{{if $i}}, {{end}}{{$m}}{{end}}</b></span>
{{- end}}
<span class="dim">{{.Now}}{{if .Refresh}} · reloads every {{.Refresh}} s{{end}}</span>
</div>

<h2>Workers <span>· running, waiting, KV cache and its stated capacity from each worker's /metrics (n/a: no fresh scrape); sessions, tree (and its budget from that capacity) and cached_tokens from the cache-aware policy</span></h2>
<table id="workers">
<tr><th>Worker</th><th>Role</th><th>Models</th><th>Health</th><th>Breaker</th><th class="n">In flight</th><th class="n">Running</th><th class="n">Waiting</th><th class="n">KV cache</th><th class="n">Sessions</th><th class="n">Tree chars</th><th class="n">Hit rate</th><th class="n">Cached tokens served</th></tr>
{{- range .Workers}}
<tr><td class="m">{{.URL}}</td><td>{{.Role}}</td><td class="m">{{.Models}}</td>
<td>{{if .Healthy}}<span class="ok">healthy</span>{{else if .HealthCheck}}<span class="warn">unroutable</span>{{else}}<span class="bad">down</span>{{end}}</td>
<td>{{if eq .Breaker "closed"}}closed{{else if eq .Breaker "open"}}<span class="bad">open</span>{{else}}<span class="warn">{{.Breaker}}</span>{{end}}</td>
<td class="n">{{.InFlight}}</td>
{{- if .Reported}}<td class="n">{{.Running}}</td><td class="n">{{.Waiting}}</td>{{else}}<td class="n dim">n/a</td><td class="n dim">n/a</td>{{end}}
<td class="n">{{.KV}}{{if .KVCapacity}} <span class="dim">of {{human .KVCapacity}} tokens</span>{{end}}</td><td class="n">{{.Sessions}}</td>
<td class="n">{{human .TreeChars}}{{if .TreeBudget}} <span class="dim">of {{human .TreeBudget}}</span>{{end}} <span class="dim">({{bytes .TreeBytes}})</span></td>
<td class="n">{{.HitRate}}</td><td class="n">{{human .Served}} <span class="dim">of {{human .Predicted}} predicted ({{.ServedRatio}})</span></td></tr>
{{- else}}
<tr><td colspan="13" class="dim">no workers registered</td></tr>
{{- end}}
</table>
{{- if .WorkersMore}}<div class="more">and {{.WorkersMore}} more workers (see /workers)</div>{{end}}

<h2>Queue <span>· requests waiting for a worker, by model and priority (lower first)</span></h2>
<table id="queue">
<tr><th>Model</th><th class="n">Priority</th><th class="n">Waiting</th></tr>
{{- range .Queue}}
<tr><td class="m">{{.Model}}</td><td class="n">{{.Priority}}</td><td class="n">{{.Waiting}}</td></tr>
{{- else}}
<tr><td colspan="3" class="dim">nothing waits</td></tr>
{{- end}}
</table>

<h2>Cut streams <span>· streams a worker cut after the first byte, and what the client got</span></h2>
<table id="streams">
<tr><th class="n">Cut</th><th class="n">Continued on another worker</th><th class="n">Not continuable (error event)</th><th class="n">No worker took the continuation</th></tr>
<tr><td class="n">{{.Cut}}</td><td class="n">{{.Resumed}}</td><td class="n">{{.NotContinuable}}</td><td class="n">{{.ResumeFailed}}</td></tr>
</table>

<div class="cols">
<div>
<h2>Decision mix <span>· {{.DecisionsTotal}} routed requests since start</span></h2>
<table id="decisions">
<tr><th>Decision</th><th class="n">Requests</th><th class="n">Share</th><th></th></tr>
{{- range .Decisions}}
<tr><td class="m">{{.Label}}</td><td class="n">{{.Count}}</td><td class="n">{{printf "%.1f" .Pct}}%</td><td><span class="bar"><i style="width:{{printf "%.1f" .Pct}}%"></i></span></td></tr>
{{- else}}
<tr><td colspan="4" class="dim">no routed requests yet</td></tr>
{{- end}}
</table>
</div>
<div>
<h2>Live sessions <span>· {{if .Memory}}{{.Sessions}} held{{if .Recent}}, {{len .Recent}} most recent shown{{end}}{{else}}kept only by --policy cache_aware{{end}}</span></h2>
<table id="sessions">
<tr><th>Session</th><th>Model</th><th>Worker</th><th class="n">Idle</th></tr>
{{- range .Recent}}
<tr><td class="m">{{.Session}}</td><td class="m">{{.Model}}</td><td class="m">{{.Worker}}</td><td class="n">{{.Idle}}</td></tr>
{{- else}}
<tr><td colspan="4" class="dim">no sessions</td></tr>
{{- end}}
</table>
{{- if .SessionsMore}}<div class="more">and {{.SessionsMore}} more (see /debug/sessions)</div>{{end}}
</div>
</div>
{{- if .ModelStep}}

<h2>Model step <span>· {{.Stats.Selections}} selections, {{.Stats.Switches}} switches, {{.Stats.HardLocks}} hard locks, {{.Stats.LockBreaks}} lock breaks, {{.Stats.WorkerFailovers}} worker failovers, continuity violations <b class="{{if .Stats.ContinuityViolations}}bad{{else}}ok{{end}}">{{.Stats.ContinuityViolations}}</b></span></h2>
<table id="records">
<tr><th>Time (UTC)</th><th>Replay id</th><th>Session</th><th>Logical → model</th><th>Phase</th><th>Action</th><th>Reason</th><th>Pinned worker</th></tr>
{{- range .Records}}
<tr><td class="m">{{.Time}}</td><td class="m">{{.ID}}</td><td class="m">{{.Session}}</td><td class="m">{{.Logical}} → {{.Model}}</td><td>{{.Phase}}</td><td>{{.Action}}</td><td class="m">{{.Reason}}</td><td class="m">{{.Pinned}}</td></tr>
{{- else}}
<tr><td colspan="8" class="dim">no model-step records yet</td></tr>
{{- end}}
</table>
<div class="more">the latest {{len .Records}} records, newest first (see /v1/router_replay)</div>
{{- end}}

<footer>JSON: <a href="/workers">/workers</a> · <a href="/debug/sessions">/debug/sessions</a> · <a href="/v1/router_replay?limit=100">/v1/router_replay</a> · <a href="/metrics">/metrics</a></footer>
</body></html>
`
