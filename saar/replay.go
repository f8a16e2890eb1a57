package saar

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/warmroute/warmroute/sessionshard"
)

// Record is the replay record of one routed turn: the inputs (signals,
// lock evidence, health), the session memory before the turn, the policy,
// the time, and the outcome with every candidate's score, bonus and
// penalty. Replaying it through Decide reproduces the outcome.
type Record struct {
	ID      string `json:"id"`
	Seq     uint64 `json:"seq"`
	Time    int64  `json:"time_unix_nano"`
	Session string `json:"session,omitempty"`
	Policy  Policy `json:"policy"`
	// Config is the revision of the config that decided the turn
	// (Config.Revision; "" for a config built in code): after a reload
	// (docs/design.md §8, "Reload and audit") records of one log may
	// come from several configs, and a replay is exact only under each
	// record's own.
	Config  string                    `json:"config_revision,omitempty"`
	Inputs  Inputs                    `json:"inputs"`
	Memory  *sessionshard.MemoryState `json:"memory_before,omitempty"`
	Outcome Outcome                   `json:"outcome"`
	// Clipped marks a ring copy (Router.Records) whose client-supplied
	// strings were cut (Options.RingTextBytes, RingFieldBytes): it may not
	// replay exactly. Replay log records are never cut.
	Clipped bool `json:"clipped,omitempty"`
}

// Verdict is the part of an outcome that replay compares.
type Verdict struct {
	Model        string `json:"model"`
	Decision     string `json:"decision"`
	Phase        string `json:"phase"`
	Action       string `json:"action"`
	Reason       string `json:"reason"`
	PinnedWorker string `json:"pinned_worker,omitempty"`
}

// Diff is a record whose replayed decision differs from the recorded one.
type Diff struct {
	ID       string  `json:"id"`
	Session  string  `json:"session,omitempty"`
	Recorded Verdict `json:"recorded"`
	Replayed Verdict `json:"replayed"`
}

func (d Diff) String() string {
	return fmt.Sprintf("%s (session %q): recorded %+v, replayed %+v", d.ID, d.Session, d.Recorded, d.Replayed)
}

// Replay re-runs every record through Decide under cfg and returns the
// records whose decision differs. With the config that produced them, the
// result is empty; with another config it shows what that config would
// have changed, turn by turn (each turn against its recorded memory).
func Replay(cfg *Config, records []Record) []Diff {
	var diffs []Diff
	for i := range records {
		rec := &records[i]
		out := Decide(cfg, rec.Policy, &rec.Inputs, rec.Memory, rec.Time)
		if got, want := out.Verdict, rec.Outcome.Verdict; got != want {
			diffs = append(diffs, Diff{ID: rec.ID, Session: rec.Session, Recorded: want, Replayed: got})
		}
	}
	return diffs
}

// Replay re-runs records under the router's config.
func (r *Router) Replay(records []Record) []Diff { return Replay(r.cfg.Load(), records) }

// ReadRecords reads JSON-lines records (the Options.Replay format).
func ReadRecords(rd io.Reader) ([]Record, error) {
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var out []Record
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var rec Record
		if err := json.Unmarshal(b, &rec); err != nil {
			return out, fmt.Errorf("replay line %d: %w", line, err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

// Report summarizes a replay of a file.
type Report struct {
	Records  int            `json:"records"`
	Diffs    []Diff         `json:"diffs"`
	Actions  map[string]int `json:"actions"`  // recorded actions
	Models   map[string]int `json:"models"`   // recorded models
	Switches int            `json:"switches"` // recorded model changes within a session
	// Configs counts the records by the config revision that decided them
	// (Record.Config; "" for records made before revisions, or under a
	// config built in code).
	Configs map[string]int `json:"configs"`
}

// ReplayFile replays the JSONL file at path under cfg (for
// `warmroute replay FILE`).
func ReplayFile(path string, cfg *Config) (Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return Report{}, err
	}
	defer f.Close()
	recs, err := ReadRecords(f)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Records: len(recs), Actions: map[string]int{}, Models: map[string]int{}, Configs: map[string]int{}}
	for i := range recs {
		rep.Configs[recs[i].Config]++
		rep.Actions[recs[i].Outcome.Action]++
		rep.Models[recs[i].Outcome.Model]++
		if m := recs[i].Memory; m != nil && m.Model != "" && m.Model != recs[i].Outcome.Model {
			rep.Switches++
		}
	}
	rep.Diffs = Replay(cfg, recs)
	return rep, nil
}
