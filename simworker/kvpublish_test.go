package simworker

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmroute/warmroute/internal/testwait"
	"github.com/warmroute/warmroute/kvevents"
)

// kvConfig is a small worker publishing KV events on loopback: blocks of
// 4 tokens of 4 bytes, no sleeping.
func kvConfig() Config {
	return Config{TimeScale: 0, BlockTokens: 4, CharsPerToken: 4,
		KVEventsEndpoint: "tcp://127.0.0.1:0", KVEventsReplayEndpoint: "tcp://127.0.0.1:0"}
}

// kvFollower is a kvevents.Subscriber on a worker, keeping what it got and
// the cache it describes: applying every event, it checks that removals
// name blocks stored before and, with parents, that a chain hangs off a
// block it holds.
type kvFollower struct {
	sub     *kvevents.Subscriber
	parents bool // check that every parent is held

	mu      sync.Mutex
	msgs    []kvevents.Message
	held    map[kvevents.BlockHash]bool
	errs    []string
	resyncs []kvevents.Resync
}

// followKV subscribes to w's events through endpoint (w's own when "") and
// waits until w's publisher counts the subscription.
func followKV(t *testing.T, w *Worker, endpoint string) *kvFollower {
	t.Helper()
	if endpoint == "" {
		endpoint = w.KVEventsAddr()
	}
	f := &kvFollower{held: map[kvevents.BlockHash]bool{}}
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{
		Endpoint:       endpoint,
		ReplayEndpoint: w.KVEventsReplayAddr(),
		OnBatch:        f.apply,
		OnResync: func(r kvevents.Resync) {
			f.mu.Lock()
			f.resyncs = append(f.resyncs, r)
			f.mu.Unlock()
		},
		MinBackoff: 2 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.sub = sub
	t.Cleanup(func() { sub.Close() })
	testwait.Until(t, "the worker's publisher to count the subscriber", func() bool { return w.kv.pub.Subscribers() == 1 })
	return f
}

func (f *kvFollower) apply(m kvevents.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, m)
	if len(m.Batch.Events) == 0 {
		f.errs = append(f.errs, fmt.Sprintf("batch %d is empty", m.Seq))
	}
	if m.Batch.DPRank != -1 {
		f.errs = append(f.errs, fmt.Sprintf("batch %d: data-parallel rank %d", m.Seq, m.Batch.DPRank))
	}
	for _, ev := range m.Batch.Events {
		switch ev := ev.(type) {
		case kvevents.BlockStored:
			if f.parents && ev.HasParent && !f.held[ev.ParentBlockHash] {
				f.errs = append(f.errs, fmt.Sprintf("batch %d stores blocks under %x, not held", m.Seq, ev.ParentBlockHash))
			}
			if ev.Medium != "GPU" || len(ev.TokenIDs) != ev.BlockSize*len(ev.BlockHashes) {
				f.errs = append(f.errs, fmt.Sprintf("batch %d: %+v", m.Seq, ev))
			}
			for _, h := range ev.BlockHashes {
				if f.held[h] {
					f.errs = append(f.errs, fmt.Sprintf("batch %d stores %x, held already", m.Seq, h))
				}
				f.held[h] = true
			}
		case kvevents.BlockRemoved:
			for _, h := range ev.BlockHashes {
				if !f.held[h] {
					f.errs = append(f.errs, fmt.Sprintf("batch %d removes %x, not held", m.Seq, h))
				}
				delete(f.held, h)
			}
		case kvevents.AllBlocksCleared:
			clear(f.held)
		}
	}
}

// events returns the events got so far, in order, from batch from on.
func (f *kvFollower) events(from int) []kvevents.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var evs []kvevents.Event
	for _, m := range f.msgs[min(from, len(f.msgs)):] {
		evs = append(evs, m.Batch.Events...)
	}
	return evs
}

func (f *kvFollower) batches() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.msgs)
}

// check fails t with the stream's inconsistencies and breaks.
func (f *kvFollower) check(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) > 0 || len(f.resyncs) > 0 {
		t.Fatalf("event stream: %v; resyncs %+v", f.errs, f.resyncs)
	}
}

