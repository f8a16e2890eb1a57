//go:build !purego

#include "textflag.h"

// func strEndBlocks(b []byte, i int) (end, next, esc int)
//
// See strend_amd64.go. Per 64-byte block: Q, the quotes, and B, the
// backslashes, as bit masks (AVX2 compares). A byte is escaped when the run
// of backslashes right before it has odd length; with c the carry (bit 0:
// the block's first byte is escaped by the previous block), the escaped
// bytes and the carry out come from a few scalar operations per block
// (simdjson's find_escaped; see escapes below), only on blocks with a
// backslash or a carry.
TEXT ·strEndBlocks(SB), NOSPLIT, $0-56
	MOVQ b_base+0(FP), SI
	MOVQ b_len+8(FP), DX
	MOVQ i+24(FP), CX
	MOVL $0x22, AX
	MOVQ AX, X0
	VPBROADCASTB X0, Y1
	MOVL $0x5c, AX
	MOVQ AX, X0
	VPBROADCASTB X0, Y2
	MOVQ $0xaaaaaaaaaaaaaaaa, R12
	XORQ R8, R8

loop:
	LEAQ 64(CX), AX
	CMPQ AX, DX
	JGT  notfound
	VMOVDQU (SI)(CX*1), Y3
	VMOVDQU 32(SI)(CX*1), Y4
	VPCMPEQB Y1, Y3, Y5
	VPCMPEQB Y1, Y4, Y6
	VPMOVMSKB Y5, R9
	VPMOVMSKB Y6, R10
	SHLQ $32, R10
	ORQ  R10, R9
	VPCMPEQB Y2, Y3, Y5
	VPCMPEQB Y2, Y4, Y6
	VPMOVMSKB Y5, R10
	VPMOVMSKB Y6, R11
	SHLQ $32, R11
	ORQ  R11, R10
	MOVQ R10, AX
	ORQ  R8, AX
	JNZ  escapes
	TESTQ R9, R9
	JNZ  found
	ADDQ $64, CX
	JMP  loop

escapes:
	// simdjson's resolution of escapes: pe, the backslashes not escaped
	// by the carry, start runs; pe<<1 | ODD minus pe ripples through each
	// run, and xor ODD leaves etc, whose bits tell the parity of each
	// position within its run: escaped = etc ^ (B | c) are the bytes an odd
	// run escapes, etc & B the backslashes that escape the next byte, the
	// one at bit 63 escaping the next block's first byte (the carry).
	MOVQ R8, AX
	NOTQ AX
	ANDQ R10, AX
	LEAQ (AX)(AX*1), BX
	ORQ  R12, BX
	SUBQ AX, BX
	XORQ R12, BX
	MOVQ R10, AX
	ORQ  R8, AX
	XORQ BX, AX
	ANDQ R10, BX
	SHRQ $63, BX
	MOVQ BX, R8
	NOTQ AX
	ANDQ AX, R9
	JNZ  found
	ADDQ $64, CX
	JMP  loop

found:
	BSFQ R9, AX
	ADDQ CX, AX
	MOVQ AX, end+32(FP)
	MOVQ CX, next+40(FP)
	MOVQ $0, esc+48(FP)
	VZEROUPPER
	RET

notfound:
	MOVQ $-1, end+32(FP)
	MOVQ CX, next+40(FP)
	MOVQ R8, esc+48(FP)
	VZEROUPPER
	RET

// func strEndCopy(b []byte, i int, dst []byte) (end, next, esc int)
//
// strEndBlocks that also copies each block it scans, b[i+64k:i+64k+64],
// to dst[64k:64k+64] (see strend_amd64.go). R14 holds i, R15 the offset of
// the block in dst.
TEXT ·strEndCopy(SB), NOSPLIT, $0-80
	MOVQ b_base+0(FP), SI
	MOVQ b_len+8(FP), DX
	MOVQ i+24(FP), CX
	MOVQ dst_base+32(FP), DI
	MOVQ CX, R14
	MOVL $0x22, AX
	MOVQ AX, X0
	VPBROADCASTB X0, Y1
	MOVL $0x5c, AX
	MOVQ AX, X0
	VPBROADCASTB X0, Y2
	MOVQ $0xaaaaaaaaaaaaaaaa, R12
	XORQ R8, R8

cloop:
	LEAQ 64(CX), AX
	CMPQ AX, DX
	JGT  cnotfound
	VMOVDQU (SI)(CX*1), Y3
	VMOVDQU 32(SI)(CX*1), Y4
	MOVQ CX, R15
	SUBQ R14, R15
	VMOVDQU Y3, (DI)(R15*1)
	VMOVDQU Y4, 32(DI)(R15*1)
	VPCMPEQB Y1, Y3, Y5
	VPCMPEQB Y1, Y4, Y6
	VPMOVMSKB Y5, R9
	VPMOVMSKB Y6, R10
	SHLQ $32, R10
	ORQ  R10, R9
	VPCMPEQB Y2, Y3, Y5
	VPCMPEQB Y2, Y4, Y6
	VPMOVMSKB Y5, R10
	VPMOVMSKB Y6, R11
	SHLQ $32, R11
	ORQ  R11, R10
	MOVQ R10, AX
	ORQ  R8, AX
	JNZ  cescapes
	TESTQ R9, R9
	JNZ  cfound
	ADDQ $64, CX
	JMP  cloop

cescapes:
	// simdjson's resolution of escapes: pe, the backslashes not escaped
	// by the carry, start runs; pe<<1 | ODD minus pe ripples through each
	// run, and xor ODD leaves etc, whose bits tell the parity of each
	// position within its run: escaped = etc ^ (B | c) are the bytes an odd
	// run escapes, etc & B the backslashes that escape the next byte, the
	// one at bit 63 escaping the next block's first byte (the carry).
	MOVQ R8, AX
	NOTQ AX
	ANDQ R10, AX
	LEAQ (AX)(AX*1), BX
	ORQ  R12, BX
	SUBQ AX, BX
	XORQ R12, BX
	MOVQ R10, AX
	ORQ  R8, AX
	XORQ BX, AX
	ANDQ R10, BX
	SHRQ $63, BX
	MOVQ BX, R8
	NOTQ AX
	ANDQ AX, R9
	JNZ  cfound
	ADDQ $64, CX
	JMP  cloop

cfound:
	BSFQ R9, AX
	ADDQ CX, AX
	MOVQ AX, end+56(FP)
	MOVQ CX, next+64(FP)
	MOVQ $0, esc+72(FP)
	VZEROUPPER
	RET

cnotfound:
	MOVQ $-1, end+56(FP)
	MOVQ CX, next+64(FP)
	MOVQ R8, esc+72(FP)
	VZEROUPPER
	RET

// func cpuHasAVX2() bool
TEXT ·cpuHasAVX2(SB), NOSPLIT, $0-1
	MOVL $1, AX
	XORL CX, CX
	CPUID
	// OSXSAVE (ECX bit 27) and AVX (ECX bit 28)
	MOVL CX, BX
	ANDL $0x18000000, BX
	CMPL BX, $0x18000000
	JNE  no
	// the OS saves XMM and YMM state
	XORL CX, CX
	XGETBV
	ANDL $6, AX
	CMPL AX, $6
	JNE  no
	MOVL $7, AX
	XORL CX, CX
	CPUID
	// AVX2: EBX bit 5
	ANDL $0x20, BX
	JZ   no
	MOVB $1, ret+0(FP)
	RET
no:
	MOVB $0, ret+0(FP)
	RET
