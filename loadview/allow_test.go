package loadview

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
)

func TestParseAllowList(t *testing.T) {
	cases := []struct {
		in   string
		want string // fmt of the list, or "error"
	}{
		{"", "[]"},
		{"GPU-1.Internal, 10.0.0.0/8  fd00::/8,10.1.2.3", "[gpu-1.internal 10.0.0.0/8 fd00::/8 10.1.2.3/32]"},
		{"10.1.2.3/8", "[10.0.0.0/8]"},
		{"[fd00::1]", "[fd00::1/128]"},
		{"10.0.0.0/33", "error"},
		{"host:8000", "error"},
		{"http://host", "error"},
		{"fe80::1%eth0", "error"},
		{"bad_host!", "error"},
	}
	for _, c := range cases {
		got, err := ParseAllowList(c.in)
		s := fmt.Sprint(got)
		if got == nil && err == nil {
			s = "[]"
		}
		if err != nil {
			s = "error"
		}
		if s != c.want {
			t.Errorf("ParseAllowList(%q) = %s (%v), want %s", c.in, s, err, c.want)
		}
	}
}

func TestAdmit(t *testing.T) {
	r := NewRegistry(Config{AllowedWorkers: []string{"GPU-1.internal", "10.0.0.0/8", "fd00::/8", "192.168.1.5", "dotted.example."}, Logger: quiet()})
	open := NewRegistry(Config{Logger: quiet()})
	cases := []struct {
		url        string
		ok, okOpen bool // under the list, and with no list
	}{
		{"http://gpu-1.internal:8000", true, true},
		{"http://GPU-1.INTERNAL:8000", true, true},
		{"https://gpu-1.internal", true, true},
		{"http://gpu-1.internal:8000@3", true, true},
		{"http://gpu-1.internal:8000/", true, true},
		{" http://gpu-1.internal:8000 ", true, true},
		{"http://gpu-1.internal.:8000", false, true}, // absolute name: not the listed one
		{"http://dotted.example.:80", true, true},
		{"http://dotted.example:80", false, true},
		{"http://gpu-1.internal@evil.example:80", false, false}, // userinfo
		{"http://gpu-1.internal:80@evil.example", false, false},
		{"http://evil.example:80@gpu-1.internal", false, false},
		{"http://evil.example#@gpu-1.internal", false, false},
		{"http://evil.example\\@gpu-1.internal", false, false},
		{"http://evil.example?x=@gpu-1.internal", false, false},
		{"http://gpu-1.internal:8000/v1", false, false},
		{"http://gpu-1.internal:8000?a=b", false, false},
		{"ftp://gpu-1.internal", false, false},
		{"HTTP://gpu-1.internal", false, false},
		{"gpu-1.internal:8000", false, false},
		{"http://gpu-1.internal.evil.example", false, true},
		{"http://xgpu-1.internal", false, true},
		{"http://localhost:8000", false, true},
		{"http://10.1.2.3:8000", true, true},
		{"http://11.0.0.1:8000", false, true},
		{"http://10.1:80", false, true}, // non-canonical numeric forms are hostnames
		{"http://0x0a000001:80", false, true},
		{"http://010.0.0.1:80", false, true},
		{"http://192.168.1.5:1", true, true},
		{"http://192.168.1.6:1", false, true},
		{"http://[fd00::1]:8000", true, true},
		{"http://[FD00::1]:8000", true, true},
		{"http://[fe80::1]:8000", false, true},
		{"http://[fd00::1%25eth0]:80", false, false},
		{"http://[::ffff:10.0.0.1]:80", true, true},
		{"http://[::ffff:11.0.0.1]:80", false, true},
		{"http://[10.0.0.1]:80", false, false},
		{"http://gpu-1.internal:99999", false, false},
		{"http://gpu-1.internal:", false, false},
		{"http://gpu-1.internal:+80", false, false},
		{"http://a\"b:80", false, false},
		{"http://a\nb:80", false, false},
		{"http://", false, false},
	}
	for _, c := range cases {
		for _, x := range []struct {
			name string
			r    *Registry
			want bool
		}{{"list", r, c.ok}, {"no list", open, c.okOpen}} {
			err := x.r.Admit(c.url)
			if (err == nil) != x.want || (err != nil && !errors.Is(err, ErrNotAllowed)) {
				t.Errorf("%s: Admit(%q) = %v, want allowed=%v", x.name, c.url, err, x.want)
			}
		}
	}
}

