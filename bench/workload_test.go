package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func smallSynthetic(seed uint64) SyntheticConfig {
	return SyntheticConfig{Sessions: 5, TurnsMin: 2, TurnsMax: 5, SystemTokens: 40, SessionPrefixTokens: 30,
		UserTokensMin: 5, UserTokensMax: 20, AssistantTokens: 8, IDStyle: IDSeq, Seed: seed}
}

// checkPrefixes asserts that each turn's messages extend the previous turn's.
func checkPrefixes(t *testing.T, w *Workload) {
	t.Helper()
	for _, s := range w.Sessions {
		for k := 1; k < len(s.Turns); k++ {
			prev, cur := s.Turns[k-1].Messages, s.Turns[k].Messages
			if len(cur) <= len(prev) {
				t.Fatalf("%s turn %d: %d messages, previous %d", s.ID, k, len(cur), len(prev))
			}
			for i := range prev {
				if !bytes.Equal(prev[i], cur[i]) {
					t.Fatalf("%s turn %d: message %d differs from the previous turn's", s.ID, k, i)
				}
			}
		}
	}
}

func TestSyntheticDeterministicAndPrefix(t *testing.T) {
	a, b := Synthetic(smallSynthetic(7)), Synthetic(smallSynthetic(7))
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same config, different workloads")
	}
	if c := Synthetic(smallSynthetic(8)); reflect.DeepEqual(a.Sessions, c.Sessions) {
		t.Fatal("different seeds, same workload")
	}
	checkPrefixes(t, a)
	cfg := smallSynthetic(7)
	for i, s := range a.Sessions {
		if n := len(s.Turns); n < cfg.TurnsMin || n > cfg.TurnsMax {
			t.Fatalf("session %d: %d turns", i, n)
		}
		if want := "session-" + string(rune('1'+i)); s.ID != want {
			t.Fatalf("session %d id %q, want %q", i, s.ID, want)
		}
		// Shared system prompt, distinct sessions, replies of AssistantTokens × 4 characters.
		last := s.Turns[len(s.Turns)-1].Messages
		if !bytes.Equal(last[0], a.Sessions[0].Turns[0].Messages[0]) {
			t.Fatalf("session %d: system prompt differs", i)
		}
		if i > 0 && bytes.Equal(last[1], a.Sessions[0].Turns[0].Messages[1]) {
			t.Fatalf("session %d: first user message equals session 0's", i)
		}
		if len(last) > 2 {
			var m struct{ Role, Content string }
			if err := json.Unmarshal(last[2], &m); err != nil || m.Role != "assistant" || len(m.Content) != cfg.AssistantTokens*4 {
				t.Fatalf("session %d: reply %s (%v)", i, last[2], err)
			}
		}
	}
	hex := smallSynthetic(7)
	hex.IDStyle = IDHex
	if id := Synthetic(hex).Sessions[0].ID; len(id) != 16 || strings.HasPrefix(id, "session-") {
		t.Fatalf("hex id %q", id)
	}
}

const tauSample = `[
 {"task_id": 0, "trial": 0, "reward": 1, "info": {}, "traj": [
  {"role": "system", "content": "# Airline policy"},
  {"role": "user", "content": "Hi, change my flight."},
  {"content": null, "role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_user_details", "arguments": "{\"user_id\": \"mia\"}"}}]},
  {"role": "tool", "tool_call_id": "call_1", "name": "get_user_details", "content": "{\"name\": \"Mia\"}"},
  {"content": "Which flight?", "role": "assistant"},
  {"role": "user", "content": "HAT001"},
  {"content": "Done.", "role": "assistant"}
 ]},
 {"task_id": 1, "trial": 0, "reward": 0, "info": {}, "traj": [
  {"role": "system", "content": "# Airline policy"},
  {"role": "user", "content": "Cancel please."},
  {"content": "Sure.", "role": "assistant"}
 ]},
 {"task_id": 2, "trial": 0, "reward": 0, "info": {}, "traj": [
  {"role": "system", "content": "# Airline policy"}
 ]}
]`

func TestLoadTau(t *testing.T) {
	w, err := LoadTau(strings.NewReader(tauSample), TraceOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) != 2 || w.Requests() != 4 {
		t.Fatalf("%d sessions, %d requests; want 2, 4 (a trajectory without assistant turns is skipped)", len(w.Sessions), w.Requests())
	}
	var lens []int
	for _, tu := range w.Sessions[0].Turns {
		lens = append(lens, len(tu.Messages))
	}
	if !reflect.DeepEqual(lens, []int{2, 4, 6}) {
		t.Fatalf("turn sizes %v, want traj[:i] for assistant i: [2 4 6]", lens)
	}
	if got := string(w.Sessions[0].Turns[1].Messages[2]); !strings.Contains(got, `"tool_calls":[{"id":"call_1"`) {
		t.Fatalf("assistant tool call not kept (compacted): %s", got)
	}
	// Each call's answer is the assistant message the next turn carries.
	turns := w.Sessions[0].Turns
	for k := range 2 {
		reply := turns[k+1].Messages[len(turns[k].Messages)]
		if want := len(reply) / tauCharsPerToken; turns[k].Answer != want || want < 1 {
			t.Fatalf("turn %d: answer %d tokens, want %d (%s)", k, turns[k].Answer, want, reply)
		}
	}
	checkPrefixes(t, w)
	one, err := LoadTau(strings.NewReader(tauSample), TraceOptions{Sessions: 1, Seed: 3})
	if err != nil || len(one.Sessions) != 1 {
		t.Fatalf("sampling 1 session: %v, %v", one, err)
	}
	again, _ := LoadTau(strings.NewReader(tauSample), TraceOptions{Sessions: 1, Seed: 3})
	if !reflect.DeepEqual(one, again) {
		t.Fatal("sampling is not deterministic")
	}
}

