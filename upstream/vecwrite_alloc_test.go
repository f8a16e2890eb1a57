//go:build !race

package upstream

import (
	"io"
	"net"
	"strings"
	"testing"
)

// 0 allocations per vectored write once the pool is warm. The peer only
// discards what it reads: AllocsPerRun counts the whole process's
// allocations, so a peer that parsed and answered each request would add
// its own, more or fewer as the scheduler interleaves it with the writes.
func TestVectoredWriteAllocs(t *testing.T) {
	ln := listen(t)
	go func() {
		s, err := ln.Accept()
		if err == nil {
			defer s.Close()
			io.Copy(io.Discard, s) //nolint:errcheck // until the client closes
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr := NewTransport(Config{})
	addr := ln.Addr().String()
	req := newReq(addr, "POST", strings.Repeat("a", 17760))
	if err := tr.writeRequest(c, req); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := tr.writeRequest(c, req); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Fatalf("allocations per write = %.1f, want 0", allocs)
	}
}
