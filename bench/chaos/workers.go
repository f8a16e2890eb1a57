package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/simworker"
)

// model is the model every worker of the harness serves.
const model = "sim-model"

// simConfig is the configuration of the harness's simulated workers.
func simConfig(scale float64) simworker.Config {
	return simworker.Config{Models: []string{model}, TimeScale: scale, HangLimit: 20 * time.Second}
}

// startSim runs one in-process simulated worker on a free loopback port.
func startSim(scale float64) (*simworker.Worker, string, error) {
	return simworker.Start(simConfig(scale))
}

// restartSim serves a fresh simulated worker on addr (host:port), the port
// of one that was closed.
func restartSim(addr string, scale float64) (*simworker.Worker, error) {
	ln, err := listenAgain(addr)
	if err != nil {
		return nil, err
	}
	w := simworker.New(simConfig(scale))
	go w.Serve(ln) //nolint:errcheck // returns at Close
	return w, nil
}

// listenAgain listens on addr, the port of a listener just closed.
func listenAgain(addr string) (net.Listener, error) {
	var ln net.Listener
	var err error
	for range 50 { // the old listener may take a moment to let go
		if ln, err = net.Listen("tcp", addr); err == nil {
			return ln, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil, err
}

// countingListener counts the connections it accepted that are still
// open, and those closed.
type countingListener struct {
	net.Listener
	open, closed atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, l: l}, nil
}

type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.closed.Add(1)
	})
	return c.Conn.Close()
}

// Bad-worker modes: what a badWorker does with an inference (POST) request.
// GET /v1/models and GET /health always answer correctly, so the router
// registers the worker as healthy, serving `model`. A request header
// `x-bad: MODE` overrides the worker's mode for that request.
const (
	modeOK         = "ok"        // 200, a minimal chat completion
	modeHang       = "hang"      // read the request, never answer; notice when the peer closes
	modeGarbage    = "garbage"   // a garbage status line, then close
	modeEcho       = "echo"      // 200 whose body is the request headers as JSON
	modeEcho500    = "echo500"   // 500 whose body is the request headers as JSON
	mode500        = "500"       // 500 with a raw marker and the worker's address in the body
	mode429        = "429"       // 429 with Retry-After: 7
	mode503        = "503"       // 503 with Retry-After: 7
	modeDieStream  = "diestream" // 200 text/event-stream, one chunk, then close
	modeReset      = "reset"     // read the request, reset the connection (TCP RST) without a byte
	rawMarker      = "UPSTREAM-RAW-BYTES-7f3a"
	garbageMarker  = "GARBAGE-STATUS-9c1e"
	badRetryAfter  = "7"
	echoMarkerName = "X-Client-Marker"
	echoMarker     = "ECHO-MARKER-42"
)

// badWorker is a tiny raw HTTP/1.1 server that misbehaves on purpose.
type badWorker struct {
	ln   net.Listener
	addr string // 127.0.0.1:port
	url  string // http://addr
	mode atomic.Pointer[string]

	mu    sync.Mutex
	conns map[net.Conn]struct{}

	inference  atomic.Int64 // POSTs received
	health     atomic.Int64 // GET /health received
	lastHealth atomic.Int64 // unix nanos of the last GET /health
	firstHang  atomic.Int64 // unix nanos of the first hung request
	// healthAfterHang: unix nanos of the first GET /health after firstHang.
	healthAfterHang atomic.Int64
	peerClosed      atomic.Int64 // hung requests whose connection the router closed
	lastClosed      atomic.Int64 // unix nanos of the last such close

	blackhole []int // raw fds of the never-accepting listener (and its queued conns)
}

func startBad(mode string) (*badWorker, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &badWorker{ln: ln, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	b.url = "http://" + b.addr
	b.setMode(mode)
	go b.accept()
	return b, nil
}

func (b *badWorker) setMode(m string) { b.mode.Store(&m) }

func (b *badWorker) accept() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		b.conns[c] = struct{}{}
		b.mu.Unlock()
		go b.serve(c)
	}
}

// kill closes the listener and every connection: the port now refuses.
func (b *badWorker) kill() {
	b.ln.Close()
	b.mu.Lock()
	for c := range b.conns {
		c.Close()
	}
	b.mu.Unlock()
}

// close releases everything, the never-accepting socket included.
func (b *badWorker) close() {
	b.kill()
	for _, fd := range b.blackhole {
		syscall.Close(fd)
	}
	b.blackhole = nil
}

