package main

import (
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/warmroute/warmroute/bench"
)

// TestChaosQuick runs the cheapest probes (those marked quick in probes.go)
// end to end against a freshly built router binary (or $WARMROUTE_BIN), so
// that CI catches regressions of the hardening contract. Skipped under
// -short.
func TestChaosQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the router binary")
	}
	bin := os.Getenv("WARMROUTE_BIN") // a prebuilt router, else ./cmd/warmroute is built
	if bin == "" {
		var err error
		if bin, err = bench.BuildRouter(t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range probes {
		if !p.quick {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			rw := runProbe(bin, p, 30*time.Second)
			if !rw.pass {
				t.Errorf("%s: %s", p.name, rw.reason)
			}
		})
	}
}

// TestStrictPromParse checks the fallback parser on good and bad text.
func TestStrictPromParse(t *testing.T) {
	good := "# HELP a_total x\n# TYPE a_total counter\na_total{l=\"x\\\"y\\\\z\\n\"} 1\nb 2.5 1700000000\nc{} +Inf\n"
	if err := strictPromParse(good); err != nil {
		t.Errorf("good text: %v", err)
	}
	for _, bad := range []string{
		"a{l=\"\\x01\"} 1\n",           // escape the format has not
		"a{l=\"x\"} 1\na{l=\"x\"} 2\n", // duplicate series
		"a one\n",                      // not a float
		"1a 1\n",                       // bad name
		"a 1\n# TYPE a counter\n",      // TYPE after samples
	} {
		if strictPromParse(bad) == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// TestBadWorkers checks the harness's own broken workers: the blackhole
// times connects out, and a hung request notices its peer leaving.
func TestBadWorkers(t *testing.T) {
	b, err := startBad(modeHang)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	c, err := net.Dial("tcp", b.addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
	time.Sleep(100 * time.Millisecond)
	c.Close()
	for t0 := time.Now(); b.peerClosed.Load() == 0 && time.Since(t0) < 2*time.Second; {
		time.Sleep(10 * time.Millisecond)
	}
	if b.peerClosed.Load() != 1 {
		t.Errorf("hang worker did not notice the peer closing")
	}
	if err := b.becomeBlackhole(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", b.addr, 300*time.Millisecond); err == nil {
		c.Close()
		t.Errorf("blackhole accepted a connection")
	}
}
