//go:build !purego

#include "textflag.h"

// The SHA-256 round constants, four to a 16-byte row.
DATA k256<>+0x00(SB)/4, $0x428a2f98
DATA k256<>+0x04(SB)/4, $0x71374491
DATA k256<>+0x08(SB)/4, $0xb5c0fbcf
DATA k256<>+0x0c(SB)/4, $0xe9b5dba5
DATA k256<>+0x10(SB)/4, $0x3956c25b
DATA k256<>+0x14(SB)/4, $0x59f111f1
DATA k256<>+0x18(SB)/4, $0x923f82a4
DATA k256<>+0x1c(SB)/4, $0xab1c5ed5
DATA k256<>+0x20(SB)/4, $0xd807aa98
DATA k256<>+0x24(SB)/4, $0x12835b01
DATA k256<>+0x28(SB)/4, $0x243185be
DATA k256<>+0x2c(SB)/4, $0x550c7dc3
DATA k256<>+0x30(SB)/4, $0x72be5d74
DATA k256<>+0x34(SB)/4, $0x80deb1fe
DATA k256<>+0x38(SB)/4, $0x9bdc06a7
DATA k256<>+0x3c(SB)/4, $0xc19bf174
DATA k256<>+0x40(SB)/4, $0xe49b69c1
DATA k256<>+0x44(SB)/4, $0xefbe4786
DATA k256<>+0x48(SB)/4, $0x0fc19dc6
DATA k256<>+0x4c(SB)/4, $0x240ca1cc
DATA k256<>+0x50(SB)/4, $0x2de92c6f
DATA k256<>+0x54(SB)/4, $0x4a7484aa
DATA k256<>+0x58(SB)/4, $0x5cb0a9dc
DATA k256<>+0x5c(SB)/4, $0x76f988da
DATA k256<>+0x60(SB)/4, $0x983e5152
DATA k256<>+0x64(SB)/4, $0xa831c66d
DATA k256<>+0x68(SB)/4, $0xb00327c8
DATA k256<>+0x6c(SB)/4, $0xbf597fc7
DATA k256<>+0x70(SB)/4, $0xc6e00bf3
DATA k256<>+0x74(SB)/4, $0xd5a79147
DATA k256<>+0x78(SB)/4, $0x06ca6351
DATA k256<>+0x7c(SB)/4, $0x14292967
DATA k256<>+0x80(SB)/4, $0x27b70a85
DATA k256<>+0x84(SB)/4, $0x2e1b2138
DATA k256<>+0x88(SB)/4, $0x4d2c6dfc
DATA k256<>+0x8c(SB)/4, $0x53380d13
DATA k256<>+0x90(SB)/4, $0x650a7354
DATA k256<>+0x94(SB)/4, $0x766a0abb
DATA k256<>+0x98(SB)/4, $0x81c2c92e
DATA k256<>+0x9c(SB)/4, $0x92722c85
DATA k256<>+0xa0(SB)/4, $0xa2bfe8a1
DATA k256<>+0xa4(SB)/4, $0xa81a664b
DATA k256<>+0xa8(SB)/4, $0xc24b8b70
DATA k256<>+0xac(SB)/4, $0xc76c51a3
DATA k256<>+0xb0(SB)/4, $0xd192e819
DATA k256<>+0xb4(SB)/4, $0xd6990624
DATA k256<>+0xb8(SB)/4, $0xf40e3585
DATA k256<>+0xbc(SB)/4, $0x106aa070
DATA k256<>+0xc0(SB)/4, $0x19a4c116
DATA k256<>+0xc4(SB)/4, $0x1e376c08
DATA k256<>+0xc8(SB)/4, $0x2748774c
DATA k256<>+0xcc(SB)/4, $0x34b0bcb5
DATA k256<>+0xd0(SB)/4, $0x391c0cb3
DATA k256<>+0xd4(SB)/4, $0x4ed8aa4a
DATA k256<>+0xd8(SB)/4, $0x5b9cca4f
DATA k256<>+0xdc(SB)/4, $0x682e6ff3
DATA k256<>+0xe0(SB)/4, $0x748f82ee
DATA k256<>+0xe4(SB)/4, $0x78a5636f
DATA k256<>+0xe8(SB)/4, $0x84c87814
DATA k256<>+0xec(SB)/4, $0x8cc70208
DATA k256<>+0xf0(SB)/4, $0x90befffa
DATA k256<>+0xf4(SB)/4, $0xa4506ceb
DATA k256<>+0xf8(SB)/4, $0xbef9a3f7
DATA k256<>+0xfc(SB)/4, $0xc67178f2
GLOBL k256<>(SB), RODATA|NOPTR, $256

// PSHUFB mask turning four big-endian words into little-endian ones.
DATA bswap<>+0(SB)/8, $0x0405060700010203
DATA bswap<>+8(SB)/8, $0x0c0d0e0f08090a0b
GLOBL bswap<>(SB), RODATA|NOPTR, $16

// LOADSTATE reads the eight words at PTR into S0 (ABEF) and S1 (CDGH).
#define LOADSTATE(PTR, S0, S1) \
	MOVOU   (PTR), S0; \
	MOVOU   16(PTR), S1; \
	PSHUFD  $0xb1, S0, S0; \
	PSHUFD  $0x1b, S1, S1; \
	MOVO    S0, X14; \
	PALIGNR $0x08, S1, S0; \
	PBLENDW $0xf0, X14, S1

// STORESTATE writes S0 (ABEF) and S1 (CDGH) back as eight words at PTR.
#define STORESTATE(PTR, S0, S1) \
	PSHUFD  $0x1b, S0, S0; \
	PSHUFD  $0xb1, S1, S1; \
	MOVO    S0, X14; \
	PBLENDW $0xf0, S1, S0; \
	PALIGNR $0x08, X14, S1; \
	MOVOU   S0, (PTR); \
	MOVOU   S1, 16(PTR)

