package saarlive

import (
	"context"
	"testing"
)

// TestLiveCheckSmall runs a small live check: no violation, no unsafe
// switch, and every session caught by the outage completes a later turn.
func TestLiveCheckSmall(t *testing.T) {
	rep, err := Run(context.Background(), Options{Sessions: 8, Turns: 10, OutageTurns: 6, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.String())
	if want := 8*16 + 8; rep.Requests != want {
		t.Fatalf("sent %d requests, want %d", rep.Requests, want)
	}
	if rep.Violations != 0 || rep.UnsafeSwitches != 0 {
		t.Fatalf("continuity: %d violations, %d unsafe switches", rep.Violations, rep.UnsafeSwitches)
	}
	if rep.ToolLoopTurns == 0 || rep.Actions["hard_lock"] == 0 {
		t.Fatalf("no tool loop exercised: %+v", rep)
	}
	if rep.Affected == 0 || rep.AffectedRecovered != rep.Affected {
		t.Fatalf("outage: %d of %d affected sessions recovered", rep.AffectedRecovered, rep.Affected)
	}
	if rep.Failed > rep.OutageRequests {
		t.Fatalf("%d failures, more than the %d requests of the outage", rep.Failed, rep.OutageRequests)
	}
}
