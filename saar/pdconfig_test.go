package saar

import (
	"errors"
	"slices"
	"testing"
)

// TestConfigPDWorkerLists: a physical model may list prefill_workers and
// decode_workers beside workers (docs/design.md §9, "Disaggregated
// fleets"); the line of the first is kept for the router's errors, and a
// list that is not a list of strings names its line.
func TestConfigPDWorkerLists(t *testing.T) {
	cfg, err := ParseConfig([]byte(`models:
  - name: a
    quality_score: 0.5
    workers: ["http://r:1"]
    decode_workers: ["http://d:1", "http://d:2@1"]
    prefill_workers:
      - http://p:1
  - name: b
    quality_score: 0.9
    workers: ["http://r:2"]
`))
	if err != nil {
		t.Fatal(err)
	}
	a, b := cfg.Models[0], cfg.Models[1]
	if !slices.Equal(a.Workers, []string{"http://r:1"}) || !slices.Equal(a.PrefillWorkers, []string{"http://p:1"}) ||
		!slices.Equal(a.DecodeWorkers, []string{"http://d:1", "http://d:2@1"}) || a.PDLine != 5 {
		t.Fatalf("model a: %+v", a)
	}
	if b.PrefillWorkers != nil || b.DecodeWorkers != nil || b.PDLine != 0 {
		t.Fatalf("model b has PD workers: %+v", b)
	}
	for _, c := range []struct {
		yml  string
		line int
	}{
		{"models:\n  - name: a\n    quality_score: 0.5\n    prefill_workers: http://p:1\n", 4},
		{"models:\n  - name: a\n    quality_score: 0.5\n    decode_workers: [[http://d:1]]\n", 4},
		{"models:\n  - name: a\n    quality_score: 0.5\n    decode_workers: []\n    decode_workers: []\n", 5},
	} {
		_, err := ParseConfig([]byte(c.yml))
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Line != c.line {
			t.Errorf("%q: %v, want an error at line %d", c.yml, err, c.line)
		}
	}
}
