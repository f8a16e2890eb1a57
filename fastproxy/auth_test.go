package fastproxy

import (
	"crypto/sha256"
	"strings"
	"testing"
)

// newAdminKeys: --admin-api-key is "admin"; a "name:key" line is name; a
// bare key (or a line with an empty side) is named from its digest, and the
// whole line is the key; every key is found by its digest, never by its name.
func FuzzAdminKeys(f *testing.F) {
	for _, s := range []string{"ops:k1", "bare", ":k", "n:", "a:b:c", "", "ünï:cödé"} {
		f.Add("single", s)
	}
	f.Fuzz(func(t *testing.T, single, line string) {
		if strings.ContainsAny(line, "\n") || line == "" {
			return
		}
		m := newAdminKeys(single, []string{line})
		name, key, named := strings.Cut(line, ":")
		if !named || name == "" || key == "" {
			name, key = "", line
		}
		got, ok := m[sha256.Sum256([]byte(key))]
		switch {
		case !ok:
			t.Fatalf("line %q: key %q not found", line, key)
		case name != "" && got != name:
			t.Fatalf("line %q: named %q, want %q", line, got, name)
		case name == "" && !strings.HasPrefix(got, "key-"):
			t.Fatalf("line %q: bare key named %q", line, got)
		}
		if single != "" && single != key {
			if m[sha256.Sum256([]byte(single))] != "admin" {
				t.Fatal("--admin-api-key is not named admin")
			}
		}
		if len(newAdminKeys("", nil)) != 0 {
			t.Fatal("no keys made a table")
		}
	})
}