// LOADMSG reads message words OFF..OFF+15 of the block at PTR into M.
#define LOADMSG(OFF, PTR, M) \
	MOVOU  OFF(PTR), M; \
	PSHUFB X15, M

// ROUNDS runs four rounds with the message words in M and the round
// constants at KOFF.
#define ROUNDS(M, KOFF, S0, S1) \
	MOVO        M, X0; \
	PADDD       KOFF(AX), X0; \
	SHA256RNDS2 X0, S0, S1; \
	PSHUFD      $0x0e, X0, X0; \
	SHA256RNDS2 X0, S1, S0

// ROUNDS2 runs four rounds of each stream, A (X1, X2) with MA and B (X7,
// X8) with MB, alternating their instructions.
#define ROUNDS2(MA, MB, KOFF) \
	MOVO        MA, X13; \
	PADDD       KOFF(AX), X13; \
	MOVO        MB, X14; \
	PADDD       KOFF(AX), X14; \
	MOVO        X13, X0; \
	SHA256RNDS2 X0, X1, X2; \
	MOVO        X14, X0; \
	SHA256RNDS2 X0, X7, X8; \
	PSHUFD      $0x0e, X13, X0; \
	SHA256RNDS2 X0, X2, X1; \
	PSHUFD      $0x0e, X14, X0; \
	SHA256RNDS2 X0, X8, X7

// SCHED replaces M4, the words four groups back, with the next group's
// words, from the three groups after it (M3 oldest, M1 newest).
#define SCHED(M4, M3, M2, M1) \
	SHA256MSG1 M3, M4; \
	MOVO       M1, X14; \
	PALIGNR    $0x04, M2, X14; \
	PADDD      X14, M4; \
	SHA256MSG2 M1, M4

// func block2(ha, hb *[8]uint32, pa, pb *byte, n int)
TEXT ·block2(SB), $64-40
	MOVQ ha+0(FP), R8
	MOVQ hb+8(FP), R9
	MOVQ pa+16(FP), SI
	MOVQ pb+24(FP), DI
	MOVQ n+32(FP), DX
	CMPQ DX, $0
	JEQ  done
	LEAQ k256<>(SB), AX
	MOVOU bswap<>(SB), X15
	LOADSTATE(R8, X1, X2)
	LOADSTATE(R9, X7, X8)

loop:
	MOVOU X1, 0(SP)
	MOVOU X2, 16(SP)
	MOVOU X7, 32(SP)
	MOVOU X8, 48(SP)

	// Groups 0-3: the message words as they are.
	LOADMSG(0, SI, X3)
	LOADMSG(0, DI, X9)
	ROUNDS2(X3, X9, 0)
	LOADMSG(16, SI, X4)
	LOADMSG(16, DI, X10)
	ROUNDS2(X4, X10, 16)
	LOADMSG(32, SI, X5)
	LOADMSG(32, DI, X11)
	ROUNDS2(X5, X11, 32)
	LOADMSG(48, SI, X6)
	LOADMSG(48, DI, X12)
	ROUNDS2(X6, X12, 48)

	// Groups 4-15: the schedule, in the register four groups back.
	SCHED(X3, X4, X5, X6)
	SCHED(X9, X10, X11, X12)
	ROUNDS2(X3, X9, 64)
	SCHED(X4, X5, X6, X3)
	SCHED(X10, X11, X12, X9)
	ROUNDS2(X4, X10, 80)
	SCHED(X5, X6, X3, X4)
	SCHED(X11, X12, X9, X10)
	ROUNDS2(X5, X11, 96)
	SCHED(X6, X3, X4, X5)
	SCHED(X12, X9, X10, X11)
	ROUNDS2(X6, X12, 112)

	SCHED(X3, X4, X5, X6)
	SCHED(X9, X10, X11, X12)
	ROUNDS2(X3, X9, 128)
	SCHED(X4, X5, X6, X3)
	SCHED(X10, X11, X12, X9)
	ROUNDS2(X4, X10, 144)
	SCHED(X5, X6, X3, X4)
	SCHED(X11, X12, X9, X10)
	ROUNDS2(X5, X11, 160)
	SCHED(X6, X3, X4, X5)
	SCHED(X12, X9, X10, X11)
	ROUNDS2(X6, X12, 176)

	SCHED(X3, X4, X5, X6)
	SCHED(X9, X10, X11, X12)
	ROUNDS2(X3, X9, 192)
	SCHED(X4, X5, X6, X3)
	SCHED(X10, X11, X12, X9)
	ROUNDS2(X4, X10, 208)
	SCHED(X5, X6, X3, X4)
	SCHED(X11, X12, X9, X10)
	ROUNDS2(X5, X11, 224)
	SCHED(X6, X3, X4, X5)
	SCHED(X12, X9, X10, X11)
	ROUNDS2(X6, X12, 240)

	MOVOU 0(SP), X13
	PADDD X13, X1
	MOVOU 16(SP), X13
	PADDD X13, X2
	MOVOU 32(SP), X13
	PADDD X13, X7
	MOVOU 48(SP), X13
	PADDD X13, X8

	ADDQ $64, SI
	ADDQ $64, DI
	DECQ DX
	JNZ  loop

	STORESTATE(R8, X1, X2)
	STORESTATE(R9, X7, X8)

done:
	RET

// func cpuid(leaf, sub uint32) (a, b, c, d uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, a+8(FP)
	MOVL BX, b+12(FP)
	MOVL CX, c+16(FP)
	MOVL DX, d+20(FP)
	RET