// heldSet is the set of blocks the events say the cache holds.
func (f *kvFollower) heldSet() map[kvevents.BlockHash]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return copySet(f.held)
}

func copySet(m map[kvevents.BlockHash]bool) map[kvevents.BlockHash]bool {
	out := make(map[kvevents.BlockHash]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// cacheSet is the set of blocks w's cache holds, by their published names.
func cacheSet(w *Worker) map[kvevents.BlockHash]bool {
	out := map[kvevents.BlockHash]bool{}
	if e := w.eng; e != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		for k := range e.kv.index {
			out[w.kv.hash(k)] = true
		}
		return out
	}
	w.cache.mu.Lock()
	defer w.cache.mu.Unlock()
	for k := range w.cache.index {
		out[w.kv.hash(k)] = true
	}
	return out
}

func sameSet(a, b map[kvevents.BlockHash]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

// stored returns the BlockStored events among evs.
func stored(evs []kvevents.Event) []kvevents.BlockStored {
	var out []kvevents.BlockStored
	for _, ev := range evs {
		if s, ok := ev.(kvevents.BlockStored); ok {
			out = append(out, s)
		}
	}
	return out
}

// storedHashes is the hashes the BlockStored events among evs name, in order.
func storedHashes(evs []kvevents.Event) []kvevents.BlockHash {
	var out []kvevents.BlockHash
	for _, s := range stored(evs) {
		out = append(out, s.BlockHashes...)
	}
	return out
}

// published names chain as w publishes it.
func published(w *Worker, chain []uint64) []kvevents.BlockHash { return w.kv.hashes(chain) }

// renderedPrompt is the prompt a chat body renders to.
func renderedPrompt(t *testing.T, body msg) []byte {
	t.Helper()
	var req chatRequest
	b, _ := api.Marshal(body)
	if err := api.Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	return renderChat(nil, req.Tools, req.Messages)
}

func chat(t *testing.T, url string, body msg) {
	t.Helper()
	if code, b := post(t, url+"/v1/chat/completions", body); code != 200 {
		t.Fatalf("chat: %d %s", code, b)
	}
}

func promptBlocks(t *testing.T, w *Worker, body msg) []uint64 {
	t.Helper()
	b, _ := api.Marshal(body)
	chain, err := w.PromptBlocks(b)
	if err != nil {
		t.Fatal(err)
	}
	return chain
}

// TestKVEventsStoreAPromptsChain: a conversation's first turn publishes its
// prompt's full blocks as one chain from no parent, chunk by chunk (one
// batch a step, each BlockStored hanging off the last block of the one
// before), with the tokens of the blocks; the second turn publishes only
// its new blocks, hanging off the first turn's last block (docs/design.md
// §6).
func TestKVEventsStoreAPromptsChain(t *testing.T) {
	cfg := kvConfig()
	cfg.MaxNumBatchedTokens = 8 // two blocks a step: a prompt's blocks come over several steps
	w, url := startWorker(t, cfg)
	f := followKV(t, w, "")
	f.parents = true

	turn1 := msg{"model": "sim-model", "max_tokens": 2, "messages": []any{user(strings.Repeat("the first question, at some length. ", 4))}}
	chain1 := promptBlocks(t, w, turn1)
	chat(t, url, turn1)
	testwait.Until(t, "the first turn's blocks published", func() bool { return len(storedHashes(f.events(0))) == len(chain1) })
	evs := f.events(0)
	if got, want := storedHashes(evs), published(w, chain1); !slices.Equal(got, want) {
		t.Fatalf("first turn stored %x, want the prompt's chain %x", got, want)
	}
	st := stored(evs)
	if len(st) < 2 || f.batches() < 2 {
		t.Fatalf("first turn: %d BlockStored in %d batches: want the prompt's blocks over several steps", len(st), f.batches())
	}
	prompt1 := renderedPrompt(t, turn1)
	bb := cfg.BlockTokens * cfg.CharsPerToken
	at := 0
	for i, s := range st {
		if i == 0 && s.HasParent {
			t.Fatalf("the prompt's first blocks hang off %x: want no parent", s.ParentBlockHash)
		}
		if i > 0 && (!s.HasParent || s.ParentBlockHash != st[i-1].BlockHashes[len(st[i-1].BlockHashes)-1]) {
			t.Fatalf("BlockStored %d hangs off %x (%v): want the last block of the one before", i, s.ParentBlockHash, s.HasParent)
		}
		want := w.kv.tokens(prompt1[at*bb : (at+len(s.BlockHashes))*bb])
		if s.BlockSize != 4 || s.LoRAID != -1 || !slices.Equal(s.TokenIDs, want) {
			t.Fatalf("BlockStored %d: %+v: want block size 4, no LoRA, tokens %v", i, s, want)
		}
		at += len(s.BlockHashes)
	}
	for _, tok := range st[0].TokenIDs {
		if tok >= kvVocab {
			t.Fatalf("token id %d beyond the vocabulary", tok)
		}
	}

	turn2 := msg{"model": "sim-model", "max_tokens": 2, "messages": []any{
		user(strings.Repeat("the first question, at some length. ", 4)),
		msg{"role": "assistant", "content": "an answer of some length, too."},
		user("a second question."),
	}}
	chain2 := promptBlocks(t, w, turn2)
	if len(chain2) <= len(chain1) || !slices.Equal(chain2[:len(chain1)], chain1) {
		t.Fatal("the second turn's prompt does not extend the first's")
	}
	from := f.batches()
	chat(t, url, turn2)
	testwait.Until(t, "the second turn's blocks published", func() bool {
		return len(storedHashes(f.events(from))) == len(chain2)-len(chain1)
	})
	evs = f.events(from)
	if got, want := storedHashes(evs), published(w, chain2[len(chain1):]); !slices.Equal(got, want) {
		t.Fatalf("second turn stored %x, want only its new blocks %x", got, want)
	}
	first := stored(evs)[0]
	if last := published(w, chain1[len(chain1)-1:])[0]; !first.HasParent || first.ParentBlockHash != last {
		t.Fatalf("second turn's blocks hang off %x (%v): want the first turn's last block %x", first.ParentBlockHash, first.HasParent, last)
	}
	f.check(t)
}

// TestKVEventsRemoveEvictedBlocks: a small cache that must evict for a new
// prompt publishes BlockRemoved for the evicted blocks in the order it
// evicts them, the least recently used prompt's tail first, before the new
// prompt's blocks are stored; the events describe the cache exactly.
func TestKVEventsRemoveEvictedBlocks(t *testing.T) {
	cfg := kvConfig()
	a := msg{"model": "sim-model", "max_tokens": 1, "messages": []any{user(strings.Repeat("A", 120))}}
	b := msg{"model": "sim-model", "max_tokens": 1, "messages": []any{user(strings.Repeat("B", 120))}}
	chainA := promptBlocks(t, New(Config{BlockTokens: 4, CharsPerToken: 4}), a)
	cfg.CacheBlocks = len(chainA) + 3 // b needs as many blocks, plus its last partial one and its output
	w, url := startWorker(t, cfg)
	chainA = promptBlocks(t, w, a)
	f := followKV(t, w, "")
	f.parents = true

	chat(t, url, a)
	testwait.Until(t, "a's blocks published", func() bool { return len(storedHashes(f.events(0))) == len(chainA) })
	from := f.batches()
	chat(t, url, b)
	chainB := promptBlocks(t, w, b)
	testwait.Until(t, "b's blocks published", func() bool { return len(storedHashes(f.events(from))) == len(chainB) })

	evs := f.events(from)
	removed, ok := evs[0].(kvevents.BlockRemoved)
	if !ok {
		t.Fatalf("first event for b: %T, want BlockRemoved before b's blocks are stored", evs[0])
	}
	tail := published(w, chainA)
	slices.Reverse(tail)
	if n := len(removed.BlockHashes); n == 0 || n >= len(chainA) || !slices.Equal(removed.BlockHashes, tail[:n]) || removed.Medium != "GPU" {
		t.Fatalf("removed %x: want a's tail, last block first: %x", removed.BlockHashes, tail)
	}
	testwait.Until(t, "the events to describe the cache", func() bool { return sameSet(f.heldSet(), cacheSet(w)) })
	f.check(t)
}

// TestKVEventsClear: /reset_prefix_cache and /sleep publish AllBlocksCleared
// when they drop every block, at once, idle engine or not; a reset that
// keeps blocks (a prefill leg's, held for a decode worker) publishes
// BlockRemoved for those it drops instead. The legacy model clears too.
func TestKVEventsClear(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(map[bool]string{false: "engine", true: "legacy"}[legacy], func(t *testing.T) {
			cfg := kvConfig()
			if legacy {
				cfg.LatencyModel = LatencyLegacy
			}
			w, url := startWorker(t, cfg)
			f := followKV(t, w, "")
			body := msg{"model": "sim-model", "max_tokens": 1, "messages": []any{user(strings.Repeat("cleared ", 20))}}
			chain := promptBlocks(t, w, body)
			onlyClear := func(what string) {
				t.Helper()
				from := f.batches()
				chat(t, url, body)
				testwait.Until(t, "blocks published", func() bool { return len(storedHashes(f.events(from))) == len(chain) })
				from = f.batches()
				switch what {
				case "reset":
					if code, b := post(t, url+"/reset_prefix_cache", nil); code != 200 {
						t.Fatalf("reset: %d %s", code, b)
					}
				case "sleep":
					if code, b := post(t, url+"/sleep?level=1", nil); code != 200 {
						t.Fatalf("sleep: %d %s", code, b)
					}
				}
				testwait.Until(t, what+" published", func() bool { return f.batches() > from })
				if evs := f.events(from); len(evs) != 1 || evs[0] != (kvevents.AllBlocksCleared{}) {
					t.Fatalf("%s published %+v: want AllBlocksCleared", what, evs)
				}
			}
			onlyClear("reset")
			onlyClear("sleep")
			if code, b := post(t, url+"/wake_up", nil); code != 200 {
				t.Fatalf("wake_up: %d %s", code, b)
			}
			if legacy {
				f.check(t)
				return
			}

			// A prefill leg's blocks stay held through a reset.
			held := msg{"model": "sim-model", "max_tokens": 1, "messages": []any{user(strings.Repeat("held ", 20))}}
			heldChain := promptBlocks(t, w, held)
			from := f.batches()
			if code, b := post(t, url+"/v1/chat/completions", prefillLeg(held)); code != 200 {
				t.Fatalf("prefill leg: %d %s", code, b)
			}
			chat(t, url, body)
			testwait.Until(t, "blocks published", func() bool {
				return len(storedHashes(f.events(from))) == len(chain)+len(heldChain)
			})
			from = f.batches()
			w.ResetCache()
			testwait.Until(t, "the reset published", func() bool { return f.batches() > from })
			evs := f.events(from)
			removed, ok := evs[0].(kvevents.BlockRemoved)
			if want := published(w, chain); len(evs) != 1 || !ok || len(removed.BlockHashes) != len(want) {
				t.Fatalf("a reset keeping held blocks published %+v: want BlockRemoved of %x", evs, want)
			}
			if !sameSet(f.heldSet(), cacheSet(w)) || len(cacheSet(w)) != len(heldChain) {
				t.Fatal("after the reset the events do not describe the held blocks")
			}
			f.check(t)
		})
	}
}

// TestKVEventsHashesAreTheWorkers: two workers name the same prompt's
// blocks differently (each its own random seed, as vLLM engines do), one
// worker names them alike every time; the token ids are one tokenizer's.
func TestKVEventsHashesAreTheWorkers(t *testing.T) {
	w1, url1 := startWorker(t, kvConfig())
	w2, url2 := startWorker(t, kvConfig())
	f1, f2 := followKV(t, w1, ""), followKV(t, w2, "")
	body := msg{"model": "sim-model", "max_tokens": 1, "messages": []any{user(strings.Repeat("same prompt ", 10))}}
	n := len(promptBlocks(t, w1, body))
	storedOf := func(f *kvFollower, from int) []kvevents.BlockStored {
		testwait.Until(t, "blocks published", func() bool { return len(storedHashes(f.events(from))) == n })
		return stored(f.events(from))
	}
	chat(t, url1, body)
	chat(t, url2, body)
	s1, s2 := storedOf(f1, 0), storedOf(f2, 0)
	h1, h2 := storedHashes(f1.events(0)), storedHashes(f2.events(0))
	for i := range h1 {
		if h1[i] == h2[i] {
			t.Fatalf("block %d has one hash on both workers: %x", i, h1[i])
		}
	}
	if !slices.Equal(s1[0].TokenIDs, s2[0].TokenIDs) {
		t.Fatal("the workers tokenize one text differently")
	}
	// The router cannot compute them from the prompt: they are not the
	// cache's own chain.
	if chain := promptBlocks(t, w1, body); uint64(h1[0]) == chain[0] {
		t.Fatal("published hash is the cache's internal one")
	}

	w1.ResetCache()
	from := f1.batches() + 1 // after the AllBlocksCleared
	testwait.Until(t, "the reset published", func() bool { return f1.batches() >= from })
	chat(t, url1, body)
	storedOf(f1, from)
	if again := storedHashes(f1.events(from)); !slices.Equal(again, h1) {
		t.Fatalf("the worker renamed the prompt's blocks: %x, then %x", h1, again)
	}
	f1.check(t)
	f2.check(t)
}

// TestKVEventsLoRA: an adapter's blocks carry its id and name.
func TestKVEventsLoRA(t *testing.T) {
	w, url := startWorker(t, kvConfig())
	f := followKV(t, w, "")
	if err := w.LoadAdapter("sql", "/adapters/sql"); err != nil {
		t.Fatal(err)
	}
	chat(t, url, msg{"model": "sql", "max_tokens": 1, "messages": []any{user(strings.Repeat("select ", 10))}})
	testwait.Until(t, "blocks published", func() bool { return len(stored(f.events(0))) > 0 })
	if s := stored(f.events(0))[0]; s.LoRAID != 1 || s.LoRAName != "sql" {
		t.Fatalf("adapter's blocks: lora %d %q, want 1 \"sql\"", s.LoRAID, s.LoRAName)
	}
}

// TestKVEventsPulledBlocks: a decode leg's pulled blocks enter its cache:
// the decode worker publishes them stored.
func TestKVEventsPulledBlocks(t *testing.T) {
	p, purl := startWorker(t, Config{TimeScale: 0})
	d, durl := startWorker(t, Config{TimeScale: 0, KVEventsEndpoint: "tcp://127.0.0.1:0"})
	f := followKV(t, d, "")
	ep := pdEndpoints[0]
	params, _ := prefill(t, p, purl, ep)
	decode(t, durl, ep, params)
	chain := promptBlocks(t, d, ep.body(false, 4))
	testwait.Until(t, "the pulled blocks published", func() bool { return len(storedHashes(f.events(0))) == len(chain) })
	if got := storedHashes(f.events(0)); !slices.Equal(got, published(d, chain)) || d.Stats().KVTransferredTokens == 0 {
		t.Fatalf("decode worker stored %x, want the pulled prompt's %x", got, published(d, chain))
	}
	f.check(t)
}

// TestKVEventsDescribeTheCache: under concurrent requests sharing prefixes,
// a small cache storing, evicting and being reset, in both latency models,
// the events a subscriber applies in order name exactly the blocks the
// cache holds once the work is done, every removal names a block stored
// before and (engine) every chain hangs off a held block.
func TestKVEventsDescribeTheCache(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(map[bool]string{false: "engine", true: "legacy"}[legacy], func(t *testing.T) {
			cfg := kvConfig()
			cfg.CacheBlocks = 40
			cfg.MaxNumBatchedTokens = 24
			if legacy {
				cfg.LatencyModel = LatencyLegacy
			}
			w, url := startWorker(t, cfg)
			// Idle keep-alive connections from concurrent clients can hold
			// the worker's Close up to its 5 s bound: close them first.
			t.Cleanup(client.CloseIdleConnections)
			f := followKV(t, w, "")
			f.parents = !legacy // the legacy cache can evict a chain's parent while inserting it
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					for i := range 12 {
						sys := strings.Repeat(fmt.Sprintf("system %d. ", i%3), 6)
						body := msg{"model": "sim-model", "max_tokens": 1 + i%3, "messages": []any{
							msg{"role": "system", "content": sys}, user(strings.Repeat(fmt.Sprintf("q%d-%d ", g, i), 1+i%4))}}
						if code, b := post(t, url+"/v1/chat/completions", body); code != 200 {
							t.Errorf("chat: %d %s", code, b)
							return
						}
						if g == 0 && i == 6 {
							w.ResetCache()
						}
					}
				})
			}
			wg.Wait()
			testwait.Until(t, "the events to describe the cache", func() bool { return sameSet(f.heldSet(), cacheSet(w)) },
				func() string {
					return fmt.Sprintf("%d blocks by the events, %d in the cache", len(f.heldSet()), len(cacheSet(w)))
				})
			f.check(t)
			if len(cacheSet(w)) == 0 {
				t.Fatal("the workload left the cache empty")
			}
		})
	}
}

