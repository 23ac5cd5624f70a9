package statcache

import (
	"encoding/json"
	"os"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// piecesPath is where the pieces of the version the last whole pull wrote
// are kept, beside the stat records.
func (c *Cache) piecesPath() string { return strings.TrimSuffix(c.path, ".rec") + ".pieces" }

// TakePulledPieces returns the digests of the index pieces of the version
// the last pull into the tree wrote whole, if it ended well and nothing
// was saved since, and forgets them: a pull calls it before it changes
// anything, so that pieces are on disk only while the tree and the records
// are as that pull left them (SavePulled writes them again). The files of
// a piece in this set are the ones the records name, unless someone changed
// the tree since without bdnvol.
func (c *Cache) TakePulledPieces() map[digest.Digest]bool {
	if c == nil {
		return nil
	}
	b, err := os.ReadFile(c.piecesPath())
	_ = os.Remove(c.piecesPath())
	if err != nil {
		return nil
	}
	var ds []digest.Digest
	if json.Unmarshal(b, &ds) != nil {
		return nil
	}
	out := make(map[digest.Digest]bool, len(ds))
	for _, d := range ds {
		out[d] = true
	}
	return out
}

// savePieces keeps the piece digests of x after a whole pull of it.
func (c *Cache) savePieces(x *layout.Index) error {
	ps := x.Pieces()
	if len(ps) == 0 {
		return nil
	}
	ds := make([]digest.Digest, len(ps))
	for i, p := range ps {
		ds[i] = p.Digest
	}
	b, err := json.Marshal(ds)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(c.piecesPath(), b, 0o600)
}
