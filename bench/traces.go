package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ErrTraceMissing wraps the error of a trace file that does not exist: the
// caller skips the workload with a clear message instead of failing.
var ErrTraceMissing = errors.New("trace file not found")

// Default trace file names under the trace directory (../shared/traces).
const (
	TauFile      = "tau-bench-airline-gpt-4o.json"
	MooncakeFile = "mooncake-conversation.jsonl"
)

// TraceSpec is a parsed --trace value: "tau", "tau:/path/file.json",
// "mooncake" or "mooncake:/path/file.jsonl". Without a path the default file
// in dir is used.
type TraceSpec struct {
	Kind string // "tau" or "mooncake"
	Path string
}

// ParseTrace parses a --trace value.
func ParseTrace(v, dir string) (TraceSpec, error) {
	kind, path, _ := strings.Cut(v, ":")
	switch kind {
	case "tau":
		if path == "" {
			path = filepath.Join(dir, TauFile)
		}
	case "mooncake":
		if path == "" {
			path = filepath.Join(dir, MooncakeFile)
		}
	default:
		return TraceSpec{}, fmt.Errorf("--trace %q: want tau[:PATH] or mooncake[:PATH]", v)
	}
	return TraceSpec{Kind: kind, Path: path}, nil
}

// TraceOptions bound what a trace loader keeps.
type TraceOptions struct {
	Sessions        int // sessions (tau) or chains (mooncake) sampled; 0 = all
	MinTurns        int // mooncake: chains with fewer requests are not sampled (default 2)
	MaxPromptTokens int // mooncake: chains with a longer request are not sampled; 0 = no bound
	IDStyle         string
	Seed            uint64
}

// LoadTrace loads spec. A missing file yields an error wrapping ErrTraceMissing.
func LoadTrace(spec TraceSpec, opt TraceOptions) (*Workload, error) {
	f, err := os.Open(spec.Path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s (the public traces live in ../shared/traces; see its README)", ErrTraceMissing, spec.Path)
		}
		return nil, err
	}
	defer f.Close()
	var w *Workload
	switch spec.Kind {
	case "tau":
		w, err = LoadTau(f, opt)
	case "mooncake":
		w, err = LoadMooncake(f, opt)
	default:
		err = fmt.Errorf("unknown trace kind %q", spec.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Path, err)
	}
	w.Note += "; file " + filepath.Base(spec.Path)
	return w, nil
}

