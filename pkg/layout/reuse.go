package layout

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
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
	return b.opt.Destination != "" && b.opt.Cache != nil && b.opt.FormatVersion == FormatVersion
}

// usableMemo returns the memo of the last push of the tree to this
// destination, if its version is still stored there.
func (b *builder) usableMemo(ctx context.Context, dst content.Storage) *pieceMemo {
	if !b.memoOn() {
		return nil
	}
	m, err := b.opt.Cache.loadMemo()
	if err != nil || m == nil {
		return nil // refused: this push writes it anew
	}
	if m.dest != b.opt.Destination || m.chunking != b.opt.Params || m.piecing != DefaultPieceParams {
		return nil
	}
	root := ocispec.Descriptor{MediaType: m.rootType, Digest: m.root, Size: m.rootSize}
	if ok, err := dst.Exists(ctx, root); err != nil || !ok {
		return nil
	}
	return m
}

// cutWalk returns the ends of the pieces the entries are cut into, as
// cutPieces cuts the index they make.
func (b *builder) cutWalk(pp PieceParams) []int {
	var threshold uint64 = ^uint64(0)
	if pp.Avg > pp.Min {
		threshold = ^uint64(0) / uint64(pp.Avg-pp.Min)
	}
	var ends []int
	n, cost := 0, int64(0)
	seen := map[digest.Digest]bool{}
	for i := range b.entries.len() {
		e, r := b.entries.at(i), &b.results[i]
		n++
		cost += int64(64 + len(e.Path) + len(e.Target) + 24*len(r.extents))
		if e.Type == TypeFile {
			cost += int64(len("sha256:") + 2*sha256Len) // the digest's length
		}
		for _, x := range r.extents {
			if !seen[x.chunk.Digest] {
				seen[x.chunk.Digest] = true
				cost += chunkCost
			}
		}
		if n >= pp.Max || cost >= pp.MaxBytes || (n >= pp.Min && pathHash(e.Path) < threshold) {
			ends = append(ends, i+1)
			n, cost = 0, 0
			clear(seen)
		}
	}
	if n > 0 {
		ends = append(ends, b.entries.len())
	}
	return ends
}

