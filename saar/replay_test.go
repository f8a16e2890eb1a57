package saar

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// updateReplay rewrites the committed replay records from this build:
//
//	go test -run TestReplayRecordsOfEveryVersion ./saar -update-replay
//
// Do it only when a decision is meant to change; the records exist to show
// that the others did not.
var updateReplay = flag.Bool("update-replay", false, "rewrite saar/testdata/replay/v*.jsonl from this build")

const replayDir = "testdata/replay"

// replayVersions are the policy versions whose records `warmroute replay`
// must keep re-running.
var replayVersions = []uint8{1, 2, 3}

func replayConfig(t testing.TB) *Config {
	t.Helper()
	cfg, err := LoadConfig(filepath.Join(replayDir, "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func replayPath(v uint8) string { return filepath.Join(replayDir, fmt.Sprintf("v%d.jsonl", v)) }

// replayScript drives a router through the turns whose records the replay
// tests keep: user turns of varying complexity (stay, switch, the minimum
// turns), tool results with known and unknown ids, previous_response_id
// and opaque reasoning locks, a worker and a model down, idle gaps and
// drifting intents.
func replayScript(r *Router, clk *fakeClock) {
	texts := []string{"hello", "prove the theorem", "fix my func", "thanks", "plan it step by step"}
	last := map[string]string{} // session → the model of its last turn
	for i := 0; i < 12; i++ {
		for j := 0; j < 6; j++ {
			sess := fmt.Sprintf("s%d", j)
			b := turn(sess, texts[(j+i/4)%len(texts)]).chars(4000 * (i + 1) * (j%3 + 1))
			kind := (i*(j+1) + j) % 10
			switch kind {
			case 1:
				b.results(fmt.Sprintf("call_%d_%d", j, i-1))
			case 2:
				b.prev(fmt.Sprintf("resp_%d_%d", j, i-1))
			case 3, 7:
				b.c(float64((i+j)%11) / 10)
			case 4:
				b.effort("medium").opaque()
			case 5:
				b.c(0.97)
			case 6:
				b.results("call_unknown")
			}
			h := allUp
			switch {
			case (i+j)%9 == 0: // a worker down, and in odd rounds the session's model
				down := last[sess]
				h.ModelUp = func(m string) bool { return m != down || i%2 == 0 }
				h.WorkerUp = func(w string) bool { return !strings.HasSuffix(w, "-w2") }
			case kind == 6 && i%3 == 2: // the model a tool result is locked to
				down := last[sess]
				h.ModelUp = func(m string) bool { return m != down }
			}
			s := r.Select(b.T(), h)
			last[sess] = s.Model
			clk.Add(time.Duration(1+(i*j)%5) * time.Second)
			r.Observe([]byte(sess), s.Model, fmt.Sprintf("%s-w%d", s.Model, 1+(i+j)%2), Observed{
				ToolCallIDs: bs(fmt.Sprintf("call_%d_%d", j, i)), ResponseID: []byte(fmt.Sprintf("resp_%d_%d", j, i)),
				PromptTokens: 1000 * (i + 1) * (j%3 + 1), CachedTokens: 700 * i * (j%3 + 1), CompletionTokens: 200,
			})
		}
		if i%5 == 4 {
			clk.Add(10 * time.Minute) // past idle_timeout_seconds
		}
	}
}

// recordVersion runs replayScript on a router of policy version v and
// returns its replay log (JSON lines, the Options.Replay format).
func recordVersion(t *testing.T, cfg *Config, v uint8) []byte {
	t.Helper()
	var log bytes.Buffer
	r, clk := newRouter(t, cfg, Options{Policy: Policy{Version: v}, Replay: &log})
	replayScript(r, clk)
	r.Close() // the log is written by its own goroutine
	return log.Bytes()
}

// TestReplayRecordsOfEveryVersion: what `warmroute replay` runs
// (ReplayFile) reproduces the records of routers of every policy version,
// both those this build makes and those committed in testdata, made by an
// earlier build; of the committed ones Decide reproduces every score, not
// only the verdict that replay compares. Each file holds records of its
// version only, with the actions the script is meant to exercise.
func TestReplayRecordsOfEveryVersion(t *testing.T) {
	cfg := replayConfig(t)
	for _, v := range replayVersions {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			log := recordVersion(t, cfg, v)
			if *updateReplay {
				if err := os.WriteFile(replayPath(v), log, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			fresh := filepath.Join(t.TempDir(), "fresh.jsonl")
			if err := os.WriteFile(fresh, log, 0o644); err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{fresh, replayPath(v)} {
				rep, err := ReplayFile(path, cfg)
				if err != nil {
					t.Fatal(err)
				}
				if rep.Records != 72 || len(rep.Diffs) != 0 {
					t.Fatalf("%s: %d records, diffs %v", path, rep.Records, rep.Diffs)
				}
				for _, a := range []string{ActionFirst, ActionStay, ActionSwitch, ActionHardLock, ActionLockBroken, ActionResetIdle, ActionResetDrift} {
					if rep.Actions[a] == 0 {
						t.Errorf("%s: no %s record: %v", path, a, rep.Actions)
					}
				}
			}
			recs := readRecordsFile(t, replayPath(v))
			for i := range recs {
				rec := &recs[i]
				if rec.Policy.Version != v {
					t.Fatalf("%s: record %s of version %d", replayPath(v), rec.ID, rec.Policy.Version)
				}
				got, want := outcomeJSON(t, Decide(cfg, rec.Policy, &rec.Inputs, rec.Memory, rec.Time)), outcomeJSON(t, rec.Outcome)
				if got != want {
					t.Fatalf("%s: record %s decided\n %s\nrecorded\n %s", replayPath(v), rec.ID, got, want)
				}
			}
		})
	}
}

// TestReplayFindsTamperedRecords: a record of any version whose outcome or
// memory was changed after the fact is reported, and only that one.
func TestReplayFindsTamperedRecords(t *testing.T) {
	cfg := replayConfig(t)
	for _, v := range replayVersions {
		recs := readRecordsFile(t, replayPath(v))
		drift := -1
		for i := range recs {
			if recs[i].Outcome.Action == ActionResetDrift {
				drift = i
				break
			}
		}
		if drift < 0 {
			t.Fatalf("v%d: no reset_drift record", v)
		}
		// The drift record's memory now names the decision it matched: no
		// drift any more. Another record claims a model it was never given.
		m := *recs[drift].Memory
		m.Decision = recs[drift].Outcome.Decision
		recs[drift].Memory = &m
		other := (drift + 7) % len(recs)
		recs[other].Outcome.Model = "sim-nonexistent"

		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		for i := range recs {
			if err := enc.Encode(&recs[i]); err != nil {
				t.Fatal(err)
			}
		}
		path := filepath.Join(t.TempDir(), "tampered.jsonl")
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		rep, err := ReplayFile(path, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ids := []string{recs[drift].ID, recs[other].ID}
		if other < drift {
			ids[0], ids[1] = ids[1], ids[0]
		}
		if len(rep.Diffs) != 2 || rep.Diffs[0].ID != ids[0] || rep.Diffs[1].ID != ids[1] {
			t.Fatalf("v%d: diffs %v, want records %v", v, rep.Diffs, ids)
		}
		for _, d := range rep.Diffs {
			if d.ID == recs[drift].ID && (d.Recorded.Action != ActionResetDrift || d.Replayed.Action == ActionResetDrift) {
				t.Fatalf("v%d: the drift record's diff %v", v, d)
			}
		}
	}
}

func readRecordsFile(t *testing.T, path string) []Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ReadRecords(f)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func outcomeJSON(t *testing.T, o Outcome) string {
	t.Helper()
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
