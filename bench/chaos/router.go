package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warmroute/warmroute/bench"
)

// logBuf collects the router's stderr (slog text lines), safe for
// concurrent use.
type logBuf struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuf) add(s string) {
	l.mu.Lock()
	l.lines = append(l.lines, s)
	l.mu.Unlock()
}

// since returns the lines from index i on; mark returns the current index.
func (l *logBuf) since(i int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i > len(l.lines) {
		return nil
	}
	return append([]string(nil), l.lines[i:]...)
}

func (l *logBuf) mark() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

func (l *logBuf) tail(n int) string {
	all := l.since(0)
	if len(all) > n {
		all = all[len(all)-n:]
	}
	return strings.Join(all, "\n")
}

// router is one warmroute subprocess on loopback ports.
type router struct {
	cmd        *exec.Cmd
	pid        int
	port       int
	mport      int
	addr       string // 127.0.0.1:port (inference)
	base       string // http://127.0.0.1:port
	mbase      string // http://127.0.0.1:mport (metrics/admin listener)
	logs       *logBuf
	done       chan struct{} // closed when the process exited
	exitCode   int
	exitReason string
}

// routerOpts configure startRouter.
type routerOpts struct {
	workers []string // --worker-urls (space separated, the vLLM router's form)
	args    []string // further flags
	nofile  int      // RLIMIT_NOFILE (soft and hard) when > 0, set by prlimit or sh's ulimit
}

// startRouter runs bin and waits until /liveness and /metrics answer (10 s).
func startRouter(bin string, o routerOpts) (*router, error) {
	port, mport := mustFreePort(), mustFreePort()
	r := &router{port: port, mport: mport, logs: &logBuf{}, done: make(chan struct{})}
	r.addr = fmt.Sprintf("127.0.0.1:%d", r.port)
	r.base = "http://" + r.addr
	r.mbase = fmt.Sprintf("http://127.0.0.1:%d", r.mport)
	args := []string{"--host", "127.0.0.1", "--port", strconv.Itoa(r.port),
		"--prometheus-host", "127.0.0.1", "--prometheus-port", strconv.Itoa(r.mport)}
	args = append(args, o.args...)
	if len(o.workers) > 0 { // last: the space-separated list runs to the next flag
		args = append(append(args, "--worker-urls"), o.workers...)
	}
	name := bin
	if o.nofile > 0 {
		n := strconv.Itoa(o.nofile)
		if p, err := exec.LookPath("prlimit"); err == nil {
			args = append([]string{"--nofile=" + n + ":" + n, "--", bin}, args...)
			name = p
		} else {
			args = append([]string{"-c", `ulimit -n ` + n + ` && exec "$0" "$@"`, bin}, args...)
			name = "/bin/sh"
		}
	}
	r.cmd = exec.Command(name, args...)
	r.cmd.Stdout = io.Discard
	stderr, err := r.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := r.cmd.Start(); err != nil {
		return nil, err
	}
	r.pid = r.cmd.Process.Pid
	scanDone := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			r.logs.add(sc.Text())
		}
		close(scanDone)
	}()
	go func() {
		<-scanDone
		err := r.cmd.Wait()
		r.exitCode = r.cmd.ProcessState.ExitCode()
		if err != nil {
			r.exitReason = err.Error()
		} else {
			r.exitReason = "exit status 0"
		}
		close(r.done)
	}()
	deadline := time.Now().Add(10 * time.Second)
	c := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if r.exited() {
			return nil, fmt.Errorf("router exited at start (%s): %s", r.exitReason, startFailure(r.logs))
		}
		if ok(c, r.base+"/liveness") && ok(c, r.mbase+"/metrics") {
			return r, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.kill()
	return nil, fmt.Errorf("router not ready within 10 s: %s", oneLine(r.logs.tail(3)))
}

// startFailure picks the line that says why the router would not start
// (`warmroute: ...`, e.g. an unknown flag), else the last lines.
func startFailure(l *logBuf) string {
	for _, line := range l.since(0) {
		if strings.HasPrefix(line, "warmroute:") || strings.Contains(line, "flag provided but not defined") {
			return strings.TrimSpace(line)
		}
	}
	return oneLine(l.tail(3))
}

func ok(c *http.Client, url string) bool {
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == 200
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " | ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func (r *router) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// kill ends the process (SIGKILL) and waits for it.
func (r *router) kill() {
	if !r.exited() {
		r.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-r.done:
		case <-time.After(5 * time.Second):
		}
	}
}

// rssKB is VmRSS from /proc/PID/status (-1 when unreadable).
func (r *router) rssKB() int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.pid))
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return -1
}