// sample returns n indices of [0, total) chosen by seed, ascending (all when
// n ≤ 0 or n ≥ total).
func sample(total, n int, seed uint64) []int {
	idx := make([]int, total)
	for i := range idx {
		idx[i] = i
	}
	if n <= 0 || n >= total {
		return idx
	}
	rng := rand.New(rand.NewPCG(seed, 0x7ace))
	rng.Shuffle(total, func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
	idx = idx[:n]
	sort.Ints(idx)
	return idx
}

// tauCharsPerToken converts a tau-bench assistant message (its compact
// JSON: text or tool calls, with the message's own keys) to the tokens a
// model decoded for it: about 4 characters of English or JSON per token.
const tauCharsPerToken = 4

// LoadTau reads tau-bench historical trajectories (a JSON list of
// {task_id, trial, traj, ...}; traj is an OpenAI message list). Each sampled
// trajectory is one session; for each assistant message at index i the
// session sends traj[:i]. The messages are sent as they are in the file
// (compacted), tool calls and tool results included; the file has no tool
// schemas, so none are sent. Turn i's Answer is the length of traj[i]
// (tauCharsPerToken).
func LoadTau(r io.Reader, opt TraceOptions) (*Workload, error) {
	var runs []struct {
		TaskID any               `json:"task_id"`
		Trial  any               `json:"trial"`
		Traj   []json.RawMessage `json:"traj"`
	}
	if err := json.NewDecoder(r).Decode(&runs); err != nil {
		return nil, fmt.Errorf("tau-bench trajectories: %w", err)
	}
	var all []Session
	for i := range runs {
		msgs := make([]json.RawMessage, len(runs[i].Traj))
		var s Session
		for j, raw := range runs[i].Traj {
			var buf bytes.Buffer
			if err := json.Compact(&buf, raw); err != nil {
				return nil, fmt.Errorf("trajectory %d message %d: %w", i, j, err)
			}
			msgs[j] = buf.Bytes()
			var m struct {
				Role string `json:"role"`
			}
			if err := json.Unmarshal(raw, &m); err != nil {
				return nil, fmt.Errorf("trajectory %d message %d: %w", i, j, err)
			}
			if m.Role == "assistant" && j > 0 {
				s.Turns = append(s.Turns, Turn{Messages: msgs[:j:j], Answer: max(1, len(msgs[j])/tauCharsPerToken)})
			}
		}
		if len(s.Turns) > 0 { // nothing to replay otherwise
			all = append(all, s)
		}
	}
	idRNG := rand.New(rand.NewPCG(opt.Seed, 0x1d))
	w := &Workload{Name: "tau"}
	calls := 0
	for _, i := range sample(len(all), opt.Sessions, opt.Seed) {
		s := all[i]
		s.ID = sessionID(opt.IDStyle, len(w.Sessions), idRNG)
		calls += len(s.Turns)
		w.Sessions = append(w.Sessions, s)
	}
	w.Note = fmt.Sprintf("tau-bench airline trajectories: %d of %d sessions (seed %d), %d LLM calls; each call sends traj[:i] for assistant message i, "+
		"as in the file (tool calls and results included; no tool schemas)", len(w.Sessions), len(all), opt.Seed, calls)
	return w, nil
}

// MooncakeBlockTokens is the size of one Mooncake hash block in tokens.
const MooncakeBlockTokens = 512

// mooncakeReq is one line of a Mooncake trace.
type mooncakeReq struct {
	Timestamp    int64    `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// full returns the hash ids of the request's full blocks (its last block is
// partial unless input_length is a multiple of the block size).
func (r *mooncakeReq) full() []uint64 {
	n := min(r.InputLength/MooncakeBlockTokens, len(r.HashIDs))
	return r.HashIDs[:n]
}

// MooncakeChains groups trace requests (in trace order) into chains: a
// request continues an earlier one when the earlier one's full blocks (its
// block list minus its last, partial block; at least one) are a prefix of its
// own block list; among several such earlier requests the longest wins, then
// the latest. A request continues the chain whose tail its parent is; when
// the parent was already continued, the request starts a chain of its own.
// It returns chains as lists of request indices.
func MooncakeChains(reqs []mooncakeReq) [][]int {
	type key struct {
		n int
		h uint64
	}
	byPrefix := map[key]int{} // full-block prefix → latest request whose full blocks are exactly it
	chainOf := make([]int, len(reqs))
	var chains [][]int
	for j := range reqs {
		r := &reqs[j]
		parent := -1
		h := uint64(1469598103934665603)
		hashes := make([]uint64, len(r.HashIDs))
		for k, id := range r.HashIDs {
			h = (h ^ id) * 1099511628211
			h ^= h >> 29
			hashes[k] = h
		}
		for n := len(r.HashIDs); n >= 1 && parent < 0; n-- {
			if p, ok := byPrefix[key{n, hashes[n-1]}]; ok && equalIDs(reqs[p].full(), r.HashIDs[:n]) {
				parent = p
			}
		}
		if parent >= 0 {
			c := chainOf[parent]
			if tail := chains[c]; tail[len(tail)-1] == parent {
				chains[c] = append(chains[c], j)
				chainOf[j] = c
				parent = -2
			}
		}
		if parent != -2 {
			chainOf[j] = len(chains)
			chains = append(chains, []int{j})
		}
		if n := len(r.full()); n > 0 {
			byPrefix[key{n, hashes[n-1]}] = j
		}
	}
	return chains
}

func equalIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// LoadMooncake reads a Mooncake trace (JSONL of {timestamp, input_length,
// output_length, hash_ids}), rebuilds sessions from prefix chains
// (MooncakeChains), samples up to opt.Sessions chains of at least
// opt.MinTurns requests, and turns each request into one user message: the
// deterministic text of each hash id (same id, same text: 512 tokens × 4
// characters) concatenated and trimmed to input_length × 4 characters; its
// Answer is output_length.
func LoadMooncake(r io.Reader, opt TraceOptions) (*Workload, error) {
	if opt.MinTurns <= 0 {
		opt.MinTurns = 2
	}
	var reqs []mooncakeReq
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var q mooncakeReq
		if err := json.Unmarshal(b, &q); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		reqs = append(reqs, q)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	chains := MooncakeChains(reqs)
	var eligible [][]int
	for _, c := range chains {
		if len(c) < opt.MinTurns {
			continue
		}
		ok := true
		for _, j := range c {
			if opt.MaxPromptTokens > 0 && reqs[j].InputLength > opt.MaxPromptTokens {
				ok = false
			}
		}
		if ok {
			eligible = append(eligible, c)
		}
	}
	const cpt = 4
	blocks := map[uint64]string{}
	blockText := func(id uint64) string {
		t, ok := blocks[id]
		if !ok {
			t = text(rand.New(rand.NewPCG(id, 0xb10c)), MooncakeBlockTokens*cpt)
			blocks[id] = t
		}
		return t
	}
	idRNG := rand.New(rand.NewPCG(opt.Seed, 0x1d))
	w := &Workload{Name: "mooncake"}
	follow := 0
	for _, ci := range sample(len(eligible), opt.Sessions, opt.Seed) {
		s := Session{ID: sessionID(opt.IDStyle, len(w.Sessions), idRNG)}
		for _, j := range eligible[ci] {
			q := &reqs[j]
			var sb strings.Builder
			n := q.InputLength * cpt
			sb.Grow(n)
			for _, id := range q.HashIDs {
				if sb.Len() >= n {
					break
				}
				t := blockText(id)
				sb.WriteString(t[:min(len(t), n-sb.Len())])
			}
			s.Turns = append(s.Turns, Turn{Messages: []json.RawMessage{msg("user", sb.String())}, Answer: q.OutputLength})
		}
		follow += len(s.Turns) - 1
		w.Sessions = append(w.Sessions, s)
	}
	w.Note = fmt.Sprintf("Mooncake trace: %d requests in %d prefix chains (%d with ≥ %d requests); sampled %d chains (seed %d), %d follow-up requests; "+
		"hash id → deterministic 2048-character block, trimmed to input_length × 4",
		len(reqs), len(chains), len(eligible), opt.MinTurns, len(w.Sessions), opt.Seed, follow)
	return w, nil
}
