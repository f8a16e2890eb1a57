// Package resume carries a streamed answer over a cut (docs/design.md
// §8.2): it follows the events a client was sent, says whether the answer
// can be continued on another worker, builds the continuation's request
// (the history plus the text delivered so far, which OpenAI-compatible
// engines continue), and rewrites the continuation's events so that the
// client sees one answer: one id, one role, one usage, one end.
package resume

import (
	"bytes"

	"github.com/warmroute/warmroute/reqview"
)

// API is the wire format of a stream.
type API uint8

const (
	Chat        API = iota // /v1/chat/completions
	Completions            // /v1/completions
	Messages               // Anthropic's /v1/messages
)

// Answer follows one streamed answer across its attempts. The zero value is
// not ready: call Reset. Not safe for concurrent use.
type Answer struct {
	api     API
	maxText int

	text   []byte // the text delivered so far, as raw JSON string content
	events int    // events that delivered text: a count of tokens that errs low
	why    string // not continuable: why; "" while it is
	ended  bool   // the stream's terminator passed

	// The first attempt's chunk values, which every chunk the client sees
	// carries (OpenAI).
	id, created, model, fingerprint []byte

	// Tokens: the latest usage the client was sent (-1: none), and the
	// counts at the start of the continuation now running.
	prompt, completion int
	before             int // completion tokens delivered before the running continuation
	contIn, contInSum  int // the running continuation's prompt tokens (-1: unreported), and the earlier ones'

	// Anthropic content blocks.
	blocks   int  // blocks started
	open     bool // the latest block is still open
	openAt   int  // its index
	blockOff int  // the running continuation's block j is the client's blockOff+j
	joinOpen bool // the continuation's block 0 continues the open block

	continuing bool // events come from a continuation
	role       bool // the client was sent the answer's role (OpenAI) or message_start (Anthropic)
	walked     int  // events of the first attempt walked whole
	ev         reqview.StreamEvent
	buf        []byte // a rewritten event, reused
}

// Reset makes a ready to follow a new answer of api, keeping at most
// maxText bytes of delivered text (beyond them it is not continuable).
func (a *Answer) Reset(api API, maxText int) {
	*a = Answer{api: api, maxText: maxText, text: a.text[:0], id: a.id[:0], created: a.created[:0],
		model: a.model[:0], fingerprint: a.fingerprint[:0], buf: a.buf[:0], prompt: -1, completion: -1, contIn: -1}
	if cap(a.text) > 64<<10 { // a pooled Answer keeps no long answer's buffer
		a.text = nil
	}
}

// Ended reports whether the stream's terminator ([DONE], message_stop) has
// passed: the answer is whole.
func (a *Answer) Ended() bool { return a.ended }

// Why returns why the answer cannot be continued, "" when it can.
func (a *Answer) Why() string { return a.why }

// Delivered returns the text delivered so far (raw JSON string content)
// and a count of its tokens that errs low.
func (a *Answer) Delivered() (text []byte, tokens int) {
	if a.completion > a.events {
		return a.text, a.completion
	}
	return a.text, a.events
}

// ContinuationPromptTokens is the prompt tokens the continuations
// reported: what continuing the answer cost.
func (a *Answer) ContinuationPromptTokens() int { return a.contInSum + max(a.contIn, 0) }

// NotContinuable marks the answer as one that cannot be continued.
func (a *Answer) NotContinuable(why string) {
	if a.why == "" {
		a.why = why
	}
}

// Continue starts the next continuation: the events that follow come from
// it and are rewritten (Rewrite).
func (a *Answer) Continue() {
	a.continuing = true
	a.contInSum += max(a.contIn, 0)
	a.contIn = -1
	_, a.before = a.Delivered()
	a.completion = -1
	a.joinOpen = a.api == Messages && a.open
	a.blockOff = a.blocks
	if a.joinOpen {
		a.blockOff = a.openAt
	}
}

