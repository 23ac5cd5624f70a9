package testutil

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"sync"
)

// RandBytes returns n pseudo-random bytes, the same for the same seed. It
// fills whole 8-byte words: when n is not a multiple of 8, the last n%8
// bytes are zero.
func RandBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

// SyncBuffer is a bytes.Buffer safe to write from one goroutine while
// another reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Pattern returns n bytes from a linear congruential generator started at
// seed: cheap, deterministic, and different for different seeds.
func Pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}
