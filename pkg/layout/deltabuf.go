package layout

import "sync"

// Buffers of delta decoding: the base a chunk is decoded over (in place),
// the decoded planes, the delta blob. Chunks vary in size, so buffers are
// pooled by size class: a buffer taken from the pool fits the next chunk
// of about the same size, instead of a too small one being dropped and a
// new one allocated, whose pages the kernel must then fault in again (the
// cold delta pull measured that in its system time).

// planesSlack is the room the buffer of decoded planes has past the
// chunk's bytes: zstd's decoder takes its fast path only when its output
// has 16 bytes to spare.
const planesSlack = 64

// bufClasses is the number of size classes: quarter powers of two from
// 64 KiB up past MaxChunkBytes.
const bufClasses = 4 * (28 - 16 + 2)

// bufPools hold buffers by size class.
var bufPools [bufClasses + 1]sync.Pool

// classSize is the capacity of a buffer of class c: 64 KiB × 2^(c/4) ×
// (1 + (c mod 4)/4).
func classSize(c int) int { return (4 + c%4) << (c/4 + 14) }

// classOf returns the smallest class whose buffers hold n bytes, or
// bufClasses for a size past every class (allocated and dropped).
func classOf(n int) int {
	for c := range bufClasses {
		if classSize(c) >= n {
			return c
		}
	}
	return bufClasses
}

// getBuf returns a buffer of n bytes, pooled by size class; its bytes are
// whatever the last user left.
func getBuf(n int) *[]byte {
	c := classOf(n)
	if c < bufClasses {
		if bp, ok := bufPools[c].Get().(*[]byte); ok {
			*bp = (*bp)[:n]
			return bp
		}
		b := make([]byte, n, classSize(c))
		return &b
	}
	b := make([]byte, n)
	return &b
}

// putBuf returns bp, from getBuf, to its pool. bp must not be used after.
func putBuf(bp *[]byte) {
	if bp == nil {
		return
	}
	if c := classOf(cap(*bp)); c < bufClasses && classSize(c) == cap(*bp) {
		bufPools[c].Put(bp)
	}
}
