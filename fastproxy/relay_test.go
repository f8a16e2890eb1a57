package fastproxy

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadview"
	"github.com/warmroute/warmroute/resume"
)

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

// TestEventOverTheBoundPassesAsItCame: an SSE event longer than the relay
// holds whole reaches the client unchanged, in pieces, and leaves the
// answer not continuable.
func TestEventOverTheBoundPassesAsItCame(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := loadview.NewRegistry(loadview.Config{Logger: quiet})
	ws, err := reg.Add(context.Background(), "http://up:80", []string{"m"})
	if err != nil {
		t.Fatal(err)
	}
	stream := `data: {"id":"c","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", maxEvent+maxEvent/2) +
		`"},"finish_reason":null}]}` + "\n\n" + "data: [DONE]\n\n"
	f := &forwarder{metrics: newServerMetrics(nil), log: quiet, reg: reg, stall: time.Minute, resumeAttempts: 1, resumeMaxBytes: 1 << 20}
	r := &relay{f: f, w: ws[0], held: true, ans: new(resume.Answer), in: relayBufs.Get().(*[]byte), body: strings.NewReader(stream)}
	r.ans.Reset(resume.Chat, 1<<20)
	got, err := io.ReadAll(r)
	if err != nil || string(got) != stream {
		t.Fatalf("relayed %d bytes (%v) of a %d-byte stream", len(got), err, len(stream))
	}
	if r.ans.Why() == "" {
		t.Fatal("an answer whose event the relay could not hold is still continuable")
	}
}
