package sharedstate

import (
	"encoding/binary"
	"math"
)

// MemoryRecord is the shared form of the model step's memory of one
// (logical model, session) (docs/design.md §5, §8.3): the plain values of
// sessionshard.MemoryState. Tool-call and response ids are not in it: they
// are hard locks with keys of their own. The store keeps the encoding
// opaque ([]byte); this codec is versioned so saar can evolve it.
//
// Encoding: a format byte (1), then fields as (uvarint tag, value). The
// tag's range fixes how its value is laid out, so a decoder skips tags it
// does not know: 1–31 a string (uvarint length, bytes), 32–63 a zig-zag
// varint, 64–95 eight bytes little endian (a float64). A new field takes a
// new tag; replicas of two releases then read each other's records,
// ignoring what they do not know.
//
// The first field is always the record's version, tag 95: LastAccess as
// eight bytes, at a fixed offset (memoryHeader) so that Redis compares two
// records without decoding them; the store writes a record only when it is
// not older than the stored one (docs/design.md §8.3, doc.go). Releases
// before it skip the tag.
type MemoryRecord struct {
	Model, Worker, Decision, Phase, Lock string

	Turns, Switches, TurnsOnModel                            int64
	LastAccess, LastEnd                                      int64 // unix ns
	LastHistoryChars, LastPromptTokens, LastCompletionTokens int64
	PromptTokensSeen, CachedTokensSeen                       int64

	Demand, DemandVar float64
}

const memoryFormat = 1

// memoryVersionTag leads every record: LastAccess, eight bytes little endian.
const memoryVersionTag = 95

// memoryHeader leads every record, before its version: memoryFormat, then
// memoryVersionTag as a one-byte uvarint.
const memoryHeader = "\x01\x5f"

func (r *MemoryRecord) strs() [5]*string {
	return [5]*string{&r.Model, &r.Worker, &r.Decision, &r.Phase, &r.Lock}
}

func (r *MemoryRecord) ints() [10]*int64 {
	return [10]*int64{&r.Turns, &r.Switches, &r.TurnsOnModel, &r.LastAccess, &r.LastEnd,
		&r.LastHistoryChars, &r.LastPromptTokens, &r.LastCompletionTokens,
		&r.PromptTokensSeen, &r.CachedTokensSeen}
}

func (r *MemoryRecord) floats() [2]*float64 { return [2]*float64{&r.Demand, &r.DemandVar} }

// AppendEncode appends the encoding of r to dst; zero fields are left out.
func (r *MemoryRecord) AppendEncode(dst []byte) []byte {
	dst = append(dst, memoryHeader...)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(r.LastAccess))
	for i, p := range r.strs() {
		if *p != "" {
			dst = binary.AppendUvarint(dst, uint64(1+i))
			dst = binary.AppendUvarint(dst, uint64(len(*p)))
			dst = append(dst, *p...)
		}
	}
	for i, p := range r.ints() {
		if *p != 0 {
			dst = binary.AppendUvarint(dst, uint64(32+i))
			dst = binary.AppendVarint(dst, *p)
		}
	}
	for i, p := range r.floats() {
		if *p != 0 {
			dst = binary.AppendUvarint(dst, uint64(64+i))
			dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(*p))
		}
	}
	return dst
}

// DecodeMemoryRecord decodes b, skipping unknown tags.
func DecodeMemoryRecord(b []byte) (MemoryRecord, error) {
	var r MemoryRecord
	if len(b) == 0 || b[0] != memoryFormat {
		return r, errBadValue
	}
	b = b[1:]
	strs, ints, floats := r.strs(), r.ints(), r.floats()
	for len(b) > 0 {
		tag, w := binary.Uvarint(b)
		if w <= 0 {
			return MemoryRecord{}, errBadValue
		}
		b = b[w:]
		switch {
		case tag >= 1 && tag < 32:
			n, w := binary.Uvarint(b)
			if w <= 0 || uint64(len(b)-w) < n {
				return MemoryRecord{}, errBadValue
			}
			if int(tag-1) < len(strs) {
				*strs[tag-1] = string(b[w : w+int(n)])
			}
			b = b[w+int(n):]
		case tag >= 32 && tag < 64:
			v, w := binary.Varint(b)
			if w <= 0 {
				return MemoryRecord{}, errBadValue
			}
			if int(tag-32) < len(ints) {
				*ints[tag-32] = v
			}
			b = b[w:]
		case tag >= 64 && tag < 96:
			if len(b) < 8 {
				return MemoryRecord{}, errBadValue
			}
			if int(tag-64) < len(floats) {
				*floats[tag-64] = math.Float64frombits(binary.LittleEndian.Uint64(b))
			}
			b = b[8:]
		default:
			return MemoryRecord{}, errBadValue
		}
	}
	return r, nil
}
