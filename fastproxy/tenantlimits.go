package fastproxy

import (
	"bytes"
	"context"
	"strconv"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/warmroute/warmroute/internal/bytesconv"
	"github.com/warmroute/warmroute/reqview"
	"github.com/warmroute/warmroute/sharedstate"
	"github.com/warmroute/warmroute/tenantlimit"
)

// Tenant limits (docs/design.md §8, "Tenant limits"): a client key's tenant may have
// requests and tokens per minute; its requests are counted at admission,
// its answers' tokens once they are done, in Redis when the replicas
// share it (--redis-url), else in the process.

// newTenantLimiter returns the limiter of the tenants' limits, counting in
// shared when set.
func newTenantLimiter(shared *sharedstate.Store, set *metrics.Set) *tenantlimit.Limiter {
	if shared != nil {
		return tenantlimit.New(tenantlimit.NewRedis(shared), set)
	}
	return tenantlimit.New(tenantlimit.NewLocal(), set)
}

// The headers OpenAI's API sends on every answer, which its clients read.
const (
	hdrLimitRequests     = "X-Ratelimit-Limit-Requests"
	hdrRemainingRequests = "X-Ratelimit-Remaining-Requests"
	hdrResetRequests     = "X-Ratelimit-Reset-Requests"
	hdrLimitTokens       = "X-Ratelimit-Limit-Tokens"
	hdrRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	hdrResetTokens       = "X-Ratelimit-Reset-Tokens"
)

// limitedClient serves the request of a tenant with limits: refused with
// 429 when the window's requests or tokens are spent, else served; its
// answer, whatever it is, carries the tenant's x-ratelimit-* headers. A
// buffered answer's tokens are charged here, a stream's by its relay when
// it ends (tenantMeter).
func (s *Server) limitedClient(ctx *fasthttp.RequestCtx, path string, ep endpoint, t *tenant, tr *reqTrace) {
	d := s.limits.Admit(context.Background(), t.name, t.limits)
	if !d.OK {
		tooManyForTenant(ctx, t, d)
		return
	}
	s.client(ctx, path, ep, t, tr)
	resp := &ctx.Response
	if t.limits.TPM > 0 && generates(ep) && !resp.IsBodyStream() && resp.StatusCode() == fasthttp.StatusOK {
		if c := s.limits.Charge(context.Background(), t.name, answerTokens(len(ctx.Request.Body()), resp.Body())); c.Known {
			c.Requests = max(c.Requests, d.Requests)
			d = c
		}
	}
	setLimitHeaders(&resp.Header, t.limits, d)
}

// generates reports whether ep's answers spend tokens: the inference
// endpoints and the workers' own (/generate and the like); not the model
// list or a stored response read again.
func generates(ep endpoint) bool {
	switch ep {
	case epModels, epResponseByID:
		return false
	}
	return true
}

// tooManyForTenant answers 429 for a tenant over a limit, with
// Retry-After: the seconds until its window ends.
func tooManyForTenant(ctx *fasthttp.RequestCtx, t *tenant, d tenantlimit.Decision) {
	secs := int64((d.Reset + time.Second - 1) / time.Second)
	limit, per := t.limits.RPM, "requests"
	if d.Over == "tokens" {
		limit, per = t.limits.TPM, "tokens"
	}
	writeError(ctx, fasthttp.StatusTooManyRequests, d.Over, "rate_limit_exceeded",
		"rate limit reached for this API key: "+strconv.FormatInt(limit, 10)+" "+per+
			" per minute; retry in "+strconv.FormatInt(secs, 10)+"s")
	ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, strconv.FormatInt(max(secs, 1), 10))
	setLimitHeaders(&ctx.Response.Header, t.limits, d)
}

// setLimitHeaders sets OpenAI's x-ratelimit-* headers of each limit the
// tenant has: the limit, what is left of it in the window, and the time
// until the window ends ("0s" while nothing is spent), in Go's duration
// format as OpenAI writes it ("12ms", "6m0s"). When the store failed
// (fail open), only the limits are known.
func setLimitHeaders(h *fasthttp.ResponseHeader, lim tenantlimit.Limits, d tenantlimit.Decision) {
	var buf [24]byte
	set := func(limit, remaining, reset string, n, used int64) {
		h.SetCanonical(bytesconv.S2B(limit), strconv.AppendInt(buf[:0], n, 10))
		if !d.Known {
			return
		}
		h.SetCanonical(bytesconv.S2B(remaining), strconv.AppendInt(buf[:0], max(n-used, 0), 10))
		r := time.Duration(0)
		if used > 0 {
			r = d.Reset
		}
		h.SetCanonical(bytesconv.S2B(reset), appendReset(buf[:0], r))
	}
	if lim.RPM > 0 {
		set(hdrLimitRequests, hdrRemainingRequests, hdrResetRequests, lim.RPM, d.Requests)
	}
	if lim.TPM > 0 {
		set(hdrLimitTokens, hdrRemainingTokens, hdrResetTokens, lim.TPM, d.Tokens)
	}
}

