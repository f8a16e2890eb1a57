package radix

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// Benchmarks (bench/results/radix-bench.md holds a dated run). Run them with
//
//	go test -run='^$' -bench=. -benchmem -benchtime=200ms ./radix
//
// Compare changes with benchstat over -count=6 or more.

var benchSizes = []int{1 << 10, 64 << 10, 1 << 20}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// jsonish fills b with bytes drawn from a small alphabet, so that random
// keys still share the occasional byte like real chat JSON does.
func jsonish(rng *rand.Rand, b []byte) []byte {
	const alphabet = `abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ",:{}[]0123456789`
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return b
}

// convFixture is a tree shaped like the router's: convs conversations over
// one shared system prompt + tool schemas (a quarter of keySize), each grown
// turn by turn up to about keySize, held by 4 workers.
type convFixture struct {
	tr    *Tree
	keys  [][]byte // each conversation's full key
	query []byte   // keys[0] plus one new turn: the next request of conv 0
	turn  int
}

func newConvFixture(keySize, convs int, cfg Config) *convFixture {
	rng := rand.New(rand.NewPCG(uint64(keySize), 7))
	f := &convFixture{tr: New(cfg), turn: max(keySize/16, 64)}
	sys := jsonish(rng, make([]byte, keySize/4))
	for c := 0; c < convs; c++ {
		key := append(append(make([]byte, 0, keySize+2*f.turn), sys...), fmt.Sprintf(`{"conv":%d}`, c)...)
		for len(key) < keySize {
			key = append(key, jsonish(rng, make([]byte, f.turn))...)
			f.tr.Insert(key, uint32(c%4))
		}
		f.keys = append(f.keys, key)
	}
	f.query = append(append([]byte{}, f.keys[0]...), jsonish(rng, make([]byte, f.turn))...)
	return f
}

func BenchmarkMatch(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			f := newConvFixture(size, 16, Config{})
			b.ReportAllocs()
			b.SetBytes(int64(len(f.query)))
			var m Match
			for b.Loop() {
				m = f.tr.Match(f.query, nil)
			}
			if m.Len != len(f.keys[0]) {
				b.Fatalf("Match = %+v; want len %d", m, len(f.keys[0]))
			}
		})
	}
}

func BenchmarkMatchEligible(b *testing.B) {
	f := newConvFixture(64<<10, 16, Config{})
	healthy := [4]bool{true, false, true, true}
	eligible := func(w uint32) bool { return w < 4 && healthy[w] }
	b.ReportAllocs()
	b.SetBytes(int64(len(f.query)))
	var m Match
	for b.Loop() {
		m = f.tr.Match(f.query, eligible)
	}
	if m.Len != len(f.keys[0]) {
		b.Fatalf("Match = %+v", m)
	}
}

// BenchmarkBaselineHasPrefix is the memory-speed bound for Match: one
// vectorized comparison of the key against a single stored copy.
func BenchmarkBaselineHasPrefix(b *testing.B) {
	f := newConvFixture(64<<10, 1, Config{})
	stored := bytes.Clone(f.keys[0])
	b.ReportAllocs()
	b.SetBytes(int64(len(f.query)))
	ok := false
	for b.Loop() {
		ok = bytes.HasPrefix(f.query, stored)
	}
	if !ok {
		b.Fatal("no prefix")
	}
}

func BenchmarkTouch(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			f := newConvFixture(size, 16, Config{})
			b.ReportAllocs()
			b.SetBytes(int64(len(f.keys[0])))
			ok := false
			for b.Loop() {
				ok = f.tr.Touch(f.keys[0], 0)
			}
			if !ok {
				b.Fatal("Touch = false")
			}
		})
	}
}

// BenchmarkInsertAppendTurn inserts, per op, a conversation's key plus one
// new turn (the router's miss path: Touch failed because the history grew).
// Turns are unique per op; a per-worker budget of the key plus 64 turns keeps
// the tree bounded, so the cost includes the amortized LRU eviction.
func BenchmarkInsertAppendTurn(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(sizeName(size), func(b *testing.B) {
			f := newConvFixture(size, 4, Config{})
			base := f.keys[0]
			budget := len(base) + 64*f.turn
			tr := New(Config{MaxCharsPerWorker: budget})
			tr.Insert(base, 0)
			rng := rand.New(rand.NewPCG(1, 1))
			key := append(bytes.Clone(base), jsonish(rng, make([]byte, f.turn))...)
			b.ReportAllocs()
			b.SetBytes(int64(len(key)))
			var i uint64
			for b.Loop() {
				i++
				binary.LittleEndian.PutUint64(key[len(base):], i) // unique turn, buffer reused
				tr.Insert(key, 0)
			}
			if c := tr.WorkerChars(0); c > budget {
				b.Fatalf("over budget: %d > %d", c, budget)
			}
		})
	}
}

// BenchmarkMatchParallelWriter runs Match on all Ps while one writer keeps
// inserting new turns (with eviction) into the same tree.
func BenchmarkMatchParallelWriter(b *testing.B) {
	f := newConvFixture(64<<10, 16, Config{MaxCharsPerWorker: 4 << 20})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(2, 2))
		key := append(bytes.Clone(f.keys[1]), jsonish(rng, make([]byte, f.turn))...)
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			binary.LittleEndian.PutUint64(key[len(f.keys[1]):], i)
			f.tr.Insert(key, 1+uint32(i%3)) // never worker 0, which holds the query
		}
	}()
	b.ReportAllocs()
	b.SetBytes(int64(len(f.query)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		m := Match{Len: len(f.keys[0])}
		for pb.Next() {
			m = f.tr.Match(f.query, nil)
		}
		if m.Len != len(f.keys[0]) {
			panic(fmt.Sprintf("Match = %+v", m))
		}
	})
	b.StopTimer()
	close(stop)
	wg.Wait()
}
