package reqview

import "bytes"

// DefaultMaxSSELine bounds one buffered SSE line; a longer line is dropped.
const DefaultMaxSSELine = 1 << 20

// SSEScanner learns from a streamed (text/event-stream) response fed in
// arbitrary chunks. It is line based: each complete "data:" line whose
// payload is a JSON object is learned from (chat.completion.chunk events,
// Responses API events carrying a "response" object or an "item", Anthropic
// message_start, content_block_start and message_delta events), unless
// ScanResponse would reject it (then the whole event teaches nothing); "[DONE]",
// comments (":..."), "event:", "id:", "retry:" and blank lines are ignored.
// Lines end with "\n" or "\r\n" (a lone "\r" is not a line end here). A
// trailing line without its newline is kept until the next Write; at the end
// of a stream an unterminated line is discarded, as the SSE specification
// says. A line longer than MaxLine is dropped whole, however it was chunked,
// so learning does not depend on chunk boundaries.
//
// Lines complete inside one chunk are read in place; only a line split across
// chunks is copied. Not safe for concurrent use; Reset before reuse.
type SSEScanner struct {
	// MaxLine is the longest line kept; 0 means DefaultMaxSSELine.
	MaxLine int

	buf  []byte // the partial line so far
	drop bool   // the partial line went over MaxLine: discard until '\n'
}

// Reset clears s for a new stream, keeping its buffer's capacity.
func (s *SSEScanner) Reset() {
	s.buf = s.buf[:0]
	s.drop = false
}

// Write feeds the next chunk of the stream and learns into l. The chunk is
// not retained (what l keeps is copied).
func (s *SSEScanner) Write(chunk []byte, l *Learned) {
	max := s.MaxLine
	if max <= 0 {
		max = DefaultMaxSSELine
	}
	for len(chunk) > 0 {
		nl := bytes.IndexByte(chunk, '\n')
		if nl < 0 {
			if s.drop {
				return
			}
			if len(s.buf)+len(chunk) > max {
				s.buf = s.buf[:0]
				s.drop = true
				return
			}
			s.buf = append(s.buf, chunk...)
			return
		}
		line := chunk[:nl]
		chunk = chunk[nl+1:]
		if s.drop {
			s.drop = false
			continue
		}
		if len(s.buf) > 0 {
			if len(s.buf)+len(line) > max {
				s.buf = s.buf[:0]
				continue
			}
			s.buf = append(s.buf, line...)
			line = s.buf
		} else if len(line) > max {
			continue
		}
		learnLine(line, l)
		s.buf = s.buf[:0]
	}
}

func learnLine(line []byte, l *Learned) {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if len(line) < 5 || string(line[:5]) != "data:" {
		return
	}
	p := line[5:]
	i := skipWS(p, 0)
	if !isByte(p, i, '{') {
		return // "[DONE]" and anything not an object
	}
	if _, ok := TokenText(p[i:]); ok && (len(l.ResponseID) > 0 || bytes.HasPrefix(p[i:], []byte(`{"type":`))) {
		// One token of text teaches nothing: no id but the chunk's own,
		// learned from the first (an Anthropic delta has none), no tool
		// call, no usage. Nearly every event of a stream is one.
		return
	}
	l.learn(p, i, (*Learned).scanResponse) // an invalid event (or one with an invalid id or key) teaches nothing
}