// appendReset appends d, rounded to the millisecond, as
// time.Duration.String writes it ("0s", "12ms", "23.456s", "1m0s") for
// the durations of a window (at most tenantlimit.Period), without
// allocating.
func appendReset(dst []byte, d time.Duration) []byte {
	ms := d.Round(time.Millisecond).Milliseconds()
	switch {
	case ms <= 0:
		return append(dst, "0s"...)
	case ms < 1000:
		return append(strconv.AppendInt(dst, ms, 10), "ms"...)
	case ms >= 60_000:
		return append(dst, time.Duration(ms*int64(time.Millisecond)).String()...)
	}
	dst = strconv.AppendInt(dst, ms/1000, 10)
	if f := ms % 1000; f != 0 {
		frac := [4]byte{'.', byte('0' + f/100), byte('0' + f/10%10), byte('0' + f%10)}
		n := 4
		for frac[n-1] == '0' {
			n--
		}
		dst = append(dst, frac[:n]...)
	}
	return append(dst, 's')
}

// bytesPerToken: where an answer reports no usage, its tokens are its
// bytes over this (OpenAI's rule of thumb for English text).
const bytesPerToken = 4

// answerTokens is what a buffered answer costs: its usage's prompt and
// completion tokens, else the request's and the answer's bytes over
// bytesPerToken.
func answerTokens(reqBytes int, body []byte) int64 {
	var l reqview.Learned
	if reqview.ScanUsage(&l, body) == nil && l.HasUsage {
		return int64(l.PromptTokens) + int64(l.CompletionTokens)
	}
	return int64((reqBytes + len(body) + bytesPerToken - 1) / bytesPerToken)
}

// tenantMeter counts the tokens of a stream its client was delivered, for
// a tenant with a token limit: each SSE "data:" event that delivers text
// (a chat or completions delta, an Anthropic text_delta, a Responses
// output_text delta) counts one token (an engine's chunk carries one, so
// the count errs low where one carries more), unless the stream reports
// usage (a chunk's, message_start's and message_delta's, response.completed's),
// whose prompt and completion tokens then count (the completion at least
// the events counted). Without a prompt count the request's bytes over
// bytesPerToken stand for it. It sees the bytes the client reads, after a
// continuation's rewrite (docs/design.md §8.2): one answer, one usage.
type tenantMeter struct {
	lim      *tenantlimit.Limiter
	tenant   string
	reqBytes int
	line     []byte // a partial line
	drop     bool   // the partial line went over maxEvent: skip to its end
	events   int64
	usage    reqview.Learned
	ev       reqview.StreamEvent
}

func newTenantMeter(lim *tenantlimit.Limiter, t *tenant, reqBytes int) *tenantMeter {
	return &tenantMeter{lim: lim, tenant: t.name, reqBytes: reqBytes}
}

// write follows p, the next bytes the client reads.
func (m *tenantMeter) write(p []byte) {
	for len(p) > 0 {
		nl := bytes.IndexByte(p, '\n')
		if nl < 0 {
			if !m.drop {
				if len(m.line)+len(p) > maxEvent {
					m.line, m.drop = m.line[:0], true
				} else {
					m.line = append(m.line, p...)
				}
			}
			return
		}
		line := p[:nl]
		p = p[nl+1:]
		if m.drop {
			m.drop = false
			continue
		}
		if len(m.line) > 0 {
			if len(m.line)+len(line) > maxEvent {
				m.line = m.line[:0]
				continue
			}
			line = append(m.line, line...)
			m.line = line
		}
		m.learn(line)
		m.line = m.line[:0]
	}
}

// learn counts one whole line.
func (m *tenantMeter) learn(line []byte) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	data, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	data = bytes.TrimLeft(data, " ")
	if len(data) == 0 || data[0] != '{' {
		return // [DONE]
	}
	if t, ok := reqview.TokenText(data); ok {
		if t.End > t.Start {
			m.events++
		}
		return
	}
	if reqview.ScanStreamEvent(&m.ev, data) {
		typ := m.ev.Type
		if m.ev.Text.End > m.ev.Text.Start || string(data[typ.Start:typ.End]) == "response.output_text.delta" {
			m.events++
		}
	}
	if bytes.Contains(data, []byte(`"usage"`)) {
		_ = reqview.ScanUsage(&m.usage, data) // a later usage keeps what it omits
	}
}

// tokens is what the stream cost.
func (m *tenantMeter) tokens() int64 {
	prompt, completion := int64(-1), int64(0)
	if m.usage.HasUsage {
		prompt, completion = int64(m.usage.PromptTokens), int64(m.usage.CompletionTokens)
	}
	if prompt <= 0 {
		prompt = int64((m.reqBytes + bytesPerToken - 1) / bytesPerToken)
	}
	return prompt + max(completion, m.events)
}

// done charges the stream's tokens.
func (m *tenantMeter) done() {
	m.lim.Charge(context.Background(), m.tenant, m.tokens())
}
