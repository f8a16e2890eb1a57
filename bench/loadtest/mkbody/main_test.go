package main

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/warmroute/warmroute/reqview"
)

// TestVariants: the bodies of --variants have one size, parse, and differ
// in their tools and their history key while sharing the system prompt; the
// escape-dense body's variants keep its escapes.
func TestVariants(t *testing.T) {
	for name, m := range map[string]map[string]json.RawMessage{
		"1024": sampleBody(1024, "sample-model", false, 16), "16384": sampleBody(16384, "sample-model", false, 16),
		"esc16k": escapeDenseBody(t),
	} {
		whole, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		var first []byte
		tools := map[string]bool{}
		keys := map[string]bool{}
		for _, v := range []int{0, 7, 42, 1000} { // numbers of every width
			b := variant(m, v)
			if first == nil {
				first = b
			} else if len(b) != len(first) {
				t.Fatalf("%s: variant %d is %d bytes, variant 0 %d", name, v, len(b), len(first))
			}
			var view reqview.View
			if err := reqview.Parse(&view, b, reqview.Chat); err != nil {
				t.Fatalf("%s: variant %d does not parse: %v", name, v, err)
			}
			var body struct {
				Tools    json.RawMessage `json:"tools"`
				Messages []struct {
					Role    string          `json:"role"`
					Content json.RawMessage `json:"content"`
				} `json:"messages"`
			}
			if err := json.Unmarshal(b, &body); err != nil {
				t.Fatal(err)
			}
			tools[string(body.Tools)] = true
			keys[string(view.History)] = true
			if body.Messages[0].Role != "system" || !bytes.Equal(body.Messages[0].Content, mustSystem(t, m)) {
				t.Fatalf("%s: variant %d changed the system prompt", name, v)
			}
			if got, want := escapes(b)["u>7f"], escapes(whole)["u>7f"]; got != want {
				t.Fatalf("%s: variant %d has %d \\u escapes of non-ASCII, the body %d", name, v, got, want)
			}
		}
		if len(tools) != 4 || len(keys) != 4 {
			t.Fatalf("%s: 4 variants gave %d tool arrays and %d history keys, want 4 of each", name, len(tools), len(keys))
		}
	}
}

// TestEscapeDense: the esc16k body is exactly 16 KB of valid JSON that
// reqview parses into a history key, dense with every kind of escape
// (at least minEach of each, minPerKB in all per KB and at least twice the
// plain 16 KB body's density), with non-ASCII both raw and as \uXXXX (a
// surrogate pair among them), and the plain 16 KB body's system prompt and
// tools.
func TestEscapeDense(t *testing.T) {
	const minEach, minPerKB = 20, 64
	m := escapeDenseBody(t)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 16<<10 {
		t.Fatalf("esc16k is %d bytes, want %d", len(b), 16<<10)
	}
	if !json.Valid(b) {
		t.Fatal("esc16k is not valid JSON")
	}
	var view reqview.View
	if err := reqview.Parse(&view, b, reqview.Chat); err != nil {
		t.Fatalf("reqview.Parse: %v", err)
	}
	if len(view.History) == 0 || string(view.LastRole) != "user" || view.Messages < 10 {
		t.Fatalf("parsed: %d history key bytes, last role %q, %d messages; want a key, user, ≥ 10",
			len(view.History), view.LastRole, view.Messages)
	}
	esc := escapes(b)
	for _, k := range []string{`"`, `\`, "n", "t", "u>7f"} {
		if esc[k] < minEach {
			t.Errorf("%d escapes %q, want ≥ %d (all: %v)", esc[k], k, minEach, esc)
		}
	}
	if esc["surrogate"] == 0 {
		t.Errorf("no surrogate pair among the \\u escapes (all: %v)", esc)
	}
	perKB := float64(esc["all"]) / float64(len(b)) * 1024
	plain, _ := json.Marshal(sampleBody(16384, "sample-model", false, 16))
	plainPerKB := float64(escapes(plain)["all"]) / float64(len(plain)) * 1024
	if perKB < minPerKB || perKB < 2*plainPerKB {
		t.Errorf("%.1f escapes per KB, want ≥ %d and ≥ 2× the plain 16 KB body's %.1f", perKB, minPerKB, plainPerKB)
	}
	if raw := len(b) - utf8.RuneCount(b); raw < minEach {
		t.Errorf("%d bytes of raw multi-byte UTF-8 beyond their first, want ≥ %d", raw, minEach)
	}
	plainM := sampleBody(16384, "sample-model", false, 16)
	if !bytes.Equal(mustSystem(t, m), mustSystem(t, plainM)) || !bytes.Equal(m["tools"], plainM["tools"]) {
		t.Error("esc16k's system prompt or tools differ from the plain 16 KB body's")
	}
}

func escapeDenseBody(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	m, err := withEscapeDense(sampleBody(escapeKinds["esc16k"], "sample-model", false, 16), escapeKinds["esc16k"])
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// escapes counts the escape sequences of JSON text b by the character after
// the backslash, "u>7f" for a \uXXXX of a non-ASCII character, "surrogate"
// for the high half of a surrogate pair, "all" for every sequence.
func escapes(b []byte) map[string]int {
	n := map[string]int{}
	for i := 0; i < len(b)-1; i++ {
		if b[i] != '\\' {
			continue
		}
		n["all"]++
		c := b[i+1]
		i++
		if c != 'u' || i+4 >= len(b) {
			n[string(c)]++
			continue
		}
		r, err := strconv.ParseUint(string(b[i+1:i+5]), 16, 16)
		i += 4
		switch {
		case err != nil:
			n["bad"]++
		case r >= 0xd800 && r < 0xdc00:
			n["surrogate"]++
			n["u>7f"]++
		case r > 0x7f:
			n["u>7f"]++
		default:
			n["u"]++
		}
	}
	return n
}

func mustSystem(t *testing.T, m map[string]json.RawMessage) json.RawMessage {
	t.Helper()
	var msgs []struct {
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(m["messages"], &msgs); err != nil || len(msgs) == 0 {
		t.Fatalf("sample body without messages: %v", err)
	}
	return msgs[0].Content
}
