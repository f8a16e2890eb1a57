package reqview

import (
	"bytes"
	"encoding/binary"
	"math/bits"
)

// This file holds the structural JSON scanner the package walks request and
// response bodies with.
//
// Design: one pass both validates and walks (docs/design.md §7). Strings are
// delimited in registers (short ones) or 64 bytes a step (strEndBlocks), never
// byte by byte, and not validated (see Parse, "Validation") — except the
// strings the router interprets (keys via objIter, ids, roles, types, names
// via idAt), whose content is checked with badAt; the structure is checked
// by the iterators (commas, colons, closers) and by skipValue, which skips a
// value the router does not need while checking its grammar as sonic's
// validator does, iteratively (no recursion, so no stack growth on deep
// nesting), with the nesting bound passed down as depths.
//
// Every function here is total on arbitrary input: indexes are bounds-checked
// and a structural surprise yields -1 instead of a panic, because the fuzz
// tests also run the scanner on unvalidated bytes.

func isWS(c byte) bool { return c <= ' ' && (c == ' ' || c == '\t' || c == '\n' || c == '\r') }

// skipWS returns the index of the first non-whitespace byte at or after i.
func skipWS(b []byte, i int) int {
	for uint(i) < uint(len(b)) && b[i] <= ' ' && isWS(b[i]) {
		i++
	}
	return i
}

// strEnd returns the index of the closing quote of the string whose content
// starts at i (the byte after the opening quote, not escaped), or -1 when
// the string is unterminated. It only delimits: the content is not validated
// (see Parse, "Validation"; badAt checks the strings the router interprets).
//
// A quote is escaped iff it is preceded by an odd run of backslashes: escape
// sequences never end in a backslash except `\\`, so the run pairs up from its
// first byte. A quote in the first 16 bytes with no backslash before it is
// found in registers (keys, ids, short values); longer strings go 64 bytes
// a step through strEndBlocks (AVX2: escapes are resolved with bit masks,
// so a string dense in escaped quotes costs no more than plain text), and the
// last bytes of the body, or every string where AVX2 is missing, through
// strEndSWAR.
func strEnd(b []byte, i int) int {
	if i < 0 || i > len(b) {
		return -1
	}
	for n, j := 0, i; n < 2 && j+8 <= len(b); n, j = n+1, j+8 {
		x := binary.LittleEndian.Uint64(b[j:])
		q, e := x^(lsb*'"'), x^bsl
		// The lowest flag is exact (see special): a quote before any
		// backslash ends the string.
		if m := ((q-lsb)&^q | (e-lsb)&^e) & msb; m != 0 {
			if k := j + bits.TrailingZeros64(m)>>3; b[k] == '"' {
				return k
			}
			break
		}
	}
	if hasBlocks && i+64 <= len(b) {
		end, next, esc := strEndBlocks(b, i)
		if end >= 0 {
			return end
		}
		i = next + esc
		if i > len(b) {
			return -1
		}
	}
	return strEndSWAR(b, i)
}

// strEndSWAR is strEnd without vector instructions: the first 16 bytes of
// each hop are searched 8 at a time in registers (the short hops between the
// escaped quotes of JSON-in-a-string text), longer spans with
// bytes.IndexByte, and a quote found is checked by counting the backslashes
// before it, back to i at most (i itself is not escaped), so the total work
// stays linear.
func strEndSWAR(b []byte, i int) int {
	start := i
	for {
		j := -1
		for n := 0; n < 2 && i+8 <= len(b); n++ {
			x := binary.LittleEndian.Uint64(b[i:]) ^ (lsb * '"')
			if m := (x - lsb) & ^x & msb; m != 0 {
				// Borrows only flag bytes above a real hit: the lowest
				// flag is exact.
				j = i + bits.TrailingZeros64(m)>>3
				break
			}
			i += 8
		}
		if j < 0 {
			j = bytes.IndexByte(b[i:], '"')
			if j < 0 {
				return -1
			}
			j += i
		}
		if j == start || b[j-1] != '\\' {
			return j
		}
		k := j - 1
		for k > start && b[k-1] == '\\' {
			k--
		}
		if (j-k)&1 == 0 {
			return j
		}
		i = j + 1
	}
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
	ctl = lsb * 0x20 // (x - ctl) &^ x & msb flags the bytes < 0x20
	bsl = lsb * '\\'
)

