package chunkcache

import (
	"errors"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// ErrWrongSize is wrapped when a descriptor names a cached, verified blob
// with another size: the descriptor is wrong, and the entry is kept.
var ErrWrongSize = errors.New("descriptor size differs from the verified blob")

// ChunkInvalidError reports a chunk whose bytes do not match its digest or
// size: it is verify's error, which wraps layout.ErrDigestMismatch (the same
// sentinel as verify.ErrDigestMismatch).
type ChunkInvalidError = verify.Error
