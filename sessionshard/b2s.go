package sessionshard

import "unsafe"

// b2s converts b to a string without copying.
//
// The returned string aliases b: it is valid only while b is neither
// modified nor released, and it must never be stored (in a map, a struct,
// a closure that outlives the call). Every caller in this package uses it
// for a lookup or a delete-only operation and drops it before returning;
// anything that is stored is copied first with string(b).
func b2s(b []byte) string {
	return unsafe.String(unsafe.SliceData(b), len(b))
}