// fds counts /proc/PID/fd (-1 when unreadable).
func (r *router) fds() int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", r.pid))
	if err != nil {
		return -1
	}
	return len(es)
}

var obsClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}

// metrics returns the text of the metrics listener's /metrics.
func (r *router) metrics() (string, error) {
	resp, err := obsClient.Get(r.mbase + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("/metrics: status %d", resp.StatusCode)
	}
	return string(b), err
}

// metricSum sums the samples of one metric name (any labels); ok is false
// when the name has no sample or /metrics failed.
func (r *router) metricSum(name string) (float64, bool) {
	text, err := r.metrics()
	if err != nil {
		return 0, false
	}
	return sumMetric(text, name)
}

func sumMetric(text, name string) (float64, bool) {
	var sum float64
	found := false
	for line := range strings.SplitSeq(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		i := strings.LastIndexByte(rest, ' ')
		v, err := strconv.ParseFloat(rest[i+1:], 64)
		if err == nil {
			sum += v
			found = true
		}
	}
	return sum, found
}

// metricSamples returns every sample line of one metric name.
func metricSamples(text, name string) []string {
	var out []string
	for line := range strings.SplitSeq(text, "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && rest != "" && (rest[0] == '{' || rest[0] == ' ') {
			out = append(out, line)
		}
	}
	return out
}

// goroutines is go_goroutines from /metrics (-1 when unavailable).
func (r *router) goroutines() int {
	v, ok := r.metricSum("go_goroutines")
	if !ok {
		return -1
	}
	return int(v)
}

// load is the router's load counter: the sum of `load` in GET /workers on
// the metrics listener when it serves that, else the sum of
// vllm_router_running_requests on /metrics (-1 when neither answers).
func (r *router) load() int {
	if n, ok := r.workersLoad(); ok {
		return n
	}
	if v, ok := r.metricSum("vllm_router_running_requests"); ok {
		return int(v)
	}
	return -1
}

func (r *router) workersLoad() (int, bool) {
	ws, err := r.workers(r.mbase, "")
	if err != nil {
		return 0, false
	}
	n := 0
	for _, w := range ws {
		n += w.Load
	}
	return n, true
}

type workerRow struct {
	URL     string `json:"url"`
	Healthy bool   `json:"healthy"`
	Load    int    `json:"load"`
}

// workers is GET base/workers (bearer when key != "").
func (r *router) workers(base, key string) ([]workerRow, error) {
	req, _ := http.NewRequest("GET", base+"/workers", nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := obsClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET /workers: %d", resp.StatusCode)
	}
	var v struct {
		Workers []workerRow `json:"workers"`
	}
	if err := jsonUnmarshal(b, &v); err != nil {
		return nil, err
	}
	return v.Workers, nil
}

// healthOf reports the router's view of one worker's health from
// vllm_router_worker_health{worker="url"} (ok false when absent).
func (r *router) healthOf(url string) (healthy, ok bool) {
	text, err := r.metrics()
	if err != nil {
		return false, false
	}
	for _, s := range metricSamples(text, "vllm_router_worker_health") {
		if strings.Contains(s, `"`+url+`"`) {
			return strings.HasSuffix(s, " 1"), true
		}
	}
	return false, false
}

// settleLoad polls the load counter until it is 0 or d passes.
func (r *router) settleLoad(d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		n := r.load()
		if n == 0 || time.Now().After(deadline) || r.exited() {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// goroutineTop summarizes the metrics listener's goroutine profile: the
// groups of 5 or more goroutines and the first non-runtime frame of each.
func (r *router) goroutineTop() string {
	resp, err := obsClient.Get(r.mbase + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		return "no goroutine profile: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []string
	for _, grp := range strings.Split(string(b), "\n\n") {
		lines := strings.Split(strings.TrimSpace(grp), "\n")
		n, err := strconv.Atoi(strings.Fields(lines[0] + " x")[0])
		if err != nil || n < 5 {
			continue
		}
		frame := "?"
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			if len(f) >= 3 && f[0] == "#" && !strings.HasPrefix(f[2], "runtime.") && !strings.HasPrefix(f[2], "internal/") {
				frame = f[2]
				break
			}
		}
		out = append(out, fmt.Sprintf("%d× %s", n, frame))
	}
	if len(out) == 0 {
		return "no group of 5+ goroutines"
	}
	return "goroutine groups: " + strings.Join(out, ", ")
}

// mustFreePort is bench.FreePort; a machine out of ports ends the run.
func mustFreePort() int {
	p, err := bench.FreePort()
	if err != nil {
		panic(err)
	}
	return p
}
