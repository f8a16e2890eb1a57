package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrMalformed is what Decode's errors wrap: the payload is not a batch.
var ErrMalformed = errors.New("kvevents: malformed batch")

// ErrTooLarge is what Decode's errors wrap when a payload or one of its
// lists is over the Limits.
var ErrTooLarge = errors.New("kvevents: over the limits")

// Decode reads one batch payload. It never panics and allocates in
// proportion to the payload's length, within lim (zero fields: defaults).
// Events with an unknown tag are left out; a known event whose fields are
// of the wrong type fails the whole batch.
func Decode(payload []byte, lim Limits) (Batch, error) {
	lim = lim.withDefaults()
	if len(payload) > lim.MaxPayloadBytes {
		return Batch{}, fmt.Errorf("%w: payload of %d bytes", ErrTooLarge, len(payload))
	}
	d := decoder{r: reader{b: payload}, lim: lim}
	b, err := d.batch()
	if err != nil {
		return Batch{}, err
	}
	if d.r.off != len(payload) {
		return Batch{}, fmt.Errorf("%w: %d bytes after the batch", ErrMalformed, len(payload)-d.r.off)
	}
	return b, nil
}

type decoder struct {
	r   reader
	lim Limits
}

func (d *decoder) batch() (Batch, error) {
	b := Batch{DPRank: -1}
	h, err := d.r.head()
	if err != nil {
		return b, err
	}
	switch h.k {
	case kArray:
		if h.n < 2 {
			return b, malformed("batch of %d elements", h.n)
		}
		if b.TS, err = d.r.float(); err != nil {
			return b, err
		}
		if b.Events, err = d.events(); err != nil {
			return b, err
		}
		if h.n >= 3 {
			if b.DPRank, err = d.r.optIndex(); err != nil {
				return b, err
			}
		}
		for i := uint64(3); i < h.n; i++ {
			if err := d.r.skip(); err != nil {
				return b, err
			}
		}
		return b, nil
	case kMap:
		var seenTS, seenEvents bool
		for i := uint64(0); i < h.n; i++ {
			key, err := d.r.str()
			if err != nil {
				return b, err
			}
			switch string(key) {
			case "ts":
				b.TS, err = d.r.float()
				seenTS = true
			case "events":
				b.Events, err = d.events()
				seenEvents = true
			case "data_parallel_rank":
				b.DPRank, err = d.r.optIndex()
			default:
				err = d.r.skip()
			}
			if err != nil {
				return b, err
			}
		}
		if !seenTS || !seenEvents {
			return b, malformed("batch map without ts or events")
		}
		return b, nil
	}
	return b, malformed("batch is a %v", h.k)
}

func (d *decoder) events() ([]Event, error) {
	n, err := d.r.arrayLen(d.lim.MaxEvents, "events")
	if err != nil {
		return nil, err
	}
	evs := make([]Event, 0, n)
	for range n {
		ev, err := d.event()
		if err != nil {
			return nil, err
		}
		if ev != nil {
			evs = append(evs, ev)
		}
	}
	return evs, nil
}

// fields gathers an event's fields before its tag is known: a map may name
// the tag after them.
type fields struct {
	hashes    []BlockHash
	hasHashes bool
	parent    BlockHash
	hasParent bool
	tokens    []uint32
	blockSize int
	loraID    int
	loraName  string
	medium    string
	groupIdx  int
}

// The positions of the fields in the positional form, after the tag at 0.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

