package route

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warmroute/warmroute/loadview"
)

// A worker whose engine states a small KV capacity has its part of the
// tree trimmed to capacity × characters per token (by the sweep, and by an
// answer), oldest conversation first; a worker that states nothing keeps
// everything, as before.
func TestTreeFollowsStatedCapacity(t *testing.T) {
	load := "vllm:num_requests_running{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\n"
	bodies := []string{
		load + `vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1` + "\n", // 1,600 tokens
		load, // states nothing
	}
	reg := loadview.NewRegistry(loadview.Config{LoadScrapeInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var ws []*loadview.Worker
	for _, body := range bodies {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/metrics" {
				io.WriteString(w, body) //nolint:errcheck
			}
		}))
		defer srv.Close()
		added, err := reg.Add(context.Background(), srv.URL, []string{"m"})
		if err != nil || !added[0].Healthy() {
			t.Fatalf("add: %v", err)
		}
		ws = append(ws, added[0])
	}
	reg.ScrapeLoadOnce(context.Background())
	if ws[0].KVCapacityTokens() != 1600 || ws[1].KVCapacityTokens() != 0 {
		t.Fatalf("capacities %d, %d", ws[0].KVCapacityTokens(), ws[1].KVCapacityTokens())
	}
	var now int64 = 1
	ca := NewCacheAware(reg, CacheAwareConfig{Threshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5, MaxTreeSize: 1 << 20,
		Now: func() int64 { return now }}, func() uint64 { return 1 })
	st, _ := ca.state("m")
	conv := func(i int) string { return "conversation " + strings.Repeat(string(rune('a'+i)), 2000) }
	for i := range 6 {
		now++
		st.tree.InsertAt([]byte(conv(i)), ws[0].ID(), now)
		st.tree.InsertAt([]byte(strings.ToUpper(conv(i))), ws[1].ID(), now)
	}
	full := st.tree.WorkerChars(ws[1].ID())
	ca.Sweep()
	budget := 1600 * int(PriorCharsPerToken) // the pooled prior: no answers yet
	if got := st.tree.WorkerBudget(ws[0].ID()); got != budget {
		t.Fatalf("budget %d, want %d", got, budget)
	}
	if got := st.tree.WorkerChars(ws[0].ID()); got != budget-budget/64 {
		t.Fatalf("worker with capacity holds %d chars, want %d", got, budget-budget/64)
	}
	if got := st.tree.WorkerChars(ws[1].ID()); got != full || st.tree.WorkerBudget(ws[1].ID()) != 0 {
		t.Fatalf("worker stating nothing holds %d chars (had %d), budget %d", got, full, st.tree.WorkerBudget(ws[1].ID()))
	}
	// The newest conversations stay whole; the oldest went.
	if m := st.tree.Match([]byte(conv(5)), nil); m.Len != len(conv(5)) {
		t.Fatalf("newest conversation cut: %d", m.Len)
	}
	if m := st.tree.Match([]byte(conv(0)), func(id uint32) bool { return id == ws[0].ID() }); m.Len > len("conversation ") {
		t.Fatalf("oldest conversation still held: %d", m.Len)
	}
	for _, s := range ca.Summaries(0)[0].Workers {
		if want := map[bool]int{true: budget, false: 0}[s.Worker == ws[0].URL()]; s.TreeBudgetChars != want {
			t.Fatalf("summary %+v, want budget %d", s, want)
		}
	}
	var b strings.Builder
	ca.WriteMetrics(&b)
	if !strings.Contains(b.String(), "vllm_router_tree_budget_chars{") || strings.Count(b.String(), "vllm_router_tree_budget_chars{") != 1 {
		t.Fatalf("budget series:\n%s", b.String())
	}

	// An answer: its characters per token (2 here) set the budget, and
	// what the new turn added is trimmed at once, off the selection.
	now++
	ch := ca.Select(&Request{Model: "m", Workers: []*loadview.Worker{ws[0]}, Prefix: []byte(conv(6))})
	if ch.Worker != ws[0] {
		t.Fatal("not placed on the only worker offered")
	}
	for range 40 { // the learned rate moves by an eighth per answer
		ca.Observe(ch, &Served{TTFB: time.Millisecond, Elapsed: time.Millisecond, Stream: true,
			PromptTokens: len(conv(6)) / 2, CachedTokens: -1, CompletionTokens: 1})
	}
	cpt, _ := ca.CharsPerToken("m", ws[0].ID())
	budget = int(1600 * cpt)
	if got := st.tree.WorkerChars(ws[0].ID()); got > budget || got < budget-budget/64-len(conv(0)) {
		t.Fatalf("after answers at %.2f chars per token: %d chars held, budget %d", cpt, got, budget)
	}
	if got := st.tree.WorkerChars(ws[1].ID()); got != full {
		t.Fatalf("worker stating nothing trimmed by another's answers: %d", got)
	}
}
