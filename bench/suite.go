package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Suite is every (policy, seed) run of one workload: the unit of a report.
type Suite struct {
	Workload string   // workload name (synthetic, tau, mooncake)
	Notes    []string // the workload's note per seed (deduplicated)
	Preset   string   // preset name, "" when none
	Options  Options
	Policies []string
	Seeds    []uint64
	Runs     map[string][]*RunResult // policy → one per seed, in Seeds order
	Requests []int                   // requests per run, by seed
	CmdLine  string
	Machine  Machine
	Date     time.Time
	Elapsed  time.Duration
}

// Machine describes where a suite ran.
type Machine struct {
	Uname string
	CPU   string
	NProc int
	Go    string
}

// HostMachine returns this machine's description: `uname -a`, the CPU model
// from /proc/cpuinfo, the CPU count and the Go version.
func HostMachine() Machine {
	m := Machine{NProc: runtime.NumCPU(), Go: runtime.Version(), Uname: runtime.GOOS + "/" + runtime.GOARCH, CPU: "unknown"}
	if b, err := exec.Command("uname", "-a").Output(); err == nil {
		m.Uname = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// RunAll runs every policy on every seed, each on a fresh fleet. load gives
// the workload of a seed; it is called once per seed, so every policy of a
// seed replays the same requests. Progress lines go to progress.
func RunAll(ctx context.Context, opt Options, load func(seed uint64) (*Workload, error), policies []string, seeds []uint64, progress io.Writer) (*Suite, error) {
	opt.setDefaults()
	s := &Suite{Options: opt, Policies: policies, Seeds: seeds, Runs: map[string][]*RunResult{}, Date: time.Now().UTC()}
	start := time.Now()
	total, done := len(policies)*len(seeds), 0
	for _, seed := range seeds {
		wl, err := load(seed)
		if err != nil {
			return nil, err
		}
		s.Workload = wl.Name
		if !slices.Contains(s.Notes, wl.Note) {
			s.Notes = append(s.Notes, wl.Note)
		}
		s.Requests = append(s.Requests, wl.Requests())
		for _, p := range policies {
			r, err := Run(ctx, opt, wl, p, seed)
			if err != nil {
				return nil, fmt.Errorf("%s seed %d: %w", p, seed, err)
			}
			s.Runs[p] = append(s.Runs[p], r)
			done++
			fmt.Fprintf(progress, "[%d/%d] %s seed %d %-15s %4d req  hit %5.1f%% (workers %5.1f%%)  TTFT p50 %.3fs  max/mean %.2f  %s  %.1fs\n",
				done, total, wl.Name, seed, p, r.Requests, 100*r.HitClient(), 100*r.HitWorkers(),
				Percentile(r.TTFT, 50), r.LoadMaxMean(), errNote(r), r.Wall.Seconds())
		}
	}
	s.Elapsed = time.Since(start)
	return s, nil
}

func errNote(r *RunResult) string {
	if r.Errors == 0 {
		return "ok"
	}
	return fmt.Sprintf("%d errors (first: %s)", r.Errors, r.FirstErr)
}

// Percentile returns the p-th percentile of v (linear interpolation between
// closest ranks); 0 for an empty v. v is not modified.
func Percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	x := p / 100 * float64(len(s)-1)
	i := int(x)
	if i >= len(s)-1 {
		return s[len(s)-1]
	}
	return s[i] + (x-float64(i))*(s[i+1]-s[i])
}

// Stat is a metric over seeds.
type Stat struct{ Mean, SD float64 }

func statOf(v []float64) Stat {
	if len(v) == 0 {
		return Stat{}
	}
	var sum float64
	for _, x := range v {
		sum += x
	}
	m := sum / float64(len(v))
	if len(v) == 1 {
		return Stat{Mean: m}
	}
	var ss float64
	for _, x := range v {
		ss += (x - m) * (x - m)
	}
	return Stat{Mean: m, SD: math.Sqrt(ss / float64(len(v)-1))}
}

// Summary is one policy's metrics over seeds (mean ± sample sd).
type Summary struct {
	Policy                     string
	HitClient, HitWorkers      Stat
	SessP10, SessP50, SessP90  Stat
	TTFT50, TTFT90, TTFT99     Stat
	E2E50, E2E90               Stat
	Throughput                 Stat
	LoadMaxMean, ServedMaxMean Stat
	Requests, Errors           int
	Labels                     map[string]int
	MaxHitGap                  float64 // max over seeds of |client − workers| hit tokens per request
	PromptTokens, CachedTokens int64
	WorkerQueries, WorkerHits  float64
	SimSeconds                 Stat
	// Hit is RunResult.Hit: the client's hit rate, or the prefill workers'
	// in a disaggregated fleet (PD), which also has the decode workers'
	// load, the tokens they pulled per run and the failed pulls in all.
	Hit               Stat
	PD                bool
	DecodeLoadMaxMean Stat
	KVTransferred     Stat
	KVFailed          uint64
	oracle            bool
}

// Summaries returns one Summary per policy, in s.Policies order.
func (s *Suite) Summaries() []Summary {
	var out []Summary
	for _, p := range s.Policies {
		runs := s.Runs[p]
		sum := Summary{Policy: p, Labels: map[string]int{}, oracle: p == PolicyOracle}
		col := func(f func(r *RunResult) float64) Stat {
			v := make([]float64, len(runs))
			for i, r := range runs {
				v[i] = f(r)
			}
			return statOf(v)
		}
		sum.HitClient = col((*RunResult).HitClient)
		sum.HitWorkers = col((*RunResult).HitWorkers)
		sum.Hit = col((*RunResult).Hit)
		sum.DecodeLoadMaxMean = col((*RunResult).DecodeLoadMaxMean)
		sum.KVTransferred = col(func(r *RunResult) float64 { return float64(r.KVTransferred) })
		sum.SessP10 = col(func(r *RunResult) float64 { return Percentile(r.SessionHit, 10) })
		sum.SessP50 = col(func(r *RunResult) float64 { return Percentile(r.SessionHit, 50) })
		sum.SessP90 = col(func(r *RunResult) float64 { return Percentile(r.SessionHit, 90) })
		sum.TTFT50 = col(func(r *RunResult) float64 { return Percentile(r.TTFT, 50) })
		sum.TTFT90 = col(func(r *RunResult) float64 { return Percentile(r.TTFT, 90) })
		sum.TTFT99 = col(func(r *RunResult) float64 { return Percentile(r.TTFT, 99) })
		sum.E2E50 = col(func(r *RunResult) float64 { return Percentile(r.E2E, 50) })
		sum.E2E90 = col(func(r *RunResult) float64 { return Percentile(r.E2E, 90) })
		sum.Throughput = col((*RunResult).Throughput)
		sum.LoadMaxMean = col((*RunResult).LoadMaxMean)
		sum.ServedMaxMean = col((*RunResult).ServedMaxMean)
		sum.SimSeconds = col(func(r *RunResult) float64 { return r.SimSeconds })
		for _, r := range runs {
			sum.Requests += r.Requests
			sum.Errors += r.Errors
			sum.PromptTokens += r.PromptTokens
			sum.CachedTokens += r.CachedTokens
			sum.WorkerQueries += r.WorkerQueries
			sum.WorkerHits += r.WorkerHits
			for k, v := range r.Labels {
				sum.Labels[k] += v
			}
			sum.KVFailed += r.KVFailed
			sum.PD = sum.PD || r.PD
			if n := r.Requests - r.Errors; n > 0 && !r.PD { // PD: the client's cached tokens include pulled ones
				sum.MaxHitGap = max(sum.MaxHitGap, math.Abs(float64(r.CachedTokens)-r.WorkerHits)/float64(n))
			}
		}
		out = append(out, sum)
	}
	return out
}

// Reference is the policy the matrix's checks judge: cache_aware, or in a
// disaggregated fleet cache_aware on both legs (--policy cache_aware, which
// --decode-policy defaults to).
func (s *Suite) Reference() string {
	if s.Options.Decode > 0 {
		return PDPolicy("cache_aware", "cache_aware")
	}
	return "cache_aware"
}

// reference reports whether policy is one the matrix reruns with the
// reference wherever a cell is contested: the reference, and in a
// disaggregated fleet cache_aware prefilling with any decode policy, so
// that the decode policies are compared over the same seeds.
func (s *Suite) reference(policy string) bool {
	if p, _, pd := SplitPD(policy); pd && s.Options.Decode > 0 {
		return p == "cache_aware"
	}
	return policy == s.Reference()
}
