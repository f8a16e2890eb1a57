package route

import (
	"fmt"
	"io"
	"math/rand/v2"
	"slices"

	"github.com/warmroute/warmroute/loadview"
)

// Policy chooses workers. Implementations are safe for concurrent use.
//
// A policy declares how much of a request it reads (Reads), so that the
// front end parses no more of a body than the policy needs, and does more
// than select only through the optional interfaces below (Learner,
// TokenRates, CacheForgetter, MetricsWriter, Summarizer, Sweeper): nothing
// outside this package names a concrete policy (docs/design.md §2).
type Policy interface {
	Name() string
	Reads() Depth
	Select(req *Request) Choice
}

// Depth is how much of a request's routing view a policy reads.
type Depth uint8

const (
	ReadsModel   Depth = iota // the model name only
	ReadsSession              // and the session key (Request.Session)
	ReadsHistory              // and the prefix key: the serialized history or prompt (Request.Prefix)
)

// Learner is a policy that learns from the answers to the requests it
// routed (docs/design.md §4, "Learning").
type Learner interface {
	// Observe records what the answer to the selection ch taught; s is
	// only read during the call.
	Observe(ch Choice, s *Served)
}

// TokenRates is a policy that learned how many characters of its prefix
// key make a token on a worker, in a model.
type TokenRates interface {
	CharsPerToken(model string, worker uint32) (float64, bool)
}

// CacheForgetter is a policy that predicts what a worker's prefix cache
// holds, and forgets it when the engine's cache is emptied (a fleet-wide
// /reset_prefix_cache or /sleep, docs/design.md §8.4).
type CacheForgetter interface {
	ForgetCache(w *loadview.Worker)
}

// MetricsWriter is a policy with series of its own, written in Prometheus
// text format after the router's.
type MetricsWriter interface {
	WriteMetrics(w io.Writer)
}

// Summarizer is a policy with a routing memory an operator can read: per
// model summaries (GET /debug/sessions) and a bounded view for the
// operator's page, each with at most recent sessions.
type Summarizer interface {
	Summaries(recent int) []Summary
	View(recent int) MemoryView
}

// Sweeper is a policy whose memory expires: Sweep drops what expired and
// returns how many sessions went. The router calls it every
// --eviction-interval.
type Sweeper interface {
	Sweep() int
}

// QueueEstimator is a policy that learned how long a request queues on a
// worker — the seconds one waits there per request in flight — and how
// long a model's pool takes to prefill a prompt token. The router's queue
// reads a pool's saturation from it where workers report no queue of their
// own, and the model step's overflow rule the wait and the cost of a move
// (docs/design.md §9).
type QueueEstimator interface {
	QueueSeconds(model string, worker *loadview.Worker) (float64, bool)
	PrefillSeconds(model string) (float64, bool)
}

// Holder is a policy that knows which worker holds a request's history
// now (nil: none does). The router's queue releases such a turn mid tool
// loop first, and keeps a background turn waiting while that worker is
// full rather than queueing it there (docs/design.md §9).
type Holder interface {
	HolderOf(req *Request) *loadview.Worker
}

// Options configures New.
type Options struct {
	CacheAware CacheAwareConfig
	Rand       func() uint64 // nil: math/rand/v2
}

// registration is one policy New can build: its name (--policy), the
// decision labels its choices carry, and its constructor.
type registration struct {
	name   string
	labels []string
	build  func(reg *loadview.Registry, opt Options, rnd func() uint64) Policy
}

// registry lists the policies. A new policy is a file in this package and
// a row here.
var registry = []registration{
	{CacheAwareName, CacheAwareLabels, func(reg *loadview.Registry, opt Options, rnd func() uint64) Policy {
		return NewCacheAware(reg, opt.CacheAware, rnd)
	}},
	{RoundRobin, []string{RoundRobin}, func(*loadview.Registry, Options, func() uint64) Policy { return &roundRobin{} }},
	{Random, []string{Random}, func(_ *loadview.Registry, _ Options, rnd func() uint64) Policy { return &random{rnd: rnd} }},
	{PowerOfTwo, []string{PowerOfTwo}, func(_ *loadview.Registry, _ Options, rnd func() uint64) Policy {
		return &powerOfTwo{rnd: rnd}
	}},
	{ConsistentHash, []string{ConsistentHash}, func(_ *loadview.Registry, _ Options, rnd func() uint64) Policy {
		return &consistentHash{rnd: rnd}
	}},
	{LeastLoaded, []string{LeastLoaded}, func(_ *loadview.Registry, _ Options, rnd func() uint64) Policy {
		return &leastLoaded{rnd: rnd}
	}},
}

// Names lists the policies New accepts, in registration order.
var Names = func() []string {
	ns := make([]string, len(registry))
	for i, r := range registry {
		ns[i] = r.name
	}
	return ns
}()

// Labels lists every decision label a routed request can carry: those of
// every policy, and PinnedWorker (a provider-state lock named the worker).
// The front end pre-registers one counter per label.
func Labels() []string {
	var ls []string
	for _, r := range registry {
		for _, l := range r.labels {
			if !slices.Contains(ls, l) {
				ls = append(ls, l)
			}
		}
	}
	return append(ls, PinnedWorker)
}

// New returns the policy called name.
func New(name string, reg *loadview.Registry, opt Options) (Policy, error) {
	rnd := opt.Rand
	if rnd == nil {
		rnd = rand.Uint64
	}
	for _, r := range registry {
		if r.name == name {
			return r.build(reg, opt, rnd), nil
		}
	}
	return nil, fmt.Errorf("unknown policy %q (want one of %v)", name, Names)
}
