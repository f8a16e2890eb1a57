package reqview

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// memoTools is a tools array with names out of order (the key sorts them)
// and one tool without a name.
const memoTools = `[{"type":"function","function":{"name":"zeta","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}},` +
	`{"type":"function","function":{"name":"alpha","description":"a \"quoted\" word"}},{"type":"custom"}]`

func memoBody(tools, user string) []byte {
	return []byte(`{"model":"m","tools":` + tools + `,"messages":[{"role":"user","content":"` + user + `"}]}`)
}

// TestToolsMemo: a View that met a tools array before gives, for every
// body, the same verdict and fields as a fresh View, whether the next body
// carries the same tools, other tools, or bytes that only start like them.
func TestToolsMemo(t *testing.T) {
	bodies := [][]byte{
		memoBody(memoTools, "first"),
		memoBody(memoTools, "second turn"),
		memoBody(strings.Replace(memoTools, "alpha", "beta", 1), "other tools"),
		memoBody(memoTools, "back"),
		[]byte(`{"messages":[{"role":"user","content":"x"}],"tools":` + memoTools + `}`),
		[]byte(`{"tools":` + memoTools[:len(memoTools)-1]),             // truncated inside the array
		[]byte(`{"tools":` + memoTools),                                // the object is not closed
		[]byte(`{"tools":` + memoTools + `,"tools":[],"messages":[]}`), // a later "tools" wins
		[]byte(`{"tools":` + memoTools + `x}`),                         // garbage after the array
		[]byte(`{"tools":` + memoTools + `,"model":"\q"}`),             // invalid model after it
		[]byte(`{"tools":` + memoTools + `,"messages":[{"role":"user","content":"` + // a longer array
			`u"}],"tools":` + strings.Replace(memoTools, `{"type":"custom"}`, `{"type":"custom"},{"name":"extra"}`, 1) + `}`),
	}
	var warm View
	for round := 0; round < 2; round++ {
		for i, b := range bodies {
			for kind := Chat; kind <= Other; kind++ {
				var fresh View
				if got, want := viewDigest(&warm, b, kind), viewDigest(&fresh, b, kind); got != want {
					t.Fatalf("round %d, body %d, %v: a warmed View differs from a fresh one: %q", round, i, kind, b)
				}
			}
		}
	}
}

// TestToolsMemoRecalled: a body with the same tools takes them from the
// memo (a memo altered behind the View's back shows in the key), and a
// body with other tools does not.
func TestToolsMemoRecalled(t *testing.T) {
	var v View
	a := memoBody(memoTools, "a")
	if err := Parse(&v, a, Chat); err != nil {
		t.Fatal(err)
	}
	want := string(v.History)
	if len(v.memo.ents) != 3 || !bytes.Equal(v.memo.raw, []byte(memoTools)) {
		t.Fatalf("memo after the first body: %d entries, %q", len(v.memo.ents), v.memo.raw)
	}
	v.memo.ents = v.memo.ents[:1]
	if err := Parse(&v, memoBody(memoTools, "a"), Chat); err != nil {
		t.Fatal(err)
	}
	if string(v.History) == want || bytes.Count(v.History, []byte{tagTool}) != 1 {
		t.Fatalf("the same tools were walked again, not recalled: %q", v.History)
	}
	other := strings.Replace(memoTools, "zeta", "eta", 1)
	if err := Parse(&v, memoBody(other, "a"), Chat); err != nil {
		t.Fatal(err)
	}
	if bytes.Count(v.History, []byte{tagTool}) != 3 || !bytes.Equal(v.memo.raw, []byte(other)) {
		t.Fatalf("other tools: key %q, memo %q", v.History, v.memo.raw)
	}
}

// TestToolsMemoKeepsNoInvalid: tools whose interpreted strings are invalid
// are never remembered, so the same bytes fail again, at the same offset.
func TestToolsMemoKeepsNoInvalid(t *testing.T) {
	bad := memoBody(strings.Replace(memoTools, `"alpha"`, `"al\qpha"`, 1), "x")
	var v View
	for range 2 {
		err := Parse(&v, bad, Chat)
		var me *MalformedError
		if !errors.As(err, &me) || me.Offset != bytes.Index(bad, []byte(`\q`)) {
			t.Fatalf("Parse = %v, want the offset of the bad escape", err)
		}
		if len(v.memo.raw) != 0 {
			t.Fatalf("an invalid tools array was remembered: %q", v.memo.raw)
		}
	}
}

// TestToolsMemoBounded: an array larger than maxToolsMemo is not copied.
func TestToolsMemoBounded(t *testing.T) {
	big := `[{"type":"function","function":{"name":"f","description":"` + strings.Repeat("d", maxToolsMemo) + `"}}]`
	var v View
	if err := Parse(&v, memoBody(memoTools, "x"), Chat); err != nil {
		t.Fatal(err)
	}
	if err := Parse(&v, memoBody(big, "x"), Chat); err != nil {
		t.Fatal(err)
	}
	if len(v.memo.raw) != 0 || !v.HasTools {
		t.Fatalf("memo of %d bytes for a %d-byte array", len(v.memo.raw), len(big))
	}
}

// BenchmarkParseToolsChanging is BenchmarkParse/1KB with the tools changing
// every body, so that the memo never serves: the cost of a miss.
func BenchmarkParseToolsChanging(b *testing.B) {
	body := SampleChatBodyOfSize(1 << 10)
	i := bytes.Index(body, []byte(`"name":"`)) + len(`"name":"`)
	bodies := [2][]byte{body, bytes.Clone(body)}
	bodies[1][i] ^= 0x20 // the first tool's name changes case
	var v View
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if err := Parse(&v, bodies[n&1], Chat); err != nil {
			b.Fatal(err)
		}
		n++
	}
}

// TestToolsMemoParseModel: ParseModel keeps the arrays whose structure it
// checked and recalls any memo; Parse recalls only the arrays it walked.
func TestToolsMemoParseModel(t *testing.T) {
	body := memoBody(memoTools, "x")
	var v, fresh View
	if err := ParseModel(&v, body); err != nil || string(v.Model) != "m" || v.HasTools {
		t.Fatalf("ParseModel: %v %q HasTools %v", err, v.Model, v.HasTools)
	}
	if !bytes.Equal(v.memo.raw, []byte(memoTools)) || v.memo.walked {
		t.Fatalf("after ParseModel: memo %q, walked %v", v.memo.raw, v.memo.walked)
	}
	if got, want := viewDigest(&v, body, Chat), viewDigest(&fresh, body, Chat); got != want {
		t.Fatal("Parse took its tools from an array ParseModel kept")
	}
	if !v.memo.walked {
		t.Fatal("Parse did not keep the array it walked")
	}
	if err := ParseModel(&v, body); err != nil || !v.memo.walked {
		t.Fatalf("ParseModel did not recall the walked array: %v, walked %v", err, v.memo.walked)
	}
	// An invalid tool name: ParseModel accepts it (as Parse(…, Other) does),
	// and its memo of the array must not make Parse(…, Chat) accept it.
	bad := memoBody(strings.Replace(memoTools, `"alpha"`, `"al\qpha"`, 1), "x")
	if err := ParseModel(&v, bad); err != nil {
		t.Fatal(err)
	}
	if err := Parse(&v, bad, Chat); err == nil {
		t.Fatal("Parse accepted an invalid tool name from ParseModel's memo")
	}
}
