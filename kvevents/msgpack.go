package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// reader reads msgpack from a byte slice it never copies. Every length on
// the wire is checked against the bytes left before it is used, and skip is
// a loop, not a recursion, so no input makes it allocate or nest without
// bound (a general-purpose decoder sizes buffers from declared lengths and
// recurses into nested values).
type reader struct {
	b   []byte
	off int
}

type kind uint8

const (
	kNil kind = iota
	kBool
	kInt // negative
	kUint
	kFloat
	kStr
	kBin
	kArray
	kMap
	kExt
)

var kindNames = [...]string{"nil", "bool", "int", "uint", "float", "str", "bin", "array", "map", "ext"}

func (k kind) String() string { return kindNames[k] }

// head is one value's header: its kind and, for a number its value, for a
// string, bytes, array, map or extension its length (n).
type head struct {
	k kind
	n uint64
	i int64
	f float64
}

func (r *reader) left() uint64 { return uint64(len(r.b) - r.off) }

func (r *reader) take(n uint64) ([]byte, error) {
	if n > r.left() {
		return nil, malformed("truncated: %d bytes wanted, %d left", n, r.left())
	}
	b := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return b, nil
}

func (r *reader) uintN(size uint64) (uint64, error) {
	b, err := r.take(size)
	if err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

func (r *reader) head() (head, error) {
	if r.left() == 0 {
		return head{}, malformed("truncated")
	}
	c := r.b[r.off]
	r.off++
	switch {
	case c <= 0x7f:
		return head{k: kUint, n: uint64(c)}, nil
	case c >= 0xe0:
		return head{k: kInt, i: int64(int8(c))}, nil
	case c <= 0x8f:
		return head{k: kMap, n: uint64(c & 0x0f)}, nil
	case c <= 0x9f:
		return head{k: kArray, n: uint64(c & 0x0f)}, nil
	case c <= 0xbf:
		return head{k: kStr, n: uint64(c & 0x1f)}, nil
	}
	var (
		h    head
		size uint64
	)
	switch c {
	case 0xc0:
		return head{k: kNil}, nil
	case 0xc2, 0xc3:
		return head{k: kBool, n: uint64(c & 1)}, nil
	case 0xc4, 0xc5, 0xc6:
		h.k, size = kBin, 1<<(c-0xc4)
	case 0xc7, 0xc8, 0xc9:
		h.k, size = kExt, 1<<(c-0xc7)
	case 0xca:
		v, err := r.uintN(4)
		return head{k: kFloat, f: float64(math.Float32frombits(uint32(v)))}, err
	case 0xcb:
		v, err := r.uintN(8)
		return head{k: kFloat, f: math.Float64frombits(v)}, err
	case 0xcc, 0xcd, 0xce, 0xcf:
		v, err := r.uintN(1 << (c - 0xcc))
		return head{k: kUint, n: v}, err
	case 0xd0, 0xd1, 0xd2, 0xd3:
		v, err := r.uintN(1 << (c - 0xd0))
		var i int64
		switch c {
		case 0xd0:
			i = int64(int8(v))
		case 0xd1:
			i = int64(int16(v))
		case 0xd2:
			i = int64(int32(v))
		default:
			i = int64(v)
		}
		if i >= 0 {
			return head{k: kUint, n: uint64(i)}, err
		}
		return head{k: kInt, i: i}, err
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return head{k: kExt, n: 1 << (c - 0xd4)}, nil
	case 0xd9, 0xda, 0xdb:
		h.k, size = kStr, 1<<(c-0xd9)
	case 0xdc, 0xdd:
		h.k, size = kArray, 2<<(c-0xdc)
	case 0xde, 0xdf:
		h.k, size = kMap, 2<<(c-0xde)
	default: // 0xc1, never used
		return head{}, malformed("byte 0x%02x", c)
	}
	n, err := r.uintN(size)
	h.n = n
	return h, err
}

// skip passes over one value, nested ones included, without recursing.
func (r *reader) skip() error {
	for pending := uint64(1); pending > 0; pending-- {
		h, err := r.head()
		if err != nil {
			return err
		}
		switch h.k {
		case kStr, kBin:
			_, err = r.take(h.n)
		case kExt:
			_, err = r.take(h.n + 1)
		case kArray:
			pending += h.n
		case kMap:
			pending += 2 * h.n
		}
		if err != nil {
			return err
		}
		// Each value still to come takes a byte at least.
		if pending-1 > r.left() {
			return malformed("truncated: %d values announced, %d bytes left", pending-1, r.left())
		}
	}
	return nil
}

// arrayLen reads an array's header, its length at most max and no more
// than the bytes left (each element takes one at least).
func (r *reader) arrayLen(max int, what string) (int, error) {
	h, err := r.head()
	if err != nil {
		return 0, err
	}
	if h.k != kArray {
		return 0, malformed("%s is a %v", what, h.k)
	}
	if h.n > uint64(max) {
		return 0, fmt.Errorf("%w: %d %s", ErrTooLarge, h.n, what)
	}
	if h.n > r.left() {
		return 0, malformed("truncated: %d %s announced, %d bytes left", h.n, what, r.left())
	}
	return int(h.n), nil
}

func (r *reader) str() ([]byte, error) {
	h, err := r.head()
	if err != nil {
		return nil, err
	}
	if h.k != kStr {
		return nil, malformed("want a string, got a %v", h.k)
	}
	if h.n > maxString {
		return nil, malformed("string of %d bytes", h.n)
	}
	return r.take(h.n)
}

// nilNext consumes a nil and says so; anything else is left to be read.
func (r *reader) nilNext() (bool, error) {
	if r.left() == 0 {
		return false, malformed("truncated")
	}
	if r.b[r.off] == 0xc0 {
		r.off++
		return true, nil
	}
	return false, nil
}

// optStr reads a string or nil (""). The usual media are not allocated.
func (r *reader) optStr() (string, error) {
	if isNil, err := r.nilNext(); isNil || err != nil {
		return "", err
	}
	b, err := r.str()
	if err != nil {
		return "", err
	}
	switch string(b) {
	case "GPU":
		return "GPU", nil
	case "CPU":
		return "CPU", nil
	}
	return string(b), nil
}

func (r *reader) int() (int64, error) {
	h, err := r.head()
	if err != nil {
		return 0, err
	}
	switch h.k {
	case kUint:
		if h.n > math.MaxInt64 {
			return 0, malformed("integer %d", h.n)
		}
		return int64(h.n), nil
	case kInt:
		return h.i, nil
	}
	return 0, malformed("want an integer, got a %v", h.k)
}

// optIndex reads a non-negative integer that fits an int32, or nil (-1).
func (r *reader) optIndex() (int, error) {
	if isNil, err := r.nilNext(); isNil || err != nil {
		return -1, err
	}
	v, err := r.int()
	if err != nil {
		return -1, err
	}
	if v < 0 || v > math.MaxInt32 {
		return -1, malformed("index %d", v)
	}
	return int(v), nil
}

func (r *reader) float() (float64, error) {
	h, err := r.head()
	if err != nil {
		return 0, err
	}
	switch h.k {
	case kFloat:
		return h.f, nil
	case kUint:
		return float64(h.n), nil
	case kInt:
		return float64(h.i), nil
	}
	return 0, malformed("want a number, got a %v", h.k)
}