// special returns the index in s of the first control byte (< 0x20) or
// backslash, or -1. 32 bytes per step in registers: for each word a,
// (a-ctl)&^a flags the bytes < 0x20 and (e-lsb)&^e, e = a^bsl, the
// backslashes; a borrow can only flag bytes above a real hit, so the lowest
// flag of the word is exact.
func special(s []byte) int {
	i := 0
	for ; i+32 <= len(s); i += 32 {
		a := binary.LittleEndian.Uint64(s[i:])
		b := binary.LittleEndian.Uint64(s[i+8:])
		c := binary.LittleEndian.Uint64(s[i+16:])
		d := binary.LittleEndian.Uint64(s[i+24:])
		ea, eb, ec, ed := a^bsl, b^bsl, c^bsl, d^bsl
		ma := ((a-ctl)&^a | (ea-lsb)&^ea) & msb
		mb := ((b-ctl)&^b | (eb-lsb)&^eb) & msb
		mc := ((c-ctl)&^c | (ec-lsb)&^ec) & msb
		md := ((d-ctl)&^d | (ed-lsb)&^ed) & msb
		if ma|mb|mc|md != 0 {
			switch {
			case ma != 0:
				return i + bits.TrailingZeros64(ma)>>3
			case mb != 0:
				return i + 8 + bits.TrailingZeros64(mb)>>3
			case mc != 0:
				return i + 16 + bits.TrailingZeros64(mc)>>3
			}
			return i + 24 + bits.TrailingZeros64(md)>>3
		}
	}
	for ; i+8 <= len(s); i += 8 {
		a := binary.LittleEndian.Uint64(s[i:])
		e := a ^ bsl
		if m := ((a-ctl)&^a | (e-lsb)&^e) & msb; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '\\' {
			return i
		}
	}
	return -1
}

// badAt returns the index of the first byte of s that makes it invalid JSON
// string content — a raw control byte (< 0x20), or the backslash of an
// invalid or truncated escape — or -1 when s is valid. sonic's structural
// validator does not look inside strings; the scanner calls this on the
// strings the router interprets (keys, ids, roles, types, names), not on
// content (see Parse, "Validation").
func badAt(s []byte) int {
	off := 0
	for {
		k := special(s)
		if k < 0 {
			return -1
		}
		if s[k] != '\\' || k+1 >= len(s) {
			return off + k
		}
		n := 2
		switch s[k+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			if k+6 > len(s) {
				return off + k
			}
			for _, h := range s[k+2 : k+6] {
				if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
					return off + k
				}
			}
			n = 6
		default:
			return off + k
		}
		s = s[k+n:]
		off += k + n
	}
}

// validStr reports whether s is valid JSON string content: no raw control
// byte and only valid escapes (see badAt).
func validStr(s []byte) bool { return badAt(s) < 0 }

// markBad records that the byte at off makes the body malformed: *bad holds
// the smallest such offset plus one (0: none), so a zero Learned or View
// needs no set-up.
func markBad(bad *int, off int) {
	if *bad == 0 || off+1 < *bad {
		*bad = off + 1
	}
}

// maxDepth is the deepest nesting of arrays and objects Parse accepts, as
// sonic's validator (the top-level object is at depth 1).
const maxDepth = 4096

