//go:build linux

package connwatch

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
)

const testInterval = 10 * time.Millisecond

// pair returns the client and server sides of a loopback TCP connection.
func pair(t testing.TB, ln net.Listener) (client, server net.Conn) {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- nil
			return
		}
		ch <- c
	}()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-ch
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-ch:
		return time.Since(start)
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: gone not called", what)
		return 0
	}
}

// sentinel watches a new connection of ln and closes its client; it returns
// once w called that registration's gone, which shows that w polled after
// every registration made before it.
func sentinel(t *testing.T, w *Watcher, ln net.Listener, what string) {
	t.Helper()
	client, server := pair(t, ln)
	gone := make(chan struct{})
	stop := w.Watch(server, func() { close(gone) })
	defer stop()
	client.Close()
	waitClosed(t, gone, what)
}

func TestClientCloseIsGone(t *testing.T) {
	w := New(testInterval)
	ln := listen(t)
	client, server := pair(t, ln)
	ch := make(chan struct{})
	var calls atomic.Int32
	stop := w.Watch(server, func() { calls.Add(1); close(ch) })
	defer stop()
	client.Close()
	d := waitClosed(t, ch, "close")
	t.Logf("gone after %v (interval %v)", d, testInterval)
	stop()
	stop() // idempotent
	if calls.Load() != 1 {
		t.Fatalf("gone called %d times", calls.Load())
	}
	if n := w.Len(); n != 0 {
		t.Fatalf("still %d registered", n)
	}
}

// A Conn reused for a connection's requests allocates nothing after its
// first Start, and its latest registration learns that the client left.
func TestConnReused(t *testing.T) {
	w := New(testInterval)
	ln := listen(t)
	client, server := pair(t, ln)
	var c Conn
	nop := func() {}
	if !w.Start(&c, server, nop) {
		t.Fatal("a TCP connection is not watched")
	}
	w.Stop(&c)
	if n := testing.AllocsPerRun(100, func() { w.Start(&c, server, nop); w.Stop(&c) }); n != 0 {
		t.Fatalf("%v allocations per Start and Stop of a reused Conn", n)
	}
	ch := make(chan struct{})
	w.Start(&c, server, func() { close(ch) })
	client.Close()
	waitClosed(t, ch, "close")
	w.Stop(&c)
	if n := w.Len(); n != 0 {
		t.Fatalf("still %d registered", n)
	}
}

// A Conn started again for another connection (a pooled per-request
// state) probes the new one, not the socket it reached before.
func TestConnMovedToAnotherConnection(t *testing.T) {
	w := New(time.Hour) // no poll of its own: the test probes
	ln := listen(t)
	c1, s1 := pair(t, ln)
	c2, s2 := pair(t, ln)
	var c Conn
	w.Start(&c, s1, func() {})
	w.Stop(&c)
	w.Start(&c, s2, func() {})
	defer w.Stop(&c)
	p := newProber()
	c1.Close()
	if p.probe(c.rc) != alive {
		t.Fatal("the registration moved to the second connection still probes the first")
	}
	c2.Close()
	// The FIN travels on loopback.
	testwait.Until(t, "the second client's close to be seen", func() bool { return p.probe(c.rc) == gone })
}

// A poll's verdict on a registration that was stopped and started again
// since the poll saw it (the connection's next request) ends nothing: only
// a probe of the current registration does.
func TestStaleVerdictEndsNothing(t *testing.T) {
	w := New(time.Hour) // no poll of its own: the test plays the poll
	ln := listen(t)
	_, server := pair(t, ln)
	var c Conn
	w.Start(&c, server, func() { t.Error("the first registration's gone called") })
	stale := probed{&c, c.rc, c.gen}
	w.Stop(&c)
	var calls atomic.Int32
	w.Start(&c, server, func() { calls.Add(1) })
	w.ended(stale)
	if calls.Load() != 0 || w.Len() != 1 {
		t.Fatalf("a stale verdict ended the new registration: %d gone calls, %d registered", calls.Load(), w.Len())
	}
	w.ended(probed{&c, c.rc, c.gen})
	w.ended(probed{&c, c.rc, c.gen}) // the same verdict twice: gone once
	if calls.Load() != 1 || w.Len() != 0 {
		t.Fatalf("the current verdict: %d gone calls, %d registered", calls.Load(), w.Len())
	}
	w.Stop(&c)
}

func TestClientResetIsGone(t *testing.T) {
	w := New(testInterval)
	ln := listen(t)
	client, server := pair(t, ln)
	ch := make(chan struct{})
	stop := w.Watch(server, func() { close(ch) })
	defer stop()
	if err := client.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	client.Close() // RST
	waitClosed(t, ch, "reset")
}

