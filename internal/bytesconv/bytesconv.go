// Package bytesconv converts between strings and byte slices without
// copying, for the hot path's lookups (fasthttp's b2s/s2b, in one place).
package bytesconv

import "unsafe"

// B2S views b as a string without copying. The string aliases b: it is
// valid only while b is neither modified nor released, and must never be
// stored (in a map, a struct, a closure that outlives the call); copy with
// string(b) what is kept.
func B2S(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// S2B views s as bytes without copying. The result must never be modified:
// a string's bytes may live in read-only memory.
func S2B(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
