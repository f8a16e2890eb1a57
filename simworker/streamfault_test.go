package simworker

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
)

// stalling reports whether a goroutine of this process runs a stall fault.
func stalling() bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Contains(buf[:n], []byte("simworker.(*Worker).stall"))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// finished reports whether evs hold a chat chunk with a finish reason.
func finished(evs []sseEvent) bool {
	for _, e := range evs {
		if strings.Contains(e.data, `"finish_reason":"`) {
			return true
		}
	}
	return false
}

func done(evs []sseEvent) bool { return len(evs) > 0 && evs[len(evs)-1].data == "[DONE]" }

func TestStreamFaults(t *testing.T) {
	for _, model := range []string{LatencyEngine, LatencyLegacy} {
		t.Run(model, func(t *testing.T) {
			w, url := startWorker(t, Config{LatencyModel: model, HangLimit: time.Minute})
			chat := msg{"messages": []any{user("x")}, "max_tokens": 5, "stream": true}
			stream := func(fault string) ([]sseEvent, error) {
				t.Helper()
				resp, err := send(url+"/v1/chat/completions", chat, FaultHeader, fault)
				if err != nil {
					t.Fatalf("%s: %v", fault, err)
				}
				if resp.StatusCode != 200 {
					t.Fatalf("%s: status %d", fault, resp.StatusCode)
				}
				return readSSE(resp, time.Now())
			}

			// cut: N whole events, then the connection closes mid-body; an
			// answer of N chunks or fewer is cut before its finish chunk.
			for _, c := range []struct {
				fault string
				n     int
			}{{"cut=0", 0}, {"cut=2", 2}, {"cut=5", 5}, {"cut=9", 5}} {
				evs, err := stream(c.fault)
				if !errors.Is(err, io.ErrUnexpectedEOF) || len(evs) != c.n || finished(evs) {
					t.Fatalf("%s: %d events %v, err %v: want %d chunks, then an unterminated body", c.fault, len(evs), evs, err, c.n)
				}
			}

			// reset: N events, then ECONNRESET.
			evs, err := stream("reset=2")
			if !errors.Is(err, syscall.ECONNRESET) || len(evs) != 2 {
				t.Fatalf("reset=2: %d events, err %v: want 2, then a reset", len(evs), err)
			}

			// truncate: N events and a properly ended body, without the
			// finish chunk and [DONE]; the connection stays usable.
			for _, n := range []int{0, 3} {
				evs, err := stream("truncate=" + string(rune('0'+n)))
				if err != nil || len(evs) != n || finished(evs) || done(evs) {
					t.Fatalf("truncate=%d: %d events %v, err %v", n, len(evs), evs, err)
				}
			}
			if evs, err := stream("slow=0"); err != nil || len(evs) != 7 || !finished(evs) || !done(evs) {
				t.Fatalf("after the faults: %d events, err %v", len(evs), err)
			}
			if st := w.Stats(); st.Dropped != 5 || st.Errors != 7 || st.Running != 0 {
				t.Fatalf("stats %+v: want 5 dropped (cut, reset), 7 errors", st)
			}
		})
	}
}

// TestStallEndsWhenClientLeaves: a stalled stream sends N events, then
// nothing; when the client gives up, the worker's goroutine for it ends.
func TestStallEndsWhenClientLeaves(t *testing.T) {
	_, url := startWorker(t, Config{HangLimit: time.Hour})
	for _, path := range []string{"/v1/chat/completions", "/v1/messages"} {
		ctx, cancel := context.WithCancel(context.Background())
		body := `{"model":"sim-model","max_tokens":6,"stream":true,"messages":[{"role":"user","content":"x"}]}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
		req.Header.Set(FaultHeader, "stall=2")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(resp.Body)
		var text strings.Builder
		for events := 0; events < 2; {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("%s: %v after %q", path, err, text.String())
			}
			text.WriteString(line)
			if strings.HasPrefix(line, "data: ") && (path != messagesPath || strings.Contains(line, "content_block_delta")) {
				events++
			}
		}
		if line, err := r.ReadString('\n'); err != nil || line != "\n" {
			t.Fatalf("%s: %q, %v: want the blank line that ends the event", path, line, err)
		}
		testwait.Until(t, path+": the stall to hold the connection", stalling)
		if r.Buffered() > 0 {
			b, _ := r.Peek(r.Buffered())
			t.Fatalf("%s: sent %q after its 2 chunks", path, b)
		}
		cancel()
		resp.Body.Close()
		testwait.Until(t, path+": the stall's goroutines to end once the client left", func() bool { return !stalling() })
	}
}

// TestStallBound: a stall ends at HangLimit with the connection closed.
func TestStallBound(t *testing.T) {
	_, url := startWorker(t, Config{HangLimit: 50 * time.Millisecond})
	resp, err := send(url+"/v1/completions", msg{"prompt": "x", "max_tokens": 4, "stream": true}, FaultHeader, "stall=1")
	if err != nil {
		t.Fatal(err)
	}
	evs, err := readSSE(resp, time.Now())
	if !errors.Is(err, io.ErrUnexpectedEOF) || len(evs) != 1 {
		t.Fatalf("stall=1 past HangLimit: %d events, err %v", len(evs), err)
	}
	testwait.Until(t, "the stall to end", func() bool { return !stalling() })
}

// TestBufferedFaults: cut, reset and stall hang up before any response to
// a buffered request; truncate leaves it alone.
func TestBufferedFaults(t *testing.T) {
	_, url := startWorker(t, Config{HangLimit: 50 * time.Millisecond})
	chat := msg{"messages": []any{user("x")}, "max_tokens": 3}
	for _, fault := range []string{"cut=1", "reset=0", "stall=0"} {
		if resp, err := send(url+"/v1/chat/completions", chat, FaultHeader, fault); err == nil {
			resp.Body.Close()
			t.Fatalf("%s: got a response %d", fault, resp.StatusCode)
		}
	}
	if code, b := post(t, url+"/v1/chat/completions", chat, FaultHeader, "truncate=1"); code != 200 || path(decodeJSON(t, b), "choices", 0, "finish_reason") != "length" {
		t.Fatalf("truncate, buffered: %d %s", code, b)
	}
}

// TestDefaultFaults: Config.DefaultFaults applies to requests without the
// fault header; a header replaces it.
func TestDefaultFaults(t *testing.T) {
	_, url := startWorker(t, Config{DefaultFaults: "truncate=1"})
	req := msg{"model": "sim-model", "max_tokens": 4, "messages": []any{user("x")}}
	evs, _, err := messagesStream(t, url, req)
	if err != nil || eventNames(evs) != "message_start,content_block_start,ping,delta*" || len(evs) != 4 {
		t.Fatalf("default truncate=1: %q (%d events), %v", eventNames(evs), len(evs), err)
	}
	evs, _, err = messagesStream(t, url, req, FaultHeader, "slow=0")
	if err != nil || !strings.HasSuffix(eventNames(evs), "content_block_stop,message_delta,message_stop") {
		t.Fatalf("header over the default: %q, %v", eventNames(evs), err)
	}
	if err := (Config{DefaultFaults: "cut=x"}).Validate(); err == nil {
		t.Fatal("Validate accepted cut=x")
	}
}
