//go:build !race

package route

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMissByTTFTAndObserveAllocateNothing: a miss placed by the estimate
// (every worker's rates read, one MatchEach walk) and the learning from an
// answer allocate nothing once the worker's rates exist.
func TestMissByTTFTAndObserveAllocateNothing(t *testing.T) {
	f := newFixture(t, 4, nil)
	shared := strings.Repeat("shared system prompt ", 200)
	f.hold(0, shared)
	f.hold(1, shared)
	key := []byte(shared + "user: 0")
	req := &Request{Model: "m", Workers: f.reg.Workers(), Prefix: key}
	ch := f.ca.Select(req)
	sv := &Served{TTFB: time.Millisecond, Elapsed: time.Millisecond, Stream: true, Load: 1, PromptTokens: 1000, CachedTokens: 900, CompletionTokens: 4}
	for _, w := range f.ws {
		f.ca.Observe(Choice{Worker: w, st: ch.st, keyLen: len(key)}, sv)
	}
	i := 0
	if n := testing.AllocsPerRun(200, func() {
		i++
		req.Prefix = strconv.AppendInt(key[:len(shared)+6], int64(i%8), 10) // 8 keys: inserts settle
		ch = f.ca.Select(req)
	}); n != 0 {
		t.Fatalf("a miss placed by the estimate allocates %.1f times", n)
	}
	if n := testing.AllocsPerRun(200, func() { f.ca.Observe(ch, sv) }); n != 0 {
		t.Fatalf("Observe allocates %.1f times", n)
	}
}
