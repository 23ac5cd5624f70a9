package chunkcache

import (
	"errors"
	"fmt"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// ErrWrongSize is wrapped when a descriptor names a cached, verified blob
// with another size: the descriptor is wrong, and the entry is kept.
var ErrWrongSize = errors.New("descriptor size differs from the verified blob")

// ChunkInvalidError reports a chunk whose bytes do not match its digest or
// size. It wraps layout.ErrDigestMismatch.
type ChunkInvalidError struct {
	Want digest.Digest // the digest the index names
	Got  digest.Digest // the digest of the bytes received; empty if the size was wrong
	Size int64         // the bytes received
}

// Error describes the mismatch.
func (e *ChunkInvalidError) Error() string {
	if e.Got == "" {
		return fmt.Sprintf("chunk %s: %v: wrong size %d", e.Want, layout.ErrDigestMismatch, e.Size)
	}
	return fmt.Sprintf("chunk %s: %v: got %s (%d bytes)", e.Want, layout.ErrDigestMismatch, e.Got, e.Size)
}

// Unwrap returns layout.ErrDigestMismatch.
func (e *ChunkInvalidError) Unwrap() error { return layout.ErrDigestMismatch }
