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
