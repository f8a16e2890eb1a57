package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/bench"
)

// flagRe matches a flag's line in Go's flag usage: two spaces, a dash, the
// name.
var flagRe = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)

// binary is a router binary and what its -h says it supports.
type binary struct {
	path  string
	flags map[string]bool
	// namedKeys: --client-api-keys takes name:key lines (its help says so,
	// or the binary has the queue, which came with them); otherwise a line
	// is the key itself.
	namedKeys bool
}

// inspect runs bin -h and records its flags.
func inspect(bin string) (*binary, error) {
	out, _ := exec.Command(bin, "-h").CombinedOutput() // -h exits 0 or 2 by flag package convention
	help := string(out)
	b := &binary{path: bin, flags: map[string]bool{}}
	for _, m := range flagRe.FindAllStringSubmatch(help, -1) {
		b.flags[m[1]] = true
	}
	if !b.flags["port"] {
		return nil, fmt.Errorf("%s -h lists no --port: not a warmroute binary? %q", bin, firstLine(help))
	}
	b.namedKeys = strings.Contains(help, "name:key") || b.flags["queue-order"]
	return b, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// router is one warmroute subprocess on loopback ports.
type router struct {
	cmd  *exec.Cmd
	base string // http://127.0.0.1:port (inference)
	done chan struct{}
	tail *tailLog
}

// tailLog keeps the last lines of the router's stderr.
type tailLog struct {
	mu    sync.Mutex
	lines []string
}

func (t *tailLog) add(s string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.lines) == 40 {
		t.lines = t.lines[1:]
	}
	t.lines = append(t.lines, s)
}

func (t *tailLog) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, " | ")
}

// startRouter runs bin with args in front of workers and waits (10 s) until
// /readiness answers 200: a worker is registered and healthy.
func startRouter(bin string, workers []string, args []string) (*router, error) {
	port, err := bench.FreePort()
	if err != nil {
		return nil, err
	}
	mport, err := bench.FreePort()
	if err != nil {
		return nil, err
	}
	full := append([]string{"--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--prometheus-host", "127.0.0.1", "--prometheus-port", strconv.Itoa(mport), "--log-level", "warn"}, args...)
	full = append(append(full, "--worker-urls"), workers...) // last: the list runs to the next flag
	r := &router{cmd: exec.Command(bin, full...), base: fmt.Sprintf("http://127.0.0.1:%d", port),
		done: make(chan struct{}), tail: &tailLog{}}
	r.cmd.Stdout = io.Discard
	stderr, err := r.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			r.tail.add(sc.Text())
		}
		r.cmd.Wait() //nolint:errcheck // the exit is reported through done
		close(r.done)
	}()
	c := &http.Client{Timeout: time.Second}
	defer c.CloseIdleConnections()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-r.done:
			return nil, fmt.Errorf("router exited at start: %s", r.tail)
		default:
		}
		if resp, err := c.Get(r.base + "/readiness"); err == nil {
			io.Copy(io.Discard, resp.Body) //nolint:errcheck // drained for reuse
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r, nil
			}
		}
		time.Sleep(50 * time.Millisecond) // polling a subprocess's start, not a synchronisation between goroutines
	}
	r.stop()
	return nil, fmt.Errorf("router not ready within 10 s: %s", r.tail)
}

// stop ends the router: SIGTERM, then SIGKILL after 5 s.
func (r *router) stop() {
	select {
	case <-r.done:
		return
	default:
	}
	r.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may have exited meanwhile
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		r.cmd.Process.Kill() //nolint:errcheck // as above
		<-r.done
	}
}

// exited reports whether the router process has ended.
func (r *router) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// cpu is the CPU time the router process used, once it has exited.
func (r *router) cpu() time.Duration {
	if !r.exited() || r.cmd.ProcessState == nil {
		return 0
	}
	return r.cmd.ProcessState.UserTime() + r.cmd.ProcessState.SystemTime()
}