// cutProxy forwards TCP connections to a target until cut: then it closes
// them and refuses new ones until healed.
type cutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns []net.Conn
	wg    sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: strings.TrimPrefix(target, "tcp://")}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) endpoint() string { return "tcp://" + p.ln.Addr().String() }

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, up)
		p.wg.Add(2)
		go func() { defer p.wg.Done(); io.Copy(up, c); up.Close() }() //nolint:errcheck
		go func() { defer p.wg.Done(); io.Copy(c, up); c.Close() }()  //nolint:errcheck
		p.mu.Unlock()
	}
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// TestKVEventsReplayAfterADroppedConnection: batches published while a
// subscriber's connection is down are sent again from the replay socket
// once it reconnects, in order, before the batch after them: the stream
// has no break.
func TestKVEventsReplayAfterADroppedConnection(t *testing.T) {
	w, url := startWorker(t, kvConfig())
	proxy := newCutProxy(t, w.KVEventsAddr())
	f := followKV(t, w, proxy.endpoint())
	body := func(s string) msg {
		return msg{"model": "sim-model", "max_tokens": 1, "messages": []any{user(strings.Repeat(s, 30))}}
	}
	chat(t, url, body("one "))
	testwait.Until(t, "the first batch", func() bool { return f.batches() > 0 })

	proxy.setCut(true)
	testwait.Until(t, "the publisher to lose its subscriber", func() bool { return w.kv.pub.Subscribers() == 0 })
	missed := msg{"model": "sim-model", "max_tokens": 1, "messages": []any{user(strings.Repeat("two ", 30))}}
	chat(t, url, missed)
	proxy.setCut(false)
	testwait.Until(t, "the subscriber to reconnect", func() bool { return w.kv.pub.Subscribers() == 1 })
	chat(t, url, body("three "))

	want := published(w, promptBlocks(t, w, missed))
	testwait.Until(t, "the missed blocks replayed", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, m := range f.msgs {
			if m.Replayed && slices.Equal(storedHashes(m.Batch.Events), want) {
				return true
			}
		}
		return false
	})
	testwait.Until(t, "the events to describe the cache", func() bool { return sameSet(f.heldSet(), cacheSet(w)) })
	f.mu.Lock()
	for i, m := range f.msgs {
		if m.Seq != uint64(i) {
			t.Errorf("batch %d has sequence %d", i, m.Seq)
		}
	}
	f.mu.Unlock()
	if c := f.sub.Counters(); c.Replays.Load() == 0 || c.Resyncs.Load() != 0 {
		t.Fatalf("replays %d, resyncs %d: want the gap filled", c.Replays.Load(), c.Resyncs.Load())
	}
	f.check(t)
}