func TestAdmitBadListFailsClosed(t *testing.T) {
	r := NewRegistry(Config{AllowedWorkers: []string{"10.0.0.0/99"}, Logger: quiet()})
	if err := r.Admit("http://10.0.0.1:80"); !errors.Is(err, ErrNotAllowed) {
		t.Fatalf("an invalid entry must not allow everything: %v", err)
	}
}

func TestMaxWorkers(t *testing.T) {
	r := NewRegistry(Config{MaxWorkers: 3, DPSize: 2, Logger: quiet(), Dial: refuse})
	ctx := context.Background()
	if ws, err := r.Add(ctx, "http://a:1", []string{"m"}); err != nil || len(ws) != 2 {
		t.Fatal(ws, err)
	}
	if _, err := r.Add(ctx, "http://b:1", []string{"m"}); !errors.Is(err, ErrTooManyWorkers) {
		t.Fatalf("2 + 2 ranks > 3: %v", err)
	}
	if len(r.Workers()) != 2 {
		t.Fatalf("a refused Add added %d workers", len(r.Workers())-2)
	}
	if _, err := r.Add(ctx, "http://b:1@0", []string{"m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Add(ctx, "http://c:1@0", []string{"m"}); !errors.Is(err, ErrTooManyWorkers) {
		t.Fatalf("4th worker: %v", err)
	}
	r.Remove("http://a:1")
	if _, err := r.Add(ctx, "http://c:1", []string{"m"}); err != nil {
		t.Fatalf("room again after Remove: %v", err)
	}
}

func refuse(string) (net.Conn, error) { return nil, errors.New("refused by the test") }

// promLine is one sample with a single worker label, by the exposition
// format's rules: only \\, \" and \n escapes, no raw newline or quote.
var promLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)\{worker="((?:[^"\\\n]|\\[\\"n])*)"(?:,role="([a-z]+)")?\} ([0-9]+)$`)

func unescapeLabel(s string) string {
	return strings.NewReplacer(`\\`, `\`, `\"`, `"`, `\n`, "\n").Replace(s)
}

func TestWriteMetricsEscapesLabels(t *testing.T) {
	clk := newFakeClock()
	r := NewRegistry(Config{Dial: refuse, CBFailureThreshold: 1, Now: clk.Now, Logger: quiet()})
	ctx := context.Background()
	odd := "http://a\"b\nc\\d:1"
	for _, u := range []string{"http://w1:1", odd} {
		ws, err := r.Add(ctx, u, []string{"m"})
		if err != nil {
			t.Fatal(err)
		}
		r.SetHealthy(ws[0], true)
	}
	r.RecordFailure(r.ByURL(odd))
	r.probes.Wait()
	var buf bytes.Buffer
	r.WriteMetrics(&buf)
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		m := promLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("invalid exposition line %q in\n%s", line, buf.String())
		}
		got[m[1]+" "+unescapeLabel(m[2])+m[3]] = m[4]
	}
	want := map[string]string{
		"vllm_router_running_requests http://w1:1":            "0",
		"vllm_router_worker_health http://w1:1":               "1",
		"vllm_router_circuit_breaker_state http://w1:1":       "0",
		"vllm_router_circuit_breaker_opens_total http://w1:1": "0",
		"vllm_router_running_requests " + odd:                 "0",
		"vllm_router_worker_health " + odd:                    "0",
		"vllm_router_circuit_breaker_state " + odd:            "1",
		"vllm_router_circuit_breaker_opens_total " + odd:      "1",
		"vllm_router_worker_role http://w1:1regular":          "1",
		"vllm_router_worker_role " + odd + "regular":          "1",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("metrics\n%v\nwant\n%v", got, want)
	}
}
