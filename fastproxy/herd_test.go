package fastproxy_test

import (
	"strconv"
	"strings"
	"testing"
)

// TestNewSessionsDoNotHerd: on four equal, idle workers that answer at
// once, nine new sessions sent one after another (each its own history,
// nothing shared) never all land on one worker (issue 30, item 6).
func TestNewSessionsDoNotHerd(t *testing.T) {
	for rep := range 20 {
		cfg := fastSim()
		cfg.TimeScale = 1e-6 // answers at once
		_, urls := startSims(t, 4, cfg)
		r := startRouter(t, urls, "cache_aware", nil)
		seen := map[string]int{}
		for s := range 9 {
			text := "session " + strconv.Itoa(rep) + "-" + strconv.Itoa(s) + strings.Repeat(" tell me about item "+strconv.Itoa(s), 30)
			resp, body := do(t, "POST", r.url+"/v1/chat/completions", chatBody("m", text, false), nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			seen[resp.Header.Get("X-Vllm-Router-Worker")]++
		}
		if len(seen) == 1 {
			t.Fatalf("run %d: all nine new sessions went to one worker: %v", rep, seen)
		}
		t.Logf("run %d: %v", rep, seen)
	}
}