// TestKVEventsOffByDefault: without an endpoint no publisher, log or
// goroutine of it exists, in either latency model.
func TestKVEventsOffByDefault(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		cfg := Config{TimeScale: 0}
		if legacy {
			cfg.LatencyModel = LatencyLegacy
		}
		w, url := startWorker(t, cfg)
		chat(t, url, msg{"model": "sim-model", "messages": []any{user(strings.Repeat("off ", 40))}})
		w.ResetCache()
		if w.kv != nil || w.cache.kv != nil || (w.eng != nil && w.eng.kv.log != nil) || w.KVEventsAddr() != "" || w.KVEventsReplayAddr() != "" {
			t.Fatal("KV events on without an endpoint")
		}
		buf := make([]byte, 1<<20)
		if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "kvevents.") {
			t.Fatalf("a kvevents goroutine runs:\n%s", stacks)
		}
	}
}

// TestKVEventsBindFailure: an endpoint that cannot be bound fails Start
// and Serve, and publishes nothing.
func TestKVEventsBindFailure(t *testing.T) {
	w1, _ := startWorker(t, kvConfig())
	cfg := kvConfig()
	cfg.KVEventsEndpoint = w1.KVEventsAddr() // taken
	if _, _, err := Start(cfg); err == nil {
		t.Fatal("Start bound a taken endpoint")
	}
	w := New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Serve(ln); err == nil || w.KVEventsAddr() != "" {
		t.Fatalf("Serve with an unbound endpoint: %v", err)
	}
	if err := (Config{KVEventsReplayEndpoint: "tcp://127.0.0.1:0"}).Validate(); err == nil {
		t.Fatal("Validate accepts a replay endpoint without an endpoint")
	}
}

