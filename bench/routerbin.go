package bench

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
)

// RepoRoot walks up from the working directory to the directory holding
// go.mod (make runs from the root, go test from the package's directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = up
	}
}

// BuildRouter builds the tree's ./cmd/warmroute into dir and returns the
// binary's path: the harnesses that measure the real router binary over
// loopback.
func BuildRouter(dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "warmroute")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/warmroute")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/warmroute: %v\n%s", err, out)
	}
	return bin, nil
}

// FreePort returns a loopback TCP port that was free a moment ago, for a
// process the harness starts.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
