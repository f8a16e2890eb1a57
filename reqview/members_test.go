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

// The view notes a top-level kv_transfer_params, however its key is
// escaped, at every depth of parse; a nested one is not it.
func TestViewNotesTransferParams(t *testing.T) {
	for body, want := range map[string]bool{
		`{"model":"m","kv_transfer_params":{"remote_host":"h"},"messages":[]}`:      true,
		`{"model":"m","kv\u005ftransfer_params":null,"messages":[]}`:                true,
		`{"model":"m","messages":[{"role":"user","content":"kv_transfer_params"}]}`: false,
		`{"model":"m","extra":{"kv_transfer_params":1},"messages":[]}`:              false,
	} {
		var v View
		if err := Parse(&v, []byte(body), Chat); err != nil || v.TransferParams != want {
			t.Errorf("Parse(%s): TransferParams %v (err %v), want %v", body, v.TransferParams, err, want)
		}
		v.Reset()
		if err := ParseModel(&v, []byte(body)); err != nil || v.TransferParams != want {
			t.Errorf("ParseModel(%s): TransferParams %v (err %v), want %v", body, v.TransferParams, err, want)
		}
	}
}
