package lazydeadline

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// tcpPair returns the two ends of a loopback TCP connection, closed when
// the test ends.
func tcpPair(tb testing.TB) (accepted, peer net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	peer, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	accepted, err = ln.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { accepted.Close(); peer.Close() })
	return accepted, peer
}

// connPair returns a wrapped connection and its peer.
func connPair(t *testing.T) (*Conn, net.Conn) {
	c, peer := tcpPair(t)
	return &Conn{Conn: c}, peer
}

// setAll sets the deadlines ds in turn with set.
func setAll(t *testing.T, set func(time.Time) error, ds ...time.Time) {
	t.Helper()
	for _, d := range ds {
		if err := set(d); err != nil {
			t.Fatal(err)
		}
	}
}

// waitPast returns once t has passed.
func waitPast(t time.Time) {
	for d := time.Until(t); d > 0; d = time.Until(t) {
		time.Sleep(d)
	}
}

// A later read deadline only recorded must not end a read when the timer
// armed earlier fires: the read goes on, and times out at the deadline
// asked for, not before.
func TestLaterReadDeadlineHolds(t *testing.T) {
	c, peer := connPair(t)
	early := time.Now().Add(30 * time.Millisecond)
	want := early.Add(150 * time.Millisecond)
	setAll(t, c.SetReadDeadline, early, want)
	got := make(chan error, 1)
	buf := make([]byte, 8)
	go func() {
		n, err := c.Read(buf)
		if err == nil && string(buf[:n]) != "next" {
			err = errors.New("read " + string(buf[:n]))
		}
		got <- err
	}()
	waitPast(early.Add(20 * time.Millisecond))
	if _, err := peer.Write([]byte("next")); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("read after the armed timer fired, before the deadline: %v", err)
	}

	// Nothing more comes: the read times out, at the deadline asked for.
	want = time.Now().Add(100 * time.Millisecond)
	setAll(t, c.SetReadDeadline, want)
	_, err := c.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with no data: %v, want a deadline error", err)
	}
	if now := time.Now(); now.Before(want) {
		t.Fatalf("read timed out %v before its deadline", want.Sub(now))
	}
}

// A deadline earlier than the armed one is armed at once.
func TestEarlierReadDeadlineIsArmed(t *testing.T) {
	c, peer := connPair(t)
	setAll(t, c.SetReadDeadline, time.Now().Add(time.Hour), time.Now().Add(50*time.Millisecond))
	watchdog := time.AfterFunc(5*time.Second, func() { peer.Close() }) // ends a read the deadline missed
	defer watchdog.Stop()
	_, err := c.Read(make([]byte, 8))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want a deadline error", err)
	}
}

// A clear (zero deadline) is armed at once: no timer set earlier ends a read.
func TestClearedReadDeadline(t *testing.T) {
	c, peer := connPair(t)
	early := time.Now().Add(30 * time.Millisecond)
	setAll(t, c.SetReadDeadline, early, time.Time{})
	c.rd.mu.Lock()
	armed := c.rd.armed
	c.rd.mu.Unlock()
	if !armed.IsZero() {
		t.Fatalf("the clear was recorded only; %v is still armed", armed)
	}
	go func() {
		waitPast(early.Add(20 * time.Millisecond))
		peer.Write([]byte("x")) //nolint:errcheck
	}()
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatalf("read without a deadline: %v", err)
	}
}

// A write blocked on a client that reads nothing goes on past an earlier
// armed timer and sends every byte once the client reads.
func TestLaterWriteDeadlineHolds(t *testing.T) {
	c, peer := connPair(t)
	early := time.Now().Add(30 * time.Millisecond)
	setAll(t, c.SetWriteDeadline, early, time.Now().Add(time.Minute))
	const size = 32 << 20 // far more than the socket buffers hold
	read := make(chan int64, 1)
	go func() {
		waitPast(early.Add(20 * time.Millisecond))
		n, _ := io.Copy(io.Discard, peer)
		read <- n
	}()
	n, err := c.Write(make([]byte, size))
	if err != nil || n != size {
		t.Fatalf("write: %d of %d bytes, %v", n, size, err)
	}
	c.Conn.Close()
	if got := <-read; got != size {
		t.Fatalf("client read %d bytes, want %d", got, size)
	}
}

// BenchmarkRequestDeadlines: the deadline moves fasthttp makes per request
// on a keep-alive client connection (idle, read, write), on a plain TCP
// connection and on a Conn. The clock is read once outside the loop.
func BenchmarkRequestDeadlines(b *testing.B) {
	raw, _ := tcpPair(b)
	run := func(b *testing.B, c net.Conn) {
		t0 := time.Now()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			t := t0.Add(time.Duration(i) * time.Microsecond)
			_ = c.SetReadDeadline(t.Add(2 * time.Minute))
			_ = c.SetReadDeadline(t.Add(time.Minute))
			_ = c.SetWriteDeadline(t.Add(30 * time.Minute))
		}
	}
	b.Run("net.Conn", func(b *testing.B) { run(b, raw) })
	b.Run("lazydeadline.Conn", func(b *testing.B) { run(b, &Conn{Conn: raw}) })
}
