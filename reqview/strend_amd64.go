//go:build !purego

package reqview

// strEndBlocks looks for the closing quote of a string from b[i], which is
// not escaped, 64 bytes at a time with AVX2, while a whole block is left: it
// returns end, the index of the closing quote, or -1 with next, the first
// byte not scanned (len(b)-next < 64), and esc = 1 when that byte is escaped
// by a backslash before it.
//
//go:noescape
func strEndBlocks(b []byte, i int) (end, next, esc int)

func cpuHasAVX2() bool

var hasBlocks = cpuHasAVX2()

// strEndCopy is strEndBlocks that also copies the blocks it scans to dst:
// b[i:next], or b[i:] up to the end of the block holding the closing quote,
// goes to dst from dst[0]. len(dst) must be at least len(b)-i (every block
// scanned lies in b[i:]).
//
//go:noescape
func strEndCopy(b []byte, i int, dst []byte) (end, next, esc int)
