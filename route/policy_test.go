package route

import (
	"slices"
	"testing"

	"github.com/warmroute/warmroute/loadview"
)

// Every policy New builds says how much of a request it reads: the front
// end parses no more than that (a policy that reads no history never pays
// for its scan), and cache_aware, which matches prefixes, gets them.
func TestPoliciesDeclareTheirViewDepth(t *testing.T) {
	reg := loadview.NewRegistry(loadview.Config{})
	f := func(name string, want Depth) {
		t.Helper()
		p, err := New(name, reg, Options{CacheAware: DefaultCacheAwareConfig()})
		if err != nil {
			t.Fatal(err)
		}
		if p.Name() != name || p.Reads() != want {
			t.Fatalf("%s: Name %q Reads %d, want %d", name, p.Name(), p.Reads(), want)
		}
	}
	f(CacheAwareName, ReadsHistory)
	f(RoundRobin, ReadsModel)
	f(Random, ReadsModel)
	f(PowerOfTwo, ReadsModel)
	f(ConsistentHash, ReadsSession)
	f(LeastLoaded, ReadsModel)
	if len(Names) != 6 {
		t.Fatalf("Names %v: a policy is registered without a depth check here", Names)
	}
	if _, err := New("nope", reg, Options{}); err == nil {
		t.Fatal("New accepted an unknown policy")
	}
}

// Labels covers every label a selection can carry, so that each has its
// counter before the first request.
func TestLabelsCoverEveryDecision(t *testing.T) {
	ls := Labels()
	for _, l := range append(slices.Clone(CacheAwareLabels), PinnedWorker, RoundRobin, Random, PowerOfTwo, ConsistentHash) {
		if !slices.Contains(ls, l) {
			t.Errorf("Labels() lacks %q", l)
		}
	}
	for i, l := range ls {
		if slices.Index(ls, l) != i {
			t.Errorf("Labels() repeats %q", l)
		}
	}
}

// Only the cache-aware policy learns, forgets caches, writes series,
// summarizes and sweeps; the stateless ones declare none of it.
func TestOptionalInterfaces(t *testing.T) {
	reg := loadview.NewRegistry(loadview.Config{})
	for _, name := range Names {
		p, _ := New(name, reg, Options{CacheAware: DefaultCacheAwareConfig()})
		_, learns := p.(Learner)
		_, rates := p.(TokenRates)
		_, queues := p.(QueueEstimator)
		_, holds := p.(Holder)
		_, forgets := p.(CacheForgetter)
		_, writes := p.(MetricsWriter)
		_, sums := p.(Summarizer)
		_, sweeps := p.(Sweeper)
		want := name == CacheAwareName
		for what, got := range map[string]bool{"Learner": learns, "TokenRates": rates, "CacheForgetter": forgets, "QueueEstimator": queues, "Holder": holds,
			"MetricsWriter": writes, "Summarizer": sums, "Sweeper": sweeps} {
			if got != want {
				t.Errorf("%s implements %s: %v, want %v", name, what, got, want)
			}
		}
	}
}
