package sessionshard

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func TestMemoryTTL(t *testing.T) {
	m := NewMemory(MemoryOptions{TTL: time.Minute})
	const s = int64(time.Second)
	e, created := m.GetOrCreate([]byte("a"), 0)
	if !created || e == nil {
		t.Fatal("create")
	}
	e.Lock()
	e.State.Model = "m"
	e.Touch(30 * s)
	e.Unlock()
	if got := m.Get([]byte("a"), 89*s); got != e {
		t.Fatal("live entry not found (TTL counts from the last touch)")
	}
	if got := m.Get([]byte("a"), 91*s); got != nil {
		t.Fatal("expired entry returned")
	}
	if m.Len() != 0 {
		t.Fatalf("expired entry not dropped: %d", m.Len())
	}
	e2, created := m.GetOrCreate([]byte("a"), 100*s)
	if !created || e2 == e || e2.State.Model != "" {
		t.Fatal("expired entry reused")
	}
	for i := 0; i < 10; i++ {
		m.GetOrCreate([]byte(fmt.Sprint("k", i)), int64(i)*s)
	}
	if n := m.Sweep(65 * s); n != 5 || m.Len() != 6 {
		t.Fatalf("Sweep dropped %d, left %d", n, m.Len())
	}
	m.Delete([]byte("a"))
	if m.Get([]byte("a"), 100*s) != nil {
		t.Fatal("Delete")
	}
}

func TestMemoryCapacity(t *testing.T) {
	m := NewMemory(MemoryOptions{Capacity: 100})
	for i := 0; i < 1000; i++ {
		m.GetOrCreate([]byte(fmt.Sprint("k", i)), int64(i))
		if m.Len() > 100 {
			t.Fatalf("len %d > capacity after %d inserts", m.Len(), i+1)
		}
	}
	if m.Get([]byte("k999"), 1000) == nil {
		t.Fatal("newest entry evicted")
	}
}

func TestMemoryIDRings(t *testing.T) {
	m := NewMemory(MemoryOptions{MaxToolIDs: 4, MaxResponseIDs: 2})
	e, _ := m.GetOrCreate([]byte("s"), 1)
	e.Lock()
	defer e.Unlock()
	for i := 0; i < 10; i++ {
		e.AddToolCallID([]byte(fmt.Sprint("c", i)), fmt.Sprint("m", i%2))
		e.AddResponse([]byte(fmt.Sprint("r", i)), "m", fmt.Sprint("w", i))
	}
	if e.ToolCallIDs() != 4 {
		t.Fatalf("tool ids %d", e.ToolCallIDs())
	}
	if _, ok := e.ToolCallOwner([]byte("c5")); ok {
		t.Fatal("old tool id kept")
	}
	if mo, ok := e.ToolCallOwner([]byte("c9")); !ok || mo != "m1" {
		t.Fatalf("c9 → %q %v", mo, ok)
	}
	if _, w, ok := e.ResponseOwner([]byte("r9")); !ok || w != "w9" {
		t.Fatal("r9")
	}
	if _, _, ok := e.ResponseOwner([]byte("r7")); ok {
		t.Fatal("old response kept")
	}
	// keys are copied: mutating the caller's buffer changes nothing
	buf := []byte("zz")
	e.AddToolCallID(buf, "mz")
	buf[0] = 'q'
	if _, ok := e.ToolCallOwner([]byte("zz")); !ok {
		t.Fatal("tool id aliased the caller's buffer")
	}
}

func TestMemoryConcurrent(t *testing.T) {
	m := NewMemory(MemoryOptions{Capacity: 64, TTL: time.Second})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				now := int64(i) * int64(time.Millisecond)
				e, _ := m.GetOrCreate([]byte(fmt.Sprint("s", (g*31+i)%200)), now)
				e.Lock()
				e.State.Turns++
				e.AddToolCallID([]byte(fmt.Sprint(i)), "m")
				e.Touch(now)
				e.Unlock()
				if i%100 == 0 {
					m.Sweep(now)
				}
			}
		}(g)
	}
	wg.Wait()
	if m.Len() > 64+8 {
		t.Fatalf("len %d", m.Len())
	}
}

func TestMemoryCapacityEvictsLeastRecent(t *testing.T) {
	m := NewMemory(MemoryOptions{Capacity: 4000})
	for i := 0; i < 4000; i++ { // stale entries
		m.GetOrCreate([]byte(fmt.Sprint("old", i)), int64(i+1))
	}
	for i := 0; i < 2000; i++ { // newer ones push the oldest out
		m.GetOrCreate([]byte(fmt.Sprint("new", i)), int64(10_000+i))
	}
	newKept := 0
	for i := 0; i < 2000; i++ {
		if m.Get([]byte(fmt.Sprint("new", i)), 20_000) != nil {
			newKept++
		}
	}
	if newKept != 2000 || m.Len() > 4000 {
		t.Fatalf("kept %d of the 2000 recent sessions, %d entries", newKept, m.Len())
	}
}

// Memory keys of distinct (logical model, session) pairs are distinct,
// whatever bytes the session key holds.
func TestMemoryKeyPerLogicalModel(t *testing.T) {
	m := NewMemory(MemoryOptions{})
	// Logical names never hold NUL (a config check), session keys may.
	keys := [][2]string{{"auto", "s"}, {"cheap", "s"}, {"auto", "s\x00cheap"}, {"auto", ""}, {"", "auto"}, {"au", "to"}}
	seen := map[string]bool{}
	for i, k := range keys {
		key := string(MemoryKey(nil, []byte(k[0]), []byte(k[1])))
		if seen[key] {
			t.Fatalf("pair %d %q collides", i, k)
		}
		seen[key] = true
	}
	a, _ := m.GetOrCreate(MemoryKey(nil, []byte("auto"), []byte("s")), 1)
	b, _ := m.GetOrCreate(MemoryKey(nil, []byte("cheap"), []byte("s")), 1)
	if a == b {
		t.Fatal("one entry for two logical models")
	}
}
