package loadview

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// dnsServer is a tiny authoritative DNS server on 127.0.0.1 (UDP) that
// answers A and AAAA queries for one name from records the test sets.
type dnsServer struct {
	conn net.PacketConn
	mu   sync.Mutex
	ips  []netip.Addr
	mode string // "", "nxdomain", "servfail", "drop"

	queries chan struct{} // a send per query while not full
}

func newDNSServer(t *testing.T) *dnsServer {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{conn: c, queries: make(chan struct{}, 64)}
	t.Cleanup(func() { c.Close() })
	go s.serve()
	return s
}

func (s *dnsServer) set(mode string, ips ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mode, s.ips = mode, nil
	for _, ip := range ips {
		s.ips = append(s.ips, netip.MustParseAddr(ip))
	}
}

// resolver returns a pure-Go resolver whose every query goes to s.
func (s *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.conn.LocalAddr().String())
	}}
}

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		select {
		case s.queries <- struct{}{}:
		default:
		}
		if resp := s.answer(buf[:n]); resp != nil {
			s.conn.WriteTo(resp, from) //nolint:errcheck
		}
	}
}

// answer builds the response to query q by hand (RFC 1035 §4): the header,
// the question echoed, and one answer per matching record, its name a
// pointer to the question's.
func (s *dnsServer) answer(q []byte) []byte {
	if len(q) < 12 {
		return nil
	}
	i := 12
	for i < len(q) && q[i] != 0 { // the question's name: length-prefixed labels
		i += int(q[i]) + 1
	}
	if i+5 > len(q) {
		return nil
	}
	question := q[12 : i+5] // name, root label, type, class
	qtype := binary.BigEndian.Uint16(q[i+1:])
	s.mu.Lock()
	mode, ips := s.mode, s.ips
	s.mu.Unlock()
	if mode == "drop" {
		return nil
	}
	rcode := uint16(0)
	switch mode {
	case "nxdomain":
		rcode, ips = 3, nil
	case "servfail":
		rcode, ips = 2, nil
	}
	var answers []byte
	count := 0
	for _, ip := range ips {
		var typ uint16 = 1 // A
		if ip.Is6() {
			typ = 28 // AAAA
		}
		if typ != qtype {
			continue
		}
		rr := []byte{0xc0, 12} // pointer to the question's name
		rr = binary.BigEndian.AppendUint16(rr, typ)
		rr = binary.BigEndian.AppendUint16(rr, 1) // IN
		rr = binary.BigEndian.AppendUint32(rr, 0) // TTL
		raw := ip.AsSlice()
		rr = binary.BigEndian.AppendUint16(rr, uint16(len(raw)))
		answers = append(append(answers, rr...), raw...)
		count++
	}
	resp := make([]byte, 12, 12+len(question)+len(answers))
	copy(resp, q[:2])                                                                 // id
	flags := uint16(1<<15|1<<10|1<<7) | binary.BigEndian.Uint16(q[2:])&(1<<8) | rcode // QR, AA, RA, RD copied
	binary.BigEndian.PutUint16(resp[2:], flags)
	binary.BigEndian.PutUint16(resp[4:], 1)
	binary.BigEndian.PutUint16(resp[6:], uint16(count))
	return append(append(resp, question...), answers...)
}

// dnsWorkers listens one fake worker on each of ips at one common port (a
// headless service's pods: same port, different addresses). handler, when
// not nil, serves /v1/chat/completions.
func dnsWorkers(t *testing.T, handler http.HandlerFunc, ips ...string) int {
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		ln0, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			t.Skipf("listen on %s: %v", ips[0], err)
		}
		port := ln0.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{ln0}
		for _, ip := range ips[1:] {
			ln, err := net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) < len(ips) {
			for _, ln := range lns {
				ln.Close()
			}
			continue
		}
		mux := http.NewServeMux()
		mux.Handle("/", &fakeVLLM{})
		if handler != nil {
			mux.Handle("/v1/chat/completions", handler)
		}
		for _, ln := range lns {
			srv := &http.Server{Handler: mux}
			go srv.Serve(ln) //nolint:errcheck
			t.Cleanup(func() { srv.Close() })
		}
		return port
	}
	t.Fatal("no common free port")
	return 0
}

func dnsFleet(t *testing.T, cfg Config, handler http.HandlerFunc, ips ...string) (*Registry, *DNSDiscovery, *dnsServer, *lockedBuffer) {
	t.Helper()
	port := dnsWorkers(t, handler, ips...)
	dns := newDNSServer(t)
	logs := &lockedBuffer{}
	cfg.Logger = slogTo(logs)
	r := NewRegistry(cfg)
	d, err := NewDNSDiscovery(r, DNSConfig{Target: fmt.Sprintf("vllm.test.:%d", port), Interval: time.Hour,
		Timeout: 500 * time.Millisecond, Resolver: dns.resolver()})
	if err != nil {
		t.Fatal(err)
	}
	return r, d, dns, logs
}

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func urls(r *Registry) string {
	var out []string
	for _, w := range r.Workers() {
		out = append(out, w.URL())
	}
	return strings.Join(out, " ")
}

