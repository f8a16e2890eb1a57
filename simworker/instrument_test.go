package simworker

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
)

// PromptBlocks names the blocks a chat request's prompt fills, HeldBlocks
// counts those the worker holds: all of them once it served the request,
// none on another worker, the shared prefix of a longer conversation, and
// a running request's blocks as its prefill chunks are scheduled.
func TestHeldBlocks(t *testing.T) {
	cfg := Config{TimeScale: 0.5, PerToken: 200 * time.Microsecond, MaxNumBatchedTokens: 512}
	w, url := startWorker(t, cfg)
	other, _ := startWorker(t, cfg)
	doc := strings.Repeat("the quick brown fox ", 200) // 4000 characters: 1000 tokens
	turn1 := msg{"messages": []any{user(doc)}, "max_tokens": 1}
	body1, _ := json.Marshal(turn1)
	chain1, err := w.PromptBlocks(body1)
	if err != nil || len(chain1) < 60 {
		t.Fatalf("PromptBlocks: %d blocks, %v", len(chain1), err)
	}
	if h := w.HeldBlocks(chain1); h != 0 {
		t.Fatalf("a fresh worker holds %d blocks", h)
	}

	// In flight: 512 tokens a step, a ~50 ms step at this scale; the
	// blocks show while the prefill runs, before the (unstreamed) answer.
	done := make(chan error, 1)
	go func() {
		resp, err := send(url+"/v1/chat/completions", body1)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	testwait.Until(t, "part of the prompt held mid prefill", func() bool {
		h := w.HeldBlocks(chain1)
		return h > 0 && h < len(chain1) && w.Stats().Running == 1
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h := w.HeldBlocks(chain1); h != len(chain1) {
		t.Fatalf("served: holds %d of %d blocks", h, len(chain1))
	}
	if h := other.HeldBlocks(chain1); h != 0 {
		t.Fatalf("another worker holds %d blocks", h)
	}
	body2, _ := json.Marshal(msg{"messages": []any{user(doc), msg{"role": "assistant", "content": "ok"}, user(doc)}})
	chain2, err := other.PromptBlocks(body2) // the same names on every worker
	if err != nil || len(chain2) <= len(chain1) {
		t.Fatalf("PromptBlocks: %d blocks, %v", len(chain2), err)
	}
	// The first turn's prompt ends with the generation prompt, which the
	// second renders as the assistant message's start: all but its last
	// (partial) block are shared.
	if h := w.HeldBlocks(chain2); h < len(chain1)-1 || h >= len(chain2) {
		t.Fatalf("longer conversation: holds %d of %d blocks (first turn %d)", h, len(chain2), len(chain1))
	}
	if _, err := w.PromptBlocks([]byte(`{"model":"nope","messages":[{"role":"user","content":"x"}]}`)); err == nil {
		t.Fatal("an unknown model named blocks")
	}
}
