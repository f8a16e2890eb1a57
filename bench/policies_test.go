package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/route"
)

// fleetFixture is n registered workers with no network (health forced), as
// in route's tests.
func fleetFixture(t *testing.T, n int) (*loadview.Registry, []*loadview.Worker) {
	t.Helper()
	reg := loadview.NewRegistry(loadview.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var ws []*loadview.Worker
	for i := 0; i < n; i++ {
		// Port 1 refuses at once: the probe fails fast, then health is forced.
		added, err := reg.Add(context.Background(), fmt.Sprintf("http://127.0.0.%d:1", i+1), []string{Model})
		if err != nil {
			t.Fatal(err)
		}
		reg.SetHealthy(added[0], true)
		ws = append(ws, added[0])
	}
	return reg, ws
}

func load(w *loadview.Worker, n int) {
	for ; n > 0; n-- {
		w.Acquire()
	}
	for ; n < 0; n++ {
		w.Release()
	}
}

func TestStickyExact(t *testing.T) {
	reg, ws := fleetFixture(t, 3)
	p := NewSticky(reg, seqRand(1))
	f := func(session string, want int, label string) {
		t.Helper()
		c := p.Select(&route.Request{Model: Model, Workers: reg.Workers(), Session: []byte(session)})
		if c.Worker != ws[want] || c.Decision != label {
			t.Fatalf("Select(%q) = %v/%s, want %s/%s", session, c.Worker, c.Decision, ws[want].URL(), label)
		}
	}
	load(ws[0], 1)
	load(ws[2], 1)
	f("a", 1, StickyMinLoad) // the only idle worker
	load(ws[1], 5)
	f("a", 1, StickyHit) // stays, however loaded
	f("b", 0, StickyMinLoad)
	p.Select(&route.Request{Model: Model, Workers: reg.Workers(), Session: []byte("c")}) // ties 0 and 2 at load 1
	f("a", 1, StickyHit)
	reg.SetHealthy(ws[1], false)
	load(ws[2], -1)
	f("a", 2, StickyMinLoad) // its worker is unhealthy: moves to min-load, and stays there
	reg.SetHealthy(ws[1], true)
	f("a", 2, StickyHit)
	reg.Remove(ws[2].URL()) // the policy forgets it through the registry
	load(ws[1], -5)
	load(ws[2], 1)
	f("a", 1, StickyMinLoad)
	f("", 1, StickyMinLoad) // no session: min-load, remembers nothing
}

// TestPreRFCSessionPrefixCollision is the RFC's bug 1: session-12 probes the
// tree, matches session-1 over 9 of its 10 characters, and follows it to a
// busier worker, while cache_aware matches session ids exactly.
func TestPreRFCSessionPrefixCollision(t *testing.T) {
	for _, thr := range []float64{0.3, 0.5} {
		reg, ws := fleetFixture(t, 2)
		p := NewPreRFC(reg, thr, 64, 1.5, seqRand(1))
		sel := func(session string) route.Choice {
			return p.Select(&route.Request{Model: Model, Workers: reg.Workers(), Session: []byte(session)})
		}
		load(ws[1], 1)
		if c := sel("session-1"); c.Worker != ws[0] || c.Decision != route.LowMatchMinLoad {
			t.Fatalf("threshold %g: session-1 = %s/%s, want %s/%s", thr, c.Worker.URL(), c.Decision, ws[0].URL(), route.LowMatchMinLoad)
		}
		load(ws[0], 3) // ws[0] is now the busier one
		if c := sel("session-12"); c.Worker != ws[0] || c.Decision != route.CacheAffinity {
			t.Fatalf("threshold %g: session-12 = %s/%s, want a collision on %s/%s", thr, c.Worker.URL(), c.Decision, ws[0].URL(), route.CacheAffinity)
		}
		if c := sel("session-1"); c.Worker != ws[0] || c.Decision != route.CacheAffinity {
			t.Fatalf("threshold %g: session-1 again = %s/%s", thr, c.Worker.URL(), c.Decision)
		}
		// Bug 2: without a session id the text is empty: always min-load.
		if c := sel(""); c.Worker != ws[1] || c.Decision != route.LowMatchMinLoad {
			t.Fatalf("threshold %g: no session = %s/%s, want %s/%s", thr, c.Worker.URL(), c.Decision, ws[1].URL(), route.LowMatchMinLoad)
		}

		// cache_aware on the same fleet: exact ids, session-12 is new.
		ca := route.NewCacheAware(reg, route.CacheAwareConfig{Threshold: thr, BalanceAbs: 64, BalanceRel: 1.5, MaxTreeSize: 1 << 20}, seqRand(2))
		ca.Select(&route.Request{Model: Model, Workers: reg.Workers()}) // past no_tree_random
		load(ws[1], -1)
		load(ws[0], -3)
		load(ws[1], 1)
		if c := ca.Select(&route.Request{Model: Model, Workers: reg.Workers(), Session: []byte("session-1")}); c.Worker != ws[0] {
			t.Fatalf("cache_aware session-1 = %s/%s", c.Worker.URL(), c.Decision)
		}
		load(ws[0], 3)
		if c := ca.Select(&route.Request{Model: Model, Workers: reg.Workers(), Session: []byte("session-12")}); c.Worker != ws[1] || c.Decision != route.EmptyHistoryMinLoad {
			t.Fatalf("cache_aware session-12 = %s/%s, want %s/%s", c.Worker.URL(), c.Decision, ws[1].URL(), route.EmptyHistoryMinLoad)
		}
	}
}

func TestPreRFCLoadGate(t *testing.T) {
	reg, ws := fleetFixture(t, 2)
	p := NewPreRFC(reg, 0.5, 8, 1.5, seqRand(1))
	sel := func(session string) route.Choice {
		return p.Select(&route.Request{Model: Model, Workers: reg.Workers(), Session: []byte(session)})
	}
	load(ws[1], 1)
	if c := sel("abc"); c.Worker != ws[0] {
		t.Fatalf("abc = %s/%s", c.Worker.URL(), c.Decision)
	}
	load(ws[0], 9) // 9 vs 1: diff 8 is not > 8
	if c := sel("abc"); c.Worker != ws[0] || c.Decision != route.CacheAffinity {
		t.Fatalf("abc at 9/1 = %s/%s", c.Worker.URL(), c.Decision)
	}
	load(ws[0], 1) // 10 vs 1: diff 9 > 8 and 10 > 1.5
	if c := sel("abc"); c.Worker != ws[1] || c.Decision != route.LoadBalance {
		t.Fatalf("abc at 10/1 = %s/%s, want %s/%s", c.Worker.URL(), c.Decision, ws[1].URL(), route.LoadBalance)
	}
}

// A disaggregated fleet's policy is a pair, prefill first; precise and the
// oracle assume one side; a pair needs decode workers.
func TestPDPolicyNames(t *testing.T) {
	if p, d, pd := SplitPD("cache_aware+least_loaded"); !pd || p != "cache_aware" || d != route.LeastLoaded {
		t.Fatalf("SplitPD = %q %q %v", p, d, pd)
	}
	if p, d, pd := SplitPD("cache_aware"); pd || p != "cache_aware" || d != "cache_aware" {
		t.Fatalf("SplitPD of one name = %q %q %v", p, d, pd)
	}
	for name, want := range map[string]bool{
		"cache_aware+least_loaded": true, "round_robin+cache_aware": true, "cache_aware+least_loaded" + ControlSuffix: true,
		"least_loaded": true, "cache_aware+precise": false, "oracle+cache_aware": false, "cache_aware+nope": false, "a+b+c": false,
	} {
		if got := ValidPolicy(name); got != want {
			t.Errorf("ValidPolicy(%q) = %v, want %v", name, got, want)
		}
	}
	wl := Synthetic(smallSynthetic(1))
	if _, err := Run(context.Background(), Options{Workers: 2}, wl, "cache_aware+least_loaded", 1); err == nil || !strings.Contains(err.Error(), "no decode workers") {
		t.Errorf("a pair without decode workers: %v", err)
	}
	if _, err := Run(context.Background(), Options{Workers: 2, Decode: 2}, wl, PolicyOracle, 1); err == nil {
		t.Error("the oracle ran a disaggregated fleet")
	}
}