// event reads one event; nil with no error is an unknown tag, skipped.
func (d *decoder) event() (Event, error) {
	h, err := d.r.head()
	if err != nil {
		return nil, err
	}
	f := fields{loraID: -1, groupIdx: -1}
	var tag []byte
	switch h.k {
	case kArray:
		if h.n == 0 {
			return nil, malformed("event without a tag")
		}
		if tag, err = d.r.str(); err != nil {
			return nil, err
		}
		var names []string
		switch string(tag) {
		case tagStored:
			names = storedFields
		case tagRemoved:
			names = removedFields
		}
		for i := uint64(1); i < h.n; i++ {
			name := ""
			if names != nil && i-1 < uint64(len(names)) {
				name = names[i-1]
			}
			if err := d.field(&f, name); err != nil {
				return nil, err
			}
		}
	case kMap:
		// The tag first: a map may name it after the fields, and the
		// fields of an unknown event are not ours to read.
		start := d.r.off
		for i := uint64(0); i < h.n; i++ {
			key, err := d.r.str()
			if err != nil {
				return nil, err
			}
			if string(key) == "type" && tag == nil {
				tag, err = d.r.str()
			} else {
				err = d.r.skip()
			}
			if err != nil {
				return nil, err
			}
		}
		switch string(tag) {
		case tagStored, tagRemoved, tagCleared:
		default:
			if tag == nil {
				return nil, malformed("event map without a type")
			}
			return nil, nil
		}
		d.r.off = start
		for i := uint64(0); i < h.n; i++ {
			key, err := d.r.str()
			if err != nil {
				return nil, err
			}
			name := string(key)
			if name == "type" {
				name = "" // read already
			}
			if err := d.field(&f, name); err != nil {
				return nil, err
			}
		}
	default:
		return nil, malformed("event is a %v", h.k)
	}
	switch string(tag) {
	case tagStored:
		if !f.hasHashes {
			return nil, malformed("BlockStored without block_hashes")
		}
		return BlockStored{
			BlockHashes: f.hashes, ParentBlockHash: f.parent, HasParent: f.hasParent,
			TokenIDs: f.tokens, BlockSize: f.blockSize, LoRAID: f.loraID, LoRAName: f.loraName,
			Medium: f.medium, GroupIdx: f.groupIdx,
		}, nil
	case tagRemoved:
		if !f.hasHashes {
			return nil, malformed("BlockRemoved without block_hashes")
		}
		return BlockRemoved{BlockHashes: f.hashes, Medium: f.medium, GroupIdx: f.groupIdx}, nil
	case tagCleared:
		return AllBlocksCleared{}, nil
	}
	return nil, nil
}

// field reads the value of the named field into f; a name it does not know
// is skipped.
func (d *decoder) field(f *fields, name string) error {
	var err error
	switch name {
	case "block_hashes":
		f.hashes, err = d.hashes()
		f.hasHashes = err == nil
	case "parent_block_hash":
		var isNil bool
		if isNil, err = d.r.nilNext(); err == nil && !isNil {
			f.parent, err = d.hash()
			f.hasParent = err == nil
		}
	case "token_ids":
		f.tokens, err = d.tokens()
	case "block_size":
		var n int64
		if n, err = d.r.int(); err == nil && (n < 0 || n > math.MaxInt32) {
			err = malformed("block_size %d", n)
		}
		f.blockSize = int(n)
	case "lora_id":
		f.loraID, err = d.r.optIndex()
	case "lora_name":
		f.loraName, err = d.r.optStr()
	case "medium":
		f.medium, err = d.r.optStr()
	case "group_idx":
		f.groupIdx, err = d.r.optIndex()
	default:
		err = d.r.skip()
	}
	return err
}

func (d *decoder) hashes() ([]BlockHash, error) {
	n, err := d.r.arrayLen(d.lim.MaxHashes, "block_hashes")
	if err != nil {
		return nil, err
	}
	hs := make([]BlockHash, n)
	for i := range hs {
		if hs[i], err = d.hash(); err != nil {
			return nil, err
		}
	}
	return hs, nil
}

func (d *decoder) hash() (BlockHash, error) {
	h, err := d.r.head()
	if err != nil {
		return 0, err
	}
	switch h.k {
	case kUint:
		return BlockHash(h.n), nil
	case kInt:
		return BlockHash(uint64(h.i)), nil
	case kBin:
		if h.n > maxHashBytes {
			return 0, malformed("block hash of %d bytes", h.n)
		}
		b, err := d.r.take(h.n)
		if err != nil {
			return 0, err
		}
		if len(b) > 8 {
			b = b[len(b)-8:]
		}
		var buf [8]byte
		copy(buf[8-len(b):], b)
		return BlockHash(binary.BigEndian.Uint64(buf[:])), nil
	}
	return 0, malformed("block hash is a %v", h.k)
}

func (d *decoder) tokens() ([]uint32, error) {
	n, err := d.r.arrayLen(d.lim.MaxTokens, "token_ids")
	if err != nil {
		return nil, err
	}
	ts := make([]uint32, n)
	for i := range ts {
		v, err := d.r.int()
		if err != nil {
			return nil, err
		}
		if v < 0 || v > math.MaxUint32 {
			return nil, malformed("token id %d", v)
		}
		ts[i] = uint32(v)
	}
	return ts, nil
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}