// pieceSum is the fingerprint of the piece of entries [lo, hi): what its
// blob holds, in a form cheaper to hash than its JSON.
func (b *builder) pieceSum(lo, hi int) [sha256.Size]byte {
	h := sha256.New()
	var buf []byte
	for i := lo; i < hi; i++ {
		e, r := b.entries.at(i), &b.results[i]
		buf = appendString(buf[:0], e.Path)
		buf = appendString(buf, e.Type)
		buf = binary.AppendUvarint(buf, uint64(e.Mode))
		switch e.Type {
		case TypeFile:
			buf = binary.AppendUvarint(buf, uint64(e.Size))
			buf = append(append(buf, 1), r.sum[:]...) // as appendDigest writes a sha256 digest
			buf = binary.AppendUvarint(buf, uint64(len(r.extents)))
			for _, x := range r.extents {
				buf = appendChunk(buf, *x.chunk)
				buf = binary.AppendUvarint(buf, uint64(x.off))
				buf = binary.AppendUvarint(buf, uint64(x.length))
			}
		case TypeSymlink:
			buf = appendString(buf, e.Target)
		}
		h.Write(buf)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// sealReusing seals the version from the chunking results, reusing the
// pieces of m that did not change, and keeps the memo of it.
func (b *builder) sealReusing(m *pieceMemo) (*Sealed, error) {
	byFirst := make(map[string]int, len(m.pieces))
	for k, p := range m.pieces {
		byFirst[p.ref.First] = k
	}
	var (
		refs   []PieceRef
		blobs  []Blob
		memo   = b.newMemo()
		chunks []ocispec.Descriptor
		seen   = map[digest.Digest]bool{}
		reused int
	)
	addChunks := func(cs []Chunk) {
		for _, c := range cs {
			if !seen[c.Digest] {
				seen[c.Digest] = true
				chunks = append(chunks, chunkDescriptor(c))
			}
		}
	}
	start := 0
	for _, end := range b.cutWalk(DefaultPieceParams) {
		sum := b.pieceSum(start, end)
		if k, ok := byFirst[b.entries.path(start)]; ok && m.pieces[k].sum == sum && m.pieces[k].ref.Entries == int64(end-start) {
			p := m.pieces[k]
			reused++
			refs = append(refs, p.ref)
			addChunks(p.chunks)
			memo.pieces = append(memo.pieces, p)
			start = end
			continue
		}
		x, err := b.indexRange(start, end)
		if err != nil {
			return nil, err
		}
		if err := b.checkRange(x); err != nil {
			return nil, err
		}
		data, ref, cs, err := encodePiece(x, 0, end-start)
		if err != nil {
			return nil, err
		}
		bl, err := b.spill.blob(data)
		if err != nil {
			return nil, err
		}
		blobs = append(blobs, bl)
		refs = append(refs, ref)
		addChunks(cs)
		memo.pieces = append(memo.pieces, memoPiece{ref: ref, sum: sum, chunks: cs})
		start = end
	}
	t := topIndex{Version: FormatVersion, Chunking: b.opt.Params, Piecing: DefaultPieceParams,
		Chunks: int64(len(chunks)), Pieces: refs}
	if t.Pieces == nil {
		t.Pieces = []PieceRef{}
	}
	for _, r := range refs {
		t.Entries += r.Entries
		t.Bytes += r.Bytes
	}
	if t.Entries != int64(b.entries.len()) {
		return nil, fmt.Errorf("layout: pieces hold %d entries, the walk %d", t.Entries, b.entries.len())
	}
	if t.Entries > MaxEntries || t.Chunks > MaxChunks {
		return nil, invalid("%d entries and %d chunks exceed the limits", t.Entries, t.Chunks)
	}
	top, err := encodeTop(&t)
	if err != nil {
		return nil, err
	}
	empty := emptyConfig()
	s := &Sealed{Chunks: chunks, pieceRefs: refs, reused: reused}
	s.Blobs = append(append([]Blob{blobOf(MediaTypeIndexV2, top)}, blobs...), empty)
	layers := make([]ocispec.Descriptor, 0, 1+len(refs))
	layers = append(layers, s.Blobs[0].Desc)
	for _, r := range refs {
		layers = append(layers, ocispec.Descriptor{MediaType: MediaTypePiece, Digest: r.Digest, Size: r.Size})
	}
	maxLayers := b.opt.MaxLayers
	if maxLayers <= 0 {
		maxLayers = DefaultMaxLayers
	}
	if maxLayers < 2 {
		return nil, fmt.Errorf("layout: max layers must be at least 2")
	}
	if err := s.seal(layers, empty.Desc, int(t.Entries), t.Bytes, maxLayers, b.opt.Annotations); err != nil {
		return nil, err
	}
	b.memo = memo
	return s, nil
}

// newMemo returns an empty piece memo for this push's destination and
// parameters.
func (b *builder) newMemo() *pieceMemo {
	return &pieceMemo{dest: b.opt.Destination, chunking: b.opt.Params, piecing: DefaultPieceParams}
}

// checkRange checks the entries of x, a run of the walk, as Validate
// checks a whole index (parents are looked up in the walk).
func (b *builder) checkRange(x *Index) error {
	chunks := x.AllChunks()
	if err := checkChunks(chunks); err != nil {
		return err
	}
	isDir := func(p string) bool {
		i := b.entries.find(p)
		return i >= 0 && b.entries.kind(i) == TypeDir
	}
	prev := ""
	for i := range x.Len() {
		f := x.File(i)
		if err := checkEntry(i, &f, prev, chunks, isDir); err != nil {
			return err
		}
		prev = f.Path
	}
	return nil
}

// writeMemo keeps the memo of the version s sealed (the one sealReusing
// built, or one of every piece of s), or drops the memo when s has no
// pieces. A memo that cannot be written is dropped: it only saves work.
func (b *builder) writeMemo(s *Sealed) {
	if !b.memoOn() {
		return
	}
	m := b.memo
	if m == nil {
		if s.Index == nil || len(s.pieceEnds) != len(s.pieceRefs) {
			b.opt.Cache.dropMemo()
			return
		}
		m = &pieceMemo{dest: b.opt.Destination, chunking: b.opt.Params, piecing: DefaultPieceParams}
		start := 0
		for k, end := range s.pieceEnds {
			m.pieces = append(m.pieces, memoPiece{ref: s.pieceRefs[k], sum: b.pieceSum(start, end),
				chunks: pieceChunks(s.Index, start, end)})
			start = end
		}
	}
	m.root, m.rootSize, m.rootType = s.Root.Desc.Digest, s.Root.Desc.Size, s.Root.Desc.MediaType
	if err := b.opt.Cache.saveMemo(m); err != nil {
		b.opt.Cache.dropMemo()
	}
}

// pieceChunks lists the chunks entries [start, end) of x use, in order of
// first use, as their piece lists them.
func pieceChunks(x *Index, start, end int) []Chunk {
	var out []Chunk
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
