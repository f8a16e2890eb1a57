package route

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/redistest"
	"github.com/warmroute/warmroute/sharedstate"
)

// BenchmarkSelectSharedSessionMiss: a session bound by another replica
// (its own store), missing from this replica's map, found in this
// replica's client-side cache of the real store: the lookup, its adoption
// into the local map, and the decision. Only the first lookup of a key
// goes to Redis; this measures the cached case.
func BenchmarkSelectSharedSessionMiss(b *testing.B) {
	rd := redistest.Start(b, redistest.Options{})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func() *sharedstate.Store {
		st, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: rd.URL(), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(st.Close)
		return st
	}
	other, mine := open(), open()
	f := newFixture(&testing.T{}, 8, func(c *CacheAwareConfig) { c.Shared = mine })
	req := &Request{Model: "m", Workers: f.reg.Workers(), Session: []byte("session-42"), Prefix: []byte(strings.Repeat("history ", 8<<10))}
	other.PublishBinding([]byte("m"), req.Session, f.ws[3].URL(), time.Hour)
	if err := other.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	ms, _ := f.ca.state("m")
	if c := f.ca.Select(req); c.Decision != SessionIDMatch || c.Worker != f.ws[3] {
		b.Fatalf("warm-up: %s", c.Decision)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ms.sessions.Delete(req.Session)
		sinkChoice = f.ca.Select(req)
	}
	b.StopTimer()
	if sinkChoice.Decision != SessionIDMatch {
		b.Fatal(sinkChoice.Decision)
	}
}
