package simworker

import "errors"

// Read-only views of the simulated engine's KV cache, for measuring
// instruments (the replay bench's "precise" policy, a ceiling that sees
// what a router cannot): no router may call them, since a real engine
// offers nothing like them.

// PromptBlocks returns the block hashes of the full blocks of the prompt
// that body, a /v1/chat/completions request, renders to on w: its chat
// template, its model's (or adapter's) cache namespace and its block size,
// chained as the prefix cache names them. Every worker of this process with
// the same BlockTokens and CharsPerToken names the blocks alike.
func (w *Worker) PromptBlocks(body []byte) ([]uint64, error) {
	var req chatRequest
	if err := api.Unmarshal(body, &req); err != nil {
		return nil, err
	}
	name := req.Model
	if name == "" {
		name = w.cfg.Models[0]
	}
	t, ok := w.resolve(name)
	if !ok {
		return nil, errors.New("simworker: model " + name + " not served")
	}
	if len(req.Messages) == 0 {
		return nil, errors.New("simworker: no messages")
	}
	sortTools(req.Tools)
	var prompt []byte
	switch {
	case req.ContinueFinalMessage:
		prompt, _ = renderContinue(req.Tools, req.Messages)
	case req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt:
		prompt = appendMessages(nil, req.Tools, req.Messages)
	default:
		prompt = renderChat(nil, req.Tools, req.Messages)
	}
	return blockHashes(nil, t.salt, prompt, w.cfg.BlockTokens*w.cfg.CharsPerToken), nil
}

// HeldBlocks returns how many of chain's leading blocks w's KV cache holds
// now: cached, held by a running request, or scheduled for prefill in the
// step under way — what the engine's KV events (BlockStored) would have
// published by now; the blocks of a running request's later prefill chunks
// and of waiting requests do not count yet. It touches no block's recency.
func (w *Worker) HeldBlocks(chain []uint64) int {
	e := w.eng
	if e == nil {
		return w.cache.contains(chain)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	held := 0
	for held < len(chain) {
		if _, ok := e.kv.index[chain[held]]; !ok {
			break
		}
		held++
	}
	bt := w.cfg.BlockTokens
	for _, s := range e.running {
		// Chained hashes: two chains agree on block i only if they agree
		// on every block before it.
		n := min(len(s.chain), len(chain), (s.prefilled+s.chunk)/bt)
		for held < n && s.chain[held] == chain[held] {
			held++
		}
	}
	return held
}
