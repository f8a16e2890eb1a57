package saar

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Config is the model-step configuration (docs/design.md §5): physical models
// with pricing and quality, and logical models with ordered decisions and
// session settings. It is read-only once returned by ParseConfig; a Router
// shares it and never mutates it. Callers may fill Model.Workers (demo
// mode) before they hand the config to the rest of the router.
type Config struct {
	Models  []Model   // physical models, in file order
	Logical []Logical // logical models, in file order

	// Revision names the file's content: "sha256:" and the first 12 hex
	// digits of the SHA-256 of the bytes ParseConfig read ("" for a config
	// built in code). Replay records carry it (Record.Config).
	Revision string

	// Router is the raw `router:` section, if any, left for the proxy to
	// decode (flag defaults from the file); SAAR does not read it.
	Router *yaml.Node

	modelIdx   map[string]int
	logicalIdx map[string]int
	maxPrompt  float64 // highest prompt_per_1m among physical models
	maxBlend   float64 // highest blended price among physical models
	headers    []string
}

// Pricing is in dollars per million tokens.
type Pricing struct {
	PromptPer1M      float64
	CachedInputPer1M float64
	CompletionPer1M  float64
}

// Blended is the price used by the base selector: 3 prompt tokens per
// completion token, (3·prompt + completion) / 4, dollars per 1M tokens.
func (p Pricing) Blended() float64 { return (3*p.PromptPer1M + p.CompletionPer1M) / 4 }

// Model is a physical model.
type Model struct {
	Name    string
	Workers []string
	// PrefillWorkers and DecodeWorkers are the model's workers of a
	// disaggregated fleet (prefill_workers, decode_workers; docs/design.md
	// §9, "Disaggregated fleets"). The model step does not read them; the
	// router accepts them only in PD mode.
	PrefillWorkers []string
	DecodeWorkers  []string
	PDLine         int     // line of the first of those keys; 0: none
	Quality        float64 // quality_score in [0, 1]
	Pricing        Pricing
	Line           int // line of the model's name in the file
}

// Logical is a logical model such as `auto`.
type Logical struct {
	Name      string
	Decisions []Decision
	Session   SessionSettings
	Line      int
}

// Decision is one intent of a logical model: the first decision whose
// signals all match the turn wins; a decision without signals matches
// every turn.
type Decision struct {
	Name       string
	Signals    Signals
	Candidates []string // physical model names, in preference order for ties
	cand       []int    // indexes into Config.Models
}

// Signals of a decision. Every signal that is set must match (AND).
type Signals struct {
	Keywords         []string // any keyword, case-insensitive, on word boundaries, in the latest user text
	Regex            []string // any regex matching the latest user text
	MinHistoryTokens int      // history tokens ≥ this (0: not set)
	HasTools         *bool    // tools offered == this
	Header           *HeaderSignal
	re               []*regexp.Regexp
	kw               [][]byte // lower-cased keywords
}

// HeaderSignal matches a request header: equal to Value (case-insensitive),
// or merely present and non-empty when Value is empty.
type HeaderSignal struct {
	Name  string
	Value string
}

// SessionSettings are the SAAR knobs of one logical model. The four
// economics keys keep their names across policy versions; their units
// differ (docs/design.md §5): under policy version 1 they are score points,
// under versions 2 and 3 (3 is the default) they price a switch in money.
type SessionSettings struct {
	IdleTimeoutSeconds   float64 // idle_timeout_seconds: reselect freely after this idle time (300)
	MinTurnsBeforeSwitch int     // min_turns_before_switch: turns on a model before an economic switch (1)
	// SwitchMargin (switch_margin, 0.05). v2: the quality value of a switch
	// must exceed its money cost by this fraction. v1: score points a
	// challenger pays.
	SwitchMargin float64
	// StayBias (stay_bias, 0.10). v2: continuity value of staying, as a
	// share of the warm history at the current model's blended price. v1:
	// score points the current model earns.
	StayBias float64
	// PrefixCacheWeight (prefix_cache_weight, 0.20). v2: share of the
	// current model's warm cache (history × (prompt − cached) × warmth)
	// charged to a switch as lost. v1: weight of the cache value in score
	// points per reference prompt.
	PrefixCacheWeight float64
	// HandoffPenalty (handoff_penalty, 0.05). v2: handoff overhead, as a
	// share of the warm history prefilled once more at the new model's
	// prompt price. v1: score points a challenger pays.
	HandoffPenalty     float64
	CacheWarmthPrior   float64 // cache_warmth_prior: warmth assumed before usage is seen (0.5)
	EconomicsRefTokens float64 // economics_ref_tokens: the reference turn that converts money to score (8192)
	// PriceSensitivity (price_sensitivity, DefaultPriceSensitivity; v2
	// and v3): quality points the selector gives up per unit of normalized
	// blended price — equivalently, one quality point is worth
	// max_blended · economics_ref_tokens / (price_sensitivity · 1e6)
	// dollars per turn. 0 buys the cheapest candidate that meets the demand
	// whatever the price; larger values trade quality for price.
	PriceSensitivity float64
}

