package push

import (
	"context"
	"crypto/sha256"
	"encoding/binary"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// A re-push and the piece memo. Files are chunked as in any push (the stat
// records give the digests of the files that kept their stat keys, and
// the packs of those files, so none is read), then the entries are cut
// into pieces as encodeV2 cuts them, straight from the walk and the
// chunking results. A piece whose fingerprint (pieceSum: every entry's
// path, type, mode, size, digest, target and extents, by chunk digest) is
// the one a piece of the memo had, with the same first path and number of
// entries, is that piece: its reference is reused, and it is not built,
// checked or stored again. Chunks of the version before are not asked for
// (its root is stored, so are they). The version is the one a push without
// the memo seals, with the same digest.

// memoOn reports whether this push keeps a piece memo.
func (b *builder) memoOn() bool {
	return b.opt.Destination != "" && b.opt.Cache != nil && b.opt.FormatVersion == layout.FormatVersion
}

// usableMemo returns the memo of the last push of the tree to this
// destination, if its version is still stored there.
func (b *builder) usableMemo(ctx context.Context, dst content.Storage) *statcache.PieceMemo {
	if !b.memoOn() {
		return nil
	}
	m, err := b.opt.Cache.LoadMemo()
	if err != nil || m == nil {
		return nil // refused: this push writes it anew
	}
	if m.Dest != b.opt.Destination || m.Chunking != b.opt.Params || m.Piecing != layout.DefaultPieceParams {
		return nil
	}
	root := ocispec.Descriptor{MediaType: m.RootType, Digest: m.Root, Size: m.RootSize}
	if ok, err := dst.Exists(ctx, root); err != nil || !ok {
		return nil
	}
	return m
}

// cutWalk returns the ends of the pieces the entries are cut into, by the
// rule that cuts a whole index (layout.CutPieces), straight from the walk
// and the chunking results.
func (b *builder) cutWalk(pp layout.PieceParams) []int {
	ends, _ := layout.CutPieces[digest.Digest](walkRun{b}, pp)
	return ends
}

// walkRun is the walk and its chunking results as the piecing rule reads
// them, chunks named by their digests.
type walkRun struct{ b *builder }

func (r walkRun) Len() int { return r.b.entries.len() }

func (r walkRun) PieceEntry(i int, chunk func(digest.Digest)) layout.PieceEntry {
	e, res := r.b.entries.at(i), &r.b.results[i]
	for _, x := range res.extents {
		chunk(x.chunk.Digest)
	}
	pe := layout.PieceEntry{Path: e.Path, Target: e.Target, Extents: len(res.extents)}
	if e.Type == layout.TypeFile {
		pe.DigestLen = len("sha256:") + 2*sha256.Size
	}
	return pe
}

// pieceSum is the fingerprint of the piece of entries [lo, hi): what its
// blob holds, in a form cheaper to hash than its JSON.
func (b *builder) pieceSum(lo, hi int) [sha256.Size]byte {
	h := sha256.New()
	var buf []byte
	for i := lo; i < hi; i++ {
		e, r := b.entries.at(i), &b.results[i]
		buf = statcache.AppendString(buf[:0], e.Path)
		buf = statcache.AppendString(buf, e.Type)
		buf = binary.AppendUvarint(buf, uint64(e.Mode))
		switch e.Type {
		case layout.TypeFile:
			buf = binary.AppendUvarint(buf, uint64(e.Size))
			buf = append(append(buf, 1), r.sum[:]...) // as appendDigest writes a sha256 digest
			buf = binary.AppendUvarint(buf, uint64(len(r.extents)))
			for _, x := range r.extents {
				buf = statcache.AppendChunk(buf, *x.chunk)
				buf = binary.AppendUvarint(buf, uint64(x.off))
				buf = binary.AppendUvarint(buf, uint64(x.length))
			}
		case layout.TypeSymlink:
			buf = statcache.AppendString(buf, e.Target)
		}
		h.Write(buf)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// sealReusing seals the version from the chunking results, reusing the
// pieces of m that did not change, and keeps the memo of it.
func (b *builder) sealReusing(m *statcache.PieceMemo) (*layout.Sealed, error) {
	byFirst := make(map[string]int, len(m.Pieces))
	for k, p := range m.Pieces {
		byFirst[p.Ref.First] = k
	}
	memo := b.newMemo()
	ps := layout.NewPieceSealer(b.opt.Params, b.spill)
	start := 0
	for _, end := range b.cutWalk(layout.DefaultPieceParams) {
		sum := b.pieceSum(start, end)
		if k, ok := byFirst[b.entries.path(start)]; ok && m.Pieces[k].Sum == sum && m.Pieces[k].Ref.Entries == int64(end-start) {
			p := m.Pieces[k]
			ps.Reuse(p.Ref, p.Chunks)
			memo.Pieces = append(memo.Pieces, p)
			start = end
			continue
		}
		x, err := b.indexRange(start, end)
		if err != nil {
			return nil, err
		}
		if err := x.ValidateRun(b.isDir); err != nil {
			return nil, err
		}
		ref, cs, err := ps.Encode(x)
		if err != nil {
			return nil, err
		}
		memo.Pieces = append(memo.Pieces, statcache.MemoPiece{Ref: ref, Sum: sum, Chunks: cs})
		start = end
	}
	s, err := ps.Seal(b.entries.len(), b.opt.MaxLayers, b.opt.Annotations)
	if err != nil {
		return nil, err
	}
	b.memo = memo
	return s, nil
}

// newMemo returns an empty piece memo for this push's destination and
// parameters.
func (b *builder) newMemo() *statcache.PieceMemo {
	return &statcache.PieceMemo{Dest: b.opt.Destination, Chunking: b.opt.Params, Piecing: layout.DefaultPieceParams}
}

// isDir reports whether p is a directory of the walk.
func (b *builder) isDir(p string) bool {
	i := b.entries.find(p)
	return i >= 0 && b.entries.kind(i) == layout.TypeDir
}

// writeMemo keeps the memo of the version s sealed (the one sealReusing
// built, or one of every piece of s), or drops the memo when s has no
// pieces. A memo that cannot be written is dropped: it only saves work.
func (b *builder) writeMemo(s *layout.Sealed) {
	if !b.memoOn() {
		return
	}
	if len(s.Deltas()) > 0 {
		// The memo says every chunk of its version is stored; a delta
		// chunk is not (its delta blob is): no memo.
		b.opt.Cache.DropMemo()
		return
	}
	m := b.memo
	if m == nil {
		ends, refs := s.PieceEnds(), s.PieceRefs()
		if s.Index == nil || len(ends) != len(refs) {
			b.opt.Cache.DropMemo()
			return
		}
		m = b.newMemo()
		start := 0
		for k, end := range ends {
			m.Pieces = append(m.Pieces, statcache.MemoPiece{Ref: refs[k], Sum: b.pieceSum(start, end),
				Chunks: pieceChunks(s.Index, start, end)})
			start = end
		}
	}
	m.Root, m.RootSize, m.RootType = s.Root.Desc.Digest, s.Root.Desc.Size, s.Root.Desc.MediaType
	if err := b.opt.Cache.SaveMemo(m); err != nil {
		b.opt.Cache.DropMemo()
	}
}

// pieceChunks lists the chunks entries [start, end) of x use, in order of
// first use, as their piece lists them.
func pieceChunks(x *layout.Index, start, end int) []layout.Chunk {
	var out []layout.Chunk
	seen := map[int]bool{}
	for i := start; i < end; i++ {
		for k := range x.NumExtents(i) {
			if c := x.Extent(i, k).Chunk; !seen[c] {
				seen[c] = true
				out = append(out, x.Chunk(c))
			}
		}
	}
	return out
}
