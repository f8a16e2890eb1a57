package main

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// promChecker names the checker the metrics-valid probe used (for the
// report header).
var promChecker = "not run"

// checkPromText validates Prometheus text exposition: with `promtool check
// metrics` when it is installed (exit 1 = parse error; 3 = lint findings
// only, which do not fail), else with strictPromParse. It returns the
// checker's name.
func checkPromText(text string) (string, error) {
	if p, err := exec.LookPath("promtool"); err == nil {
		cmd := exec.Command(p, "check", "metrics")
		cmd.Stdin = strings.NewReader(text)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		switch {
		case err == nil:
			return "promtool check metrics", nil
		case errors.As(err, &ee) && ee.ExitCode() == 3:
			return "promtool check metrics (lint findings ignored)", nil
		default:
			return "promtool check metrics", fmt.Errorf("%v: %s", err, oneLine(string(out)))
		}
	}
	return "built-in strict parser (promtool not installed)", strictPromParse(text)
}

var (
	metricNameRE = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelNameRE  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
	promTypes    = map[string]bool{"counter": true, "gauge": true, "histogram": true, "summary": true, "untyped": true}
)

// strictPromParse checks text format 0.0.4: comment lines, metric and
// label names, label-value escapes (only \\ \" \n), float values, no
// duplicate series, at most one TYPE per family, declared before its
// samples.
func strictPromParse(text string) error {
	seen := map[string]bool{}
	typed := map[string]bool{}
	sampled := map[string]bool{}
	for n, line := range strings.Split(text, "\n") {
		ln := n + 1
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			f := strings.Fields(line)
			if len(f) >= 3 && (f[1] == "TYPE" || f[1] == "HELP") {
				if !metricNameRE.MatchString(f[2]) {
					return fmt.Errorf("line %d: bad metric name in %s", ln, f[1])
				}
				if f[1] == "TYPE" {
					if len(f) != 4 || !promTypes[f[3]] {
						return fmt.Errorf("line %d: bad TYPE line %q", ln, line)
					}
					if typed[f[2]] {
						return fmt.Errorf("line %d: second TYPE for %s", ln, f[2])
					}
					if sampled[f[2]] {
						return fmt.Errorf("line %d: TYPE for %s after its samples", ln, f[2])
					}
					typed[f[2]] = true
				}
			}
			continue
		}
		name, labels, value, err := splitSample(line)
		if err != nil {
			return fmt.Errorf("line %d: %v: %q", ln, err, clip(line, 120))
		}
		if !metricNameRE.MatchString(name) {
			return fmt.Errorf("line %d: bad metric name %q", ln, name)
		}
		sampled[name] = true
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			sampled[strings.TrimSuffix(name, suf)] = true
		}
		fs := strings.Fields(value)
		if len(fs) < 1 || len(fs) > 2 {
			return fmt.Errorf("line %d: want VALUE [TIMESTAMP], got %q", ln, value)
		}
		if _, err := strconv.ParseFloat(fs[0], 64); err != nil && fs[0] != "+Inf" && fs[0] != "-Inf" && fs[0] != "NaN" {
			return fmt.Errorf("line %d: bad value %q", ln, fs[0])
		}
		key := name + "{" + labels + "}"
		if seen[key] {
			return fmt.Errorf("line %d: duplicate series %s", ln, clip(key, 120))
		}
		seen[key] = true
	}
	return nil
}

// splitSample splits `name{labels} value` and validates the labels.
func splitSample(line string) (name, labels, value string, err error) {
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return "", "", "", errors.New("no value")
	}
	name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		j, err := scanLabels(rest)
		if err != nil {
			return "", "", "", err
		}
		labels, rest = rest[1:j], rest[j+1:]
	}
	if !strings.HasPrefix(rest, " ") {
		return "", "", "", errors.New("no space before the value")
	}
	return name, labels, strings.TrimSpace(rest), nil
}

// scanLabels validates `{a="x",b="y"}` at the start of s and returns the
// index of the closing brace.
func scanLabels(s string) (int, error) {
	i := 1
	names := map[string]bool{}
	for {
		if i < len(s) && s[i] == '}' {
			return i, nil
		}
		j := strings.IndexByte(s[i:], '=')
		if j < 0 {
			return 0, errors.New("label without '='")
		}
		ln := s[i : i+j]
		if !labelNameRE.MatchString(ln) {
			return 0, fmt.Errorf("bad label name %q", ln)
		}
		if names[ln] {
			return 0, fmt.Errorf("duplicate label %q", ln)
		}
		names[ln] = true
		i += j + 1
		if i >= len(s) || s[i] != '"' {
			return 0, errors.New("label value not quoted")
		}
		i++
		var val bytes.Buffer
		for {
			if i >= len(s) {
				return 0, errors.New("unterminated label value")
			}
			c := s[i]
			if c == '"' {
				break
			}
			if c == '\\' {
				if i+1 >= len(s) || !strings.ContainsRune(`\"n`, rune(s[i+1])) {
					return 0, fmt.Errorf("bad escape in label value %q", ln)
				}
				i += 2
				continue
			}
			if c == '\n' {
				return 0, errors.New("raw newline in a label value")
			}
			val.WriteByte(c)
			i++
		}
		i++ // closing quote
		if i < len(s) && s[i] == ',' {
			i++
		}
	}
}
