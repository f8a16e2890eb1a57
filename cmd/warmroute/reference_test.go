package main

import (
	"bytes"
	"context"
	"errors"
	"go/scanner"
	"go/token"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// referencePath is docs/reference.md, from this package's directory (where
// go test runs).
const referencePath = "../../docs/reference.md"

// noDefault is the default column of a flag whose --help prints none.
const noDefault = "—"

// TestReferenceListsEveryFlag holds docs/reference.md's flag tables to the
// binary: every flag --help prints has one row, with the default --help
// prints, and every row names a flag. A new flag fails here until its row
// is written.
func TestReferenceListsEveryFlag(t *testing.T) {
	help := helpDefaults(t)
	rows := referenceRows(t, "Flags", "--")
	for name, def := range help {
		want := noDefault
		if def != "" {
			want = "`" + def + "`"
		}
		got, ok := rows[name]
		switch {
		case !ok:
			t.Errorf("--%s is not in docs/reference.md: add the row | `--%s` | %s | … | to a table under ## Flags", name, name, want)
		case got != want:
			t.Errorf("docs/reference.md gives --%s the default %s; --help prints %s", name, got, want)
		}
	}
	for name := range rows {
		if _, ok := help[name]; !ok {
			t.Errorf("docs/reference.md lists --%s, which --help does not print", name)
		}
	}
}

// TestReferenceListsEveryMetric holds docs/reference.md's metric tables to
// the router: every vllm_router_* and warmroute_* family a demo router
// exposes, after one routed request, has a row; and every row names a
// metric some non-test source of the module writes (as a string literal),
// so a renamed or removed metric fails here too.
func TestReferenceListsEveryMetric(t *testing.T) {
	rows := referenceRows(t, "Metrics", "")
	for _, f := range exposedFamilies(t) {
		if _, ok := rows[f]; !ok {
			t.Errorf("the router exposes %s, which docs/reference.md does not list: add its row under ## Metrics", f)
		}
	}
	literals := sourceStringLiterals(t, "../..")
	for name := range rows {
		if !regexp.MustCompile(`(^|[^a-z0-9_])` + regexp.QuoteMeta(name) + `($|[^a-z0-9_])`).MatchString(literals) {
			t.Errorf("docs/reference.md lists the metric %s, which no source writes", name)
		}
	}
}

// helpDefaults returns every flag --help prints, with the default it prints
// ("" when it prints none).
func helpDefaults(t *testing.T) map[string]string {
	t.Helper()
	var out bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &out); !errors.Is(err, errHelp) {
		t.Fatalf("-h: %v, want errHelp", err)
	}
	quoted := regexp.MustCompile(`\(default ("(?:[^"\\]|\\.)*")\)$`)
	plain := regexp.MustCompile(`\(default ([^()"]*)\)$`)
	flags := map[string]string{}
	lines := strings.Split(out.String(), "\n")
	for i, line := range lines {
		if !strings.HasPrefix(line, "  -") {
			continue
		}
		fields := strings.Fields(line[3:])
		name, typ := fields[0], ""
		if len(fields) > 1 {
			typ = fields[1]
		}
		var usage string
		for _, u := range lines[i+1:] {
			if !strings.HasPrefix(u, "    \t") {
				break
			}
			usage += u[len("    \t"):]
		}
		def := ""
		if m := quoted.FindStringSubmatch(usage); m != nil {
			s, err := strconv.Unquote(m[1])
			if err != nil {
				t.Fatalf("--%s: default %s: %v", name, m[1], err)
			}
			def = s
		} else if m := plain.FindStringSubmatch(usage); m != nil && typ != "string" {
			def = m[1] // a string flag's default is always quoted
		}
		flags[name] = def
	}
	if len(flags) < 10 {
		t.Fatalf("read %d flags from --help:\n%s", len(flags), out.String())
	}
	return flags
}

// referenceRows returns the rows of the tables in docs/reference.md's
// section "## title" (its subsections included) whose first cell is one
// back-quoted name starting with prefix: name without prefix → the row's
// second cell. A name listed twice fails the test.
func referenceRows(t *testing.T, title, prefix string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(referencePath)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "## ") {
			in = line == "## "+title
			continue
		}
		if !in || !strings.HasPrefix(line, "| `"+prefix) {
			continue
		}
		cells := strings.Split(line, " | ")
		name := strings.TrimPrefix(cells[0], "| ")
		if len(cells) < 2 || strings.Count(name, "`") != 2 || !strings.HasSuffix(name, "`") {
			t.Errorf("docs/reference.md, %s: the row %q must start with one back-quoted name", title, line)
			continue
		}
		name = strings.TrimPrefix(strings.Trim(name, "`"), prefix)
		if _, dup := rows[name]; dup {
			t.Errorf("docs/reference.md, %s: %s has two rows", title, name)
		}
		rows[name] = strings.TrimSpace(cells[1])
	}
	if len(rows) == 0 {
		t.Fatalf("docs/reference.md has no rows under ## %s", title)
	}
	return rows
}

// exposedFamilies starts a demo router as main does, sends one request of
// the logical model through it (so that per-model and per-worker series
// exist), and returns the vllm_router_* and warmroute_* families of its
// /metrics, histogram suffixes folded into their family.
func exposedFamilies(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr, code := startMain(t, ctx, "--demo", "--demo-workers", "3", "--admin-api-key", "k")
	defer func() {
		cancel()
		if c := <-code; c != 0 {
			t.Errorf("router exit code %d", c)
		}
	}()
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"auto","max_tokens":1,"messages":[{"role":"user","content":"hello"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer k")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		name := line[:strings.IndexAny(line+" ", "{ ")]
		if !strings.HasPrefix(name, "vllm_router_") && !strings.HasPrefix(name, "warmroute_") {
			continue
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && histogramFamily(string(body), base) {
				name = base
			}
		}
		seen[name] = true
	}
	if len(seen) < 20 {
		t.Fatalf("only %d router families on /metrics:\n%s", len(seen), body)
	}
	out := make([]string, 0, len(seen))
	for f := range seen {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// histogramFamily reports whether base is a histogram in the exposition:
// it has _bucket series.
func histogramFamily(exposition, base string) bool {
	return strings.Contains(exposition, "\n"+base+"_bucket{") || strings.HasPrefix(exposition, base+"_bucket{")
}

// sourceStringLiterals returns the string literals of every non-test Go
// file of the module under root, bench/ excluded (it reads metrics, it does
// not write them), concatenated: where metric names are written. Comments
// are not literals, so a name only a comment mentions is no metric.
func sourceStringLiterals(t *testing.T, root string) string {
	t.Helper()
	var sb strings.Builder
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "bench") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		var s scanner.Scanner
		s.Init(fset.AddFile(path, -1, len(src)), src, nil, 0)
		for {
			_, tok, lit := s.Scan()
			if tok == token.EOF {
				return nil
			}
			if tok == token.STRING {
				sb.WriteString(lit)
				sb.WriteByte('\n')
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return sb.String()
}
