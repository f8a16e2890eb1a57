package reqview

// MaxPriority bounds View.Priority: a priority past it counts as
// ±MaxPriority. The router's queue keeps one band per priority waiting, so
// the bound also bounds the bands a client can make it walk.
const MaxPriority = 1000

// priority reads the top-level "priority" member whose value is at i: its
// value, and the member's span when its key is written plainly (a key with
// escapes, or a value that is not an integer, leaves the span unset: the
// member is then forwarded as sent).
func (v *View) priority(b []byte, i int) {
	v.Priority, v.PriorityStart, v.PriorityEnd = 0, -1, -1
	n, end, ok := integerAt(b, i)
	if !ok {
		return
	}
	v.Priority = n
	k := i - 1
	for k >= 0 && isWS(b[k]) {
		k--
	}
	if k < 0 || b[k] != ':' {
		return
	}
	k--
	for k >= 0 && isWS(b[k]) {
		k--
	}
	const key = `"priority"`
	if k+1 < len(key) || string(b[k+1-len(key):k+1]) != key {
		return
	}
	v.PriorityStart, v.PriorityEnd = k+1-len(key), end
}

// integerAt reads the JSON integer at i (an optional minus, digits, no
// fraction or exponent), clamped to ±MaxPriority, and the index after it.
func integerAt(b []byte, i int) (n, end int, ok bool) {
	neg := i < len(b) && b[i] == '-'
	j := i
	if neg {
		j++
	}
	start := j
	for ; j < len(b) && b[j] >= '0' && b[j] <= '9'; j++ {
		if n <= MaxPriority {
			n = n*10 + int(b[j]-'0')
		}
	}
	if j == start || j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0, 0, false
	}
	n = min(n, MaxPriority)
	if neg {
		n = -n
	}
	return n, j, true
}

// PriorityCut is the bytes of body to remove to drop its "priority"
// member: v's span, with the comma that joined it to a neighbour. v must be
// the view of body, with PriorityStart ≥ 0.
func (v *View) PriorityCut(body []byte) (start, end int) {
	s, e := v.PriorityStart, v.PriorityEnd
	j := e
	for j < len(body) && isWS(body[j]) {
		j++
	}
	if j < len(body) && body[j] == ',' { // a member follows: take its comma
		return s, j + 1
	}
	k := s - 1 // the last member: take the comma before it
	for k >= 0 && isWS(body[k]) {
		k--
	}
	if k >= 0 && body[k] == ',' {
		s = k
	}
	return s, e
}

// WithoutPriority appends body without its "priority" member to dst (see
// PriorityCut).
func (v *View) WithoutPriority(dst, body []byte) []byte {
	s, e := v.PriorityCut(body)
	dst = append(dst, body[:s]...)
	return append(dst, body[e:]...)
}

// PriorityAppend is where to add a "priority" member to body, an object
// the view parsed: at its closing brace, after a comma when lead (the
// object has members). ok false when body does not end in the brace.
func PriorityAppend(body []byte) (at int, lead, ok bool) {
	i := len(body) - 1
	for i >= 0 && isWS(body[i]) {
		i--
	}
	if i < 0 || body[i] != '}' {
		return 0, false, false
	}
	j := i - 1
	for j >= 0 && isWS(body[j]) {
		j--
	}
	return i, j >= 0 && body[j] != '{', true
}
