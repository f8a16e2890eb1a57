package saar

import (
	"strconv"
	"strings"

	"github.com/warmroute/warmroute/internal/bytesconv"
)

// ComplexityHeader is the request header that sets the complexity
// explicitly (a float in [0, 1]; it wins over every other estimate).
const ComplexityHeader = "x-warmroute-complexity"

// Complexity sources, as recorded.
const (
	SourceHeader          = "header"
	SourceReasoningEffort = "reasoning_effort"
	SourceHeuristic       = "heuristic"
)

// Keyword tiers of the complexity heuristic (matched case-insensitively on
// word boundaries in the latest user text).
var (
	highTier = words("prove", "proof", "theorem", "derive", "derivation", "formal", "formally", "rigorous",
		"step by step", "architecture", "tradeoff", "trade-off", "tradeoffs", "optimize", "optimise",
		"analyze", "analyse", "research", "plan", "reason")
	midTier = words("debug", "refactor", "implement", "explain", "compare", "design", "algorithm",
		"bug", "code", "function", "test", "review", "sql", "regex", "compile", "stack trace")
	lowTier = words("hi", "hello", "thanks", "thank you", "summarize", "summarise", "translate",
		"rephrase", "list", "spell", "define")
)

func words(ws ...string) [][]byte {
	out := make([][]byte, len(ws))
	for i, w := range ws {
		out[i] = []byte(w)
	}
	return out
}

// Complexity estimate (documented in the package doc):
//
//	header x-warmroute-complexity (float, clamped to [0,1])      wins
//	else reasoning_effort: minimal .1, low .2, medium .5, high .9, xhigh 1
//	else 0.35 + 0.35 if a high-tier keyword, else + 0.15 if a mid-tier
//	     keyword, else − 0.20 if a low-tier keyword;
//	     + 0.15 · min(1, history_tokens / 32000); + 0.05 if tools offered;
//	     clamped to [0, 1].
func complexity(in *Inputs) (float64, string) {
	if v := in.header(ComplexityHeader); v != "" {
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && f == f {
			return clamp01(f), SourceHeader
		}
	}
	switch strings.ToLower(in.ReasoningEffort) {
	case "minimal", "none":
		return 0.1, SourceReasoningEffort
	case "low":
		return 0.2, SourceReasoningEffort
	case "medium":
		return 0.5, SourceReasoningEffort
	case "high":
		return 0.9, SourceReasoningEffort
	case "xhigh":
		return 1, SourceReasoningEffort
	}
	c := 0.35
	t := bytesconv.S2B(in.Text)
	switch {
	case anyWordFold(t, highTier):
		c += 0.35
	case anyWordFold(t, midTier):
		c += 0.15
	case anyWordFold(t, lowTier):
		c -= 0.20
	}
	c += 0.15 * min(1, float64(in.HistoryTokens)/32000)
	if in.HasTools {
		c += 0.05
	}
	return clamp01(c), SourceHeuristic
}

func clamp01(f float64) float64 {
	if f < 0 {
		return 0
	}
	if f > 1 {
		return 1
	}
	return f
}

// matchDecision returns the index of the first decision of lg whose signals
// all match; -1 when none matches (a config whose last decision has no
// signals never returns -1).
func matchDecision(lg *Logical, in *Inputs) int {
	for i := range lg.Decisions {
		if signalsMatch(&lg.Decisions[i].Signals, in) {
			return i
		}
	}
	return -1
}

func signalsMatch(s *Signals, in *Inputs) bool {
	t := bytesconv.S2B(in.Text)
	if len(s.kw) > 0 && !anyWordFold(t, s.kw) {
		return false
	}
	if len(s.re) > 0 {
		ok := false
		for _, re := range s.re {
			if re.Match(t) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if s.MinHistoryTokens > 0 && in.HistoryTokens < s.MinHistoryTokens {
		return false
	}
	if s.HasTools != nil && *s.HasTools != in.HasTools {
		return false
	}
	if s.Header != nil {
		v := in.header(s.Header.Name)
		if v == "" || (s.Header.Value != "" && !strings.EqualFold(v, s.Header.Value)) {
			return false
		}
	}
	return true
}

// anyWordFold reports whether any of the lower-case words occurs in text,
// ASCII case-insensitively, delimited by non-alphanumeric bytes or the ends.
func anyWordFold(text []byte, ws [][]byte) bool {
	for _, w := range ws {
		if containsWordFold(text, w) {
			return true
		}
	}
	return false
}

func containsWordFold(text, w []byte) bool {
	n := len(w)
	if n == 0 || n > len(text) {
		return false
	}
	for i := 0; i+n <= len(text); i++ {
		if i > 0 && isAlnum(text[i-1]) {
			continue
		}
		if i+n < len(text) && isAlnum(text[i+n]) {
			continue
		}
		j := 0
		for ; j < n; j++ {
			c := text[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != w[j] {
				break
			}
		}
		if j == n {
			return true
		}
	}
	return false
}

func isAlnum(c byte) bool {
	return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') || c == '_'
}
