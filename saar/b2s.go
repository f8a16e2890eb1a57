package saar

import "unsafe"

// b2s converts b to a string without copying. The string aliases b: valid
// only while b is unchanged, and never stored (lookups only).
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// s2b converts s to a []byte without copying. The slice must never be
// written to.
func s2b(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }
