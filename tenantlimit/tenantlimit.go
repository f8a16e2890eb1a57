// Package tenantlimit meters tenants — the names of the router's client
// keys — by requests and tokens per minute (docs/design.md §8, "Tenant limits"). A
// tenant's use is counted in fixed one-minute windows aligned to the
// clock's minutes: a request is counted, or refused, at admission; an
// answer's tokens are charged once it is done, so a tenant may overshoot
// its token limit by the answers it had in flight when it was reached. The counts live in a
// Store: in the process (Local), or in Redis, shared by the router's
// replicas (Redis). A store that fails admits (fails open) and is counted.
package tenantlimit

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// Period is the length of a window.
const Period = time.Minute

// Limits are a tenant's limits per Period; 0: none.
type Limits struct {
	RPM int64 // requests per minute
	TPM int64 // tokens per minute: prompt and completion
}

// On reports whether any limit is set.
func (l Limits) On() bool { return l.RPM > 0 || l.TPM > 0 }

// Window is a tenant's use of the window it was read in.
type Window struct {
	Requests int64         // requests counted, this one included when admitted
	Tokens   int64         // tokens charged
	Reset    time.Duration // until the window ends and the counts start again from 0
}

// Store keeps the counts of the tenants' windows. Safe for concurrent use.
type Store interface {
	// Admit counts one request of tenant in the window holding now,
	// unless that window's requests reached lim.RPM or its tokens
	// lim.TPM (a limit of 0 is none): then it counts nothing and returns
	// false.
	Admit(ctx context.Context, tenant string, lim Limits, now time.Time) (Window, bool, error)
	// Charge adds tokens to tenant's window holding now.
	Charge(ctx context.Context, tenant string, tokens int64, now time.Time) (Window, error)
}

// window returns the index of the window holding now and the time left in it.
func window(now time.Time) (int64, time.Duration) {
	ms := now.UnixMilli()
	p := Period.Milliseconds()
	w := ms / p
	return w, time.Duration((w+1)*p-ms) * time.Millisecond
}

// Decision is what the limiter made of a request or an answer.
type Decision struct {
	Window
	OK    bool   // admitted (always, for a charge)
	Known bool   // the store answered: Window holds the tenant's counts
	Over  string // refused: "requests" or "tokens", the limit reached
}

// Limiter checks and charges tenants against a Store, counting what it
// refuses and the store's failures in a metrics set. Safe for concurrent use.
type Limiter struct {
	store Store
	set   *metrics.Set
	errs  *metrics.Counter
	now   func() time.Time
}

// New returns a Limiter over store, registering
// vllm_router_tenant_limit_store_errors_total in set.
func New(store Store, set *metrics.Set) *Limiter {
	return &Limiter{store: store, set: set, now: time.Now,
		errs: set.GetOrCreateCounter("vllm_router_tenant_limit_store_errors_total")}
}

// Admit counts a request of tenant against lim. A store error admits the
// request (fails open), counted; the Decision is then not Known. The
// store bounds its own wait (Redis: sharedstate's read timeout).
func (l *Limiter) Admit(ctx context.Context, tenant string, lim Limits) Decision {
	w, ok, err := l.store.Admit(ctx, tenant, lim, l.now())
	if err != nil {
		l.errs.Inc()
		return Decision{OK: true}
	}
	d := Decision{Window: w, OK: ok, Known: true}
	if !ok {
		d.Over = "tokens"
		if lim.RPM > 0 && w.Requests >= lim.RPM {
			d.Over = "requests"
		}
		l.set.GetOrCreateCounter(`vllm_router_tenant_limited_total{tenant="` + tenant + `",limit="` + d.Over + `"}`).Inc()
	}
	return d
}

// Charge adds an answer's tokens to tenant's window; a store error is
// counted and the tokens are lost (fails open).
func (l *Limiter) Charge(ctx context.Context, tenant string, tokens int64) Decision {
	if tokens <= 0 {
		return Decision{OK: true}
	}
	w, err := l.store.Charge(ctx, tenant, tokens, l.now())
	if err != nil {
		l.errs.Inc()
		return Decision{OK: true}
	}
	return Decision{Window: w, OK: true, Known: true}
}

// Local is a Store in the process: one count per tenant, for the window
// it was last used in. Its memory is bounded by the tenants' names, which
// come from the key file; entries of past windows are dropped once there
// are more than maxLocal.
type Local struct {
	mu sync.Mutex
	m  map[string]*count
}

type count struct{ window, requests, tokens int64 }

const maxLocal = 4096

// NewLocal returns an empty Local store.
func NewLocal() *Local { return &Local{m: map[string]*count{}} }

// at returns tenant's count for window w, starting it when it is older.
func (s *Local) at(tenant string, w int64) *count {
	c := s.m[tenant]
	if c == nil {
		if len(s.m) >= maxLocal {
			for k, old := range s.m {
				if old.window != w {
					delete(s.m, k)
				}
			}
		}
		c = &count{window: w}
		s.m[tenant] = c
	}
	if c.window != w {
		*c = count{window: w}
	}
	return c
}

// Admit implements Store.
func (s *Local) Admit(_ context.Context, tenant string, lim Limits, now time.Time) (Window, bool, error) {
	w, reset := window(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.at(tenant, w)
	if over(lim, c.requests, c.tokens) {
		return Window{Requests: c.requests, Tokens: c.tokens, Reset: reset}, false, nil
	}
	c.requests++
	return Window{Requests: c.requests, Tokens: c.tokens, Reset: reset}, true, nil
}

// Charge implements Store.
func (s *Local) Charge(_ context.Context, tenant string, tokens int64, now time.Time) (Window, error) {
	w, reset := window(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.at(tenant, w)
	c.tokens += tokens
	return Window{Requests: c.requests, Tokens: c.tokens, Reset: reset}, nil
}

func over(lim Limits, requests, tokens int64) bool {
	return (lim.RPM > 0 && requests >= lim.RPM) || (lim.TPM > 0 && tokens >= lim.TPM)
}

// itoa formats n in decimal.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
