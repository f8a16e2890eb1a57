//go:build !race

package sessionshard

import "testing"

func TestMemoryGetAllocs(t *testing.T) {
	m := NewMemory(MemoryOptions{})
	m.GetOrCreate([]byte("session-1"), 1)
	key := []byte("session-1")
	if n := testing.AllocsPerRun(100, func() { m.Get(key, 2) }); n != 0 {
		t.Fatalf("Get allocates %v", n)
	}
}
