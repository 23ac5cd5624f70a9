//go:build !amd64 || purego

package sha2x

const useBlock2 = false

func block2(ha, hb *[8]uint32, pa, pb *byte, n int) { panic("sha2x: block2 without SHA-NI") }
