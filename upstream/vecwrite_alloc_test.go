//go:build !race

package upstream

import (
	"io"
	"net"
	"strings"
	"testing"
)

// 0 allocations per vectored write once the pool is warm.
func TestVectoredWriteAllocs(t *testing.T) {
	addr, _ := rawServer(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go io.Copy(io.Discard, c) //nolint:errcheck // responses are not read here
	tr := NewTransport(Config{})
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