// payload returns the data of an SSE event (its first "data:" line).
func payload(event []byte) (data []byte, at int) {
	for i := 0; i < len(event); {
		end := bytes.IndexByte(event[i:], '\n')
		if end < 0 {
			end = len(event)
		} else {
			end += i
		}
		line := event[i:end]
		if bytes.HasPrefix(line, []byte("data:")) {
			j := i + 5
			if j < end && event[j] == ' ' {
				j++
			}
			e := end
			if e > j && event[e-1] == '\r' {
				e--
			}
			return event[j:e], j
		}
		i = end + 1
	}
	return nil, -1
}

// Observe follows one whole SSE event of the first attempt, sent to the
// client as it is.
func (a *Answer) Observe(event []byte) {
	data, _ := payload(event)
	if data == nil {
		return
	}
	if string(data) == "[DONE]" {
		a.ended = true
		return
	}
	// The first events are walked whole: they carry the values the
	// client must see on every chunk (some only from the second).
	if t, ok := reqview.TokenText(data); ok && (a.walked >= 2 || a.api == Messages) {
		a.addText(data[t.Start:t.End]) // the common event, read without a walk
		return
	}
	if !reqview.ScanStreamEvent(&a.ev, data) {
		a.NotContinuable("an event is not JSON")
		return
	}
	a.walked++
	a.learn(data)
}

// learn follows the scanned event data, as the client sees it.
func (a *Answer) learn(data []byte) {
	a.learnText(data)
	e := &a.ev
	if a.api == Messages {
		a.learnBlocks(data, -1)
		return
	}
	if e.Role.Has() {
		a.role = true
	}
	// The values of the first chunk the client saw, whichever attempt
	// sent it (the first may have been cut before its first event).
	a.id = keep(a.id, data, e.ID)
	a.created = keep(a.created, data, e.Created)
	a.model = keep(a.model, data, e.Model)
	a.fingerprint = keep(a.fingerprint, data, e.Fingerprint)
}

// learnText follows what the scanned event delivers: its text, its
// usage, and whatever makes the answer one that cannot be continued.
func (a *Answer) learnText(data []byte) {
	e := &a.ev
	if e.Opaque {
		a.NotContinuable("it delivered a tool call, reasoning or logprobs")
	}
	if e.Finished {
		a.NotContinuable("its end was delivered") // only the usage and the terminator were left
	}
	a.addText(data[e.Text.Start:e.Text.End])
	if e.Usage.Has() {
		in, out := e.UsageTokens(data)
		switch {
		case in < 0:
		case a.continuing:
			a.contIn = in
		case a.prompt < 0:
			a.prompt = in
		}
		if out >= 0 {
			a.completion = a.before + out
		}
	}
}

// addText follows text delivered.
func (a *Answer) addText(t []byte) {
	if len(t) == 0 {
		return
	}
	a.events++
	if len(a.text)+len(t) > a.maxText {
		a.NotContinuable("its text is over --stream-resume-max-bytes")
	} else if a.why == "" {
		a.text = append(a.text, t...)
	}
}

// keep returns kept, or a copy of the value at s when none is kept yet.
func keep(kept, data []byte, s reqview.Span) []byte {
	if len(kept) > 0 || !s.Has() {
		return kept
	}
	return append(kept, data[s.Start:s.End]...)
}

// learnBlocks follows an Anthropic event's content blocks and its end;
// index is the block's index as the client sees it (-1: the event's own).
func (a *Answer) learnBlocks(data []byte, index int) {
	e := &a.ev
	switch string(data[e.Type.Start:e.Type.End]) {
	case "content_block_start":
		if index < 0 {
			index = a.index(data)
		}
		if index >= 0 {
			a.open, a.openAt = true, index
			a.blocks = max(a.blocks, index+1)
		}
	case "content_block_stop":
		a.open = false
	case "message_stop":
		a.ended = true
	case "message_start":
		a.role = true
	}
}

// index returns the scanned event's content-block index, -1 when it has none.
func (a *Answer) index(data []byte) int {
	s := a.ev.Index
	if !s.Has() || s.End-s.Start > 9 {
		return -1
	}
	n := 0
	for _, c := range data[s.Start:s.End] {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}
