// Package testwait is the tests' one way to wait for a condition that
// another goroutine or process makes true: poll it, fail after a bound.
// Tests synchronise on conditions, never on sleeps.
package testwait

import (
	"testing"
	"time"
)

// Timeout bounds Until: long enough for a loaded CI machine under -race.
const Timeout = 10 * time.Second

// Until polls cond every millisecond until it holds, and fails t with what
// (and, when given, the text detail returns at that moment) after Timeout.
func Until(t testing.TB, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	Within(t, Timeout, what, cond, detail...)
}

// Within is Until with its own bound d.
func Within(t testing.TB, d time.Duration, what string, cond func() bool, detail ...func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			msg := "timed out after " + d.String() + " waiting for " + what
			for _, f := range detail {
				msg += ": " + f()
			}
			t.Fatal(msg)
		}
		time.Sleep(time.Millisecond) // the polling interval, not a synchronisation
	}
}