const mooncakeSample = `{"timestamp": 0, "input_length": 1100, "output_length": 11, "hash_ids": [1, 2, 3]}
{"timestamp": 5, "input_length": 2000, "output_length": 12, "hash_ids": [1, 2, 3, 4]}
{"timestamp": 6, "input_length": 600, "output_length": 13, "hash_ids": [9, 10]}
{"timestamp": 9, "input_length": 1600, "output_length": 14, "hash_ids": [1, 2, 3, 5]}
{"timestamp": 9, "input_length": 1200, "output_length": 15, "hash_ids": [1, 2, 7]}

{"timestamp": 12, "input_length": 1100, "output_length": 16, "hash_ids": [9, 10, 11]}
`

func TestMooncakeChains(t *testing.T) {
	w, err := LoadMooncake(strings.NewReader(mooncakeSample), TraceOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Chains: [0 1 3] (3 continues 1, the longest full-block prefix),
	// [2 5], [4] (its parent 0 was already continued): two with ≥ 2 requests.
	if len(w.Sessions) != 2 || len(w.Sessions[0].Turns) != 3 || len(w.Sessions[1].Turns) != 2 {
		t.Fatalf("sessions %d: %+v", len(w.Sessions), w.Sessions)
	}
	content := func(s, k int) string {
		var m struct{ Content string }
		if err := json.Unmarshal(w.Sessions[s].Turns[k].Messages[0], &m); err != nil {
			t.Fatal(err)
		}
		return m.Content
	}
	const blk = MooncakeBlockTokens * 4
	for k, want := range []int{1100, 2000, 1600} {
		if n := len(content(0, k)); n != want*4 {
			t.Fatalf("turn %d: %d characters, want input_length × 4 = %d", k, n, want*4)
		}
	}
	for k, want := range []int{11, 12, 14} {
		if a := w.Sessions[0].Turns[k].Answer; a != want {
			t.Fatalf("turn %d: answer %d tokens, want output_length %d", k, a, want)
		}
	}
	// Same hash id, same text; the full blocks of a turn prefix the next.
	if content(0, 0)[:2*blk] != content(0, 1)[:2*blk] || content(0, 1)[:3*blk] != content(0, 2)[:3*blk] {
		t.Fatal("a turn's full blocks do not prefix the next turn")
	}
	if content(0, 1)[3*blk:3*blk+100] == content(0, 2)[3*blk:3*blk+100] {
		t.Fatal("hash ids 4 and 5 have the same text")
	}
	if content(1, 0)[:blk] != content(1, 1)[:blk] {
		t.Fatal("chain [2 5]: block 9 differs")
	}
	all, _ := LoadMooncake(strings.NewReader(mooncakeSample), TraceOptions{MinTurns: 1, Seed: 1})
	if len(all.Sessions) != 3 {
		t.Fatalf("MinTurns 1: %d chains, want 3", len(all.Sessions))
	}
}

func TestTraceMissingSkips(t *testing.T) {
	for _, kind := range []string{"tau", "mooncake"} {
		spec, err := ParseTrace(kind, filepath.Join(t.TempDir(), "nowhere"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := LoadTrace(spec, TraceOptions{}); !errors.Is(err, ErrTraceMissing) {
			t.Fatalf("%s: %v, want ErrTraceMissing", kind, err)
		}
	}
	if _, err := ParseTrace("sharegpt:/x", ""); err == nil {
		t.Fatal("unknown trace kind accepted")
	}
}

// TestRealTraces loads a few sessions of the public traces when they are
// beside the repository (../shared/traces), and skips otherwise.
func TestRealTraces(t *testing.T) {
	dir := filepath.Join("..", "..", "shared", "traces")
	for _, kind := range []string{"tau", "mooncake"} {
		spec, _ := ParseTrace(kind, dir)
		if _, err := os.Stat(spec.Path); err != nil {
			t.Logf("skipping %s: %s is absent", kind, spec.Path)
			continue
		}
		w, err := LoadTrace(spec, TraceOptions{Sessions: 3, MaxPromptTokens: 32768, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(w.Sessions) != 3 {
			t.Fatalf("%s: %d sessions", kind, len(w.Sessions))
		}
		if kind == "tau" {
			checkPrefixes(t, w)
		}
		t.Logf("%s: %s", kind, w.Note)
	}
}