// DefaultPriceSensitivity is the default price_sensitivity (version 3): the
// point of the cost–quality frontier of the policy matrix
// (bench/results/saar-frontier.svg) that is no worse than version 1 on both
// fair cost cut and shortfall per turn (docs/design.md §5).
const DefaultPriceSensitivity = 0.5

// DefaultSessionSettings returns the documented defaults.
func DefaultSessionSettings() SessionSettings {
	return SessionSettings{
		IdleTimeoutSeconds:   300,
		MinTurnsBeforeSwitch: 1,
		SwitchMargin:         0.05,
		StayBias:             0.10,
		PrefixCacheWeight:    0.20,
		HandoffPenalty:       0.05,
		CacheWarmthPrior:     0.5,
		EconomicsRefTokens:   8192,
		PriceSensitivity:     DefaultPriceSensitivity,
	}
}

// ConfigError is a configuration error at a line of the file (1-based; 0
// when the error concerns the whole file).
type ConfigError struct {
	Line int
	Msg  string
}

func (e *ConfigError) Error() string {
	if e.Line <= 0 {
		return "config: " + e.Msg
	}
	return fmt.Sprintf("config line %d: %s", e.Line, e.Msg)
}

func errAt(n *yaml.Node, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &ConfigError{Line: line, Msg: fmt.Sprintf(format, args...)}
}

