package reqview

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/view.golden from the current Parse")

// goldenBodies returns the named bodies of TestHistoryGolden: the fuzz seeds,
// the checked-in fuzz corpus, the sample and prose bodies, a Responses body,
// and deterministic mutations (truncations, inserted escapes, quotes and
// brackets, flipped bytes) of a small sample body, valid and not.
func goldenBodies(t *testing.T) map[string][]byte {
	t.Helper()
	m := map[string][]byte{}
	for i, s := range seedBodies {
		m["seed/"+strconv.Itoa(i)] = []byte(s)
	}
	for i, s := range validateSeeds {
		m["validate/"+strconv.Itoa(i)] = []byte(s)
	}
	files, _ := filepath.Glob("testdata/fuzz/*/*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// go test fuzz v1, one []byte(...) line per argument: the first one.
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if strings.HasPrefix(line, "[]byte(") && strings.HasSuffix(line, ")") {
				s, err := strconv.Unquote(line[len("[]byte(") : len(line)-1])
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				m["corpus/"+f] = []byte(s)
				break
			}
		}
	}
	for _, size := range []int{1 << 10, 16 << 10, 64 << 10} {
		m["sample/"+strconv.Itoa(size)] = SampleChatBodyOfSize(size)
		m["prose/"+strconv.Itoa(size)] = proseChatBody(size)
	}
	m["sample/3x200"] = SampleChatBody(3, 200)
	m["responses"] = []byte(`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b\"\\"}]},` +
		`{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":[1,2]}"},{"type":"function_call_output","call_id":"c1","output":"o"},` +
		`{"type":"reasoning","encrypted_content":"e"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"t"}]}],` +
		`"instructions":"i","tools":[{"type":"function","name":"f","parameters":{"type":"object"}},{"type":"function","name":"e"}],"m\u006fdel":"x"}`)
	base := SampleChatBody(3, 200)
	ins := []string{`\`, `"`, `\"`, `\\`, `{`, `}`, `[`, `]`, `,`, `:`, " ", "\x01", "\n", `\u00e9`, `\q`, `1`, `null`, `"x":1,`}
	for k, b := range mutations(base, ins, 12345, 3000) {
		m[fmt.Sprintf("mut/%04d", k)] = b
	}
	return m
}

// mutations returns n deterministic mutations of base, each one to three
// edits drawn by an xorshift generator seeded with seed: an insertion of one
// of ins, a deleted or a flipped byte, or a truncation. The golden digests
// depend on them: the draws must not change.
func mutations(base []byte, ins []string, seed uint64, n int) [][]byte {
	r := seed
	rnd := func(n int) int {
		r ^= r << 13
		r ^= r >> 7
		r ^= r << 17
		return int(r % uint64(n))
	}
	out := make([][]byte, n)
	for k := range out {
		b := append([]byte(nil), base...)
		for n := 1 + rnd(3); n > 0; n-- {
			p := rnd(len(b) + 1)
			switch rnd(4) {
			case 0:
				b = append(b[:p:p], append([]byte(ins[rnd(len(ins))]), b[p:]...)...)
			case 1:
				if p < len(b) {
					b = append(b[:p:p], b[p+1:]...)
				}
			case 2:
				if p < len(b) {
					b[p] ^= byte(1 << rnd(8))
				}
			default:
				b = b[:p]
			}
		}
		out[k] = b
	}
	return out
}

// viewDigest is what Parse made of body: its verdict and every field a
// caller reads, History first.
func viewDigest(v *View, body []byte, kind Kind) string {
	err := Parse(v, body, kind)
	h := sha256.New()
	fmt.Fprintf(h, "err=%v\x00hist=%q\x00last=%q\x00", err, v.History, v.LastUserText)
	fmt.Fprintf(h, "%q %d:%d %v %q %q %q %q %q %q %q %v %d %q %d %v %v %q\x00",
		v.Model, v.ModelStart, v.ModelEnd, v.Stream, v.SessionParamsID, v.SessionID, v.ConversationID, v.UserID, v.User,
		v.PreviousResponseID, v.ReasoningEffort, v.HasTools, v.Messages, v.LastRole, v.ToolResults, v.OpaqueReasoning,
		v.HasReasoningContent, v.Prompt)
	for _, id := range v.ToolResultIDs {
		fmt.Fprintf(h, "%q,", id)
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

// TestHistoryGolden: Parse's History (and the rest of the View, and the
// verdict) is byte-identical to that of the implementation frozen in
// testdata/view.golden (generated when the key format was last set), for
// every kind, on the fuzz seeds and corpus, the test
// bodies and 3000 mutations of a sample body. A scanner change must never
// move a history key: the prefix tree of a running router would go cold.
// Regenerate (only for an intended format change) with
//
//	go test -run TestHistoryGolden ./reqview -update-golden
func TestHistoryGolden(t *testing.T) {
	bodies := goldenBodies(t)
	names := make([]string, 0, len(bodies))
	for n := range bodies {
		names = append(names, n)
	}
	sort.Strings(names)
	var v View
	got := map[string]string{}
	var lines []string
	for _, n := range names {
		for kind := Chat; kind <= Other; kind++ {
			key, d := n+" "+kind.String(), viewDigest(&v, bodies[n], kind)
			if strings.HasPrefix(n, "mut/") {
				// The mutations in groups of 100: one digest of digests.
				key = n[:len(n)-2] + "xx " + kind.String()
				if g, ok := got[key]; ok {
					d = fmt.Sprintf("%x", sha256.Sum256([]byte(g+d)))[:24]
				}
			}
			if _, ok := got[key]; !ok {
				lines = append(lines, key)
			}
			got[key] = d
		}
	}
	for i, key := range lines {
		lines[i] = key + " " + got[key]
	}
	const file = "testdata/view.golden"
	if *updateGolden {
		if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 {
			continue
		}
		key := fs[0] + " " + fs[1]
		seen++
		if g, ok := got[key]; !ok {
			t.Errorf("%s: body missing from the test", key)
		} else if g != fs[2] {
			t.Errorf("%s: view digest %s, golden %s", key, g, fs[2])
		}
	}
	if seen != len(got) {
		t.Errorf("golden has %d entries, test %d", seen, len(got))
	}
}
