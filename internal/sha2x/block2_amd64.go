//go:build !purego

package sha2x

import "golang.org/x/sys/cpu"

// useBlock2 tells whether block2 may run: it needs the SHA extensions,
// SSSE3 (PSHUFB, PALIGNR) and SSE4.1 (PBLENDW).
var useBlock2 = hasSHA() && cpu.X86.HasSSSE3 && cpu.X86.HasSSE41

// hasSHA reads the SHA extensions' CPUID bit (leaf 7, EBX bit 29).
func hasSHA() bool {
	if maxLeaf, _, _, _ := cpuid(0, 0); maxLeaf < 7 {
		return false
	}
	_, ebx, _, _ := cpuid(7, 0)
	return ebx&(1<<29) != 0
}

// cpuid runs the CPUID instruction.
func cpuid(leaf, sub uint32) (a, b, c, d uint32)

// block2 hashes n blocks at pa into ha and n blocks at pb into hb,
// the two chains of rounds interleaved.
//
//go:noescape
func block2(ha, hb *[8]uint32, pa, pb *byte, n int)
