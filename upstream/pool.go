package upstream

import (
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// pconn is a connection owned by a Transport: pooled while idle, owned by one
// exchange while in use.
type pconn struct {
	c       net.Conn // what the exchange reads and writes (TLS or raw)
	raw     net.Conn // the underlying connection: closing it cancels
	created time.Time
	lastUse time.Time
	rdSet   bool // a read deadline may be set on c
	wdSet   bool // a write deadline may be set on c
}

type poolKey struct {
	addr  string
	isTLS bool
}

// hostPool holds the idle connections to one address, most recently used
// last (LIFO reuse keeps the set of warm connections small; idle[0] is always
// the oldest, so expiry trims from the front).
type hostPool struct {
	addr    string
	maxIdle int
	maxAge  time.Duration // idle expiry

	mu    sync.Mutex
	idle  []*pconn
	timer *time.Timer // expiry; armed while idle is non-empty
	armed bool

	tlsOnce sync.Once
	tlsCfg  *tls.Config
}

func (t *Transport) pool(hc *fasthttp.HostClient) *hostPool {
	k := poolKey{hc.Addr, hc.IsTLS}
	if p, ok := t.pools.Load(k); ok {
		return p
	}
	p, _ := t.pools.LoadOrCompute(k, func() *hostPool {
		maxAge := t.cfg.MaxIdleConnDuration
		if maxAge <= 0 {
			maxAge = hc.MaxIdleConnDuration
		}
		if maxAge <= 0 {
			maxAge = fasthttp.DefaultMaxIdleConnDuration
		}
		return &hostPool{
			addr:    fasthttp.AddMissingPort(hc.Addr, hc.IsTLS),
			maxIdle: t.cfg.MaxIdleConnsPerHost,
			maxAge:  maxAge,
		}
	})
	return p
}

func (p *hostPool) tlsConfig(hc *fasthttp.HostClient) *tls.Config {
	p.tlsOnce.Do(func() {
		var cfg *tls.Config
		if hc.TLSConfig != nil {
			cfg = hc.TLSConfig.Clone()
		} else {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
			host, _, err := net.SplitHostPort(p.addr)
			if err != nil {
				host = p.addr
			}
			cfg.ServerName = host
		}
		p.tlsCfg = cfg
	})
	return p.tlsCfg
}

// get pops the most recently used idle connection that has not expired, or
// returns nil.
func (p *hostPool) get() *pconn {
	p.mu.Lock()
	n := len(p.idle)
	if n == 0 {
		p.mu.Unlock()
		return nil
	}
	pc := p.idle[n-1]
	p.idle[n-1] = nil
	p.idle = p.idle[:n-1]
	if time.Since(pc.lastUse) < p.maxAge {
		p.mu.Unlock()
		return pc
	}
	// The newest is expired, so all are (the timer is late): drop them all.
	stale := append(p.idle[:0:0], p.idle...)
	clear(p.idle)
	p.idle = p.idle[:0]
	p.mu.Unlock()
	_ = pc.c.Close()
	for _, s := range stale {
		_ = s.c.Close()
	}
	return nil
}

// put returns a healthy idle connection to the pool (or closes it when the
// pool is full).
func (p *hostPool) put(pc *pconn) {
	pc.lastUse = time.Now()
	p.mu.Lock()
	if len(p.idle) >= p.maxIdle {
		p.mu.Unlock()
		_ = pc.c.Close()
		return
	}
	p.idle = append(p.idle, pc)
	if !p.armed {
		p.armed = true
		if p.timer == nil {
			p.timer = time.AfterFunc(p.maxAge, p.expire)
		} else {
			p.timer.Reset(p.maxAge)
		}
	}
	p.mu.Unlock()
}

// expire closes the connections idle for maxAge and re-arms for the next.
func (p *hostPool) expire() {
	now := time.Now()
	p.mu.Lock()
	i := 0
	for i < len(p.idle) && now.Sub(p.idle[i].lastUse) >= p.maxAge {
		i++
	}
	stale := append([]*pconn(nil), p.idle[:i]...)
	rest := copy(p.idle, p.idle[i:])
	clear(p.idle[rest:])
	p.idle = p.idle[:rest]
	if rest > 0 {
		p.timer.Reset(p.idle[0].lastUse.Add(p.maxAge).Sub(now))
	} else {
		p.armed = false
	}
	p.mu.Unlock()
	for _, s := range stale {
		_ = s.c.Close()
	}
}

func (p *hostPool) closeIdle() {
	p.mu.Lock()
	stale := append([]*pconn(nil), p.idle...)
	clear(p.idle)
	p.idle = p.idle[:0]
	p.mu.Unlock()
	for _, s := range stale {
		_ = s.c.Close()
	}
}
