package fastproxy

import "unsafe"

// b2s views b as a string without copying. The string is valid only while b
// is neither modified nor released; never store it.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
