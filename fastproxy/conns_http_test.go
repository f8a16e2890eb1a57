package fastproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/fastproxy"
	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/simworker"
)

// patience bounds a request that must not wait for an idle connection to
// time out: far below the header timeout of these tests.
const patience = 10 * time.Second

// rawConn is a client connection to the router driven by hand.
type rawConn struct {
	net.Conn
	br *bufio.Reader
}

func dialRouter(t *testing.T, r *testRouter) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{Conn: c, br: bufio.NewReader(c)}
}

// chat sends one non-streaming chat request on c and reads its answer.
func (c *rawConn) chat(t *testing.T) int {
	t.Helper()
	body := chatBody("m", "hi", false)
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
	c.SetDeadline(time.Now().Add(patience)) //nolint:errcheck
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	return resp.StatusCode
}

// closedByRouter reports whether the router closed c (within patience),
// after what it sent (a 408 for a request that never came).
func (c *rawConn) closedByRouter() bool {
	c.SetReadDeadline(time.Now().Add(patience)) //nolint:errcheck
	_, err := io.Copy(io.Discard, c.br)
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// freshRequest sends one request on a new connection, waiting no longer
// than patience.
func freshRequest(t *testing.T, r *testRouter) (int, error) {
	t.Helper()
	cl := &http.Client{Timeout: patience, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "hi", false)))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	return resp.StatusCode, nil
}

// Idle connections filling the cap make room for a new one, the oldest
// idle first; they do not keep it waiting until they time out
// (docs/design.md §8.1, "Bounds"). The silent connection is dialled
// first: the router accepts in arrival order, so it is idle before the
// keep-alive one whatever the scheduling (the other way round, the
// keep-alive connection's idle mark, set by its server goroutine after the
// answer, could come after the next accept on a busy machine).
func TestIdleConnectionsDoNotStarveNewOnes(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "round_robin", func(fc *fastproxy.Config, _ *loadview.Config) { fc.MaxConns = 2 })

	silent := dialRouter(t, r) // never sends a byte
	kept := dialRouter(t, r)   // keep-alive, idle after its request
	if code := kept.chat(t); code != http.StatusOK {
		t.Fatalf("first request: %d", code)
	}

	if code, err := freshRequest(t, r); err != nil || code != http.StatusOK {
		t.Fatalf("a new connection with the cap full of idle ones: %d, %v; want 200 at once", code, err)
	}
	if !silent.closedByRouter() {
		t.Fatal("the oldest idle connection (open since its accept, no byte sent) was not closed")
	}
	if code := kept.chat(t); code != http.StatusOK { // still open: only the oldest was closed
		t.Fatalf("the younger idle connection (keep-alive since its answer): %d, want 200", code)
	}
	waitIdle(t, r.reg)
}

// A connection with a request in flight is never closed to make room: the
// new connection takes an idle one's place, or waits.
func TestBusyConnectionsAreNeverClosedForRoom(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "round_robin", func(fc *fastproxy.Config, _ *loadview.Config) { fc.MaxConns = 2 })

	type result struct {
		code int
		body string
		err  error
	}
	busy := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", strings.NewReader(chatBody("m", "long", true)))
		req.Header.Set(simworker.FaultHeader, "slow=500") // in flight, no byte yet, while the others come
		resp, err := (&http.Client{Timeout: patience}).Do(req)
		if err != nil {
			busy <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		busy <- result{resp.StatusCode, string(b), err}
	}()
	w := r.reg.Workers()[0]
	testwait.Until(t, "the stream in flight on its worker", func() bool { return w.Load() == 1 })

	silent := dialRouter(t, r)
	if code, err := freshRequest(t, r); err != nil || code != http.StatusOK {
		t.Fatalf("a new connection with one busy and one idle: %d, %v; want 200 at once", code, err)
	}
	if !silent.closedByRouter() {
		t.Fatal("the idle connection was not closed to make room")
	}
	res := <-busy
	if res.err != nil || res.code != http.StatusOK || !strings.Contains(res.body, "data: [DONE]") || strings.Contains(res.body, "error") {
		t.Fatalf("the stream in flight: %d %v %q; want it whole", res.code, res.err, res.body)
	}
	waitIdle(t, r.reg)
}

// A connection that sends no byte is closed after --client-header-timeout-secs;
// a body that takes longer than that once the headers are in is still read.
func TestClientHeaderTimeout(t *testing.T) {
	const headerTimeout = 200 * time.Millisecond
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "round_robin", func(fc *fastproxy.Config, _ *loadview.Config) { fc.ClientHeaderTimeout = headerTimeout })

	start := time.Now()
	silent := dialRouter(t, r)
	if !silent.closedByRouter() {
		t.Fatalf("a connection that sent nothing was still open after %v", patience)
	}
	if d := time.Since(start); d < headerTimeout {
		t.Fatalf("closed after %v, before the header timeout", d)
	}

	slow := dialRouter(t, r)
	body := chatBody("m", "hi", false)
	io.WriteString(slow, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: "+ //nolint:errcheck
		strconv.Itoa(len(body))+"\r\n\r\n"+body[:5])
	time.Sleep(2 * headerTimeout)                  // the behaviour under test: a body slower than the header timeout
	io.WriteString(slow, body[5:])                 //nolint:errcheck
	slow.SetReadDeadline(time.Now().Add(patience)) //nolint:errcheck
	resp, err := http.ReadResponse(slow.br, nil)
	if err != nil {
		t.Fatalf("a body slower than the header timeout: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a body slower than the header timeout: %d, want 200", resp.StatusCode)
	}
}

// A new connection that finds every slot busy waits, and takes the place of
// the first connection to turn idle rather than waiting for it to time out.
func TestWaitingConnectionTakesTheFirstIdleOnesPlace(t *testing.T) {
	_, urls := startSims(t, 1, fastSim())
	r := startRouter(t, urls, "round_robin", func(fc *fastproxy.Config, _ *loadview.Config) { fc.MaxConns = 1 })

	kept := dialRouter(t, r)
	body := chatBody("m", "hi", false)
	io.WriteString(kept, "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nx-sim-fault: slow=300\r\nContent-Type: application/json\r\nContent-Length: "+ //nolint:errcheck
		strconv.Itoa(len(body))+"\r\n\r\n"+body)
	w := r.reg.Workers()[0]
	testwait.Until(t, "the request in flight on its worker", func() bool { return w.Load() == 1 })

	fresh := make(chan error, 1)
	go func() {
		code, err := freshRequest(t, r)
		if err == nil && code != http.StatusOK {
			err = errors.New("status " + strconv.Itoa(code))
		}
		fresh <- err
	}()
	kept.SetReadDeadline(time.Now().Add(patience)) //nolint:errcheck
	resp, err := http.ReadResponse(kept.br, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the request in flight: %v %v; it must complete", resp, err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	if err := <-fresh; err != nil {
		t.Fatalf("the waiting connection: %v; want 200 once the busy one turned idle", err)
	}
	if !kept.closedByRouter() {
		t.Fatal("the connection that turned idle was not closed for the waiting one")
	}
	waitIdle(t, r.reg)
}
