package fastproxy

import (
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/tenantlimit"
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

// TestParseClientKeys: the old forms keep their meaning, limits attach to
// the tenant, and each malformed line is refused by its number without
// quoting its key.
func TestParseClientKeys(t *testing.T) {
	keys, err := parseClientKeys([]string{"# comment", "", "alpha:ka rpm=5\ttpm=900", "kbare", "alpha:ka2  tpm=900 rpm=5", ":odd", "beta:kb"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		name string
		lim  tenantlimit.Limits
	}{
		"ka":    {"alpha", tenantlimit.Limits{RPM: 5, TPM: 900}},
		"ka2":   {"alpha", tenantlimit.Limits{RPM: 5, TPM: 900}},
		"kbare": {"key-", tenantlimit.Limits{}},
		":odd":  {"key-", tenantlimit.Limits{}}, // empty name: a bare key, as before
		"beta":  {"", tenantlimit.Limits{}},     // not a key
		"kb":    {"beta", tenantlimit.Limits{}},
	}
	for k, w := range want {
		tn := keys[sha256.Sum256([]byte(k))]
		if w.name == "" {
			if tn != nil {
				t.Errorf("%q is a key", k)
			}
			continue
		}
		if tn == nil || !strings.HasPrefix(tn.name, w.name) || tn.limits != w.lim {
			t.Errorf("%q: %+v, want %s %+v", k, tn, w.name, w.lim)
		}
	}
	if keys[sha256.Sum256([]byte("ka"))] != keys[sha256.Sum256([]byte("ka2"))] {
		t.Error("two keys of one name are two tenants")
	}
	for _, tc := range []struct {
		lines []string
		want  string
	}{
		{[]string{"a:secret1", "b:secret2 rpm"}, "line 2: after the key"},
		{[]string{"a:secret1 rpm=0"}, "line 1: rpm wants a whole number"},
		{[]string{"a:secret1 tpm=-3"}, "line 1: tpm wants"},
		{[]string{"a:secret1 rpm=1 rpm=2"}, "line 1: rpm given twice"},
		{[]string{"a:secret1 burst=2"}, "line 1: after the key"},
		{[]string{"a:secret1", "", "a:secret1"}, "line 3: the same key as line 1"},
		{[]string{"a:secret1 rpm=2", "a:secret2"}, "line 2: a has other limits on line 1"},
		{[]string{`a"b:secret1`}, "line 1: a key's name"},
		{[]string{"", "# none"}, "no keys"},
	} {
		_, err := parseClientKeys(tc.lines)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.lines, err, tc.want)
			continue
		}
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error quotes a key: %v", tc.lines, err)
		}
	}
	if k, err := parseClientKeys(nil); k != nil || err != nil {
		t.Fatalf("no lines: %v %v", k, err)
	}
}

// FuzzParseClientKeys: any file parses or fails without panicking; an
// error never quotes a key; what parses maps each key line's key to a
// tenant with a valid name, without limits when its line gives none.
func FuzzParseClientKeys(f *testing.F) {
	for _, s := range []string{"a:k", "k", "a:k rpm=1 tpm=2", "a:k rpm=1\na:j rpm=1", "a:k rpm=1\na:j", "# c\n\n  a:k   tpm=9 ", ":k", "a:", "a:k rpm=1 rpm=1", "a:k x", "a:k rpm=99999999999999999999", "a\"b:k"} {
		f.Add(s)
	}
	const secret = "SECRET-9f8e7d"
	f.Fuzz(func(t *testing.T, file string) {
		lines := strings.Split(strings.ReplaceAll(file, "$", secret), "\n")
		keys, err := parseClientKeys(lines)
		if err != nil {
			named := false // the secret as a name may be quoted: names are not secret
			for _, l := range lines {
				if name, _, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && strings.Contains(name, secret) {
					named = true
				}
			}
			if !named && strings.Contains(err.Error(), secret) {
				t.Fatalf("the error quotes a key: %v", err)
			}
			return
		}
		for _, l := range lines {
			fs := strings.Fields(l)
			if len(fs) == 0 || strings.HasPrefix(fs[0], "#") {
				continue
			}
			key := fs[0]
			if name, k, ok := strings.Cut(fs[0], ":"); ok && name != "" && k != "" {
				key = k
			}
			tn := keys[sha256.Sum256([]byte(key))]
			if tn == nil || !validTenantName(tn.name) {
				t.Fatalf("line %q: tenant %+v", l, tn)
			}
			if len(fs) == 1 && tn.limits.On() { // the lines of a name agree on its limits
				t.Fatalf("line %q without limits: %+v", l, tn.limits)
			}
		}
	})
}