// skipValue returns the index just after the JSON value starting at i, or -1
// when it is not a valid JSON value (or nests arrays and objects deeper than
// maxDepth; depth is that of the container the value sits in, 0 on input
// already validated). Validation is sonic's: structure, literals and number
// grammar; strings (keys included) are only delimited.
func skipValue(b []byte, i, depth int) int {
	if i < 0 || i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		e := strEnd(b, i+1)
		if e < 0 {
			return -1
		}
		return e + 1
	case '{', '[':
		return skipContainer(b, i, depth)
	}
	return scalarEnd(b, i)
}

// skipContainer is skipValue for an array or object at i: one loop over its
// members, the kinds of the open containers kept as bits (no recursion, so a
// deep nest costs no stack).
func skipContainer(b []byte, i, depth int) int {
	var objs [maxDepth / 64]uint64 // bit n: the container n levels in is an object
	n := 0                         // open containers
	budget := maxDepth - depth
	obj := false
	for {
		// b[i] opens a container.
		if n >= budget || n >= maxDepth {
			return -1
		}
		obj = b[i] == '{'
		if obj {
			objs[n>>6] |= 1 << (n & 63)
		} else {
			objs[n>>6] &^= 1 << (n & 63)
		}
		n++
		if i = skipWS(b, i+1); i >= len(b) {
			return -1
		}
		if c := b[i]; c == '}' && obj || c == ']' && !obj {
			i++
			goto closed
		}
	member:
		if obj {
			if b[i] != '"' {
				return -1
			}
			e := strEnd(b, i+1)
			if e < 0 {
				return -1
			}
			if i = skipWS(b, e+1); i >= len(b) || b[i] != ':' {
				return -1
			}
			if i = skipWS(b, i+1); i >= len(b) {
				return -1
			}
		}
		switch b[i] {
		case '{', '[':
			continue
		case '"':
			e := strEnd(b, i+1)
			if e < 0 {
				return -1
			}
			i = e + 1
		default:
			if i = scalarEnd(b, i); i < 0 {
				return -1
			}
		}
	after:
		// A value of the innermost open container ended at i.
		if i = skipWS(b, i); i >= len(b) {
			return -1
		}
		switch c := b[i]; {
		case c == ',':
			if i = skipWS(b, i+1); i >= len(b) {
				return -1
			}
			goto member
		case c == '}' && obj || c == ']' && !obj:
			i++
		default:
			return -1
		}
	closed:
		if n--; n == 0 {
			return i
		}
		obj = objs[(n-1)>>6]&(1<<((n-1)&63)) != 0
		goto after
	}
}

