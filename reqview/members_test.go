package reqview

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMembers(t *testing.T) {
	body := []byte(` { "model" : "m", "a\"b":[1,{"x":"}"}], "n":null ,"s":"v\\"}  `)
	var got []string
	if !Members(body, func(k []byte, from, s, e int) bool {
		if body[from] != '"' || from >= s {
			t.Errorf("member %q starts at %d, its value at %d", k, from, s)
		}
		got = append(got, string(k)+"="+string(body[s:e]))
		return true
	}) {
		t.Fatal("a valid object was not walked")
	}
	if want := `model="m"|a"b=[1,{"x":"}"}]|n=null|s="v\\"`; strings.Join(got, "|") != want {
		t.Fatalf("members %q, want %q", strings.Join(got, "|"), want)
	}
	for _, bad := range []string{``, `[1]`, `{"a":1`, `{"a":}`, `{"a":1} x`, `{"a" 1}`, `"s"`} {
		if Members([]byte(bad), func([]byte, int, int, int) bool { return true }) {
			t.Errorf("Members(%q) walked garbage", bad)
		}
	}
	n := 0
	if !Members([]byte(`{"a":1,"b":2}`), func([]byte, int, int, int) bool { n++; return false }) || n != 1 {
		t.Fatal("stopping early")
	}
}

func FuzzMembers(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	f.Add([]byte(`{"a":"\u00e9\"","b":[[]],"c":{}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		valid := json.Valid(body) && strings.HasPrefix(strings.TrimSpace(string(body)), "{")
		ok := Members(body, func(k []byte, from, s, e int) bool {
			if from < 0 || from >= s || s >= e || e > len(body) || body[from] != '"' || valid && !json.Valid(body[s:e]) {
				t.Fatalf("member %q: span [%d,%d) of %q is not a JSON value", k, s, e, body)
			}
			return true
		})
		if valid && !ok {
			t.Fatalf("a valid object was not walked: %q", body)
		}
	})
}
