package redistest

import (
	"bufio"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// do sends one inline command and returns the first reply line.
func do(t *testing.T, s *Server, cmd string) string {
	t.Helper()
	var c net.Conn
	var err error
	if s.TLSConfig() != nil {
		c, err = tls.Dial("tcp", s.Addr(), s.TLSConfig())
	} else {
		c, err = net.Dial("tcp", s.Addr())
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(line)
}

// The server persists what it acknowledged across a crash, is down while
// stopped, and runs with the §8.3 settings.
func TestStopKillRestart(t *testing.T) {
	s := Start(t, Options{})
	if !strings.HasPrefix(s.URL(), "redis://127.0.0.1:") || !s.Running() {
		t.Fatal(s.URL(), s.Running())
	}
	if got := do(t, s, "SET k v"); got != "+OK" {
		t.Fatal(got)
	}
	s.Kill()
	if s.Running() {
		t.Fatal("running after Kill")
	}
	if c, err := net.DialTimeout("tcp", s.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("port still served after Kill")
	}
	s.Start()
	if got := do(t, s, "GET k"); got != "$1" {
		t.Fatal("acknowledged write lost in a crash:", got)
	}
	s.Restart()
	if got := do(t, s, "CONFIG GET maxmemory-policy"); got != "*2" {
		t.Fatal(got)
	}
	s.Stop()
	s.Stop() // idempotent
	if _, err := os.Stat(filepath.Join(s.Dir(), "redis.log")); err != nil {
		t.Fatal(err)
	}
}

func TestPasswordAndTLS(t *testing.T) {
	s := Start(t, Options{Password: "pw", TLS: true})
	if s.URL() != "rediss://:pw@"+s.Addr() || s.TLSConfig() == nil {
		t.Fatal(s.URL())
	}
	if got := do(t, s, "PING"); !strings.HasPrefix(got, "-NOAUTH") {
		t.Fatal(got)
	}
	if got := do(t, s, "AUTH pw"); got != "+OK" {
		t.Fatal(got)
	}
}
