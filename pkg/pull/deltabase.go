package pull

import (
	"context"
	"fmt"
	"io"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// Delta chunks: a chunk stored as a delta is decoded from its delta blob
// and its base chunk, a chunk of the version before. An upgrade of a
// directory that holds the version before reads the base there (where the
// previous pull's record puts it, else at the delta chunk's own place in
// the file at the same name) instead of fetching it: the delta source
// verifies the bytes against the base's digest, and fetches the base when
// they are not it. Those reads happen while the local copies run, before
// any file is renamed over the one that holds the base.

// localBases returns where the bases of the delta chunks still to write
// may be in the destination.
func (p *puller) localBases() map[digest.Digest]localChunk {
	needed := map[digest.Digest]bool{}
	for k, ts := range p.byChunk {
		if d, ok := p.x.Delta(k); ok && len(ts) > 0 {
			needed[d.Base] = true
		}
	}
	out := map[digest.Digest]localChunk{}
	if len(needed) == 0 {
		return out
	}
	p.previous.Each(func(path string, rec statcache.Record) bool {
		var off int64
		for _, e := range rec.Extents {
			if needed[e.Digest] {
				if _, found := out[e.Digest]; !found {
					out[e.Digest] = localChunk{d: p.d, path: path, off: off}
				}
			}
			off += e.Length
		}
		return p.ctx.Err() == nil
	})
	for i := range p.x.Len() {
		if !p.files.active(i) {
			continue
		}
		f := fileAt(p.x, i)
		var off int64
		for _, e := range f.Extents {
			if d, ok := p.x.Delta(e.Chunk); ok && e.Offset == 0 && e.Length == d.Size {
				if _, found := out[d.Base]; !found && needed[d.Base] {
					out[d.Base] = localChunk{d: p.d, path: f.Path, off: off}
				}
			}
			off += e.Length
		}
	}
	return out
}

// baseFinder returns the finder of local bases of bases.
func baseFinder(bases map[digest.Digest]localChunk) layout.LocalBases {
	return func(ctx context.Context, desc ocispec.Descriptor, dst []byte) error {
		loc, ok := bases[desc.Digest]
		if !ok {
			return fmt.Errorf("base %s: not in the directory", desc.Digest)
		}
		rc, err := loc.Fetch(ctx, desc)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.ReadFull(rc, dst[:desc.Size])
		return err
	}
}
