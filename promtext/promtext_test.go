package promtext

import "testing"

func TestAppendLabelValue(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		if got := string(AppendLabelValue(nil, in)); got != want {
			t.Fatalf("AppendLabelValue(%q) = %s, want %s", in, got, want)
		}
	}
	f("", `""`)
	f("http://127.0.0.1:8001", `"http://127.0.0.1:8001"`)
	f(`a"b`, `"a\"b"`)
	f(`a\b`, `"a\\b"`)
	f("a\nb", `"a\nb"`)
	f("\x01tab\t", "\"\x01tab\t\"") // the format escapes only \ " and LF
	f("héllo", `"héllo"`)           // UTF-8 passes through, not \u00e9
	f("bad\xffbyte", "\"bad\uFFFDbyte\"")
}

func TestLabel(t *testing.T) {
	if got, want := Label("worker", `x"y`), `worker="x\"y"`; got != want {
		t.Fatalf("Label = %s, want %s", got, want)
	}
}

func FuzzAppendLabelValue(f *testing.F) {
	f.Add("a\"\\\n\xff")
	f.Fuzz(func(t *testing.T, s string) {
		out := AppendLabelValue(nil, s)
		// Between the quotes: no raw LF, every " and \ escaped.
		body := out[1 : len(out)-1]
		for i := 0; i < len(body); i++ {
			switch body[i] {
			case '\n':
				t.Fatalf("raw newline in %q", out)
			case '"':
				t.Fatalf("unescaped quote in %q", out)
			case '\\':
				if i+1 >= len(body) || (body[i+1] != '\\' && body[i+1] != '"' && body[i+1] != 'n') {
					t.Fatalf("bad escape in %q", out)
				}
				i++
			}
		}
	})
}