func TestDNSDiscoveryFollowsRecords(t *testing.T) {
	r, d, dns, _ := dnsFleet(t, Config{}, nil, "127.0.0.1", "127.0.0.2")
	port := d.port
	a, b := "http://127.0.0.1:"+port, "http://127.0.0.2:"+port
	ctx := context.Background()
	step := func(want string, ips ...string) {
		t.Helper()
		dns.set("", ips...)
		if err := d.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if got := urls(r); got != want {
			t.Fatalf("records %v: workers %q, want %q", ips, got, want)
		}
		for _, w := range r.Workers() {
			if !w.Healthy() || fmt.Sprint(w.Models()) != "[m]" {
				t.Fatalf("%s: healthy %v models %v", w.URL(), w.Healthy(), w.Models())
			}
		}
	}
	step(a, "127.0.0.1")
	step(a+" "+b, "127.0.0.1", "127.0.0.2")
	step(b, "127.0.0.2")
	if fmt.Sprint(d.Workers()) != "["+b+"]" {
		t.Fatalf("owned %v", d.Workers())
	}
	var buf strings.Builder
	r.WriteMetrics(&buf)
	if !strings.Contains(buf.String(), `vllm_router_dns_discovery_workers{target="vllm.test.:`+port+`"} 1`) {
		t.Fatalf("metrics:\n%s", buf.String())
	}
}

func TestDNSDiscoveryKeepsWorkersThroughOutages(t *testing.T) {
	r, d, dns, logs := dnsFleet(t, Config{}, nil, "127.0.0.1", "127.0.0.2")
	ctx := context.Background()
	dns.set("", "127.0.0.1", "127.0.0.2")
	if err := d.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	before := urls(r)
	for i, mode := range []string{"nxdomain", "servfail", "drop", "empty"} {
		dns.set(mode)
		if mode == "empty" {
			dns.set("")
		}
		err := d.Sync(ctx)
		if err == nil {
			t.Fatalf("%s: no error", mode)
		}
		if got := urls(r); got != before {
			t.Fatalf("%s: workers %q, want %q kept", mode, got, before)
		}
		if d.Failures() != uint64(i+1) {
			t.Fatalf("%s: %d failures counted", mode, d.Failures())
		}
	}
	if n := logs.count("worker DNS resolution failed"); n != 1 {
		t.Fatalf("outage logged %d times, want once", n)
	}
	dns.set("", "127.0.0.2")
	if err := d.Sync(ctx); err != nil || urls(r) != "http://127.0.0.2:"+d.port {
		t.Fatalf("after the outage: %v %q", err, urls(r))
	}
	if logs.count("worker DNS resolution works again") != 1 {
		t.Fatal("recovery not logged")
	}
}

func TestDNSDiscoveryRemovesOnlyItsOwn(t *testing.T) {
	r, d, dns, _ := dnsFleet(t, Config{}, nil, "127.0.0.1", "127.0.0.2")
	a := "http://127.0.0.1:" + d.port
	if _, err := r.Add(context.Background(), a, nil); err != nil { // --worker-urls
		t.Fatal(err)
	}
	dns.set("", "127.0.0.1", "127.0.0.2")
	if err := d.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	dns.set("", "127.0.0.2")
	if err := d.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := urls(r); got != a+" http://127.0.0.2:"+d.port {
		t.Fatalf("workers %q: the operator's worker must stay", got)
	}
	// One of its own removed by an admin is forgotten, then added again.
	r.Remove("http://127.0.0.2:" + d.port)
	if err := d.Sync(context.Background()); err != nil || len(r.Workers()) != 2 {
		t.Fatalf("re-add: %v %q", err, urls(r))
	}
}

