package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"

	"github.com/warmroute/warmroute/bench"
)

// Tenants and priority classes. The heavy tenant's sessions arrive at 4×
// the light one's rate; a fifth of the sessions are interactive.
var (
	tenantNames  = [2]string{"heavy", "light"}
	tenantShares = [2]float64{0.8, 0.2}
	classNames   = [2]string{"interactive", "batch"}
	classShares  = [2]float64{0.2, 0.8}
	// classPriority is the x-request-priority of each class (lower first).
	classPriority = [2]int{0, 10}
)

// pool is one source of sessions: a workload whose sessions arrivals replay.
type pool struct {
	name     string
	note     string
	sessions []bench.Session
}

// meanTurns is the mean number of turns of a pool's sessions.
func (p *pool) meanTurns() float64 {
	n := 0
	for i := range p.sessions {
		n += len(p.sessions[i].Turns)
	}
	return float64(n) / float64(max(len(p.sessions), 1))
}

// loadPools returns the tau-bench airline sessions (when the trace file is
// in traceDir) and synthetic multi-turn sessions (vLLM's multi-turn
// benchmark's shape, bench.DefaultSynthetic) with distinct prefixes.
func loadPools(traceDir string, synthetic int, seed uint64) ([]*pool, []string, error) {
	var pools []*pool
	var notes []string
	tau, err := bench.LoadTrace(bench.TraceSpec{Kind: "tau", Path: filepath.Join(traceDir, bench.TauFile)},
		bench.TraceOptions{IDStyle: bench.IDSeq, Seed: seed})
	switch {
	case errors.Is(err, bench.ErrTraceMissing):
		notes = append(notes, "tau-bench skipped: "+err.Error())
	case err != nil:
		return nil, nil, err
	default:
		pools = append(pools, &pool{name: "tau", note: tau.Note, sessions: tau.Sessions})
	}
	cfg := bench.DefaultSynthetic()
	cfg.Sessions, cfg.Seed = synthetic, seed
	syn := bench.Synthetic(cfg)
	pools = append(pools, &pool{name: "synthetic", note: syn.Note, sessions: syn.Sessions})
	return pools, notes, nil
}

// arrival is one session of a run.
type arrival struct {
	index  int
	at     float64 // simulated seconds after the run's start
	tenant int
	class  int
	pool   int // index into the pools
	src    *bench.Session
}

// arrivals draws the sessions that arrive in [0, span) simulated seconds as
// a Poisson process of rate sessions per simulated second. Arrival i's
// tenant, class and session depend on seed and i only, and its time is the
// i-th point of one unit-rate process divided by rate: every load and
// every router configuration replays the same sessions, the heavier loads
// only closer together.
func arrivals(seed uint64, rate, span float64, pools []*pool) []arrival {
	if rate <= 0 || span <= 0 {
		return nil
	}
	clock := rand.New(rand.NewPCG(seed, 0xa7))
	var out []arrival
	t := 0.0
	for i := 0; ; i++ {
		t += clock.ExpFloat64()
		if t/rate >= span {
			return out
		}
		rng := rand.New(rand.NewPCG(seed, uint64(i)+1<<32))
		a := arrival{index: i, at: t / rate, tenant: pick(rng, tenantShares[:]), class: pick(rng, classShares[:])}
		a.pool = i % len(pools) // the sources alternate
		ss := pools[a.pool].sessions
		a.src = &ss[rng.IntN(len(ss))]
		out = append(out, a)
	}
}

// pick draws an index with the given probabilities (summing to 1).
func pick(rng *rand.Rand, shares []float64) int {
	u := rng.Float64()
	for i, s := range shares {
		if u < s {
			return i
		}
		u -= s
	}
	return len(shares) - 1
}

// personalize returns src replayed as conversation id: its first message's
// content ends with " [conversation id]". Arrivals that replay the same
// trace session then share the system prompt's blocks (as sessions of one
// agent do) but not their histories.
func personalize(src *bench.Session, id string) (bench.Session, error) {
	s := bench.Session{ID: id, Turns: make([]bench.Turn, len(src.Turns))}
	if len(src.Turns) == 0 || len(src.Turns[0].Messages) == 0 {
		return s, nil
	}
	first, err := markContent(src.Turns[0].Messages[0], " [conversation "+id+"]")
	if err != nil {
		return s, err
	}
	for i, t := range src.Turns {
		msgs := make([]json.RawMessage, len(t.Messages))
		copy(msgs, t.Messages)
		msgs[0] = first
		s.Turns[i] = bench.Turn{Messages: msgs, Answer: t.Answer}
	}
	return s, nil
}

// markContent appends mark to a message's string content.
func markContent(msg json.RawMessage, mark string) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(msg, &m); err != nil {
		return nil, err
	}
	var content string
	if err := json.Unmarshal(m["content"], &content); err != nil {
		return nil, fmt.Errorf("first message: content is not a string: %w", err)
	}
	c, err := json.Marshal(content + mark)
	if err != nil {
		return nil, err
	}
	m["content"] = c
	return json.Marshal(m)
}

// fairShares returns the max-min fair shares of capacity among demands
// (water filling): a demand below an equal split of what is left is met
// in full, the rest split what remains equally.
func fairShares(demand []float64, capacity float64) []float64 {
	share := make([]float64, len(demand))
	left, open := capacity, len(demand)
	done := make([]bool, len(demand))
	for open > 0 {
		even := left / float64(open)
		progressed := false
		for i, d := range demand {
			if !done[i] && d <= even {
				share[i], done[i] = d, true
				left -= d
				open--
				progressed = true
			}
		}
		if !progressed {
			for i := range demand {
				if !done[i] {
					share[i] = even
				}
			}
			return share
		}
	}
	return share
}
