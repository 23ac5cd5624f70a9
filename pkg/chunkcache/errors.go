package chunkcache

import (
	"errors"

	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// ErrWrongSize is wrapped when a descriptor names a cached, verified blob
// with another size: the descriptor is wrong, and the entry is kept.
var ErrWrongSize = errors.New("descriptor size differs from the verified blob")

// ChunkInvalidError reports a chunk whose bytes do not match its digest or
// size: it is verify's error, which wraps layout.ErrDigestMismatch (the same
// sentinel as verify.ErrDigestMismatch).
type ChunkInvalidError = verify.Error

// RefetchError is what a source's reader returns for a blob it could not
// finish or whose bytes turned out wrong (a peer that stalled, went away
// or lied, see pkg/peer), when another source may serve it: a load drops
// the bytes read so far and fetches the blob again from Next, so that a
// source streaming into the cache costs a fallback, never a failed read.
type RefetchError struct {
	Next content.Fetcher // where to fetch the blob instead
	Err  error           // why the first source failed
}

func (e *RefetchError) Error() string { return e.Err.Error() + " (fetching it again elsewhere)" }

// Unwrap returns the source's failure.
func (e *RefetchError) Unwrap() error { return e.Err }

// maxRefetches bounds the sources one load falls back through.
const maxRefetches = 8
