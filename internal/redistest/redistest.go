// Package redistest runs a real redis-server child process for tests: a
// free loopback port, its data (AOF) in a temporary directory, the
// persistence settings of docs/design.md §8.3 (appendonly yes, appendfsync
// always, maxmemory-policy noeviction), stopped when the test ends. A test
// can stop, kill and restart it on the same port and AOF to play an outage.
//
// Without redis-server on PATH the test is skipped, unless the environment
// sets WARMROUTE_REQUIRE_REDIS (CI does): then it fails. Launch serves
// programs that are not tests (make bench-replicas).
package redistest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options of a test Redis; the zero value is the production setup of §8.3.
type Options struct {
	Fsync    string   // "always" (default) or "everysec"
	Password string   // requirepass; URL carries it
	TLS      bool     // serve TLS only, with a self-signed certificate for 127.0.0.1
	Args     []string // extra redis-server arguments
}

// Server is one redis-server child process. Its methods are safe for
// concurrent use.
type Server struct {
	fatal func(error) // tb.Fatal in a test, panic elsewhere
	bin   string
	dir   string
	port  int
	pass  string
	args  []string
	tls   *tls.Config

	mu    sync.Mutex
	cmd   *exec.Cmd
	waitc chan error
}

// Start starts redis-server and waits until it answers PING, or skips tb
// when the binary is absent (fails it when WARMROUTE_REQUIRE_REDIS is set).
// It is stopped at tb's cleanup.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil && os.Getenv("WARMROUTE_REQUIRE_REDIS") != "" {
		tb.Fatal("redis-server not installed and WARMROUTE_REQUIRE_REDIS is set")
	}
	if err != nil {
		tb.Skip("redis-server not installed (apt-get install redis-server): skipping")
	}
	s, err := launch(bin, tb.TempDir(), o, func(err error) { tb.Helper(); tb.Fatal(err) })
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// Launch starts redis-server (on PATH) with its data in dir, outside a
// test: a failed Start or Restart later panics. Stop it when done.
func Launch(dir string, o Options) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errors.New("redis-server not installed (apt-get install redis-server)")
	}
	return launch(bin, dir, o, func(err error) { panic(err) })
}

func launch(bin, dir string, o Options, fatal func(error)) (*Server, error) {
	if o.Fsync == "" {
		o.Fsync = "always"
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{fatal: fatal, bin: bin, dir: dir, port: port, pass: o.Password}
	s.args = []string{"--bind", "127.0.0.1", "--dir", s.dir, "--save", "",
		"--appendonly", "yes", "--appendfsync", o.Fsync, "--maxmemory-policy", "noeviction",
		"--protected-mode", "no", "--daemonize", "no", "--logfile", filepath.Join(s.dir, "redis.log")}
	if o.Password != "" {
		s.args = append(s.args, "--requirepass", o.Password)
	}
	if o.TLS {
		if s.tls, err = writeCert(s.dir); err != nil {
			return nil, err
		}
		s.args = append(s.args, "--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", filepath.Join(s.dir, "cert.pem"), "--tls-key-file", filepath.Join(s.dir, "key.pem"),
			"--tls-auth-clients", "no")
	} else {
		s.args = append(s.args, "--port", strconv.Itoa(s.port))
	}
	s.args = append(s.args, o.Args...)
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	p, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Addr is host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// URL is redis://[:password@]host:port, or rediss:// with TLS.
func (s *Server) URL() string {
	scheme := "redis://"
	if s.tls != nil {
		scheme = "rediss://"
	}
	if s.pass != "" {
		return scheme + ":" + s.pass + "@" + s.Addr()
	}
	return scheme + s.Addr()
}

// TLSConfig is a client config trusting the server's certificate; nil
// without TLS.
func (s *Server) TLSConfig() *tls.Config { return s.tls }

// Dir is the server's data directory (AOF, redis.log).
func (s *Server) Dir() string { return s.dir }

// Running reports whether the process is started.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Start runs the server if it is stopped (same port and directory: the AOF
// is reloaded) and waits until it answers PING.
func (s *Server) Start() {
	if err := s.start(); err != nil {
		s.fatal(err)
	}
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	cmd := exec.Command(s.bin, s.args...)
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for !s.ping() {
		select {
		case err := <-waitc:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-waitc
			return errors.New("redis-server did not answer PING within 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
	s.cmd, s.waitc = cmd, waitc
	return nil
}

// Stop shuts the server down cleanly (SIGTERM) and waits; a no-op when
// stopped.
func (s *Server) Stop() { s.signal(syscall.SIGTERM) }

// Kill crashes the server (SIGKILL) and waits: only what it acknowledged
// under the fsync policy survives a restart.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

// Restart is Stop then Start.
func (s *Server) Restart() {
	s.Stop()
	s.Start()
}

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.waitc:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.waitc
	}
	s.cmd, s.waitc = nil, nil
}

func (s *Server) ping() bool {
	var c net.Conn
	var err error
	d := net.Dialer{Timeout: 200 * time.Millisecond}
	if s.tls != nil {
		c, err = tls.DialWithDialer(&d, "tcp", s.Addr(), s.tls)
	} else {
		c, err = d.Dial("tcp", s.Addr())
	}
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, _ := bufio.NewReader(c).ReadString('\n')
	// +PONG, or -NOAUTH when a password is required: either way it serves.
	return strings.HasPrefix(line, "+PONG") || strings.HasPrefix(line, "-NOAUTH")
}