// becomeBlackhole replaces the worker by a socket on the same port that
// listens (backlog 0) but never accepts, and fills its accept queue: new
// SYNs are then dropped and connects time out, as to a host that is gone.
func (b *badWorker) becomeBlackhole() error {
	b.kill()
	tcp := b.ln.Addr().(*net.TCPAddr)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		return err
	}
	syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	sa := &syscall.SockaddrInet4{Port: tcp.Port, Addr: [4]byte{127, 0, 0, 1}}
	if err := syscall.Bind(fd, sa); err != nil {
		syscall.Close(fd)
		return err
	}
	if err := syscall.Listen(fd, 0); err != nil {
		syscall.Close(fd)
		return err
	}
	b.blackhole = append(b.blackhole, fd)
	// Fill the queue with connections nobody accepts until one hangs.
	for range 8 {
		cfd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK, 0)
		if err != nil {
			return err
		}
		b.blackhole = append(b.blackhole, cfd)
		syscall.Connect(cfd, sa) // EINPROGRESS
		time.Sleep(30 * time.Millisecond)
	}
	c, err := net.DialTimeout("tcp", b.addr, 300*time.Millisecond)
	if err == nil {
		c.Close()
		return fmt.Errorf("blackhole %s still accepts connections", b.addr)
	}
	return nil
}

func (b *badWorker) serve(c net.Conn) {
	defer func() {
		c.Close()
		b.mu.Lock()
		delete(b.conns, c)
		b.mu.Unlock()
	}()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body)
		_ = body
		switch {
		case req.Method == "GET" && req.URL.Path == "/v1/models":
			writeResp(c, 200, "application/json", `{"object":"list","data":[{"id":"`+model+`","object":"model","owned_by":"bad"}]}`, nil)
			continue
		case req.Method == "GET" && req.URL.Path == "/health":
			b.health.Add(1)
			now := time.Now().UnixNano()
			b.lastHealth.Store(now)
			if b.firstHang.Load() != 0 {
				b.healthAfterHang.CompareAndSwap(0, now)
			}
			writeResp(c, 200, "text/plain", "", nil)
			continue
		case req.Method != "POST":
			writeResp(c, 404, "application/json", `{"error":{"message":"no route","type":"not_found_error","param":null,"code":null}}`, nil)
			continue
		}
		b.inference.Add(1)
		mode := *b.mode.Load()
		if m := req.Header.Get("x-bad"); m != "" {
			mode = m
		}
		switch mode {
		case modeOK:
			writeResp(c, 200, "application/json", okCompletion, nil)
		case modeHang:
			b.firstHang.CompareAndSwap(0, time.Now().UnixNano())
			var one [1]byte
			c.SetReadDeadline(time.Now().Add(60 * time.Second))
			if _, err := c.Read(one[:]); err != nil {
				if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
					b.peerClosed.Add(1)
					b.lastClosed.Store(time.Now().UnixNano())
				}
			}
			return
		case modeGarbage:
			io.WriteString(c, garbageMarker+" "+rawMarker+" \x00\x01\r\nX: y\r\n\r\n")
			return
		case modeEcho, modeEcho500:
			h := map[string]string{}
			for k, v := range req.Header {
				h[strings.ToLower(k)] = strings.Join(v, ", ")
			}
			hb, _ := json.Marshal(h)
			status := 200
			if mode == modeEcho500 {
				status = 500
			}
			writeResp(c, status, "application/json", `{"id":"chatcmpl-echo","object":"chat.completion","model":"`+model+
				`","choices":[{"index":0,"message":{"role":"assistant","content":"echo"},"finish_reason":"stop"}],"echo_headers":`+string(hb)+`}`, nil)
		case mode500:
			writeResp(c, 500, "application/json", `{"error":{"message":"`+rawMarker+` at `+b.addr+`","type":"server_error","param":null,"code":null}}`, nil)
		case mode429, mode503:
			status := 429
			if mode == mode503 {
				status = 503
			}
			writeResp(c, status, "application/json", `{"error":{"message":"busy","type":"server_error","param":null,"code":null}}`,
				map[string]string{"Retry-After": badRetryAfter})
		case modeDieStream:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
			ev := `data: {"id":"chatcmpl-die","object":"chat.completion.chunk","model":"` + model + `","choices":[{"index":0,"delta":{"role":"assistant","content":"partial"},"finish_reason":null}]}` + "\n\n"
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
			time.Sleep(100 * time.Millisecond)
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0) // reset: the worker died
			}
			return
		case modeReset:
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetLinger(0)
			}
			return
		default:
			writeResp(c, 500, "text/plain", "unknown bad mode "+mode, nil)
		}
	}
}

const okCompletion = `{"id":"chatcmpl-bad","object":"chat.completion","created":1,"model":"` + model +
	`","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`

func writeResp(c net.Conn, status int, ctype, body string, hdr map[string]string) {
	var sb strings.Builder
	fmt.Fprintf(&sb, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n", status, http.StatusText(status), ctype, len(body))
	for k, v := range hdr {
		fmt.Fprintf(&sb, "%s: %s\r\n", k, v)
	}
	sb.WriteString("\r\n")
	sb.WriteString(body)
	io.WriteString(c, sb.String())
}
