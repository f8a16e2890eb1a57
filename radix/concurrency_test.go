package radix

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// TestConcurrentReadersWriter runs Match and Touch readers against one
// writer that inserts (splitting edges on the readers' paths), evicts and
// removes workers. Run it with -race. Readers must always see a consistent
// snapshot:
//   - keys inserted before the readers started, by a worker the writer never
//     touches, always match fully and Touch true;
//   - a key whose Insert returned before the reader loaded its index
//     (published through an atomic) always matches fully.
func TestConcurrentReadersWriter(t *testing.T) {
	const (
		stableW = 100
		chainW  = 7
		budget  = 20000
	)
	tr := New(Config{MaxCharsPerWorker: budget})
	rng := rand.New(rand.NewPCG(1, 2))
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = "abcd"[rng.IntN(4)]
		}
		return b
	}
	sys := randBytes(500)
	var stable [][]byte
	for i := 0; i < 4; i++ {
		k := append(append([]byte{}, sys...), fmt.Appendf(nil, "conv%d|", i)...)
		k = append(k, randBytes(300)...)
		stable = append(stable, k)
		tr.Insert(k, stableW)
	}
	chain := [][]byte{append(append([]byte{}, sys...), "chain|"...)}
	for i := 1; i < 60; i++ {
		prev := chain[i-1]
		chain = append(chain, append(append(make([]byte, 0, len(prev)+100), prev...), randBytes(100)...))
	}

	var published atomic.Int64 // index of the last chain key whose Insert returned
	published.Store(-1)
	var done atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	reader := func(seed uint64) {
		defer wg.Done()
		r := rand.New(rand.NewPCG(seed, 3))
		for iter := 0; !done.Load() || iter < 100; iter++ {
			k := stable[r.IntN(len(stable))]
			if m := tr.Match(k, nil); m.Len != len(k) || m.AnyLen != len(k) {
				errs <- fmt.Errorf("stable key: Match = %+v, want len %d", m, len(k))
				return
			}
			if m := tr.Match(k, func(w uint32) bool { return w == stableW }); m.Len != len(k) || m.Worker != stableW {
				errs <- fmt.Errorf("stable key, eligible: Match = %+v", m)
				return
			}
			if !tr.Touch(k, stableW) {
				errs <- fmt.Errorf("stable key: Touch = false")
				return
			}
			if c := published.Load(); c >= 0 {
				ck := chain[c]
				if m := tr.Match(ck, func(w uint32) bool { return w == chainW }); m.Len != len(ck) || m.Worker != chainW {
					errs <- fmt.Errorf("chain key %d: Match = %+v, want len %d", c, m, len(ck))
					return
				}
				if !tr.Touch(ck[:len(ck)-r.IntN(50)], chainW) {
					errs <- fmt.Errorf("chain key %d: Touch = false", c)
					return
				}
			}
			_ = tr.WorkerChars(uint32(r.IntN(4)))
			_ = tr.Chars()
		}
	}
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go reader(uint64(i))
	}

	ops := 3000
	if testing.Short() {
		ops = 500
	}
	buf := make([]byte, 0, 4096)
	for i := 0; i < ops; i++ {
		switch {
		case i%50 == 49:
			tr.RemoveWorker(uint32(rng.IntN(4)))
		case i%25 == 0 && i/25 < len(chain):
			tr.Insert(chain[i/25], chainW) // one more turn of the chain
			published.Store(int64(i / 25))
		default:
			// Branch off a stable key (splits its edges) and reuse the
			// buffer right away: the tree must have copied it.
			k := stable[rng.IntN(len(stable))]
			buf = append(buf[:0], k[:rng.IntN(len(k))]...)
			buf = append(buf, randBytes(1+rng.IntN(200))...)
			tr.Insert(buf, uint32(rng.IntN(4)))
		}
	}
	done.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	checkTree(t, tr)
	for w := uint32(0); w < 4; w++ {
		if c := tr.WorkerChars(w); c > budget {
			t.Fatalf("worker %d over budget: %d", w, c)
		}
	}
}