func TestDNSDiscoveryObeysAllowListAndMaxWorkers(t *testing.T) {
	r, d, dns, logs := dnsFleet(t, Config{AllowedWorkers: []string{"127.0.0.1/32"}}, nil, "127.0.0.1", "127.0.0.2")
	dns.set("", "127.0.0.1", "127.0.0.2")
	for i := 0; i < 2; i++ {
		if err := d.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := urls(r); got != "http://127.0.0.1:"+d.port {
		t.Fatalf("workers %q", got)
	}
	if n := logs.count("worker from DNS not added"); n != 1 {
		t.Fatalf("refusal logged %d times, want once", n)
	}

	r2, d2, dns2, _ := dnsFleet(t, Config{MaxWorkers: 1}, nil, "127.0.0.1", "127.0.0.2")
	dns2.set("", "127.0.0.1", "127.0.0.2")
	if err := d2.Sync(context.Background()); err != nil || len(r2.Workers()) != 1 || len(d2.Workers()) != 1 {
		t.Fatalf("max workers: %v %q", err, urls(r2))
	}
}

func TestDNSDiscoveryIPv6(t *testing.T) {
	r, d, dns, _ := dnsFleet(t, Config{}, nil, "::1")
	dns.set("", "::1")
	if err := d.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := urls(r); got != "http://[::1]:"+d.port {
		t.Fatalf("workers %q", got)
	}
	if !r.Workers()[0].Healthy() {
		t.Fatal("IPv6 worker not reachable")
	}
}

// A worker whose address leaves DNS gets no new request, and its request in
// flight completes.
func TestDNSDiscoveryDrainsRemovedWorker(t *testing.T) {
	arrived, finish := make(chan struct{}), make(chan struct{})
	slow := func(w http.ResponseWriter, _ *http.Request) {
		close(arrived)
		<-finish
		io.WriteString(w, `{"ok":true}`) //nolint:errcheck
	}
	r, d, dns, _ := dnsFleet(t, Config{}, slow, "127.0.0.1", "127.0.0.2")
	dns.set("", "127.0.0.1")
	if err := d.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	w := r.Workers()[0]
	w.Acquire()
	type result struct {
		code int
		body string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(w.URL() + "/v1/chat/completions")
		req.Header.SetMethod(fasthttp.MethodPost)
		err := w.Client().Do(req, resp)
		w.Release() // before the result is sent: the test reads the load after it
		done <- result{resp.StatusCode(), string(resp.Body()), err}
	}()
	<-arrived
	dns.set("", "127.0.0.2")
	if err := d.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if w.Healthy() || r.ByURL(w.URL()) != nil {
		t.Fatal("removed worker still routable")
	}
	if ws, _ := r.ForModel([]byte("m")); len(ws) != 1 || ws[0] == w {
		t.Fatalf("removed worker still offered: %v", ws)
	}
	close(finish)
	res := <-done
	if res.err != nil || res.code != http.StatusOK || res.body != `{"ok":true}` {
		t.Fatalf("in-flight request on the removed worker: %+v", res)
	}
	if w.Load() != 0 {
		t.Fatalf("load %d after the drained request", w.Load())
	}
}

func TestParseDNSTarget(t *testing.T) {
	for _, c := range []struct {
		in   string
		name string
		port int
	}{
		{"vllm.default.svc.cluster.local:8000", "vllm.default.svc.cluster.local", 8000},
		{"vllm-headless:80", "vllm-headless", 80},
		{"[fd00::1]:8000", "fd00::1", 8000},
		{"10.0.0.1:1", "10.0.0.1", 1},
	} {
		name, port, err := ParseDNSTarget(c.in)
		if err != nil || name != c.name || port != c.port {
			t.Errorf("ParseDNSTarget(%q) = %q, %d, %v", c.in, name, port, err)
		}
	}
	for _, bad := range []string{"", "vllm", "vllm:0", "vllm:65536", "vllm:+80", "http://vllm:80", "vl lm:80", "vllm:http"} {
		if _, _, err := ParseDNSTarget(bad); err == nil {
			t.Errorf("ParseDNSTarget(%q): no error", bad)
		}
	}
	if _, err := NewDNSDiscovery(NewRegistry(Config{Logger: quiet()}), DNSConfig{Target: "a:1", Network: "tcp"}); err == nil {
		t.Error("network tcp accepted")
	}
}

// Run syncs at once and stops with its context.
func TestDNSDiscoveryRun(t *testing.T) {
	r, d, dns, _ := dnsFleet(t, Config{}, nil, "127.0.0.1")
	dns.set("", "127.0.0.1")
	for len(dns.queries) > 0 {
		<-dns.queries
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		d.Run(ctx)
		close(done)
	}()
	<-dns.queries                          // the first round is resolving, holding d.mu ...
	if got := d.Workers(); len(got) != 1 { // ... so this waits for its end
		t.Fatalf("after the first round: %v", got)
	}
	cancel()
	<-done
	if len(r.Workers()) != 1 {
		t.Fatalf("workers %q", urls(r))
	}
}

// TestDNSDiscoveryAddsInItsRole: a discovery with a Role adds its workers
// in that role (--prefill-worker-dns, --decode-worker-dns): decode workers
// on the decode side of the fleet, not among the entry workers.
func TestDNSDiscoveryAddsInItsRole(t *testing.T) {
	port := dnsWorkers(t, nil, "127.0.0.1", "127.0.0.2")
	r := NewRegistry(Config{Logger: slogTo(io.Discard)})
	for _, c := range []struct {
		ip   string
		role Role
	}{{"127.0.0.1", Prefill}, {"127.0.0.2", Decode}} {
		dns := newDNSServer(t)
		dns.set("", c.ip)
		d, err := NewDNSDiscovery(r, DNSConfig{Target: fmt.Sprintf("%s.test.:%d", c.role, port), Interval: time.Hour,
			Timeout: 500 * time.Millisecond, Resolver: dns.resolver(), Role: c.role})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	p, d := r.ByURL(fmt.Sprintf("http://127.0.0.1:%d", port)), r.ByURL(fmt.Sprintf("http://127.0.0.2:%d", port))
	if p == nil || d == nil || p.Role() != Prefill || d.Role() != Decode {
		t.Fatalf("workers %q: prefill %v, decode %v", urls(r), p, d)
	}
	entry, _ := r.ForModel([]byte("m"))
	dec, _ := r.DecodeWorkers([]byte("m"))
	if len(entry) != 1 || entry[0] != p || len(dec) != 1 || dec[0] != d {
		t.Fatalf("entry side %v, decode side %v", entry, dec)
	}
}
