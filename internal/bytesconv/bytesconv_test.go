package bytesconv

import "testing"

func TestRoundTrip(t *testing.T) {
	f := func(s string) {
		t.Helper()
		b := S2B(s)
		if string(b) != s || len(b) != len(s) {
			t.Fatalf("S2B(%q) = %q", s, b)
		}
		if got := B2S(b); got != s {
			t.Fatalf("B2S(S2B(%q)) = %q", s, got)
		}
	}
	f("")
	f("a")
	f("model/with\\escape")
}

func TestB2SAliases(t *testing.T) {
	b := []byte("abc")
	s := B2S(b)
	b[0] = 'x' // the string sees the change: it is a view, not a copy
	if s != "xbc" {
		t.Fatalf("B2S copied: %q", s)
	}
	if n := testing.AllocsPerRun(100, func() { _ = B2S(b); _ = S2B("abc") }); n != 0 {
		t.Fatalf("%v allocations, want 0", n)
	}
}
