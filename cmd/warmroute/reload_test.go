package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/saar"
	"github.com/warmroute/warmroute/simworker"
)

// startMainHUP is startMain with a SIGHUP channel, and stderr kept (the
// audit log's default sink) in a buffer the test reads.
func startMainHUP(t *testing.T, ctx context.Context, hup chan os.Signal, stderr io.Writer, args ...string) (string, chan int) {
	t.Helper()
	pr, pw := io.Pipe()
	code := make(chan int, 1)
	go func() {
		code <- runHUP(ctx, append([]string{"--port", "0", "--prometheus-port", "0", "--log-level", "warn"}, args...), pw, stderr, hup)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("router printed no curl line: %v", err)
	}
	go io.Copy(io.Discard, pr) //nolint:errcheck
	m := regexp.MustCompile(`http://([0-9.:]+)/v1/chat/completions`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no address in %q", line)
	}
	return m[1], code
}

// writeFile replaces path's content at once (rename), as an operator's
// tooling should, so that a reload never reads half a file.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func call(t *testing.T, method, url, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func startSim(t *testing.T, model string, seed int64) string {
	t.Helper()
	w, url, err := simworker.Start(simworker.Config{Models: []string{model}, TimeScale: 0.01, MaxTokens: 4, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return url
}

// The configs the reload test cycles through: B drops w3 (m1 keeps w1) and
// brings m2 on w2; C brings w3 back and prefers m1. No transition removes
// the last worker of a model the logical model may choose.
func reloadConfigs(w1, w2, w3 string) (a, b, c string) {
	model := func(name, q string, ws ...string) string {
		return fmt.Sprintf("  - {name: %s, quality_score: %s, workers: [%s], pricing: {prompt_per_1m: 1, cached_input_per_1m: 0.2, completion_per_1m: 4}}\n",
			name, q, `"`+strings.Join(ws, `", "`)+`"`)
	}
	logical := func(cands string) string {
		return "logical_models:\n  - name: auto\n    decisions: [{name: all, candidates: [" + cands + "]}]\n"
	}
	a = "models:\n" + model("m1", "0.6", w1, w3) + logical("m1")
	b = "models:\n" + model("m1", "0.6", w1) + model("m2", "0.9", w2) + logical("m2, m1")
	c = "models:\n" + model("m1", "0.6", w1, w3) + model("m2", "0.9", w2) + logical("m1, m2")
	return a, b, c
}

// The test: the client keys, the worker allow-list and the model
// step's config are swapped by POST /reload while clients send requests
// through a real router; none of the requests fails. A broken config or
// key file is rejected whole: the old keys still work, the metric counts
// the error. Workers the config adds join, those it drops leave; replay
// records name the revision that decided them.
func TestReloadUnderLoad(t *testing.T) {
	w1, w2, w3 := startSim(t, "m1", 1), startSim(t, "m2", 2), startSim(t, "m1", 3)
	dir := t.TempDir()
	cfgPath, keys, admins, allow := filepath.Join(dir, "fleet.yaml"), filepath.Join(dir, "keys"), filepath.Join(dir, "admins"), filepath.Join(dir, "allow")
	cfgA, cfgB, cfgC := reloadConfigs(w1, w2, w3)
	writeFile(t, cfgPath, cfgA)
	writeFile(t, keys, "t1:ka\n")
	writeFile(t, admins, "ops:adm\n")
	writeFile(t, allow, "10.0.0.0/8\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, code := startMain(t, ctx, "--config", cfgPath, "--client-api-keys", keys, "--admin-api-keys-file", admins,
		"--worker-allowlist-file", allow, "--audit-log", filepath.Join(dir, "audit.jsonl"), "--replay-log", filepath.Join(dir, "replay.jsonl"))
	base := "http://" + addr
	reload := func() (int, string) { return call(t, "POST", base+"/reload", "adm", "") }
	chat := func(key string, i int) (int, string) {
		return call(t, "POST", base+"/v1/chat/completions", key,
			fmt.Sprintf(`{"model":"auto","stream":%v,"max_tokens":4,"messages":[{"role":"user","content":"hello %d"}]}`, i%2 == 0, i%7))
	}
	if st, b := call(t, "POST", base+"/add_worker?url=http://127.0.0.1:9", "adm", ""); st != 403 {
		t.Fatalf("an add outside the first allow-list: %d %s", st, b)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var served, failed atomic.Int64
	var firstFailure atomic.Value
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; ; i += 6 {
				select {
				case <-stop:
					return
				default:
				}
				st, b := chat("ka", i)
				served.Add(1)
				if st != 200 {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, fmt.Sprintf("%d %.300s", st, b))
				}
			}
		}()
	}
	testwait.Until(t, "requests in flight before the first reload", func() bool { return served.Load() > 20 })
	writeFile(t, allow, "127.0.0.0/8\n")
	for i := 0; i < 12; i++ {
		next, keyLines := cfgB, "t1:ka\nt2:kb\n"
		if i%2 == 1 {
			next, keyLines = cfgC, "t1:ka\nt3:kc\n"
		}
		writeFile(t, cfgPath, next)
		writeFile(t, keys, keyLines)
		if st, b := reload(); st != 200 {
			t.Fatalf("reload %d: %d %s", i, st, b)
		}
		at := served.Load()
		testwait.Until(t, "requests served under the new config", func() bool { return served.Load() > at+10 })
	}
	// The last good state is config C with keys {ka, kc}. Broken files
	// change nothing.
	writeFile(t, cfgPath, "models: [oops")
	if st, b := reload(); st != 422 || !strings.Contains(b, "reload_rejected") || !strings.Contains(b, "fleet.yaml") {
		t.Fatalf("a broken config: %d %s", st, b)
	}
	writeFile(t, cfgPath, cfgB)
	writeFile(t, keys, "# nobody\n")
	if st, b := reload(); st != 422 || !strings.Contains(b, "--client-api-keys") {
		t.Fatalf("an empty key file: %d %s", st, b)
	}
	at := served.Load()
	testwait.Until(t, "requests served after the rejected reloads", func() bool { return served.Load() > at+10 })
	close(stop)
	wg.Wait()
	if f := failed.Load(); f != 0 {
		t.Fatalf("%d of %d requests failed across the reloads; first: %v", f, served.Load(), firstFailure.Load())
	}

	if st, _ := chat("kc", 1); st != 200 {
		t.Fatalf("a key of the last good file: %d", st)
	}
	if st, _ := chat("kb", 1); st != 401 {
		t.Fatalf("a key the last good file dropped: %d, want 401", st)
	}
	st, workers := call(t, "GET", base+"/list_workers", "adm", "")
	if st != 200 || !strings.Contains(workers, w3) || !strings.Contains(workers, w2) {
		t.Fatalf("workers under config C (w2 and w3 in, the broken B not applied): %s", workers)
	}
	if st, b := call(t, "POST", base+"/add_worker?url=http://127.0.0.1:9", "adm", ""); st == 403 {
		t.Fatalf("the reloaded allow-list does not admit loopback: %s", b)
	}
	_, metrics := call(t, "GET", base+"/metrics", "adm", "")
	for _, want := range []string{`vllm_router_config_reloads_total{result="ok"} 12`, `vllm_router_config_reloads_total{result="error"} 2`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	_, recs := call(t, "GET", base+"/v1/router_replay?limit=100000", "adm", "")
	var rr struct {
		Records []struct {
			Config string `json:"config_revision"`
		} `json:"records"`
	}
	if err := json.Unmarshal([]byte(recs), &rr); err != nil {
		t.Fatal(err)
	}
	revs := map[string]bool{}
	for _, r := range rr.Records {
		revs[r.Config] = true
	}
	if len(revs) != 3 || revs[""] {
		t.Errorf("replay records name revisions %v, want the three configs'", revs)
	}
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("exit code %d", c)
	}
	audit, err := os.ReadFile(filepath.Join(dir, "audit.jsonl"))
	if err != nil || strings.Count(string(audit), `"path":"/reload"`) != 14 || !strings.Contains(string(audit), `"who":"ops"`) {
		t.Fatalf("audit log: %v\n%s", err, audit)
	}
}

