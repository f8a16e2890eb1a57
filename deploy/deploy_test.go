package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/internal/testwait"
)

// binary is the router built once by TestMain: the tests run the same
// program the image ships.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "warmroute-deploy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "warmroute")
	// go test puts its own go first on PATH.
	if out, err := exec.Command("go", "build", "-o", binary, "github.com/warmroute/warmroute/cmd/warmroute").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./cmd/warmroute: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// helpText is `warmroute -h`: the binary's flags with their help.
func helpText(t *testing.T) string {
	t.Helper()
	out, err := exec.Command(binary, "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("warmroute -h: %v\n%s", err, out)
	}
	return string(out)
}

// router is a running warmroute process with its two listeners.
type router struct {
	api, metrics string // http://host:port
}

// startRouter runs the built binary in demo mode (three simulated workers
// over the demo config's physical models and its logical model "auto"),
// sharing state through a real Redis, and stops it (SIGTERM) at cleanup.
func startRouter(t *testing.T) router {
	t.Helper()
	rd := redistest.Start(t, redistest.Options{})
	mport := strconv.Itoa(redistest.FreePort(t))
	cmd := exec.Command(binary, "--demo", "--port", "0", "--prometheus-port", mport, "--demo-workers", "3",
		"--redis-url", rd.URL(), "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("router exit after SIGTERM: %v\n%s", err, stderr.String())
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Error("router did not stop on SIGTERM")
		}
	})
	lines := bufio.NewReader(stdout)
	line, err := lines.ReadString('\n')
	go func() {
		_, _ = io.Copy(io.Discard, lines)
		exited <- cmd.Wait()
	}()
	m := regexp.MustCompile(`http://([0-9.:]+)/v1/chat/completions`).FindStringSubmatch(line)
	if err != nil || m == nil {
		t.Fatalf("router printed no address (%v): %q\n%s", err, line, stderr.String())
	}
	r := router{api: "http://" + m[1], metrics: "http://127.0.0.1:" + mport}
	testwait.Until(t, "the router on redis", func() bool {
		return strings.Contains(r.get(t, r.metrics+"/metrics"), "\nwarmroute_redis_up 1\n")
	})
	return r
}

// get returns url's body; any status but 200 is an empty string.
func (r router) get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return ""
	}
	return string(b)
}

// chat sends one chat completion and returns the response and its body;
// any status but 200 fails the test.
func (r router) chat(t *testing.T, session, complexity, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", r.api+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-ID", session)
	}
	if complexity != "" {
		req.Header.Set("x-warmroute-complexity", complexity)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	return resp, string(b)
}

// traffic sends the requests that create the router's lazily created
// series: a physical model, the logical model (SAAR selections), a tool
// call and its result (a hard lock, written to Redis before the last byte:
// lock write wait), and a session whose demand rises (a switch).
func (r router) traffic(t *testing.T) {
	t.Helper()
	r.chat(t, "", "", `{"model":"sim-small","max_tokens":4,"messages":[{"role":"user","content":"hello there"}]}`)
	r.chat(t, "plain", "", `{"model":"auto","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`)

	tools := `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{}}}}]`
	user := `{"role":"user","content":"weather in Paris?"}`
	_, body := r.chat(t, "tools", "", `{"model":"auto","max_tokens":4,`+tools+`,"messages":[`+user+`]}`)
	m := regexp.MustCompile(`"tool_calls":\[\{"id":"([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no tool call in %s", body)
	}
	call := `{"role":"assistant","content":null,"tool_calls":[{"id":"` + m[1] + `","type":"function","function":{"name":"get_weather","arguments":"{}"}}]}`
	result := `{"role":"tool","tool_call_id":"` + m[1] + `","content":"sunny"}`
	resp, _ := r.chat(t, "tools", "", `{"model":"auto","max_tokens":4,`+tools+`,"messages":[`+user+`,`+call+`,`+result+`]}`)
	if a := resp.Header.Get("x-vsr-session-action"); a != "hard_lock" {
		t.Fatalf("tool result: session action %q, want hard_lock", a)
	}

	theorem := `{"model":"auto","max_tokens":4,"messages":[{"role":"user","content":"prove the theorem step by step"}]}`
	r.chat(t, "switch", "0.1", theorem)
	if resp, _ := r.chat(t, "switch", "0.95", theorem); resp.Header.Get("x-vsr-session-action") != "switch" {
		t.Fatalf("harder turn: session action %q, want switch (the switch series are created by the first switch)",
			resp.Header.Get("x-vsr-session-action"))
	}
}

// exposition parses Prometheus text: series names and their label names.
func exposition(text string) (map[string]map[string]bool, error) {
	out := map[string]map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ ")
		if end <= 0 {
			return nil, fmt.Errorf("bad sample line %q", line)
		}
		name, labels := line[:end], out[line[:end]]
		if labels == nil {
			labels = map[string]bool{}
			out[name] = labels
		}
		if line[end] != '{' {
			continue
		}
		rest := line[end+1:]
		for rest != "" && rest[0] != '}' {
			eq := strings.Index(rest, `="`)
			if eq <= 0 {
				return nil, fmt.Errorf("bad labels in %q", line)
			}
			labels[strings.TrimPrefix(rest[:eq], ",")] = true
			i := eq + 2
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' {
					i++
				}
			}
			if i >= len(rest) {
				return nil, fmt.Errorf("unterminated label value in %q", line)
			}
			rest = strings.TrimPrefix(rest[i+1:], ",")
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no series")
	}
	return out, nil
}
