package fastproxy

import (
	"testing"
	"time"
)

// TestAppendReset: the reset headers are written as time.Duration.String
// writes the duration rounded to the millisecond, which OpenAI's clients
// parse.
func TestAppendReset(t *testing.T) {
	for _, d := range []time.Duration{0, 400 * time.Microsecond, time.Millisecond, 12 * time.Millisecond, 999 * time.Millisecond,
		999600 * time.Microsecond, time.Second, 1500 * time.Millisecond, 23456 * time.Millisecond, 23400 * time.Millisecond,
		20 * time.Second, 59999 * time.Millisecond, time.Minute} {
		want := d.Round(time.Millisecond).String()
		if got := string(appendReset(nil, d)); got != want {
			t.Errorf("%v: %q, want %q", d, got, want)
		}
	}
}