// SIGHUP reloads as POST /reload does: a key added to the file works
// after the signal; the audit log, renamed away as logrotate does, is
// reopened under its name.
func TestSIGHUPReloadsAndReopensTheAuditLog(t *testing.T) {
	w := startSim(t, "m", 1)
	dir := t.TempDir()
	keys, audit := filepath.Join(dir, "keys"), filepath.Join(dir, "audit.jsonl")
	writeFile(t, keys, "a:ka\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal, 1)
	addr, code := startMainHUP(t, ctx, hup, io.Discard, "--worker-urls", w, "--client-api-keys", keys, "--admin-api-key", "adm", "--audit-log", audit)
	base := "http://" + addr
	body := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	if st, _ := call(t, "POST", base+"/v1/chat/completions", "kb", body); st != 401 {
		t.Fatalf("before: %d", st)
	}
	call(t, "GET", base+"/workers", "adm", "")
	if err := os.Rename(audit, audit+".1"); err != nil {
		t.Fatal(err)
	}
	writeFile(t, keys, "a:ka\nb:kb\n")
	hup <- syscall.SIGHUP
	testwait.Until(t, "the new key after SIGHUP", func() bool {
		st, _ := call(t, "POST", base+"/v1/chat/completions", "kb", body)
		return st == 200
	})
	call(t, "GET", base+"/list_workers", "adm", "")
	cancel()
	<-code
	old, _ := os.ReadFile(audit + ".1")
	cur, _ := os.ReadFile(audit)
	if !strings.Contains(string(old), `"/workers"`) || strings.Contains(string(old), "/list_workers") || !strings.Contains(string(cur), `"/list_workers"`) {
		t.Fatalf("rotated audit log %q, reopened %q", old, cur)
	}
}

// main's SIGHUP wiring: hupSignals receives the process's SIGHUP (and the
// process survives it).
func TestHUPSignalWiring(t *testing.T) {
	c := hupSignals()
	defer signal.Stop(c)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-c:
		if s != syscall.SIGHUP {
			t.Fatalf("got %v", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("SIGHUP not delivered to hupSignals' channel")
	}
}

// applyWorkers: the config's new workers join and its dropped ones leave;
// a worker the admin API added stays when a config lists it and then
// drops it; a worker whose models changed is the same worker; a flag's
// worker the config drops stays.
func TestApplyWorkers(t *testing.T) {
	dead := func(port int) string { return fmt.Sprintf("http://127.0.0.1:%d", port) } // refused: added unhealthy, fine here
	w1, w2, admin, flagged := dead(9), dead(19), dead(29), dead(39)
	parse := func(y string) *saar.Config {
		y = strings.ReplaceAll(y, "workers:", "quality_score: 0.5, pricing: {prompt_per_1m: 1, cached_input_per_1m: 0.1, completion_per_1m: 2}, workers:")
		cfg, err := saar.ParseConfig([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	o := &options{maxWorkers: 100, dpSize: 1, workerURLs: []string{flagged}}
	a := parse(`models: [{name: m1, workers: ["` + w1 + `", "` + flagged + `"]}]`)
	reg := loadview.NewRegistry(loadview.Config{HealthTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := context.Background()
	if err := addWorkers(ctx, reg, a, o); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Add(ctx, admin, []string{"x"}); err != nil {
		t.Fatal(err)
	}
	models := saar.NewRouter(a, saar.Options{})
	r := &reloader{o: o, reg: reg, models: models, log: slog.New(slog.NewTextHandler(io.Discard, nil)), applied: configWorkersOf(o, a)}
	first := reg.ByURL(w1)
	r.applyWorkers(parse(`models: [{name: m1, workers: ["` + w1 + `", "` + admin + `"]}, {name: m2, workers: ["` + w1 + `", "` + w2 + `"]}]`))
	if reg.ByURL(w1) != first || fmt.Sprint(first.Models()) != "[m1 m2]" {
		t.Fatalf("w1 after its models changed: same %v, models %v", reg.ByURL(w1) == first, first.Models())
	}
	if reg.ByURL(w2) == nil || reg.ByURL(flagged) == nil || fmt.Sprint(reg.ByURL(admin).Models()) != "[m1]" {
		t.Fatalf("after B: w2 %v, flagged %v, admin's models %v", reg.ByURL(w2), reg.ByURL(flagged), reg.ByURL(admin).Models())
	}
	if len(models.Config().Models) != 2 {
		t.Fatal("the model step did not take the new config")
	}
	r.applyWorkers(parse(`models: [{name: m2, workers: ["` + w2 + `"]}]`))
	if reg.ByURL(w1) != nil || reg.ByURL(w2) == nil || reg.ByURL(admin) == nil || reg.ByURL(flagged) == nil {
		t.Fatalf("after C: %v", reg.Workers())
	}
}
