package testutil

import (
	"crypto/sha256"
	"hash"
	"sync/atomic"
)

// CountingHash is a SHA-256 that adds the bytes it is given to N.
type CountingHash struct {
	hash.Hash
	N *atomic.Int64
}

// NewCountingHash returns a SHA-256 that counts what it hashes into n.
func NewCountingHash(n *atomic.Int64) hash.Hash { return CountingHash{sha256.New(), n} }

// Write hashes p and counts its bytes.
func (h CountingHash) Write(p []byte) (int, error) {
	h.N.Add(int64(len(p)))
	return h.Hash.Write(p)
}
