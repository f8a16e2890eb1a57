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

// TestMemoryPerChar checks that the tree retains at most 2 bytes of heap per
// stored character for chat-like turns.
func TestMemoryPerChar(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 2 MB tree")
	}
	perChar, chars := memPerChar(64, 16, 2048)
	t.Logf("2 KB turns: %.3f bytes/char over %d chars", perChar, chars)
	if perChar > 2 {
		t.Fatalf("%.3f bytes per stored character; want <= 2", perChar)
	}
	perChar, chars = memPerChar(64, 16, 256)
	t.Logf("256 B turns: %.3f bytes/char over %d chars", perChar, chars)
	if perChar > 2 {
		t.Fatalf("%.3f bytes per stored character; want <= 2", perChar)
	}
}
