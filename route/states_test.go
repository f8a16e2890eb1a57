package route

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/warmroute/warmroute/loadview"
)

// addWorker registers a worker at 127.0.0.x:1 (refuses at once, so probe
// and discovery fail fast) serving models (nil: wildcard) and forces it
// healthy.
func (f *fixture) addWorker(host int, models []string) *loadview.Worker {
	f.t.Helper()
	ws, err := f.reg.Add(context.Background(), fmt.Sprintf("http://127.0.1.%d:1", host), models)
	if err != nil {
		f.t.Fatal(err)
	}
	f.reg.SetHealthy(ws[0], true)
	return ws[0]
}

// TestStatesBoundedByServedModels: 5,000 distinct model names, routed as
// the front end does (ForModel's workers, or every worker for a
// pass-through), leave at most served models + 1 states and a bounded
// WriteMetrics output, with and without wildcard workers.
func TestStatesBoundedByServedModels(t *testing.T) {
	for _, wildcard := range []bool{false, true} {
		t.Run(fmt.Sprintf("wildcard=%v", wildcard), func(t *testing.T) {
			f := newFixture(t, 2, nil) // serves "m"
			f.addWorker(1, []string{"m2"})
			if wildcard {
				f.addWorker(2, nil)
			}
			served := len(f.reg.Models())
			for i := 0; i < 5000; i++ {
				model := fmt.Sprintf("attacker-model-%d\x01\"\n", i)
				ws, ok := f.reg.ForModel([]byte(model))
				if !ok {
					ws = f.reg.Workers() // pass-through
				}
				f.ca.Select(&Request{Model: model, Workers: ws,
					Session: []byte(fmt.Sprintf("s-%d", i)), Prefix: []byte(sys + model)})
			}
			f.sel("s", sys+"served") // "m"
			f.ca.Select(&Request{Model: "m2", Workers: f.reg.Workers(), Session: []byte("s2")})
			if n := f.ca.States(); n > served+1 {
				t.Fatalf("%d states for %d served models", n, served)
			}
			var buf bytes.Buffer
			f.ca.WriteMetrics(&buf)
			lines := strings.Count(buf.String(), "\n")
			// Per state: sessions, refused, and two tree gauges per worker.
			if max := (served + 1) * (2 + 2*len(f.reg.Workers())); lines > max {
				t.Fatalf("%d metric lines > %d:\n%s", lines, max, buf.String())
			}
			if strings.Contains(buf.String(), "attacker") {
				t.Fatalf("a client's model name reached the metrics:\n%s", buf.String())
			}
		})
	}
}

// TestSweepDropsUnservedStates: once no worker serves a model, Sweep drops
// its state.
func TestSweepDropsUnservedStates(t *testing.T) {
	f := newFixture(t, 1, nil)
	w := f.addWorker(1, []string{"gone-model"})
	f.ca.Select(&Request{Model: "gone-model", Workers: []*loadview.Worker{w}, Session: []byte("s")})
	if n := f.ca.States(); n != 2 {
		t.Fatalf("%d states, want 2 (m, gone-model)", n)
	}
	f.reg.Remove(w.URL())
	f.ca.Sweep()
	if n := f.ca.States(); n != 1 {
		t.Fatalf("%d states after the model's last worker left, want 1", n)
	}
	for _, s := range f.ca.Summaries(0) {
		if s.Model == "gone-model" {
			t.Fatal("gone-model still summarized")
		}
	}
}

// TestFallbackSticksWithinWorkers: unserved model names share the fallback
// state, which still gives session stickiness on wildcard workers but never
// sends a request to a worker outside its Workers.
func TestFallbackSticksWithinWorkers(t *testing.T) {
	f := newFixture(t, 2, nil) // two workers serving "m"
	a := f.addWorker(1, nil)
	b := f.addWorker(2, nil)
	wild := []*loadview.Worker{a, b}
	req := &Request{Model: "unknown", Workers: wild, Session: []byte("s"), Prefix: []byte(sys + "hi")}
	first := f.ca.Select(req)
	if first.Decision != NoTreeRandom || (first.Worker != a && first.Worker != b) {
		t.Fatalf("first fallback selection: %s on %v", first.Decision, first.Worker.URL())
	}
	if c := f.ca.Select(req); c.Worker != first.Worker || c.Decision != SessionIDMatch {
		t.Fatalf("fallback session not sticky: %s %s", c.Worker.URL(), c.Decision)
	}
	// Another unserved name shares the state; the same session key routed
	// with other workers must not follow the stored worker out of them.
	other := &Request{Model: "unknown-2", Workers: f.ws, Session: []byte("s"), Prefix: []byte(sys + "hi")}
	if c := f.ca.Select(other); c.Worker != f.ws[0] && c.Worker != f.ws[1] {
		t.Fatalf("fallback affinity left the request's workers: %s (%s)", c.Worker.URL(), c.Decision)
	}
	var fb *Summary
	for _, s := range f.ca.Summaries(0) {
		if s.Fallback {
			fb = &s
		}
	}
	if fb == nil || fb.Model != FallbackModel || fb.Sessions != 1 {
		t.Fatalf("fallback summary: %+v", fb)
	}
}

// TestWriteMetricsEscapes: label values use the Prometheus escaping
// (backslash, quote, newline only), never Go's \x01 or \u escapes.
func TestWriteMetricsEscapes(t *testing.T) {
	f := newFixture(t, 1, nil)
	model := "m\"x\\y\nz\x01é"
	w := f.addWorker(1, []string{model})
	f.ca.Select(&Request{Model: model, Workers: []*loadview.Worker{w}, Session: []byte("s"), Prefix: []byte("p")})
	var buf bytes.Buffer
	f.ca.WriteMetrics(&buf)
	want := `vllm_router_sessions{model="m\"x\\y\nz` + "\x01" + `é"} 1`
	if !strings.Contains(buf.String(), want+"\n") {
		t.Fatalf("missing %q in:\n%s", want, buf.String())
	}
	if strings.Contains(buf.String(), `\x01`) || strings.Contains(buf.String(), `\u00e9`) {
		t.Fatalf("Go escapes in the metrics:\n%s", buf.String())
	}
}
