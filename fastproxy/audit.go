package fastproxy

import (
	"io"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/bytedance/sonic"
	"github.com/valyala/fasthttp"
)

// auditLog writes one JSON line per admin call to Config.Audit, apart from
// the inference log (docs/design.md §8, "Reload and audit"). A line is one
// Write, under mu, so lines of concurrent calls never interleave.
type auditLog struct {
	mu sync.Mutex
	w  io.Writer // nil: no audit
}

// auditLine is the audit record of one admin call. Who is the admin key's
// name ("loopback" on a loopback metrics listener; "" for a call refused
// before it named one); Worker and Model are the call's target, read from
// its query (?url=, ?model=), the worker URL of DELETE /workers/{url} and
// its JSON body (url, model, lora_name), only for admitted calls.
type auditLine struct {
	Time      string `json:"time"`
	Who       string `json:"who"`
	Method    string `json:"method"`
	Path      string `json:"path"`
	Worker    string `json:"worker,omitempty"`
	Model     string `json:"model,omitempty"`
	Status    int    `json:"status"`
	RequestID string `json:"request_id"`
	Remote    string `json:"remote"`
}

// maxAuditField bounds each client-given string of a line; maxAuditBody the
// body read for a target.
const (
	maxAuditField = 512
	maxAuditBody  = 64 << 10
)

// record writes ctx's call, answered, to the audit log. who is "" when the
// call was refused (401, or 404 without admin keys): its target is not read.
func (a *auditLog) record(ctx *fasthttp.RequestCtx, who, path string, rid []byte) {
	if a.w == nil {
		return
	}
	l := auditLine{
		Time:      time.Now().UTC().Format(time.RFC3339Nano),
		Who:       who,
		Method:    clip(string(ctx.Method()), 16),
		Path:      clip(path, maxAuditField),
		Status:    ctx.Response.StatusCode(),
		RequestID: clip(string(rid), maxAuditField),
		Remote:    ctx.RemoteIP().String(),
	}
	if who != "" {
		l.Worker, l.Model = auditTarget(ctx, path)
	}
	b, err := sonic.Marshal(&l)
	if err != nil {
		return
	}
	b = append(b, '\n')
	a.mu.Lock()
	_, _ = a.w.Write(b)
	a.mu.Unlock()
}

// auditTarget reads the worker and the model an admin call names.
func auditTarget(ctx *fasthttp.RequestCtx, path string) (worker, model string) {
	q := ctx.QueryArgs()
	worker, model = string(q.Peek("url")), string(q.Peek("model"))
	if strings.HasPrefix(path, "/workers/") {
		orig := string(ctx.Request.URI().PathOriginal())
		if raw, err := url.PathUnescape(orig[strings.Index(orig, "/workers/")+len("/workers/"):]); err == nil {
			worker = raw
		}
	}
	if body := ctx.PostBody(); len(body) > 0 && len(body) <= maxAuditBody {
		var v struct {
			URL      string `json:"url"`
			Model    string `json:"model"`
			LoraName string `json:"lora_name"`
		}
		if sonic.Unmarshal(body, &v) == nil {
			worker = firstOf(worker, v.URL)
			model = firstOf(model, v.LoraName, v.Model)
		}
	}
	return clip(worker, maxAuditField), clip(model, maxAuditField)
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// serveAdmin admits an admin call under access, serves it with serve when
// admitted, and writes its audit line.
func (s *Server) serveAdmin(ctx *fasthttp.RequestCtx, access adminAccess, path string, rid []byte, serve func()) {
	who, ok := s.admitAdmin(ctx, access)
	if ok {
		serve()
	}
	s.audit.record(ctx, who, path, rid)
}
