package reqview

import (
	"bytes"
	"encoding/binary"
	"math/bits"
)

// This file holds the structural JSON scanner the package walks request and
// response bodies with.
//
// Design: the body has already been validated by sonic (SIMD, ~30 GB/s), so
// the scanner does not validate; it only has to find where things end. Strings
// are skipped with bytes.IndexByte (SIMD) plus a backslash-parity check, never
// byte by byte; containers are skipped by counting brackets outside strings,
// iteratively (no recursion, so no stack growth on deep nesting).
//
// Every function here is total on arbitrary input: indexes are bounds-checked
// and a structural surprise yields -1 instead of a panic, because the fuzz
// tests also run the scanner on unvalidated bytes.

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipWS returns the index of the first non-whitespace byte at or after i.
func skipWS(b []byte, i int) int {
	if i < 0 {
		return i
	}
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

// strEnd returns the index of the closing quote of the string whose content
// starts at i (the byte after the opening quote), or -1 when the string is
// unterminated or its content is not valid JSON (see validStr).
//
// A quote is escaped iff it is preceded by an odd run of backslashes: escape
// sequences never end in a backslash except `\\`, so the run pairs up from its
// first byte. Short strings (keys, ids) are searched 8 bytes at a time in
// registers; longer ones with bytes.IndexByte (SIMD). The backward count stops
// at the previous non-backslash byte, so the total work stays linear.
func strEnd(b []byte, i int) int {
	if i < 0 || i > len(b) {
		return -1
	}
	start := i
	for {
		j := -1
		// SWAR: up to 16 bytes without a call.
		for n := 0; n < 2 && i+8 <= len(b); n++ {
			x := binary.LittleEndian.Uint64(b[i:]) ^ (lsb * '"')
			if m := (x - lsb) & ^x & msb; m != 0 {
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
		k := j
		for k > start && b[k-1] == '\\' {
			k--
		}
		if (j-k)&1 == 0 {
			if !validStr(b[start:j]) {
				return -1
			}
			return j
		}
		i = j + 1
	}
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// validStr reports whether s is valid JSON string content: no raw control
// byte (< 0x20) and only valid escapes. sonic's structural validator does not
// check string contents, so the scanner does, on every string it meets (the
// walk meets every string of the body once). Backslashes are found with
// IndexByte; control bytes are searched 32 bytes per step in registers.
func validStr(s []byte) bool {
	for {
		k := bytes.IndexByte(s, '\\')
		seg := s
		if k >= 0 {
			seg = s[:k]
		}
		if hasCtl(seg) {
			return false
		}
		if k < 0 {
			return true
		}
		if k+1 >= len(s) {
			return false
		}
		switch s[k+1] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s = s[k+2:]
		case 'u':
			if k+6 > len(s) {
				return false
			}
			for _, h := range s[k+2 : k+6] {
				if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
					return false
				}
			}
			s = s[k+6:]
		default:
			return false
		}
	}
}

// hasCtl reports whether s has a byte < 0x20. (x - 0x20..) & ^x & 0x80.. is
// non-zero iff some byte of x is below 0x20 (bytes >= 0x80 have their top bit
// cleared by ^x).
func hasCtl(s []byte) bool {
	const k = lsb * 0x20
	for len(s) >= 32 {
		a := binary.LittleEndian.Uint64(s)
		b := binary.LittleEndian.Uint64(s[8:])
		c := binary.LittleEndian.Uint64(s[16:])
		d := binary.LittleEndian.Uint64(s[24:])
		if ((a-k)&^a|(b-k)&^b|(c-k)&^c|(d-k)&^d)&msb != 0 {
			return true
		}
		s = s[32:]
	}
	for len(s) >= 8 {
		a := binary.LittleEndian.Uint64(s)
		if (a-k)&^a&msb != 0 {
			return true
		}
		s = s[8:]
	}
	for _, c := range s {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// skipValue returns the index just after the JSON value starting at i, or -1.
func skipValue(b []byte, i int) int {
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
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				e := strEnd(b, i+1)
				if e < 0 {
					return -1
				}
				i = e + 1
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	default:
		for i < len(b) {
			c := b[i]
			if c == ',' || c == '}' || c == ']' || isWS(c) {
				break
			}
			i++
		}
		return i
	}
}

// strAt returns the raw (escaped) content of the string value at i and the
// index after its closing quote; ok is false when the value at i is not a
// string (or is unterminated).
func strAt(b []byte, i int) (s []byte, end int, ok bool) {
	if i < 0 || i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	e := strEnd(b, i+1)
	if e < 0 {
		return nil, 0, false
	}
	return b[i+1 : e], e + 1, true
}

// isByte reports whether b[i] == c, with bounds checking.
func isByte(b []byte, i int, c byte) bool { return i >= 0 && i < len(b) && b[i] == c }

// objIter walks the members of one object. Usage:
//
//	var it objIter
//	it.init(b, i) // b[i] == '{'
//	for it.next() {
//		// it.name() is the (unescaped) key, it.val the index of the value
//		it.i = end of the value (or it.skip())
//	}
//	if it.i < 0 { malformed }
//	// it.i is the index after '}'
type objIter struct {
	b     []byte
	i     int
	val   int
	first bool
	key   []byte // raw key; when it has escapes, the decoded key is kbuf[:kn]
	kn    int    // -1: key has no escapes
	kbuf  [32]byte
}

// name returns the current key, unescaped. Valid until the next call of next.
func (it *objIter) name() []byte {
	if it.kn >= 0 {
		return it.kbuf[:it.kn]
	}
	return it.key
}

func (it *objIter) init(b []byte, i int) {
	it.b = b
	it.first = true
	if !isByte(b, i, '{') {
		it.i = -1
		return
	}
	it.i = i + 1
}

func (it *objIter) next() bool {
	b := it.b
	i := skipWS(b, it.i)
	if i < 0 || i >= len(b) {
		it.i = -1
		return false
	}
	if b[i] == '}' {
		it.i = i + 1
		return false
	}
	if !it.first {
		if b[i] != ',' {
			it.i = -1
			return false
		}
		i = skipWS(b, i+1)
	}
	it.first = false
	if !isByte(b, i, '"') {
		it.i = -1
		return false
	}
	e := strEnd(b, i+1)
	if e < 0 {
		it.i = -1
		return false
	}
	it.key = b[i+1 : e]
	it.kn = -1
	if bytes.IndexByte(it.key, '\\') >= 0 {
		it.kn = unescapeKey(&it.kbuf, it.key)
	}
	i = skipWS(b, e+1)
	if !isByte(b, i, ':') {
		it.i = -1
		return false
	}
	i = skipWS(b, i+1)
	if i >= len(b) {
		it.i = -1
		return false
	}
	it.val = i
	it.i = i
	return true
}

// skip moves past the current value; use when the member is not handled.
func (it *objIter) skip() { it.i = skipValue(it.b, it.val) }

// arrIter walks the elements of one array, like objIter.
type arrIter struct {
	b     []byte
	i     int
	val   int
	first bool
}

func (it *arrIter) init(b []byte, i int) {
	it.b = b
	it.first = true
	if !isByte(b, i, '[') {
		it.i = -1
		return
	}
	it.i = i + 1
}

func (it *arrIter) next() bool {
	b := it.b
	i := skipWS(b, it.i)
	if i < 0 || i >= len(b) {
		it.i = -1
		return false
	}
	if b[i] == ']' {
		it.i = i + 1
		return false
	}
	if !it.first {
		if b[i] != ',' {
			it.i = -1
			return false
		}
		i = skipWS(b, i+1)
		if i >= len(b) {
			it.i = -1
			return false
		}
	}
	it.first = false
	it.val = i
	it.i = i
	return true
}

func (it *arrIter) skip() { it.i = skipValue(it.b, it.val) }

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
