package sharedstate

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// redisServer is a redis-server child process on a free loopback port with
// its data (AOF) in a temporary directory, for tests. It is stopped when
// the test ends.
type redisServer struct {
	tb    testing.TB
	bin   string
	dir   string
	port  int
	args  []string
	tls   *tls.Config // client config when started with TLS
	cmd   *exec.Cmd
	waitc chan error
}

// redisOpts: extra redis-server arguments, fsync policy and TLS.
type redisOpts struct {
	fsync string // "always" (default) or "everysec"
	extra []string
	tls   bool
}

// startRedis starts redis-server with the persistence of doc.go
// (appendonly yes, appendfsync always, maxmemory-policy noeviction) or
// skips the test when the binary is absent — unless WARMROUTE_REQUIRE_REDIS
// is set (CI sets it), where an absent binary fails the test instead.
func startRedis(tb testing.TB, o redisOpts) *redisServer {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil && os.Getenv("WARMROUTE_REQUIRE_REDIS") != "" {
		tb.Fatal("redis-server not installed and WARMROUTE_REQUIRE_REDIS is set")
	}
	if err != nil {
		tb.Skip("redis-server not installed (apt-get install redis-server): skipping the Redis store tests")
	}
	if o.fsync == "" {
		o.fsync = "always"
	}
	r := &redisServer{tb: tb, bin: bin, dir: tb.TempDir(), port: freePort(tb)}
	r.args = []string{"--bind", "127.0.0.1", "--dir", r.dir, "--save", "",
		"--appendonly", "yes", "--appendfsync", o.fsync, "--maxmemory-policy", "noeviction",
		"--protected-mode", "no", "--daemonize", "no", "--logfile", filepath.Join(r.dir, "redis.log")}
	if o.tls {
		r.tls = writeCert(tb, r.dir)
		r.args = append(r.args, "--port", "0", "--tls-port", strconv.Itoa(r.port),
			"--tls-cert-file", filepath.Join(r.dir, "cert.pem"), "--tls-key-file", filepath.Join(r.dir, "key.pem"),
			"--tls-auth-clients", "no")
	} else {
		r.args = append(r.args, "--port", strconv.Itoa(r.port))
	}
	r.args = append(r.args, o.extra...)
	r.start()
	tb.Cleanup(func() { r.stop(syscall.SIGTERM) })
	return r
}

func freePort(tb testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (r *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *redisServer) url() string {
	if r.tls != nil {
		return "rediss://" + r.addr()
	}
	return "redis://" + r.addr()
}

// start runs the server (same directory and port: a restart reloads the
// AOF) and waits until it answers PING.
func (r *redisServer) start() {
	r.tb.Helper()
	r.cmd = exec.Command(r.bin, r.args...)
	if err := r.cmd.Start(); err != nil {
		r.tb.Fatal(err)
	}
	r.waitc = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(r.cmd, r.waitc)
	deadline := time.Now().Add(10 * time.Second)
	for !r.ping() {
		select {
		case err := <-r.waitc:
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			r.tb.Fatalf("redis-server exited: %v\n%s", err, log)
		default:
		}
		if time.Now().After(deadline) {
			r.tb.Fatal("redis-server did not answer PING within 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
}

func (r *redisServer) ping() bool {
	var c net.Conn
	var err error
	d := net.Dialer{Timeout: 200 * time.Millisecond}
	if r.tls != nil {
		c, err = tls.DialWithDialer(&d, "tcp", r.addr(), r.tls)
	} else {
		c, err = d.Dial("tcp", r.addr())
	}
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, _ := bufio.NewReader(c).ReadString('\n')
	// +PONG, or -NOAUTH when a password is required: either way it serves.
	return strings.HasPrefix(line, "+PONG") || strings.HasPrefix(line, "-NOAUTH")
}

// stop sends sig (SIGKILL: a crash; SIGTERM: a clean shutdown) and waits.
func (r *redisServer) stop(sig syscall.Signal) {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(sig)
	select {
	case <-r.waitc:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.waitc
	}
	r.cmd = nil
}

// writeCert writes a self-signed certificate for 127.0.0.1 to dir and
// returns a client config trusting it.
func writeCert(tb testing.TB, dir string) *tls.Config {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "warmroute-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(filepath.Join(dir, "cert.pem"), certPEM, 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(tb testing.TB, d time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("condition not reached within %v: %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