// TestKVEventsLegacyNetChange: the legacy cache inserts a chain from its
// tail and may evict blocks of the chain itself on the way; an admission
// publishes its net change: a cached block it evicted and inserted again
// is neither removed nor stored, and blocks of a chain longer than the
// cache that it inserted and evicted again are neither stored nor removed.
func TestKVEventsLegacyNetChange(t *testing.T) {
	cfg := kvConfig()
	cfg.LatencyModel = LatencyLegacy
	cfg.CacheBlocks = 4
	w, url := startWorker(t, cfg)
	f := followKV(t, w, "")
	complete := func(prompt string) {
		t.Helper()
		if code, b := post(t, url+"/v1/completions", msg{"model": "sim-model", "prompt": prompt, "max_tokens": 1}); code != 200 {
			t.Fatalf("completions: %d %s", code, b)
		}
	}
	block := func(c string) string { return strings.Repeat(c, 16) } // one block: 4 tokens of 4 bytes
	described := func(what string) {
		t.Helper()
		testwait.Until(t, what, func() bool { return sameSet(f.heldSet(), cacheSet(w)) },
			func() string {
				return fmt.Sprintf("%d blocks by the events, %d in the cache", len(f.heldSet()), len(cacheSet(w)))
			})
		f.check(t)
	}
	complete(block("a") + block("b")) // a b
	complete(block("c") + block("d")) // c d a b
	complete(block("e"))              // e c d a: b evicted, a least recently used
	described("the cache of a, c, d, e")
	// Inserting g and f evicts a, d; touching a again brings it back,
	// evicting c: a is in the cache before and after.
	complete(block("a") + block("f") + block("g"))
	described("a kept through its eviction")
	// Six blocks in a cache of four: the last two are inserted, then
	// evicted by the first four.
	complete(block("h") + block("i") + block("j") + block("k") + block("l") + block("m"))
	described("a chain longer than the cache")
	if n := len(cacheSet(w)); n != 4 {
		t.Fatalf("cache holds %d blocks, want 4", n)
	}
}
