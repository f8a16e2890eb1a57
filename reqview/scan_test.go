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

// TestAddTextAtCopy: a content string copied into the history key by the
// same loads that find its end (strEndCopy), across block boundaries and in
// the last bytes of the body, with escaped quotes and backslash runs of
// every length; the key must hold exactly the raw content.
func TestAddTextAtCopy(t *testing.T) {
	r := uint64(11)
	rnd := func() uint64 {
		r ^= r << 13
		r ^= r >> 7
		r ^= r << 17
		return r
	}
	pieces := []string{"a", "é", `\"`, `\\`, `\n`, " ", `\u00e9`, "{", "}"}
	var v View
	for n := 0; n < 20000; n++ {
		l := int(rnd() % 300)
		var c []byte
		for len(c) < l {
			x := rnd()
			if x%8 == 0 {
				for k := int(x>>8) % 40; k > 0; k-- { // a run of escaped backslashes
					c = append(c, `\\`...)
				}
				continue
			}
			c = append(c, pieces[x>>20%uint64(len(pieces))]...)
		}
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"`)
		body = append(body, c...)
		body = append(body, `"}]`...)
		for k := int(rnd() % 80); k > 0; k-- {
			body = append(body, ' ')
		}
		body = append(body, '}')
		if err := Parse(&v, body, Chat); err != nil {
			t.Fatalf("Parse(%q): %v", body, err)
		}
		want := ""
		if len(c) > 0 {
			want = "\x04\x1e" + string(c)
		}
		if string(v.History) != want || string(v.LastUserText) != string(c) {
			t.Fatalf("Parse(%q): History %q, LastUserText %q, want content %q", body, v.History, v.LastUserText, c)
		}
	}
}
