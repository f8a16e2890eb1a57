//go:build !race

package admission

import "testing"

// The admit stage adds nothing to a request that does not wait.
func TestAdmitAllocsNothingWhenNothingWaits(t *testing.T) {
	c := New(Config{Size: 100, MaxInFlight: 1024, Room: func(string) int { return -1 }})
	tk := Ticket{Model: "m", Tenant: "a"}
	if n := testing.AllocsPerRun(1000, func() {
		if c.Admit(&tk) != nil {
			t.Fatal("not admitted")
		}
		c.Done(&tk)
	}); n != 0 {
		t.Fatalf("%v allocations per admitted request", n)
	}
}
