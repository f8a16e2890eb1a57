package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `warmroute replay` re-runs the records of routers of every policy version
// (saar/testdata/replay: made under versions 1, 2 and 3 by an earlier
// build, with the config beside them) and exits 1 on a tampered record.
func TestReplayEveryPolicyVersion(t *testing.T) {
	dir := filepath.Join("..", "..", "saar", "testdata", "replay")
	cfg := filepath.Join(dir, "config.yaml")
	for _, v := range []string{"v1", "v2", "v3"} {
		path := filepath.Join(dir, v+".jsonl")
		var errOut strings.Builder
		if c := run(context.Background(), []string{"replay", "--config", cfg, path}, io.Discard, &errOut); c != 0 ||
			!strings.Contains(errOut.String(), "all 72 decisions reproduced") {
			t.Fatalf("%s: replay exit %d: %s", v, c, errOut.String())
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		tampered := filepath.Join(t.TempDir(), v+".jsonl")
		if err := os.WriteFile(tampered, []byte(strings.Replace(string(b), `"action":"stay"`, `"action":"switch"`, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
		errOut.Reset()
		if c := run(context.Background(), []string{"replay", "--config", cfg, tampered}, io.Discard, &errOut); c != 1 ||
			!strings.Contains(errOut.String(), "1 of 72 decisions differ") {
			t.Fatalf("%s: tampered replay exit %d: %s", v, c, errOut.String())
		}
	}
}

// Records name the config revision that decided them; replay says how many
// came from another config than the one it was given.
func TestReplayNamesOtherConfigRevisions(t *testing.T) {
	dir := filepath.Join("..", "..", "saar", "testdata", "replay")
	b, err := os.ReadFile(filepath.Join(dir, "v3.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSpace(string(b)), "\n")
	lines[0] = strings.Replace(lines[0], `"policy":`, `"config_revision":"sha256:000000000000","policy":`, 1)
	path := filepath.Join(t.TempDir(), "mixed.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut strings.Builder
	run(context.Background(), []string{"replay", "--config", filepath.Join(dir, "config.yaml"), path}, &out, &errOut)
	if !strings.Contains(errOut.String(), "1 of 72 records were decided under another config") ||
		!strings.Contains(out.String(), `"sha256:000000000000": 1`) {
		t.Fatalf("stdout %.300s\nstderr %s", out.String(), errOut.String())
	}
}
