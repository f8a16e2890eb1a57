package kvevents

import (
	"bytes"
	"errors"
	"reflect"
	"runtime"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func sampleBatch() Batch {
	return Batch{
		TS: 1789095808.8378847,
		Events: []Event{
			BlockStored{
				BlockHashes: []BlockHash{15760518052499183552, 7}, ParentBlockHash: 42, HasParent: true,
				TokenIDs: []uint32{151644, 872, 198, 0, 4294967295, 1, 2, 3}, BlockSize: 4,
				LoRAID: 3, LoRAName: "sql-adapter", Medium: "GPU", GroupIdx: 1,
			},
			BlockStored{BlockHashes: []BlockHash{1}, TokenIDs: []uint32{9, 9}, BlockSize: 2, LoRAID: -1, GroupIdx: -1},
			BlockRemoved{BlockHashes: []BlockHash{15760518052499183552}, Medium: "CPU", GroupIdx: 0},
			BlockRemoved{BlockHashes: []BlockHash{}, GroupIdx: -1},
			AllBlocksCleared{},
		},
		DPRank: 2,
	}
}

func TestRoundTripEveryEventInBothEncodings(t *testing.T) {
	for _, enc := range []Encoding{EncodeMap, EncodeArray} {
		for _, dp := range []int{2, -1} {
			want := sampleBatch()
			want.DPRank = dp
			payload, err := Encode(want, enc)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(payload, Limits{})
			if err != nil {
				t.Fatalf("encoding %d: %v", enc, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("encoding %d:\n got %+v\nwant %+v", enc, got, want)
			}
		}
	}
}

func marshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The shapes below are written by a general-purpose encoder, not by Encode:
// what engines of each generation put on the wire.
func TestDecodesEveryGenerationOfTheWire(t *testing.T) {
	tokens := []any{151644, 872, 198, 9064}
	sha := bytes.Repeat([]byte{0xab}, 24)
	sha = append(sha, 1, 2, 3, 4, 5, 6, 7, 8)
	cases := []struct {
		name    string
		payload []byte
		want    Batch
	}{{
		name: "first release: positional, no medium, no rank",
		payload: marshal(t, []any{1.5, []any{
			[]any{"BlockStored", []any{uint64(1), int64(-1)}, nil, tokens, 2, nil},
			[]any{"BlockRemoved", []any{1}},
			[]any{"AllBlocksCleared"},
		}}),
		want: Batch{TS: 1.5, DPRank: -1, Events: []Event{
			BlockStored{BlockHashes: []BlockHash{1, 0xffffffffffffffff}, TokenIDs: []uint32{151644, 872, 198, 9064}, BlockSize: 2, LoRAID: -1, GroupIdx: -1},
			BlockRemoved{BlockHashes: []BlockHash{1}, GroupIdx: -1},
			AllBlocksCleared{},
		}},
	}, {
		name: "positional with medium, lora_name, extra_keys, group, spec kind; bytes hashes",
		payload: marshal(t, []any{2, []any{
			[]any{"BlockStored", []any{sha}, []byte{1, 0}, tokens, 2, 5, "GPU", "a", []any{[]any{"mm", []any{1, 2}}, nil}, 1, "sliding_window", 4096},
			[]any{"BlockRemoved", []any{sha}, "GPU", 1},
		}, 0}),
		want: Batch{TS: 2, DPRank: 0, Events: []Event{
			BlockStored{BlockHashes: []BlockHash{0x0102030405060708}, ParentBlockHash: 256, HasParent: true, TokenIDs: []uint32{151644, 872, 198, 9064}, BlockSize: 2, LoRAID: 5, LoRAName: "a", Medium: "GPU", GroupIdx: 1},
			BlockRemoved{BlockHashes: []BlockHash{0x0102030405060708}, Medium: "GPU", GroupIdx: 1},
		}},
	}, {
		name: "named fields (vLLM after the switch to maps), unknown keys",
		payload: marshal(t, []any{1789095808.8378847, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(15760518052499183552)}, "parent_block_hash": nil,
				"token_ids": tokens, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil,
				"extra_keys": []any{nil}, "group_idx": 0, "kv_cache_spec_kind": "full_attention"},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{3}, "medium": "GPU", "cache_salt": "x"},
			map[string]any{"type": "AllBlocksCleared"},
		}, 0}),
		want: Batch{TS: 1789095808.8378847, DPRank: 0, Events: []Event{
			BlockStored{BlockHashes: []BlockHash{15760518052499183552}, TokenIDs: []uint32{151644, 872, 198, 9064}, BlockSize: 16, LoRAID: -1, Medium: "GPU", GroupIdx: 0},
			BlockRemoved{BlockHashes: []BlockHash{3}, Medium: "GPU", GroupIdx: -1},
			AllBlocksCleared{},
		}},
	}, {
		name: "a batch as a map",
		payload: marshal(t, map[string]any{"ts": float32(0.5), "data_parallel_rank": 1, "later": []any{1},
			"events": []any{map[string]any{"type": "AllBlocksCleared"}}}),
		want: Batch{TS: 0.5, DPRank: 1, Events: []Event{AllBlocksCleared{}}},
	}, {
		name: "unknown tags are skipped in both forms",
		payload: marshal(t, []any{1, []any{
			[]any{"BlockMoved", []any{1, 2}, map[string]any{"x": []any{1}}},
			map[string]any{"type": "BlockMoved", "block_hashes": "not ours to read"},
			[]any{"AllBlocksCleared"},
		}}),
		want: Batch{TS: 1, DPRank: -1, Events: []Event{AllBlocksCleared{}}},
	}}
	for _, c := range cases {
		got, err := Decode(c.payload, Limits{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Fatalf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

func TestRejectsWhatIsNotABatch(t *testing.T) {
	good, err := Encode(sampleBatch(), EncodeMap)
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(good) {
		if _, err := Decode(good[:i], Limits{}); !errors.Is(err, ErrMalformed) {
			t.Fatalf("prefix of %d bytes: %v", i, err)
		}
	}
	bad := map[string][]byte{
		"trailing bytes":     append(append([]byte{}, good...), 0),
		"not msgpack":        []byte("hello, world"),
		"a string":           marshal(t, "batch"),
		"one element":        marshal(t, []any{1.0}),
		"events not a list":  marshal(t, []any{1.0, 3}),
		"event untagged":     marshal(t, []any{1.0, []any{[]any{}}}),
		"map without type":   marshal(t, []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}}),
		"stored no hashes":   marshal(t, []any{1.0, []any{[]any{"BlockStored"}}}),
		"hash a string":      marshal(t, []any{1.0, []any{[]any{"BlockRemoved", []any{"h"}}}}),
		"token negative":     marshal(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1}}}),
		"token over 32 bits": marshal(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1 << 32}, 1}}}),
		"negative rank":      marshal(t, []any{1.0, []any{}, -3}),
		"huge array header":  {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"huge skipped str":   {0x92, 0x01, 0x91, 0x92, 0xa3, 'A', 'B', 'C', 0xdb, 0xff, 0xff, 0xff, 0xff},
		"map without ts":     marshal(t, map[string]any{"events": []any{}}),
	}
	for name, payload := range bad {
		if _, err := Decode(payload, Limits{}); err == nil {
			t.Fatalf("%s: decoded", name)
		}
	}
}