// LoadConfig reads and validates the YAML file at path.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig parses and validates a YAML configuration. Every error is a
// *ConfigError naming the offending line: unknown keys, wrong types,
// duplicate names, a logical name equal to a physical one, unknown
// candidates, bad regexes, negative prices, out-of-range scores and
// settings, logical models without decisions.
func ParseConfig(data []byte) (*Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &ConfigError{Msg: err.Error()} // yaml's message carries its own line
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &ConfigError{Msg: "empty document"}
	}
	root := doc.Content[0]
	cfg := &Config{modelIdx: map[string]int{}, logicalIdx: map[string]int{}}
	var modelsNode, logicalNode *yaml.Node
	err := eachKey(root, "top level", []string{"models", "logical_models", "router"}, func(k string, kn, v *yaml.Node) error {
		switch k {
		case "models":
			modelsNode = v
		case "logical_models":
			logicalNode = v
		case "router":
			cfg.Router = v
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if modelsNode == nil {
		return nil, errAt(root, "no models: the `models` list is required")
	}
	if err := seq(modelsNode, "models", func(n *yaml.Node) error { return cfg.parseModel(n) }); err != nil {
		return nil, err
	}
	if len(cfg.Models) == 0 {
		return nil, errAt(modelsNode, "models: at least one physical model is required")
	}
	if len(cfg.Models) > 64 {
		return nil, errAt(modelsNode, "models: at most 64 physical models are supported")
	}
	if logicalNode != nil {
		if err := seq(logicalNode, "logical_models", func(n *yaml.Node) error { return cfg.parseLogical(n) }); err != nil {
			return nil, err
		}
	}
	cfg.finish()
	sum := sha256.Sum256(data)
	cfg.Revision = "sha256:" + hex.EncodeToString(sum[:6])
	return cfg, nil
}

func (c *Config) finish() {
	for i := range c.Models {
		c.maxPrompt = math.Max(c.maxPrompt, c.Models[i].Pricing.PromptPer1M)
		c.maxBlend = math.Max(c.maxBlend, c.Models[i].Pricing.Blended())
	}
	seen := map[string]bool{ComplexityHeader: true}
	c.headers = append(c.headers[:0], ComplexityHeader)
	for li := range c.Logical {
		for di := range c.Logical[li].Decisions {
			if h := c.Logical[li].Decisions[di].Signals.Header; h != nil && !seen[strings.ToLower(h.Name)] {
				seen[strings.ToLower(h.Name)] = true
				c.headers = append(c.headers, strings.ToLower(h.Name))
			}
		}
	}
}

func (c *Config) parseModel(n *yaml.Node) error {
	m := Model{Line: n.Line}
	var nameNode *yaml.Node
	hasQuality := false
	err := eachKey(n, "model", []string{"name", "workers", "prefill_workers", "decode_workers", "quality_score", "pricing"}, func(k string, kn, v *yaml.Node) error {
		switch k {
		case "name":
			nameNode = v
			return str(v, &m.Name)
		case "workers":
			return strList(v, &m.Workers)
		case "prefill_workers", "decode_workers":
			if m.PDLine == 0 {
				m.PDLine = kn.Line
			}
			if k == "prefill_workers" {
				return strList(v, &m.PrefillWorkers)
			}
			return strList(v, &m.DecodeWorkers)
		case "quality_score":
			hasQuality = true
			if err := num(v, &m.Quality); err != nil {
				return err
			}
			if m.Quality < 0 || m.Quality > 1 {
				return errAt(v, "quality_score %v is outside [0, 1]", m.Quality)
			}
		case "pricing":
			return eachKey(v, "pricing", []string{"prompt_per_1m", "cached_input_per_1m", "completion_per_1m"}, func(k string, kn, v *yaml.Node) error {
				var p *float64
				switch k {
				case "prompt_per_1m":
					p = &m.Pricing.PromptPer1M
				case "cached_input_per_1m":
					p = &m.Pricing.CachedInputPer1M
				default:
					p = &m.Pricing.CompletionPer1M
				}
				if err := num(v, p); err != nil {
					return err
				}
				if *p < 0 {
					return errAt(v, "%s is negative (%v)", k, *p)
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return err
	}
	if nameNode == nil || m.Name == "" {
		return errAt(n, "model without a name")
	}
	if !hasQuality {
		return errAt(n, "model %q: quality_score is required", m.Name)
	}
	if m.Pricing.CachedInputPer1M > m.Pricing.PromptPer1M {
		return errAt(n, "model %q: cached_input_per_1m exceeds prompt_per_1m", m.Name)
	}
	if _, dup := c.modelIdx[m.Name]; dup {
		return errAt(nameNode, "duplicate model name %q", m.Name)
	}
	c.modelIdx[m.Name] = len(c.Models)
	m.Line = nameNode.Line
	c.Models = append(c.Models, m)
	return nil
}

func (c *Config) parseLogical(n *yaml.Node) error {
	lg := Logical{Line: n.Line, Session: DefaultSessionSettings()}
	var nameNode, decNode *yaml.Node
	err := eachKey(n, "logical model", []string{"name", "decisions", "session"}, func(k string, kn, v *yaml.Node) error {
		switch k {
		case "name":
			nameNode = v
			return str(v, &lg.Name)
		case "decisions":
			decNode = v
		case "session":
			return parseSession(v, &lg.Session)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if nameNode == nil || lg.Name == "" {
		return errAt(n, "logical model without a name")
	}
	if strings.IndexByte(lg.Name, 0) >= 0 { // it separates the memory key (sessionshard.MemoryKey)
		return errAt(nameNode, "logical model name %q contains a NUL byte", lg.Name)
	}
	if _, dup := c.modelIdx[lg.Name]; dup {
		return errAt(nameNode, "logical model %q has the name of a physical model", lg.Name)
	}
	if _, dup := c.logicalIdx[lg.Name]; dup {
		return errAt(nameNode, "duplicate logical model name %q", lg.Name)
	}
	if decNode == nil {
		return errAt(nameNode, "logical model %q has no decisions", lg.Name)
	}
	names := map[string]bool{}
	err = seq(decNode, "decisions", func(dn *yaml.Node) error {
		d, dnName, err := c.parseDecision(dn)
		if err != nil {
			return err
		}
		if names[d.Name] {
			return errAt(dnName, "duplicate decision name %q in logical model %q", d.Name, lg.Name)
		}
		names[d.Name] = true
		lg.Decisions = append(lg.Decisions, d)
		return nil
	})
	if err != nil {
		return err
	}
	if len(lg.Decisions) == 0 {
		return errAt(decNode, "logical model %q has no decisions", lg.Name)
	}
	c.logicalIdx[lg.Name] = len(c.Logical)
	lg.Line = nameNode.Line
	c.Logical = append(c.Logical, lg)
	return nil
}

func (c *Config) parseDecision(n *yaml.Node) (Decision, *yaml.Node, error) {
	var d Decision
	var nameNode, candNode *yaml.Node
	err := eachKey(n, "decision", []string{"name", "signals", "candidates"}, func(k string, kn, v *yaml.Node) error {
		switch k {
		case "name":
			nameNode = v
			return str(v, &d.Name)
		case "signals":
			return parseSignals(v, &d.Signals)
		case "candidates":
			candNode = v
			return seq(v, "candidates", func(cn *yaml.Node) error {
				var name string
				if err := str(cn, &name); err != nil {
					return err
				}
				i, ok := c.modelIdx[name]
				if !ok {
					return errAt(cn, "unknown candidate model %q", name)
				}
				for _, prev := range d.cand {
					if prev == i {
						return errAt(cn, "duplicate candidate %q", name)
					}
				}
				d.Candidates = append(d.Candidates, name)
				d.cand = append(d.cand, i)
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return d, nil, err
	}
	if nameNode == nil || d.Name == "" {
		return d, nil, errAt(n, "decision without a name")
	}
	if len(d.cand) == 0 {
		if candNode == nil {
			candNode = nameNode
		}
		return d, nil, errAt(candNode, "decision %q has no candidates", d.Name)
	}
	return d, nameNode, nil
}

func parseSignals(n *yaml.Node, s *Signals) error {
	return eachKey(n, "signals", []string{"keywords", "regex", "min_history_tokens", "has_tools", "header"}, func(k string, kn, v *yaml.Node) error {
		switch k {
		case "keywords":
			if err := strList(v, &s.Keywords); err != nil {
				return err
			}
			for _, kw := range s.Keywords {
				if strings.TrimSpace(kw) == "" {
					return errAt(v, "empty keyword")
				}
				s.kw = append(s.kw, bytes.ToLower([]byte(kw)))
			}
		case "regex":
			var list []string
			var nodes []*yaml.Node
			if v.Kind == yaml.ScalarNode {
				list, nodes = []string{v.Value}, []*yaml.Node{v}
			} else {
				if err := strList(v, &list); err != nil {
					return err
				}
				nodes = v.Content
			}
			for i, expr := range list {
				re, err := regexp.Compile(expr)
				if err != nil {
					return errAt(nodes[i], "bad regex %q: %v", expr, err)
				}
				s.Regex = append(s.Regex, expr)
				s.re = append(s.re, re)
			}
		case "min_history_tokens":
			if err := v.Decode(&s.MinHistoryTokens); err != nil || s.MinHistoryTokens < 0 {
				return errAt(v, "min_history_tokens must be a non-negative integer")
			}
		case "has_tools":
			var b bool
			if err := v.Decode(&b); err != nil {
				return errAt(v, "has_tools must be a boolean")
			}
			s.HasTools = &b
		case "header":
			h := &HeaderSignal{}
			err := eachKey(v, "header", []string{"name", "value"}, func(k string, kn, v *yaml.Node) error {
				if k == "name" {
					return str(v, &h.Name)
				}
				return str(v, &h.Value)
			})
			if err != nil {
				return err
			}
			if h.Name == "" {
				return errAt(v, "header signal without a name")
			}
			s.Header = h
		}
		return nil
	})
}

func parseSession(n *yaml.Node, s *SessionSettings) error {
	keys := []string{"idle_timeout_seconds", "min_turns_before_switch", "switch_margin", "stay_bias",
		"prefix_cache_weight", "handoff_penalty", "cache_warmth_prior", "economics_ref_tokens", "price_sensitivity"}
	return eachKey(n, "session", keys, func(k string, kn, v *yaml.Node) error {
		if k == "min_turns_before_switch" {
			if err := v.Decode(&s.MinTurnsBeforeSwitch); err != nil || s.MinTurnsBeforeSwitch < 0 {
				return errAt(v, "min_turns_before_switch must be a non-negative integer")
			}
			return nil
		}
		var f float64
		if err := num(v, &f); err != nil {
			return err
		}
		if f < 0 {
			return errAt(v, "%s is negative (%v)", k, f)
		}
		if f > 1e6 { // larger values only overflow the scores into ±Inf
			return errAt(v, "%s is out of range (%v > 1e6)", k, f)
		}
		switch k {
		case "idle_timeout_seconds":
			if f == 0 {
				return errAt(v, "idle_timeout_seconds must be positive (0 would reset the session on every turn)")
			}
			s.IdleTimeoutSeconds = f
		case "switch_margin":
			s.SwitchMargin = f
		case "stay_bias":
			s.StayBias = f
		case "prefix_cache_weight":
			s.PrefixCacheWeight = f
		case "handoff_penalty":
			s.HandoffPenalty = f
		case "price_sensitivity":
			s.PriceSensitivity = f
		case "cache_warmth_prior":
			if f > 1 {
				return errAt(v, "cache_warmth_prior %v is outside [0, 1]", f)
			}
			s.CacheWarmthPrior = f
		case "economics_ref_tokens":
			if f < 1 {
				return errAt(v, "economics_ref_tokens must be at least 1")
			}
			s.EconomicsRefTokens = f
		}
		return nil
	})
}

// eachKey walks a mapping node, rejecting unknown and duplicate keys.
func eachKey(n *yaml.Node, what string, allowed []string, f func(k string, kn, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		return errAt(n, "%s must be a mapping", what)
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kn, v := n.Content[i], n.Content[i+1]
		k := kn.Value
		ok := false
		for _, a := range allowed {
			if a == k {
				ok = true
				break
			}
		}
		if !ok {
			return errAt(kn, "unknown key %q in %s (allowed: %s)", k, what, strings.Join(allowed, ", "))
		}
		if seen[k] {
			return errAt(kn, "duplicate key %q in %s", k, what)
		}
		seen[k] = true
		if err := f(k, kn, v); err != nil {
			return err
		}
	}
	return nil
}

func seq(n *yaml.Node, what string, f func(*yaml.Node) error) error {
	if n.Kind != yaml.SequenceNode {
		return errAt(n, "%s must be a list", what)
	}
	for _, c := range n.Content {
		if err := f(c); err != nil {
			return err
		}
	}
	return nil
}

func str(n *yaml.Node, dst *string) error {
	if n.Kind != yaml.ScalarNode {
		return errAt(n, "expected a string")
	}
	*dst = n.Value
	return nil
}

func strList(n *yaml.Node, dst *[]string) error {
	return seq(n, "value", func(c *yaml.Node) error {
		var s string
		if err := str(c, &s); err != nil {
			return err
		}
		*dst = append(*dst, s)
		return nil
	})
}

func num(n *yaml.Node, dst *float64) error {
	if n.Kind != yaml.ScalarNode {
		return errAt(n, "expected a number")
	}
	if err := n.Decode(dst); err != nil || math.IsNaN(*dst) || math.IsInf(*dst, 0) {
		return errAt(n, "expected a number, got %q", n.Value)
	}
	return nil
}

// IsLogical reports whether name is a logical model of the config.
func (c *Config) IsLogical(name string) bool {
	_, ok := c.logicalIdx[name]
	return ok
}

// logical returns the logical model named by b, or nil. No allocation.
func (c *Config) logical(b []byte) *Logical {
	i, ok := c.logicalIdx[string(b)]
	if !ok {
		return nil
	}
	return &c.Logical[i]
}

func (c *Config) logicalByName(s string) *Logical {
	i, ok := c.logicalIdx[s]
	if !ok {
		return nil
	}
	return &c.Logical[i]
}

// ModelIndex returns the index of the physical model name in Models.
func (c *Config) ModelIndex(name string) (int, bool) {
	i, ok := c.modelIdx[name]
	return i, ok
}

// Model returns the physical model name, or nil.
func (c *Config) Model(name string) *Model {
	i, ok := c.modelIdx[name]
	if !ok {
		return nil
	}
	return &c.Models[i]
}
