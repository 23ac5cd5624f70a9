package layout

import "github.com/opencontainers/go-digest"

// previousChunks returns the chunk list of a file of the previous version
// (PushOptions.Previous) that has the digest the source states for e, so
// that e is not read: only a file of the same size whose chunks hold its
// bytes alone (each extent a whole chunk, as large files are cut), so that
// the list is the file's, whatever else the previous version held.
func (b *builder) previousChunks(e Entry) ([]Chunk, bool) {
	if e.Digest == "" || b.opt.Previous == nil {
		return nil, false
	}
	b.prevOnce.Do(func() {
		x := b.opt.Previous
		b.prev = map[digest.Digest]int{}
		for i := range x.Len() {
			if x.Kind(i) == TypeFile {
				b.prev[x.fileRef(i).Digest] = i
			}
		}
	})
	i, ok := b.prev[e.Digest]
	x := b.opt.Previous
	if !ok || x.size(i) != e.Size {
		return nil, false
	}
	chunks := make([]Chunk, 0, x.NumExtents(i))
	for k := range x.NumExtents(i) {
		ex := x.Extent(i, k)
		if ex.Offset != 0 || ex.Length != x.ChunkSize(ex.Chunk) {
			return nil, false
		}
		chunks = append(chunks, x.Chunk(ex.Chunk))
	}
	return chunks, true
}
