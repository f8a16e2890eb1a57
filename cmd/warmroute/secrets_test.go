package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"context"

	"github.com/warmroute/warmroute/loadview"
)

// Each secret: the flag wins, then its file, then the environment; the
// flag with its file is an error; a bad file's error names the file, never
// its content; the file is read again on reload, the environment is not.
func TestSecretPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "secret")
	for _, s := range []struct{ flag, env, value string }{
		{"api-key", "WARMROUTE_API_KEY", "k-"},
		{"admin-api-key", "WARMROUTE_ADMIN_API_KEY", "a-"},
		{"redis-url", "WARMROUTE_REDIS_URL", "redis://:pw@127.0.0.1:6379/0?client_name=x"},
	} {
		t.Setenv(s.env, s.value+"env")
		got := func(o *options) string {
			switch s.flag {
			case "api-key":
				return o.apiKey
			case "admin-api-key":
				return o.adminAPIKey
			}
			return o.redisURL
		}
		parse := func(args ...string) (*options, error) {
			return parseFlags(append([]string{"--allow-empty-fleet"}, args...), io.Discard)
		}
		if o, err := parse(); err != nil || got(o) != s.value+"env" {
			t.Fatalf("%s from the environment: %v", s.flag, err)
		}
		writeFile(t, file, "  "+s.value+"file\n")
		if o, err := parse("--"+s.flag+"-file", file); err != nil || got(o) != s.value+"file" {
			t.Fatalf("--%s-file over the environment: %v", s.flag, err)
		}
		if o, err := parse("--"+s.flag, s.value+"flag"); err != nil || got(o) != s.value+"flag" {
			t.Fatalf("--%s over the environment: %v", s.flag, err)
		}
		if _, err := parse("--"+s.flag, s.value+"flag", "--"+s.flag+"-file", file); err == nil {
			t.Fatalf("--%s with --%s-file accepted", s.flag, s.flag)
		}
		for _, bad := range []string{"", "\n \n", s.value + "one\n" + s.value + "two\n"} {
			writeFile(t, file, bad)
			_, err := parse("--"+s.flag+"-file", file)
			if err == nil || !strings.Contains(err.Error(), file) || (bad != "" && strings.Contains(err.Error(), s.value+"one")) {
				t.Fatalf("--%s-file of %q: %v", s.flag, bad, err)
			}
		}
		if _, err := parse("--"+s.flag+"-file", filepath.Join(dir, "missing")); err == nil {
			t.Fatalf("--%s-file of a missing file accepted", s.flag)
		}
	}
	// A reload reads the file again, and never the environment again.
	writeFile(t, file, "first")
	o, err := parseFlags([]string{"--allow-empty-fleet", "--api-key-file", file}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, file, "second")
	t.Setenv("WARMROUTE_ADMIN_API_KEY", "changed")
	a, err := readAuth(o)
	if err != nil || a.APIKey != "second" || a.AdminAPIKey != "a-env" {
		t.Fatalf("reload read api key %q, admin key %q (%v); want the file's new one and the start's environment", a.APIKey, a.AdminAPIKey, err)
	}
}

func FuzzAllowListLines(f *testing.F) {
	for _, s := range []string{"", "10.0.0.0/8\n# c\ngpu-1, gpu-2 # two\n", "#only\n\n", "[fd00::1]\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, e := range allowListLines(b) {
			if e == "" || strings.ContainsAny(e, "#\n") || e != strings.TrimSpace(e) {
				t.Fatalf("entry %q of %q", e, b)
			}
		}
		if entries, err := loadview.ParseAllowList(strings.Join(allowListLines(b), ",")); err == nil {
			if err := loadview.NewRegistry(loadview.Config{}).SetAllowedWorkers(entries); err != nil {
				t.Fatalf("ParseAllowList's entries refused: %v", err)
			}
		}
	})
}

// writePair writes a self-signed certificate for 127.0.0.1 named cn and
// its key.
func writePair(t *testing.T, certPath, keyPath, cn string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, certPath, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeFile(t, keyPath, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})))
}

// A reload gives new TLS handshakes the new pair; an open connection keeps
// serving; a pair that does not match is rejected and the last good pair
// stays.
func TestReloadSwapsTheTLSCertificate(t *testing.T) {
	w := startSim(t, "m", 1)
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writePair(t, cert, key, "first")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, code := startMain(t, ctx, "--worker-urls", w, "--tls-cert-file", cert, "--tls-key-file", key, "--admin-api-key", "adm")
	peer := func() (string, *tls.Conn) {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test reads which certificate is served
		if err != nil {
			t.Fatal(err)
		}
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName, c
	}
	reload := func() string {
		_, c := peer()
		defer c.Close()
		if _, err := io.WriteString(c, "POST /reload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer adm\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(c)
		return string(b)
	}
	cn, open := peer()
	defer open.Close()
	if cn != "first" {
		t.Fatalf("served %q", cn)
	}
	writePair(t, cert, key, "second")
	if r := reload(); !strings.HasPrefix(r, "HTTP/1.1 200") {
		t.Fatalf("reload: %.200s", r)
	}
	if cn, c := peer(); cn != "second" {
		t.Fatalf("after the reload a new handshake got %q", cn)
	} else {
		c.Close()
	}
	writePair(t, filepath.Join(dir, "other.pem"), key, "third") // the key no longer matches cert.pem
	if r := reload(); !strings.HasPrefix(r, "HTTP/1.1 422") {
		t.Fatalf("a mismatched pair: %.200s", r)
	}
	if cn, c := peer(); cn != "second" {
		t.Fatalf("after a rejected reload a new handshake got %q", cn)
	} else {
		c.Close()
	}
	if _, err := io.WriteString(open, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(open); !strings.HasPrefix(string(b), "HTTP/1.1 200") {
		t.Fatalf("the connection opened before the reloads: %.200s", b)
	}
	cancel()
	<-code
}
