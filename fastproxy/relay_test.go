package fastproxy

import "testing"

// TestEventsEnd: the end of the last whole SSE event, however its blank
// line is written and wherever the read stopped.
func TestEventsEnd(t *testing.T) {
	for in, want := range map[string]int{
		"":                         0,
		"data: x":                  0,
		"data: x\n":                0,
		"data: x\n\n":              9,
		"data: x\n\ndata: y":       9,
		"data: x\n\ndata: y\n\n":   18,
		"data: x\r\n\r\n":          11,
		"data: x\r\n\r\ndata: y\r": 11,
		"\n\n":                     2,
		"\n":                       0,
		"a\nb\nc\n\nd\ne":          7,
	} {
		if got := eventsEnd([]byte(in)); got != want {
			t.Errorf("eventsEnd(%q) = %d, want %d", in, got, want)
		}
	}
}
