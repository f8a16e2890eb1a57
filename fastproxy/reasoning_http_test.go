package fastproxy_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/warmroute/warmroute/sharedstate"
)

// A Responses API answer carrying an encrypted reasoning item, through
// replica A, whole and streamed: the artifact's lock is in Redis the
// instant the client has the response, and the follow-up turn that echoes
// the item back, sent without a session id to replica B, is served by the
// same model and worker (docs/design.md §5, §8.3).
func TestReplicasReasoningLock(t *testing.T) {
	enc := map[string]string{} // worker URL → its artifact
	f := startReplicasOn(t, func(model string) []string {
		var urls []string
		for i := range 2 {
			e := "gAAAAB" + model + "-" + strconv.Itoa(i) + "+x/y=="
			item := `{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"` + e + `"}`
			whole := `{"id":"resp_` + model + strconv.Itoa(i) + `","object":"response","status":"completed","output":[` + item +
				`,{"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"ok"}]}]}`
			chunks := [][]byte{
				[]byte("event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"output_index\":0,\"item\":" + item + "}\n\n"),
				[]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":" + whole + "}\n\n"),
			}
			// The worker holds the stream open after response.completed:
			// only the wait before that chunk keeps the lock ahead.
			up := startEcho(t, []byte(whole), chunks, 100*time.Millisecond)
			enc[up.url] = e
			urls = append(urls, up.url)
		}
		return urls
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	probe, err := sharedstate.Open(context.Background(), sharedstate.Config{URL: f.redis.URL(), Logger: quiet, ReadTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	user := `{"role":"user","content":"hello there"}`
	check := func(h http.Header, seen string) {
		t.Helper()
		model, worker := h.Get("x-vsr-selected-model"), h.Get("x-vllm-router-worker")
		e := enc[worker]
		if e == "" {
			t.Fatalf("worker %q unknown", worker)
		}
		sum := sha256.Sum256([]byte(e))
		l, ok, err := probe.GetLock(context.Background(), sharedstate.KindReasoning, []byte(hex.EncodeToString(sum[:16])))
		if err != nil || !ok || l.Model != model || l.Worker != worker {
			t.Fatalf("at the end of the response, Redis holds %+v %v %v; want %s on %s", l, ok, err, model, worker)
		}
		// The client echoes the output item back (an SDK re-encodes it).
		item, _ := json.Marshal(map[string]any{"type": "reasoning", "id": "rs_1", "summary": []any{}, "encrypted_content": e})
		body := `{"model":"auto","input":[` + user + `,` + string(item) + `,{"role":"user","content":"prove it rigorously, step by step"}]}`
		resp, got := do(t, "POST", f.rep[1].url+"/v1/responses", body, map[string]string{"x-warmroute-complexity": "1"})
		if resp.StatusCode != 200 || resp.Header.Get("x-vsr-selected-model") != model || resp.Header.Get("x-vllm-router-worker") != worker ||
			resp.Header.Get("x-vsr-session-action") != "hard_lock" {
			t.Fatalf("follow-up on B: %d %s on %s, %s (want %s on %s, hard_lock): %s", resp.StatusCode, resp.Header.Get("x-vsr-selected-model"),
				resp.Header.Get("x-vllm-router-worker"), resp.Header.Get("x-vsr-session-action"), model, worker, got)
		}
	}
	resp, body := do(t, "POST", f.rep[0].url+"/v1/responses", `{"model":"auto","input":[`+user+`]}`, map[string]string{"x-warmroute-complexity": "0"})
	if resp.StatusCode != 200 {
		t.Fatalf("responses on A: %d %s", resp.StatusCode, body)
	}
	check(resp.Header, string(body))
	streamUntil(t, f.rep[0].url+"/v1/responses", `{"model":"auto","stream":true,"input":[`+user+`]}`,
		map[string]string{"x-warmroute-complexity": "0"}, "response.completed", check)
	if n := f.models[1].Stats().HardLocks; n != 2 {
		t.Fatalf("B hard-locked %d turns, want 2", n)
	}
}