// scalarEnd returns the index after the literal (true, false, null) or the
// number at i, or -1. What follows is the caller's to check.
func scalarEnd(b []byte, i int) int {
	if i < 0 || i >= len(b) {
		return -1
	}
	switch b[i] {
	case 't':
		if len(b)-i >= 4 && string(b[i:i+4]) == "true" {
			return i + 4
		}
		return -1
	case 'f':
		if len(b)-i >= 5 && string(b[i:i+5]) == "false" {
			return i + 5
		}
		return -1
	case 'n':
		if len(b)-i >= 4 && string(b[i:i+4]) == "null" {
			return i + 4
		}
		return -1
	}
	// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
	if b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return -1
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

// digits returns the index of the first non-digit at or after i.
func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// strAt returns the raw (escaped) content of the string value at i and the
// index after its closing quote; ok is false when the value at i is not a
// string (or is unterminated). The content is not validated: use it for
// content the router only forwards or hashes.
func strAt(b []byte, i int) (s []byte, end int, ok bool) {
	if i < 0 || i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	e := contentEnd(b, i+1)
	if e < 0 {
		return nil, 0, false
	}
	return b[i+1 : e], e + 1, true
}

// contentEnd is strEnd for a content string (text, arguments), typically
// long: with AVX2 and a whole block left it goes to the 64-byte blocks at
// once, without strEnd's 16-byte register prelude for keys and ids.
func contentEnd(b []byte, i int) int {
	if hasBlocks && i >= 0 && i+64 <= len(b) {
		end, next, esc := strEndBlocks(b, i)
		if end >= 0 {
			return end
		}
		if i = next + esc; i > len(b) {
			return -1
		}
		return strEndSWAR(b, i)
	}
	return strEnd(b, i)
}

// idAt is strAt for a string the router interprets (a model, an id, a role,
// a type, a name): when its content is not valid JSON string content, the
// offset of the first offending byte is recorded in *bad (see markBad) and
// the caller's Parse or ScanResponse fails. The value is returned all the
// same, so the walk goes on unchanged.
func idAt(b []byte, i int, bad *int) (s []byte, end int, ok bool) {
	if i < 0 || i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	e := plainEnd8(b, i+1)
	if e < 0 {
		e = plainEnd(b, plainFrom(b, i+1))
	}
	if e >= len(b) || b[e] != '"' {
		// A backslash or a control byte (or the end): the general path.
		if e = strEnd(b, i+1); e < 0 {
			return nil, 0, false
		}
		if k := badAt(b[i+1 : e]); k >= 0 {
			markBad(bad, i+1+k)
		}
	}
	return b[i+1 : e], e + 1, true
}

// valueSet is the values an interpreted string is expected to hold (roles,
// types), each as the bytes `"value"`: idIn matches them as objIter.step
// matches a keySet, so the index after the string is a constant of the entry.
func valueSet(values ...string) keySet { return newWordSet(`"`, values) }

// idIn is idAt for a string that is usually one of the values of ws.
func idIn(b []byte, i int, ws keySet, bad *int) (s []byte, end int, ok bool) {
	if e := wordEnd(b, i, ws); e > 0 {
		return b[i+1 : e-1], e, true
	}
	return idAt(b, i, bad)
}

// wordEnd returns the index after the string at i when it is one of the
// values of ws, else 0.
func wordEnd(b []byte, i int, ws keySet) int {
	if i >= 0 && i+16 <= len(b) {
		w0 := binary.LittleEndian.Uint64(b[i:])
		w1 := binary.LittleEndian.Uint64(b[i+8:])
		for k := range ws {
			p := &ws[k]
			if w0&p.m0 == p.w0 && w1&p.m1 == p.w1 {
				return i + p.n
			}
		}
	}
	return 0
}

// plainEnd returns the index of the first quote, backslash or control byte
// at or after i, or len(b) when there is none: on a short plain string (a
// key, an id) the closing quote, found and the content checked in one pass,
// 8 bytes at a time in registers. The lowest flag of a word is exact (see
// special).
func plainEnd(b []byte, i int) int {
	if i < 0 {
		return len(b)
	}
	for ; i+8 <= len(b); i += 8 {
		a := binary.LittleEndian.Uint64(b[i:])
		e, q := a^bsl, a^(lsb*'"')
		if m := ((a-ctl)&^a | (e-lsb)&^e | (q-lsb)&^q) & msb; m != 0 {
			return i + bits.TrailingZeros64(m)>>3
		}
	}
	for ; i < len(b); i++ {
		if c := b[i]; c < 0x20 || c == '\\' || c == '"' {
			return i
		}
	}
	return len(b)
}

// plainEnd8 is plainEnd on the 8 bytes at i only (small enough to be
// inlined: most keys and ids end there); -1 when none of them is a quote,
// backslash or control byte, or fewer than 8 are left.
func plainEnd8(b []byte, i int) int {
	if i < 0 || i+8 > len(b) {
		return -1
	}
	a := binary.LittleEndian.Uint64(b[i:])
	e, q := a^bsl, a^(lsb*'"')
	if m := ((a-ctl)&^a | (e-lsb)&^e | (q-lsb)&^q) & msb; m != 0 {
		return i + bits.TrailingZeros64(m)>>3
	}
	return -1
}

// plainFrom is where plainEnd resumes after plainEnd8(b, i) found nothing:
// past the 8 plain bytes it checked, or at i when fewer were left.
func plainFrom(b []byte, i int) int {
	if i+8 <= len(b) {
		return i + 8
	}
	return i
}

// isByte reports whether b[i] == c, with bounds checking.
func isByte(b []byte, i int, c byte) bool { return i >= 0 && i < len(b) && b[i] == c }

// objIter walks the members of one object. Usage:
//
//	var it objIter
//	it.init(b, i, &bad, depth) // b[i] == '{'; bad: see markBad; depth: its nesting depth
//	for it.next() {
//		// it.name() is the (unescaped) key, it.val the index of the value
//		it.i = end of the value (or it.skip())
//	}
//	if it.i < 0 { malformed }
//	// it.i is the index after '}'
//
// Keys are interpreted (matched), so they are validated: an invalid key is
// recorded in *bad and matches nothing. A walk that expects known keys sets
// it.keys (see keySet) before the first step and switches on it.id, the
// key's index in the set (-1: another key, then read with it.name()).
type objIter struct {
	b     []byte
	i     int
	val   int
	first bool
	bad   *int
	depth int    // of this object: 1 for the body (0: input already validated)
	key   []byte // raw key; when it has escapes, the decoded key is kbuf[:kn]
	kn    int    // -1: key has no escapes
	keys  keySet // the keys the walk expects, if any (see keySet)
	id    int    // the current key's index in keys; -1: none of them
	kbuf  [32]byte
}

// keySet is the keys an object walk expects (a chat message: role,
// content, tool_calls, …), each as the bytes `"key":` matched by two masked
// 8-byte compares at the opening quote. Found that way, a key's end and its
// value's index are the quote's index plus the entry's constant n: the
// processor goes on to the value on the predicted branch instead of waiting
// for the key's end to be computed from its bytes (plainEnd8), which is what
// a walk's time is made of (see objIter.step). Only compact JSON matches (the
// value must follow the colon); anything else takes the general path. A key
// of the set needs no validation (its bytes are the entry's) nor unescaping.
type keySet []keyWord

type keyWord struct {
	w0, m0, w1, m1 uint64
	n              int // len(`"key":`)
	name           []byte
}

// find returns the index of name in ks, or -1.
func (ks keySet) find(name []byte) int {
	for k := range ks {
		if string(ks[k].name) == string(name) {
			return k
		}
	}
	return -1
}

// newKeySet returns the set of keys, in the order they are tried (most
// frequent first). Keys longer than 13 bytes do not fit the two words.
func newKeySet(keys ...string) keySet { return newWordSet(`":`, keys) }

// newWordSet is newKeySet for the words `"w` + end.
func newWordSet(end string, words []string) keySet {
	ks := make(keySet, len(words))
	for k, key := range words {
		p := `"` + key + end
		if len(p) > 16 {
			panic("reqview: key too long for keySet: " + key)
		}
		var buf, mask [16]byte
		copy(buf[:], p)
		for j := range p {
			mask[j] = 0xff
		}
		ks[k] = keyWord{
			w0: binary.LittleEndian.Uint64(buf[:]), m0: binary.LittleEndian.Uint64(mask[:]),
			w1: binary.LittleEndian.Uint64(buf[8:]), m1: binary.LittleEndian.Uint64(mask[8:]),
			n: len(p), name: []byte(key),
		}
	}
	return ks
}

// name returns the current key, unescaped. Valid until the next call of next.
func (it *objIter) name() []byte {
	if it.id >= 0 {
		return it.keys[it.id].name
	}
	if it.kn >= 0 {
		return it.kbuf[:it.kn]
	}
	return it.key
}

// init returns it.i: the position to step from (see step), -1 when b[i]
// is not '{'.
func (it *objIter) init(b []byte, i int, bad *int, depth int) int {
	it.b = b
	it.bad = bad
	it.depth = depth
	it.first = true
	it.id = -1
	if !isByte(b, i, '{') {
		i = -2
	}
	it.i = i + 1
	return i + 1
}

// advance moves from i (inside a container closed by end) to the start of
// its next member or element, past whitespace and the separating comma. It
// returns that index and true, or false with the index after the closing
// byte, or -1 when the container is malformed.
func advance(b []byte, i int, first *bool, end byte) (int, bool) {
	i = skipWS(b, i)
	if i < 0 || i >= len(b) {
		return -1, false
	}
	if b[i] == end {
		return i + 1, false
	}
	if !*first {
		if b[i] != ',' {
			return -1, false
		}
		if i = skipWS(b, i+1); i >= len(b) {
			return -1, false
		}
	}
	*first = false
	return i, true
}

func (it *objIter) next() bool {
	_, ok := it.step(it.i)
	return ok
}

// step is next from i, the index after the previous member's value (or
// it.i as init left it). It returns the index of the member's value (it.val)
// and true, or, when there is none, the index after the object (-1 when it
// is malformed; it.i is set to it too) and false. A hot loop keeps the
// positions in locals,
//
//	i, ok := it.step(it.i)
//	for ; ok; i, ok = it.step(end) { … }
//	// i: the index after the object, or -1
//
// which spares the processor a store and a reload (of it.i, of it.val) on
// the path from one member to the next: that path, each position computed
// from the bytes at the previous one, is what a walk's time is made of.
func (it *objIter) step(i int) (int, bool) {
	b := it.b
	if i >= 0 && i+1 < len(b) && b[i] == ',' && b[i+1] == '"' && !it.first {
		i++ // compact JSON: `,"` — advance's work in two compares
	} else if uint(i) < uint(len(b)) && b[i] == '"' && it.first {
		it.first = false // compact JSON: `{"`
	} else if uint(i) < uint(len(b)) && b[i] == '}' {
		it.i = i + 1 // the object closes right after the value (or at once)
		return i + 1, false
	} else {
		var ok bool
		if i, ok = advance(b, i, &it.first, '}'); !ok {
			it.i = i
			return i, false
		}
	}
	if it.keys != nil && i+16 <= len(b) {
		// A key of the set in compact JSON: matched by two word compares,
		// so the value's index is i plus a constant of the entry, not a
		// result of the bytes (see keySet).
		w0 := binary.LittleEndian.Uint64(b[i:])
		w1 := binary.LittleEndian.Uint64(b[i+8:])
		for k := range it.keys {
			p := &it.keys[k]
			if w0&p.m0 == p.w0 && w1&p.m1 == p.w1 {
				if j := i + p.n; j < len(b) && b[j] > ' ' {
					it.id = k
					it.val, it.i = j, j
					return j, true
				}
				break
			}
		}
	}
	if !isByte(b, i, '"') {
		it.i = -1
		return -1, false
	}
	it.kn = -1
	e := plainEnd8(b, i+1)
	if e < 0 {
		e = plainEnd(b, plainFrom(b, i+1))
	}
	if e >= len(b) || b[e] != '"' {
		// A backslash or a control byte (or the end): the general path.
		if e = strEnd(b, i+1); e < 0 {
			it.i = -1
			return -1, false
		}
		key := b[i+1 : e]
		if k := badAt(key); k >= 0 {
			markBad(it.bad, i+1+k)
			it.kbuf[0] = '\\'
			it.kn = 1 // matches nothing
		} else if bytes.IndexByte(key, '\\') >= 0 {
			it.kn = unescapeKey(&it.kbuf, key)
		}
	}
	it.key = b[i+1 : e]
	it.id = -1
	if it.keys != nil {
		it.id = it.keys.find(it.name())
	}
	if i = e + 1; uint(i+1) < uint(len(b)) && b[i] == ':' && b[i+1] > ' ' {
		i++ // compact JSON: `":` then the value
	} else {
		i = skipWS(b, i)
		if !isByte(b, i, ':') {
			it.i = -1
			return -1, false
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			it.i = -1
			return -1, false
		}
	}
	it.val = i
	it.i = i
	return i, true
}

// skip moves past the current value; use when the member is not handled.
func (it *objIter) skip() { it.i = skipValue(it.b, it.val, it.depth) }

// arrIter walks the elements of one array, like objIter.
type arrIter struct {
	b     []byte
	i     int
	val   int
	first bool
	depth int
}

// init returns it.i, as objIter.init.
func (it *arrIter) init(b []byte, i int, depth int) int {
	it.b = b
	it.depth = depth
	it.first = true
	if !isByte(b, i, '[') {
		i = -2
	}
	it.i = i + 1
	return i + 1
}

func (it *arrIter) next() bool {
	_, ok := it.step(it.i)
	return ok
}

// step is next from i, the index after the previous element: it returns
// the element's index (it.val) and true, or the index after the array (-1
// when malformed) and false; see objIter.step.
func (it *arrIter) step(i int) (int, bool) {
	b := it.b
	if i >= 0 && i+1 < len(b) && b[i] == ',' && b[i+1] > ' ' && !it.first {
		// compact JSON: `,` then the element (advance's work in two
		// compares; a closer there fails the element's own walk).
		i++
		it.val, it.i = i, i
		return i, true
	}
	i, ok := advance(b, i, &it.first, ']')
	if !ok {
		it.i = i
		return i, false
	}
	it.val, it.i = i, i
	return i, true
}

// nextObject is next, skipping the elements that are not objects.
func (it *arrIter) nextObject() bool {
	for it.next() {
		if it.b[it.val] == '{' {
			return true
		}
		it.skip()
	}
	return false
}

func (it *arrIter) skip() { it.i = skipValue(it.b, it.val, it.depth) }

// unescapeKey decodes the escapes of an object key into dst and returns the
// decoded length. Keys are only compared against the package's short ASCII
// names, so a key that is malformed, decodes to non-ASCII or to more than
// len(dst) bytes yields a length whose dst[:n] matches none of them (a lone
// backslash).
func unescapeKey(dst *[32]byte, key []byte) int {
	const noMatch = 1
	n := 0
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == '\\' {
			if i+1 >= len(key) {
				break
			}
			i++
			switch key[i] {
			case '"', '\\', '/':
				c = key[i]
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'n':
				c = '\n'
			case 'r':
				c = '\r'
			case 't':
				c = '\t'
			case 'u':
				if i+4 >= len(key) {
					dst[0] = '\\'
					return noMatch
				}
				r := 0
				for _, h := range key[i+1 : i+5] {
					r <<= 4
					switch {
					case h >= '0' && h <= '9':
						r |= int(h - '0')
					case h >= 'a' && h <= 'f':
						r |= int(h-'a') + 10
					case h >= 'A' && h <= 'F':
						r |= int(h-'A') + 10
					default:
						dst[0] = '\\'
						return noMatch
					}
				}
				if r >= 0x80 {
					dst[0] = '\\'
					return noMatch
				}
				c = byte(r)
				i += 4
			default:
				dst[0] = '\\'
				return noMatch
			}
		}
		if n == len(dst) {
			dst[0] = '\\'
			return noMatch
		}
		dst[n] = c
		n++
	}
	return n
}

// parseUint parses a non-negative JSON integer at b[i:]; ok is false for
// anything else (negative, fraction, exponent, overflow, not a number).
func parseUint(b []byte, i int) (n int, ok bool) {
	if i < 0 || i >= len(b) {
		return 0, false
	}
	j := i
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		if j-i >= 18 {
			return 0, false
		}
		n = n*10 + int(b[j]-'0')
		j++
	}
	if j == i {
		return 0, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0, false
	}
	return n, true
}
