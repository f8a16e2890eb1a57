//go:build !race

package radix

import "testing"

func TestAllocsMatchTouch(t *testing.T) {
	f := newConvFixture(64<<10, 8, Config{})
	healthy := [4]bool{true, false, true, true}
	eligible := func(w uint32) bool { return w < 4 && healthy[w] }
	var m Match
	if n := testing.AllocsPerRun(100, func() { m = f.tr.Match(f.query, nil) }); n != 0 {
		t.Fatalf("Match allocates %v times", n)
	}
	if m.Len != len(f.keys[0]) {
		t.Fatalf("Match = %+v", m)
	}
	if n := testing.AllocsPerRun(100, func() { m = f.tr.Match(f.query, eligible) }); n != 0 {
		t.Fatalf("Match with eligible allocates %v times", n)
	}
	ok := false
	if n := testing.AllocsPerRun(100, func() { ok = f.tr.Touch(f.keys[0], 0) }); n != 0 {
		t.Fatalf("Touch allocates %v times", n)
	}
	if !ok {
		t.Fatal("Touch = false")
	}
	if n := testing.AllocsPerRun(100, func() { ok = f.tr.Touch(f.query, 0) }); n != 0 || ok {
		t.Fatalf("failed Touch allocates %v times (ok=%v)", n, ok)
	}
}
