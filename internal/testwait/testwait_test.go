package testwait

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 5 {
			n.Add(1)
		}
	}()
	Until(t, "five increments", func() bool { return n.Load() == 5 })
}

// fakeTB records a Fatal instead of ending the test.
type fakeTB struct {
	testing.TB
	failed string
}

func (f *fakeTB) Helper()           {}
func (f *fakeTB) Fatal(args ...any) { f.failed = args[0].(string) }

func TestWithinFailsWithWhatAndDetail(t *testing.T) {
	f := &fakeTB{TB: t}
	Within(f, 5*time.Millisecond, "never", func() bool { return f.failed != "" }, func() string { return "state 7" })
	if f.failed == "" {
		t.Fatal("Within did not fail")
	}
	const want = "timed out after 5ms waiting for never: state 7"
	if f.failed != want {
		t.Fatalf("message %q, want %q", f.failed, want)
	}
}
