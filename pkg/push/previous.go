package push

import (
	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// previousChunks returns the chunk list of a file of the previous version
// (Options.Previous) that has the digest the source states for e, so
// that e is not read: only a file of the same size whose chunks hold its
// bytes alone (each extent a whole chunk, as large files are cut), so that
// the list is the file's, whatever else the previous version held.
func (b *builder) previousChunks(e Entry) ([]layout.Chunk, bool) {
	if e.Digest == "" || b.opt.Previous == nil {
		return nil, false
	}
	i, ok := b.previousFiles()[e.Digest]
	x := b.opt.Previous
	if !ok || x.Size(i) != e.Size {
		return nil, false
	}
	chunks := make([]layout.Chunk, 0, x.NumExtents(i))
	for k := range x.NumExtents(i) {
		ex := x.Extent(i, k)
		if ex.Offset != 0 || ex.Length != x.ChunkSize(ex.Chunk) {
			return nil, false
		}
		chunks = append(chunks, x.Chunk(ex.Chunk))
	}
	return chunks, true
}

// previousFiles maps the file digests of the previous version to one file
// of each; nil when there is no previous version.
func (b *builder) previousFiles() map[digest.Digest]int {
	if b.opt.Previous == nil {
		return nil
	}
	b.prevOnce.Do(func() {
		x := b.opt.Previous
		b.prev = map[digest.Digest]int{}
		for i := range x.Len() {
			if x.Kind(i) == layout.TypeFile {
				b.prev[x.File(i).Digest] = i
			}
		}
	})
	return b.prev
}

// previousPack returns the chunk of the previous version that holds
// exactly the files ms, in this order and nothing else (each of them, as a
// file of that version, one extent of that chunk, end to end), so that a
// pack of files whose digests the source states is not read to be cut: the
// previous version's index, covered by its digest, says what the chunk's
// bytes are.
func (b *builder) previousPack(ms []packMember, total int64) (layout.Chunk, bool) {
	files := b.previousFiles()
	if files == nil {
		return layout.Chunk{}, false
	}
	x := b.opt.Previous
	chunk := -1
	var off int64
	for _, m := range ms {
		i, ok := files[m.dg]
		if !ok || x.Size(i) != m.size || x.NumExtents(i) != 1 {
			return layout.Chunk{}, false
		}
		ex := x.Extent(i, 0)
		if ex.Offset != off || ex.Length != m.size || chunk >= 0 && ex.Chunk != chunk {
			return layout.Chunk{}, false
		}
		chunk, off = ex.Chunk, off+m.size
	}
	if chunk < 0 || x.ChunkSize(chunk) != total {
		return layout.Chunk{}, false
	}
	return x.Chunk(chunk), true
}
