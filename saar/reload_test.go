package saar

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

const reloadA = `models:
  - {name: small, quality_score: 0.6, pricing: {prompt_per_1m: 0.1, cached_input_per_1m: 0.02, completion_per_1m: 0.4}}
  - {name: large, quality_score: 0.95, pricing: {prompt_per_1m: 8, cached_input_per_1m: 1.2, completion_per_1m: 24}}
logical_models:
  - name: auto
    decisions: [{name: all, candidates: [small]}]
`

// reloadB drops small: a session on it must move, with its memory kept.
const reloadB = `models:
  - {name: large, quality_score: 0.95, pricing: {prompt_per_1m: 8, cached_input_per_1m: 1.2, completion_per_1m: 24}}
logical_models:
  - name: auto
    decisions: [{name: all, candidates: [large]}]
`

func mustParse(t *testing.T, y string) *Config {
	t.Helper()
	cfg, err := ParseConfig([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// SetConfig: the next turn is decided under the new config, the session's
// memory survives it (the turn is a switch from the old model, not a first
// turn), and each replay record names the revision that decided it.
func TestSetConfigKeepsMemoryAndRecordsRevision(t *testing.T) {
	a, b := mustParse(t, reloadA), mustParse(t, reloadB)
	if a.Revision == "" || a.Revision == b.Revision || !strings.HasPrefix(a.Revision, "sha256:") {
		t.Fatalf("revisions %q %q: want distinct sha256: names", a.Revision, b.Revision)
	}
	if again := mustParse(t, reloadA); again.Revision != a.Revision {
		t.Fatalf("same bytes, revisions %q and %q", a.Revision, again.Revision)
	}
	var log bytes.Buffer
	r, _ := newRouter(t, a, Options{Replay: &log})
	s1 := r.Select(turn("s", "hi").T(), allUp)
	expect(t, s1, "small", ActionFirst, "", "")
	r.Observe([]byte("s"), "small", "w1", Observed{Logical: []byte("auto")})
	r.SetConfig(b)
	if r.Config() != b {
		t.Fatal("Config() is not the new config")
	}
	s2 := r.Select(turn("s", "hi").T(), allUp)
	if s2.Model != "large" || s2.Action == ActionFirst {
		t.Fatalf("after the reload: %+v, want a move of the remembered session to large", s2)
	}
	r1, ok1 := r.Record(s1.ReplayID)
	r2, ok2 := r.Record(s2.ReplayID)
	if !ok1 || !ok2 || r1.Config != a.Revision || r2.Config != b.Revision {
		t.Fatalf("records' revisions %q, %q; want %q, %q", r1.Config, r2.Config, a.Revision, b.Revision)
	}
	r.Close()
	recs, err := ReadRecords(&log)
	if err != nil || len(recs) != 2 || recs[1].Config != b.Revision {
		t.Fatalf("replay log: %v %+v", err, recs)
	}
	if d := Replay(b, recs[1:]); len(d) != 0 {
		t.Fatalf("a record replayed under its own revision differs: %v", d)
	}
	var m strings.Builder
	r.WriteMetrics(&m)
	if !strings.Contains(m.String(), `vllm_router_saar_selections_total{model="large",action="switch"} 1`) &&
		!strings.Contains(m.String(), `vllm_router_saar_selections_total{model="large",action="reset_drift"} 1`) {
		t.Errorf("the new config's model is not counted:\n%s", m.String())
	}
}

// Turns decided while the config is swapped see one config each (run with -race).
func TestSetConfigConcurrentWithSelect(t *testing.T) {
	a, b := mustParse(t, reloadA), mustParse(t, reloadB)
	r, _ := newRouter(t, a, Options{})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				s := r.Select(turn(string(rune('a'+i%8)), "hi").T(), allUp)
				if s.Model != "small" && s.Model != "large" {
					t.Errorf("selection %+v", s)
					return
				}
			}
		}()
	}
	for i := 0; i < 200; i++ {
		if i%2 == 0 {
			r.SetConfig(b)
		} else {
			r.SetConfig(a)
		}
	}
	close(stop)
	wg.Wait()
}
