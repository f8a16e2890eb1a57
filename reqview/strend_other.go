//go:build !amd64 || purego

package reqview

const hasBlocks = false

func strEndBlocks(b []byte, i int) (end, next, esc int) { return -1, i, 0 }

func strEndCopy(b []byte, i int, dst []byte) (end, next, esc int) { return -1, i, 0 }