// A client that keeps its connection open and has already sent more bytes
// (a pipelined request) is alive, and the bytes are still there for the
// server to read.
func TestPipelinedBytesAlive(t *testing.T) {
	w := New(testInterval)
	ln := listen(t)
	client, server := pair(t, ln)
	const next = "GET /next HTTP/1.1\r\nHost: x\r\n\r\n"
	if _, err := client.Write([]byte(next)); err != nil {
		t.Fatal(err)
	}
	var called atomic.Bool
	stop := w.Watch(server, func() { called.Store(true) })
	// A second conn whose client closes shows that polls have happened
	// (it is registered after, so it is polled after, in the same round or
	// later) without sleeping for a guessed time; a third, one more full
	// round.
	sentinel(t, w, ln, "sentinel")
	sentinel(t, w, ln, "sentinel 2")

	stop()
	if called.Load() {
		t.Fatal("gone called for a live client with pipelined bytes")
	}
	buf := make([]byte, len(next))
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(server, buf); err != nil || string(buf) != next {
		t.Fatalf("pipelined bytes: %q, %v", buf, err)
	}
}

func TestStopBeforeCloseNeverGone(t *testing.T) {
	w := New(testInterval)
	ln := listen(t)
	client, server := pair(t, ln)
	var called atomic.Bool
	stop := w.Watch(server, func() { called.Store(true) })
	stop()
	client.Close()
	// Later registrations seen gone prove polls ran after.
	sentinel(t, w, ln, "sentinel")
	sentinel(t, w, ln, "sentinel 2")
	if called.Load() {
		t.Fatal("gone called after stop")
	}
}

// stop waits for a gone in progress: after stop returns, gone has finished.
func TestStopWaitsForGone(t *testing.T) {
	w := New(testInterval)
	ln := listen(t)
	client, server := pair(t, ln)
	entered := make(chan struct{})
	release := make(chan struct{})
	var finished atomic.Bool
	stop := w.Watch(server, func() {
		close(entered)
		<-release
		finished.Store(true)
	})
	client.Close()
	<-entered
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while gone was running")
	default:
	}
	close(release)
	<-stopped
	if !finished.Load() {
		t.Fatal("stop returned before gone finished")
	}
}

// The background goroutine exits when nothing is registered and restarts on
// the next Watch.
func TestIdleGoroutineExits(t *testing.T) {
	w := New(time.Millisecond)
	ln := listen(t)
	sentinel(t, w, ln, "first") // watched, gone and stopped
	testwait.Until(t, "the poll goroutine to exit with nothing registered", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return !w.running
	})
	sentinel(t, w, ln, "after restart")
}

func TestTLSConnUnwrapped(t *testing.T) {
	w := New(testInterval)
	ln := listen(t)
	client, server := pair(t, ln)
	tc := tls.Server(server, &tls.Config{})
	ch := make(chan struct{})
	stop := w.Watch(tc, func() { close(ch) })
	defer stop()
	if w.Len() != 1 {
		t.Fatal("tls conn not watched")
	}
	client.Close()
	waitClosed(t, ch, "tls")
}

func TestUninspectableNotWatched(t *testing.T) {
	w := New(testInterval)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	stop := w.Watch(a, func() { t.Error("gone called on a pipe") })
	if w.Len() != 0 {
		t.Fatal("pipe registered")
	}
	stop()
	stop()
}

func TestThousandConns(t *testing.T) {
	const n = 1000
	w := New(testInterval)
	ln := listen(t)
	clients := make([]net.Conn, n)
	stops := make([]func(), n)
	chans := make([]chan struct{}, n)
	var fired [n]atomic.Int32
	for i := range n {
		c, s := pair(t, ln)
		clients[i] = c
		chans[i] = make(chan struct{})
		stops[i] = w.Watch(s, func() { fired[i].Add(1); close(chans[i]) })
	}
	if w.Len() != n {
		t.Fatalf("registered %d", w.Len())
	}
	// Close the even clients concurrently, stop the odd watches concurrently.
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				clients[i].Close()
			} else {
				stops[i]()
			}
		}()
	}
	wg.Wait()
	for i := 0; i < n; i += 2 {
		waitClosed(t, chans[i], "conn")
	}
	for i := range n {
		stops[i]()
		want := int32(0)
		if i%2 == 0 {
			want = 1
		}
		if got := fired[i].Load(); got != want {
			t.Fatalf("conn %d: gone called %d times, want %d", i, got, want)
		}
	}
	if w.Len() != 0 {
		t.Fatalf("still %d registered", w.Len())
	}
}

// BenchmarkPoll measures one polling round over 1,000 live connections.
func BenchmarkPoll1000(b *testing.B) {
	b.ReportAllocs()
	ln := listen(b)
	p := newProber()
	rcs := make([]syscall.RawConn, 1000)
	for i := range rcs {
		_, s := pair(b, ln)
		rcs[i] = rawConn(s)
	}
	b.ResetTimer()
	for b.Loop() {
		for _, rc := range rcs {
			if p.probe(rc) != alive {
				b.Fatal("not alive")
			}
		}
	}
}

func BenchmarkWatchStop(b *testing.B) {
	w := New(time.Hour)
	ln := listen(b)
	_, s := pair(b, ln)
	b.ReportAllocs()
	for b.Loop() {
		w.Watch(s, func() {})()
	}
}

// BenchmarkStartStop: a connection's reused registration, as a server
// keeps it per connection (0 allocations).
func BenchmarkStartStop(b *testing.B) {
	w := New(time.Hour)
	ln := listen(b)
	_, s := pair(b, ln)
	var c Conn
	gone := func() {}
	b.ReportAllocs()
	for b.Loop() {
		w.Start(&c, s, gone)
		w.Stop(&c)
	}
}
