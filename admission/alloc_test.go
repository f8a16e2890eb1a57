//go:build !race

package admission

import (
	"context"
	"testing"
)

// The admit stage adds nothing to a request that does not wait.
func TestAdmitAllocsNothingWhenNothingWaits(t *testing.T) {
	c := New(Config{Size: 100, MaxInFlight: 1024, Room: func(string) int { return -1 }})
	ctx := context.Background()
	tk := Ticket{Model: "m", Tenant: "a"}
	if n := testing.AllocsPerRun(1000, func() {
		if c.Admit(ctx, &tk) != nil {
			t.Fatal("not admitted")
		}
		c.Done(&tk)
	}); n != 0 {
		t.Fatalf("%v allocations per admitted request", n)
	}
}
