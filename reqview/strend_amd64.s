//go:build !purego

#include "textflag.h"

// func strEndBlocks(b []byte, i int) (end, next, esc int)
//
// See strend_amd64.go. Per 64-byte block: Q, the quotes, and B, the
// backslashes, as bit masks (AVX2 compares). A byte is escaped when the run
// of backslashes right before it has odd length; with c the carry (bit 0:
// the block's first byte is escaped by the previous block), B1 = B &^ c are
// the backslashes that escape or pair up inside this block, each run of B1
// starts at s = B1 &^ (B1 << 1), and adding a run's start bit to B1 ripples
// the carry to the byte just after the run. The run had odd length when that
// byte's position has the other parity than its start, hence the two sums,
// one for runs starting on even bits and one for odd. The carry out is the
// parity of the run of B1 ending at bit 63.
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
	MOVQ $0x5555555555555555, R12
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
	// R10 = B1 = B &^ c
	MOVQ R8, AX
	NOTQ AX
	ANDQ AX, R10
	// R11 = run starts
	MOVQ R10, R11
	SHLQ $1, R11
	NOTQ R11
	ANDQ R10, R11
	// R13 = even starts, R11 = odd starts
	MOVQ R11, R13
	ANDQ R12, R13
	XORQ R13, R11
	ADDQ R10, R13
	ADDQ R10, R11
	MOVQ R10, AX
	NOTQ AX
	ANDQ AX, R13
	ANDQ AX, R11
	// escaped = ends of even-started runs on odd bits | ends of
	// odd-started runs on even bits | c
	ANDQ R12, R11
	MOVQ R12, BX
	NOTQ BX
	ANDQ BX, R13
	ORQ  R11, R13
	ORQ  R8, R13
	// carry out: the run of B1 ending at bit 63 has odd length, i.e. the
	// highest zero bit of B1 (highest one of AX = ^B1) is at an even bit.
	XORQ R8, R8
	BSRQ AX, BX
	JZ   nocarry
	NOTQ BX
	ANDQ $1, BX
	MOVQ BX, R8

nocarry:
	NOTQ R13
	ANDQ R13, R9
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
