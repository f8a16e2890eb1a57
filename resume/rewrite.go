package resume

import (
	"strconv"

	"github.com/warmroute/warmroute/reqview"
)

// patch replaces data[at.Start:at.End] with with.
type patch struct {
	at   reqview.Span
	with []byte
}

// Rewrite appends to dst the event of a continuation as the client is to
// see it — nothing, when the client must not see it — and follows it. An
// OpenAI chunk carries the first attempt's id, created, model and
// system_fingerprint, no second role, and usage that counts the tokens
// delivered before; an Anthropic stream keeps one message_start, and its
// content-block indices go on from the client's.
func (a *Answer) Rewrite(dst, event []byte) []byte {
	data, at := payload(event)
	switch {
	case data == nil:
		return append(dst, event...)
	case string(data) == "[DONE]":
		a.ended = true
		return append(dst, event...)
	case !reqview.ScanStreamEvent(&a.ev, data):
		a.NotContinuable("an event is not JSON")
		return append(dst, event...)
	}
	var ps [6]patch
	var n int
	var keep bool
	if a.api == Messages {
		n, keep = a.messagesPatches(&ps, data)
	} else {
		n, keep = a.chunkPatches(&ps, data)
	}
	if !keep {
		return dst
	}
	// The patches are in data's order: the top-level ones come in the
	// order the chunk has them, so sort the few there are.
	p := ps[:n]
	for i := 1; i < len(p); i++ {
		for j := i; j > 0 && p[j].at.Start < p[j-1].at.Start; j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
	dst = append(dst, event[:at]...)
	from := 0
	for _, q := range p {
		dst = append(dst, data[from:q.at.Start]...)
		dst = append(dst, q.with...)
		from = q.at.End
	}
	dst = append(dst, data[from:]...)
	return append(dst, event[at+len(data):]...)
}

// chunkPatches lists the patches of an OpenAI chunk of a continuation, or
// keep false when the client must not see it (the role the first attempt
// already sent, with nothing else).
func (a *Answer) chunkPatches(ps *[6]patch, data []byte) (n int, keep bool) {
	e := &a.ev
	if a.role && e.Role.Has() && e.Text.End == e.Text.Start && !e.Finished && !e.Usage.Has() && !e.Opaque {
		return 0, false
	}
	add := func(at reqview.Span, with []byte) {
		if at.Has() && len(with) > 0 {
			ps[n] = patch{at, with}
			n++
		}
	}
	add(e.ID, a.id)
	add(e.Created, a.created)
	add(e.Model, a.model)
	add(e.Fingerprint, a.fingerprint)
	if e.Role.Has() && a.role {
		ps[n] = patch{at: withComma(data, e.Role)}
		n++
	}
	a.learn(data)
	if e.Usage.Has() {
		ps[n] = patch{e.Usage, a.usage(data, e.Usage)}
		n++
	}
	return n, true
}

// withComma widens a member's span to the comma that separates it from
// the next member, else from the one before.
func withComma(data []byte, s reqview.Span) reqview.Span {
	if s.End < len(data) && data[s.End] == ',' {
		return reqview.Span{Start: s.Start, End: s.End + 1}
	}
	for i := s.Start - 1; i >= 0; i-- {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			continue
		case ',':
			return reqview.Span{Start: i, End: s.End}
		}
		break
	}
	return s
}

// usage renders the usage of the whole answer from a continuation's: the
// prompt of the first attempt (its prompt less what was delivered, when
// the first attempt sent none), the completion tokens of all of them, and
// the cached prompt tokens the continuation reported (its cache hit on the
// history, as the first attempt's is unknown), at most that prompt.
func (a *Answer) usage(data []byte, s reqview.Span) []byte {
	in, out := a.ev.UsageTokens(data)
	completion := a.before + max(out, 0)
	prompt := a.prompt
	if prompt < 0 {
		prompt = max(in-a.before, 0)
	}
	b := a.buf[:0]
	if a.api == Messages {
		b = append(b, `{"output_tokens":`...)
		b = strconv.AppendInt(b, int64(completion), 10)
	} else {
		b = append(b, `{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(prompt), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(prompt+completion), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(completion), 10)
		if cached := a.ev.UsageCached(data); cached >= 0 {
			b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
			b = strconv.AppendInt(b, int64(min(cached, prompt)), 10)
			b = append(b, '}')
		}
	}
	a.buf = append(b, '}')
	return a.buf
}

// messagesPatches lists the patches of an Anthropic event of a
// continuation, or keep false for one the client must not see (its
// message_start; the start of a block that continues the open one).
func (a *Answer) messagesPatches(ps *[6]patch, data []byte) (n int, keep bool) {
	e := &a.ev
	typ := string(data[e.Type.Start:e.Type.End])
	if typ == "message_start" {
		if a.role {
			return 0, false
		}
		a.role = true // the cut came before the first attempt's
		return 0, true
	}
	j := a.index(data)
	if j < 0 {
		a.learn(data)
		if e.Usage.Has() {
			ps[0] = patch{e.Usage, a.usage(data, e.Usage)}
			return 1, true
		}
		return 0, true
	}
	mapped := a.blockOff + j
	a.learnText(data)
	if typ == "content_block_start" && j == 0 && a.joinOpen {
		return 0, false
	}
	a.learnBlocks(data, mapped)
	ps[0] = patch{e.Index, strconv.AppendInt(a.buf[:0], int64(mapped), 10)}
	a.buf = ps[0].with
	return 1, true
}