func TestLimitsRejectBeforeAllocating(t *testing.T) {
	lim := Limits{MaxPayloadBytes: 1 << 20, MaxEvents: 4, MaxHashes: 4, MaxTokens: 8}
	hashes := make([]BlockHash, 5)
	cases := map[string]Batch{
		"events": {Events: []Event{AllBlocksCleared{}, AllBlocksCleared{}, AllBlocksCleared{}, AllBlocksCleared{}, AllBlocksCleared{}}},
		"hashes": {Events: []Event{BlockRemoved{BlockHashes: hashes}}},
		"tokens": {Events: []Event{BlockStored{BlockHashes: hashes[:1], TokenIDs: make([]uint32, 9)}}},
	}
	for name, b := range cases {
		payload, err := Encode(b, EncodeArray)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(payload, lim); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("%s: %v", name, err)
		}
	}
	big := make([]byte, 1<<20+1)
	if _, err := Decode(big, lim); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("payload: %v", err)
	}
	// An array header announcing four billion elements costs nothing.
	huge := []byte{0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 100 {
		if _, err := Decode(huge, Limits{MaxEvents: 1 << 40}); err == nil {
			t.Fatal("decoded")
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Fatalf("a huge header allocated %d bytes", n)
	}
}

func TestSkipsDeepNestingWithoutRecursion(t *testing.T) {
	const depth = 1 << 20
	// [1, [["X", [[[[...]]]]]]]: an unknown event nesting a million arrays.
	p := []byte{0x92, 0x01, 0x91, 0x92, 0xa1, 'X'}
	p = append(p, bytes.Repeat([]byte{0x91}, depth)...)
	p = append(p, 0xc0)
	got, err := Decode(p, Limits{})
	if err != nil || len(got.Events) != 0 {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, enc := range []Encoding{EncodeMap, EncodeArray} {
		p, err := Encode(sampleBatch(), enc)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Add(marshal(f, map[string]any{"ts": 1, "events": []any{[]any{"BlockStored", []any{[]byte{1, 2}}, nil, []any{1}, 1}}}))
	f.Add([]byte{0x92, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff})
	lim := Limits{MaxPayloadBytes: 1 << 16, MaxEvents: 64, MaxHashes: 64, MaxTokens: 256}
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload, lim)
		if err != nil {
			return
		}
		if len(b.Events) > lim.MaxEvents {
			t.Fatalf("%d events", len(b.Events))
		}
		for _, ev := range b.Events {
			switch ev := ev.(type) {
			case BlockStored:
				if len(ev.BlockHashes) > lim.MaxHashes || len(ev.TokenIDs) > lim.MaxTokens {
					t.Fatalf("over the limits: %+v", ev)
				}
			case BlockRemoved:
				if len(ev.BlockHashes) > lim.MaxHashes {
					t.Fatalf("over the limits: %+v", ev)
				}
			}
		}
		// What decodes encodes, and decodes to itself.
		again, err := Encode(b, EncodeMap)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := Decode(again, Limits{})
		if err != nil {
			t.Fatalf("re-encoded batch does not decode: %v", err)
		}
		if !reflect.DeepEqual(normal(b), normal(b2)) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", b2, b)
		}
	})
}

// normal makes nil and empty lists alike, as the wire does, and NaN
// timestamps comparable.
func normal(b Batch) Batch {
	if b.TS != b.TS {
		b.TS = 0
	}
	evs := make([]Event, len(b.Events))
	for i, ev := range b.Events {
		switch e := ev.(type) {
		case BlockStored:
			if len(e.BlockHashes) == 0 {
				e.BlockHashes = nil
			}
			if len(e.TokenIDs) == 0 {
				e.TokenIDs = nil
			}
			ev = e
		case BlockRemoved:
			if len(e.BlockHashes) == 0 {
				e.BlockHashes = nil
			}
			ev = e
		}
		evs[i] = ev
	}
	b.Events = evs
	return b
}
