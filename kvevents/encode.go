package kvevents

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding is how Encode writes events: as vLLM writes them now, or as
// engines before its switch to named fields did. The batch itself is a
// positional array in both.
type Encoding uint8

const (
	// EncodeMap writes each event as a map, its tag under "type".
	EncodeMap Encoding = iota
	// EncodeArray writes each event as a positional array, its tag first.
	EncodeArray
)

// Encode writes b as an engine would publish it. DPRank < 0 leaves the rank
// out; LoRAID < 0 and GroupIdx < 0 are written as absent, Medium "" as nil.
func Encode(b Batch, enc Encoding) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	n := 2
	if b.DPRank >= 0 {
		n = 3
	}
	must := errs{}
	must.add(e.EncodeArrayLen(n))
	must.add(e.EncodeFloat64(b.TS))
	must.add(e.EncodeArrayLen(len(b.Events)))
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case BlockStored:
			encodeStored(e, &must, ev, enc)
		case BlockRemoved:
			encodeRemoved(e, &must, ev, enc)
		case AllBlocksCleared:
			if enc == EncodeMap {
				must.add(e.EncodeMapLen(1))
				must.add(e.EncodeString("type"))
			} else {
				must.add(e.EncodeArrayLen(1))
			}
			must.add(e.EncodeString(tagCleared))
		default:
			return nil, fmt.Errorf("kvevents: cannot encode event %T", ev)
		}
	}
	if n == 3 {
		must.add(e.EncodeInt(int64(b.DPRank)))
	}
	if must.err != nil {
		return nil, must.err
	}
	return buf.Bytes(), nil
}

// errs keeps the first error of a run of writes.
type errs struct{ err error }

func (m *errs) add(err error) {
	if m.err == nil {
		m.err = err
	}
}

// encodeStored writes the fields in vLLM's order; in the positional form
// extra_keys (never sent here) holds group_idx's place.
func encodeStored(e *msgpack.Encoder, must *errs, ev BlockStored, enc Encoding) {
	n := 8
	if ev.GroupIdx >= 0 {
		n = 10
		if enc == EncodeMap {
			n = 9
		}
	}
	key := func(k string) {
		if enc == EncodeMap {
			must.add(e.EncodeString(k))
		}
	}
	if enc == EncodeMap {
		must.add(e.EncodeMapLen(n))
	} else {
		must.add(e.EncodeArrayLen(n))
	}
	key("type")
	must.add(e.EncodeString(tagStored))
	key("block_hashes")
	encodeHashes(e, must, ev.BlockHashes)
	key("parent_block_hash")
	if ev.HasParent {
		must.add(e.EncodeUint(uint64(ev.ParentBlockHash)))
	} else {
		must.add(e.EncodeNil())
	}
	key("token_ids")
	must.add(e.EncodeArrayLen(len(ev.TokenIDs)))
	for _, t := range ev.TokenIDs {
		must.add(e.EncodeUint(uint64(t)))
	}
	key("block_size")
	must.add(e.EncodeInt(int64(ev.BlockSize)))
	key("lora_id")
	optInt(e, must, ev.LoRAID)
	key("medium")
	optStr(e, must, ev.Medium)
	key("lora_name")
	optStr(e, must, ev.LoRAName)
	if ev.GroupIdx >= 0 {
		if enc == EncodeArray {
			must.add(e.EncodeNil()) // extra_keys
		}
		key("group_idx")
		must.add(e.EncodeInt(int64(ev.GroupIdx)))
	}
}

func encodeRemoved(e *msgpack.Encoder, must *errs, ev BlockRemoved, enc Encoding) {
	n := 3
	if ev.GroupIdx >= 0 {
		n = 4
	}
	if enc == EncodeMap {
		must.add(e.EncodeMapLen(n))
		must.add(e.EncodeString("type"))
	} else {
		must.add(e.EncodeArrayLen(n))
	}
	must.add(e.EncodeString(tagRemoved))
	if enc == EncodeMap {
		must.add(e.EncodeString("block_hashes"))
	}
	encodeHashes(e, must, ev.BlockHashes)
	if enc == EncodeMap {
		must.add(e.EncodeString("medium"))
	}
	optStr(e, must, ev.Medium)
	if ev.GroupIdx >= 0 {
		if enc == EncodeMap {
			must.add(e.EncodeString("group_idx"))
		}
		must.add(e.EncodeInt(int64(ev.GroupIdx)))
	}
}

func encodeHashes(e *msgpack.Encoder, must *errs, hs []BlockHash) {
	must.add(e.EncodeArrayLen(len(hs)))
	for _, h := range hs {
		must.add(e.EncodeUint(uint64(h)))
	}
}

func optInt(e *msgpack.Encoder, must *errs, v int) {
	if v < 0 {
		must.add(e.EncodeNil())
		return
	}
	must.add(e.EncodeInt(int64(v)))
}

func optStr(e *msgpack.Encoder, must *errs, s string) {
	if s == "" {
		must.add(e.EncodeNil())
		return
	}
	must.add(e.EncodeString(s))
}
