package reqview

import "testing"

// refStrEnd is strEnd byte by byte: the closing quote of the string whose
// content starts at i, or -1.
func refStrEnd(b []byte, i int) int {
	for ; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return -1
}

// TestStrEndLong: strEnd and contentEnd (the 64-byte block path, its carry across blocks
// and its tail) against the byte-by-byte reference, on strings of up to 400
// bytes with runs of backslashes of every length, at every density.
func TestStrEndLong(t *testing.T) {
	r := uint64(7)
	rnd := func() uint64 {
		r ^= r << 13
		r ^= r >> 7
		r ^= r << 17
		return r
	}
	for n := 0; n < 60000; n++ {
		l := int(rnd() % 400)
		dense := rnd() % 4 // how often a backslash run or a quote comes
		b := make([]byte, 0, l+8)
		b = append(b, "xyz\""[3-int(rnd()%4):]...)
		start := len(b)
		for len(b)-start < l {
			x := rnd()
			switch {
			case x%16 < dense*3:
				run := int(x>>8) % 70 // runs crossing a block boundary too
				for k := 0; k < run; k++ {
					b = append(b, '\\')
				}
			case x%16 < dense*3+dense:
				b = append(b, '"')
			default:
				b = append(b, "ab\x01é\x00 {}"[x>>20%8])
			}
		}
		if got, want := strEnd(b, start), refStrEnd(b, start); got != want {
			t.Fatalf("strEnd(%q, %d) = %d, want %d", b, start, got, want)
		}
		if got, want := contentEnd(b, start), refStrEnd(b, start); got != want {
			t.Fatalf("contentEnd(%q, %d) = %d, want %d", b, start, got, want)
		}
		if got, want := strEndSWAR(b, start), refStrEnd(b, start); got != want {
			t.Fatalf("strEndSWAR(%q, %d) = %d, want %d", b, start, got, want)
		}
	}
}
