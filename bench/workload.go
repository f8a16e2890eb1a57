package bench

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Workload is a set of sessions to replay. Every policy of one seed replays
// the same Workload, so every policy sends byte-identical requests.
type Workload struct {
	Name     string    // "synthetic", "tau", "mooncake", ...
	Note     string    // one line: where it came from and how it was shaped
	Sessions []Session // in start order
}

// Session is one conversation, replayed turn by turn, strictly in order.
type Session struct {
	ID    string // sent as X-Session-ID or session_params.session_id (see SessionVia)
	Turns []Turn
}

// Turn is one request: the whole conversation so far, as raw JSON chat
// messages (compact, one object each). Turns of one session usually share
// the backing array of one message list: never modify Messages.
type Turn struct {
	Messages []json.RawMessage
	// Answer is the length in tokens of the answer this call got where the
	// workload was recorded (the assistant message the next turn's history
	// carries); 0: unknown. The replay asks the worker for exactly that many
	// tokens unless Options.MaxTokens fixes one length for every call.
	Answer int
}

// Requests returns the number of turns over all sessions.
func (w *Workload) Requests() int {
	n := 0
	for i := range w.Sessions {
		n += len(w.Sessions[i].Turns)
	}
	return n
}

// Chars returns the content bytes of the turn (the JSON of its messages).
func (t *Turn) Chars() int {
	n := 0
	for _, m := range t.Messages {
		n += len(m)
	}
	return n
}

// SyntheticConfig shapes the built-in workload after the vLLM multi-turn
// benchmark (benchmarks/multi_turn): one system prompt shared by every
// session, a per-session prefix (the task: documents, code), then 12–18
// user/assistant turns. Sizes are in tokens of CharsPerToken characters.
type SyntheticConfig struct {
	Sessions            int
	TurnsMin, TurnsMax  int // turns per session, uniform
	SystemTokens        int // shared prefix of every session
	SessionPrefixTokens int // per-session prefix, uniform in [½×, 1½×]
	UserTokensMin       int // each later user message, uniform
	UserTokensMax       int
	AssistantTokens     int // each assistant reply in the history (each turn's Answer)
	CharsPerToken       int // default 4
	IDStyle             string
	Seed                uint64
}

// DefaultSynthetic is the default workload of cmd/warmbench: the sizes of
// vLLM's benchmarks/multi_turn/generate_multi_turn.json (common prefix 500
// tokens, per-conversation prefix ~1000, 12–18 turns, user turns 120–160
// tokens) with 64-token replies (theirs: 80–120) to keep a default run short.
func DefaultSynthetic() SyntheticConfig {
	return SyntheticConfig{
		Sessions: 32, TurnsMin: 12, TurnsMax: 18,
		SystemTokens: 500, SessionPrefixTokens: 1000,
		UserTokensMin: 120, UserTokensMax: 160, AssistantTokens: 64,
		CharsPerToken: 4, IDStyle: IDSeq,
	}
}

// Session id styles.
const (
	IDSeq = "seq" // session-1, session-2, ... (the RFC's example: session-1 is a prefix of session-12)
	IDHex = "hex" // 16 random hex digits per session, deterministic per seed
)

// sessionID returns the id of session i (0-based) in style.
func sessionID(style string, i int, rng *rand.Rand) string {
	if style == IDHex {
		return fmt.Sprintf("%016x", rng.Uint64())
	}
	return "session-" + strconv.Itoa(i+1)
}

// Synthetic generates the workload of cfg. It is a pure function of cfg:
// the same cfg (Seed included) gives the same bytes.
func Synthetic(cfg SyntheticConfig) *Workload {
	if cfg.CharsPerToken <= 0 {
		cfg.CharsPerToken = 4
	}
	if cfg.TurnsMax < cfg.TurnsMin {
		cfg.TurnsMax = cfg.TurnsMin
	}
	if cfg.UserTokensMax < cfg.UserTokensMin {
		cfg.UserTokensMax = cfg.UserTokensMin
	}
	cpt := cfg.CharsPerToken
	root := rand.New(rand.NewPCG(cfg.Seed, 0x5e55))
	system := msg("system", text(rand.New(rand.NewPCG(cfg.Seed, 0x5157)), cfg.SystemTokens*cpt))
	w := &Workload{
		Name: "synthetic",
		Note: fmt.Sprintf("built-in, shaped like vLLM's multi-turn benchmark: %d sessions × %d–%d turns; shared system prompt %d tokens; "+
			"per-session prefix %d tokens (±50%%); user turns %d–%d tokens; assistant replies %d tokens of deterministic text; seed %d",
			cfg.Sessions, cfg.TurnsMin, cfg.TurnsMax, cfg.SystemTokens, cfg.SessionPrefixTokens,
			cfg.UserTokensMin, cfg.UserTokensMax, cfg.AssistantTokens, cfg.Seed),
	}
	for i := 0; i < cfg.Sessions; i++ {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)+1))
		turns := cfg.TurnsMin + rng.IntN(cfg.TurnsMax-cfg.TurnsMin+1)
		var msgs []json.RawMessage
		if cfg.SystemTokens > 0 {
			msgs = append(msgs, system)
		}
		pre := cfg.SessionPrefixTokens
		if pre > 1 {
			pre = pre/2 + rng.IntN(pre+1)
		}
		s := Session{ID: sessionID(cfg.IDStyle, i, root)}
		for k := 0; k < turns; k++ {
			n := cfg.UserTokensMin + rng.IntN(cfg.UserTokensMax-cfg.UserTokensMin+1)
			if k == 0 {
				n += pre
			}
			msgs = append(msgs, msg("user", text(rng, n*cpt)))
			s.Turns = append(s.Turns, Turn{Messages: msgs[:len(msgs):len(msgs)], Answer: cfg.AssistantTokens})
			msgs = append(msgs, msg("assistant", text(rng, cfg.AssistantTokens*cpt)))
		}
		w.Sessions = append(w.Sessions, s)
	}
	return w
}

// msg returns the compact JSON of a chat message whose content needs no
// escaping (text returns only lowercase letters and spaces).
func msg(role, content string) json.RawMessage {
	b := make([]byte, 0, len(content)+32)
	b = append(b, `{"role":"`...)
	b = append(b, role...)
	b = append(b, `","content":"`...)
	b = append(b, content...)
	b = append(b, `"}`...)
	return b
}

// text returns n bytes of pseudo-words (lowercase letters and spaces) from
// rng: distinct for distinct rng streams from the first word on.
func text(rng *rand.Rand, n int) string {
	var sb strings.Builder
	sb.Grow(n)
	for sb.Len() < n {
		wl := 2 + rng.IntN(8)
		for j := 0; j < wl && sb.Len() < n; j++ {
			sb.WriteByte(byte('a' + rng.IntN(26)))
		}
		if sb.Len() < n {
			sb.WriteByte(' ')
		}
	}
	return sb.String()
}
