package layout

import (
	"context"
	"fmt"
	"sort"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// A re-push and its piece memo. A piece is what the entries from its first
// path on make of it: the files' results (digests, chunks) and the piece's
// cut depend on those entries alone, once the piece starts where a piece
// starts and no pack of small files runs into it. So a piece of the last
// push (the memo) is sealed again as it was when
//
//   - its entries, with their stat keys, are the same (the fingerprint);
//   - in the last push, no pack ran into it from the piece before, and its
//     own last pack was closed by its own last small file (memoCleanEnd),
//     or it was the last piece and still ends the walk;
//   - in this push, what comes before it ends a piece where it starts and
//     leaves no pack open there: checked after the entries between reused
//     pieces are chunked, and a piece for which it does not hold is
//     chunked too, over again.
//
// The version then is the one a push reading every file would seal, with
// the same digest.

// memoCandidate is a piece of the memo whose entries the walk still holds.
type memoCandidate struct {
	lo, hi int // its entries in the walk
	piece  int // in the memo
}

// memoOn reports whether this push keeps a piece memo.
func (b *builder) memoOn() bool {
	return b.opt.Destination != "" && b.opt.Cache != nil && b.opt.FormatVersion == FormatVersion &&
		b.buffer == nil && b.opt.Previous == nil
}

// skip reports whether entry i is in a reused piece.
func (b *builder) skip(i int) bool { return b.reused != nil && b.reused[i] }

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

// candidates returns the pieces of m that the walk still holds unchanged
// and that the last push left clean at both ends, in path order.
func (b *builder) candidates(m *pieceMemo) []memoCandidate {
	es := b.entries
	var out []memoCandidate
	for k, p := range m.pieces {
		last := k == len(m.pieces)-1
		if p.flags&memoTrusted == 0 || (k > 0 && m.pieces[k-1].flags&memoCleanEnd == 0) ||
			(!last && p.flags&memoCleanEnd == 0) {
			continue
		}
		lo := sort.Search(len(es), func(i int) bool { return es[i].Path >= p.ref.First })
		hi := lo + int(p.ref.Entries)
		if lo == len(es) || es[lo].Path != p.ref.First || hi > len(es) || (last && hi != len(es)) {
			continue
		}
		if entriesSum(es[lo:hi]) != p.sum {
			continue
		}
		out = append(out, memoCandidate{lo: lo, hi: hi, piece: k})
	}
	return out
}

// pushReusing seals the version reusing the candidates of m that hold:
// only the entries between them are chunked (and read, where the stat
// records do not know them), and only their pieces are built and stored.
func (b *builder) pushReusing(ctx context.Context, dst content.Storage, up *uploader, m *pieceMemo, cands []memoCandidate) (*PushResult, error) {
	b.collect = true
	for {
		b.reused = make([]bool, len(b.entries))
		for _, c := range cands {
			for i := c.lo; i < c.hi; i++ {
				b.reused[i] = true
			}
		}
		clear(b.results)
		b.pending = nil
		if err := b.chunkAll(ctx, nil); err != nil {
			return nil, err
		}
		keep, err := b.holding(cands)
		if err != nil {
			return nil, err
		}
		if len(keep) == len(cands) {
			break
		}
		cands = keep // chunk the entries of the others too, over again
	}
	b.collect = false
	s, memo, err := b.sealReusing(m, cands)
	if err != nil {
		return nil, err
	}
	var done int64
	for _, e := range b.entries {
		if e.Type == TypeFile {
			done += e.Size
		}
	}
	if ok, err := dst.Exists(ctx, s.Root.Desc); err == nil && ok {
		b.opt.Counters.Processed.Store(done)
		if err := b.opt.Cache.Save(); err != nil {
			return nil, fmt.Errorf("save stat cache: %w", err)
		}
		b.memo = memo
		return b.result(s, up, 0, true), nil
	}
	err = up.run(ctx, b.opt.Jobs, func(ctx context.Context, submit func(chunkJob) error) error {
		for _, j := range b.pending {
			if err := submit(j); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	b.opt.Counters.Processed.Store(done)
	b.memo = memo
	return b.store(ctx, dst, s, up)
}

// region is a run of entries of this push: a reused piece of the memo, or
// entries chunked (piece -1).
type region struct {
	lo, hi int
	piece  int
}

// regions lists the reused pieces and the runs of entries between them.
func (b *builder) regions(cands []memoCandidate) []region {
	var out []region
	at := 0
	for _, c := range cands {
		if c.lo > at {
			out = append(out, region{at, c.lo, -1})
		}
		out = append(out, region{c.lo, c.hi, c.piece})
		at = c.hi
	}
	if at < len(b.entries) {
		out = append(out, region{at, len(b.entries), -1})
	}
	return out
}

// smallPacked reports whether entry i is a small file in a pack.
func (b *builder) smallPacked(i int) bool {
	e := &b.entries[i]
	return e.Type == TypeFile && e.Size > 0 && e.Size < b.opt.Params.Min
}

// holding returns the candidates that the chunked runs before them leave
// as they were: a run ends where its last piece was cut by the rule, and
// with no pack open.
func (b *builder) holding(cands []memoCandidate) ([]memoCandidate, error) {
	rs := b.regions(cands)
	drop := map[int]bool{} // by the candidate's first entry
	for _, r := range rs {
		if r.piece >= 0 || r.hi == len(b.entries) {
			continue
		}
		x, err := b.indexRange(r.lo, r.hi)
		if err != nil {
			return nil, err
		}
		if _, rule := cutPiecesRule(x, DefaultPieceParams); !rule || !b.packClosed(r.lo, r.hi) {
			drop[r.hi] = true
		}
	}
	out := cands[:0:0]
	for _, c := range cands {
		if !drop[c.lo] {
			out = append(out, c)
		}
	}
	return out, nil
}

// packClosed reports whether the chunked entries [lo, hi) leave no pack
// open: their last small file closed its pack by itself (or they hold
// none, and what comes before them, the start or a reused piece, left
// none).
func (b *builder) packClosed(lo, hi int) bool {
	for i := hi - 1; i >= lo; i-- {
		if b.smallPacked(i) {
			return b.results[i].closes
		}
	}
	return true
}

// sealReusing seals the version from the reused pieces and the pieces of
// the runs between them, and returns the memo of it.
func (b *builder) sealReusing(m *pieceMemo, cands []memoCandidate) (*Sealed, *pieceMemo, error) {
	var (
		refs   []PieceRef
		blobs  []Blob
		memo   = &pieceMemo{dest: b.opt.Destination, chunking: b.opt.Params, piecing: DefaultPieceParams}
		chunks []ocispec.Descriptor
		seen   = map[digest.Digest]bool{}
	)
	addChunks := func(cs []Chunk) {
		for _, c := range cs {
			if !seen[c.Digest] {
				seen[c.Digest] = true
				chunks = append(chunks, chunkDescriptor(c))
			}
		}
	}
	b.memoCleanBefore = true
	for _, r := range b.regions(cands) {
		if r.piece >= 0 {
			p := m.pieces[r.piece]
			refs = append(refs, p.ref)
			addChunks(p.chunks)
			memo.pieces = append(memo.pieces, p)
			b.memoCleanBefore = p.flags&memoCleanEnd != 0
			continue
		}
		x, err := b.indexRange(r.lo, r.hi)
		if err != nil {
			return nil, nil, err
		}
		if err := b.checkRange(x); err != nil {
			return nil, nil, err
		}
		start := 0
		for _, end := range cutPieces(x, DefaultPieceParams) {
			data, ref, cs, err := encodePiece(x, start, end)
			if err != nil {
				return nil, nil, err
			}
			blobs = append(blobs, blobOf(MediaTypePiece, data))
			refs = append(refs, ref)
			addChunks(cs)
			memo.pieces = append(memo.pieces, b.memoPiece(r.lo+start, r.lo+end, ref, cs))
			start = end
		}
	}
	t := topIndex{Version: FormatVersion, Chunking: b.opt.Params, Piecing: DefaultPieceParams,
		Chunks: int64(len(chunks)), Pieces: refs}
	for _, r := range refs {
		t.Entries += r.Entries
		t.Bytes += r.Bytes
	}
	if t.Entries != int64(len(b.entries)) {
		return nil, nil, fmt.Errorf("layout: reused pieces hold %d entries, the walk %d", t.Entries, len(b.entries))
	}
	if t.Entries > MaxEntries || t.Chunks > MaxChunks {
		return nil, nil, invalid("%d entries and %d chunks exceed the limits", t.Entries, t.Chunks)
	}
	top, err := encodeTop(&t)
	if err != nil {
		return nil, nil, err
	}
	empty := emptyConfig()
	s := &Sealed{Chunks: chunks}
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
	if err := s.seal(layers, empty.Desc, int(t.Entries), t.Bytes, maxLayers, b.opt.Annotations); err != nil {
		return nil, nil, err
	}
	return s, memo, nil
}

// checkRange checks the entries of x, a run of the walk, as Validate
// checks a whole index (parents are looked up in the walk).
func (b *builder) checkRange(x *Index) error {
	chunks := x.AllChunks()
	if err := checkChunks(chunks); err != nil {
		return err
	}
	isDir := func(p string) bool {
		i := sort.Search(len(b.entries), func(i int) bool { return b.entries[i].Path >= p })
		return i < len(b.entries) && b.entries[i].Path == p && b.entries[i].Type == TypeDir
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

// memoPiece describes the piece of entries [lo, hi) of the walk for the
// memo.
func (b *builder) memoPiece(lo, hi int, ref PieceRef, chunks []Chunk) memoPiece {
	p := memoPiece{ref: ref, sum: entriesSum(b.entries[lo:hi]), chunks: chunks, flags: memoTrusted}
	since := b.opt.Cache.since
	for i := lo; i < hi; i++ {
		if e := &b.entries[i]; e.Type == TypeFile && (e.Stat.Mtime >= since || e.Stat.Ctime >= since) {
			p.flags &^= memoTrusted // may still change within the clock's resolution
			break
		}
	}
	// A piece with no small file leaves packs as the piece before did.
	closed := b.memoCleanBefore
	for i := lo; i < hi; i++ {
		if b.smallPacked(i) {
			closed = b.results[i].closes
		}
	}
	if closed {
		p.flags |= memoCleanEnd
	}
	b.memoCleanBefore = closed
	return p
}

// writeMemo keeps the memo of the version s sealed (the one pushReusing
// built, or one of every piece of s), or drops the memo when this push
// keeps none. A memo that cannot be written is dropped: it only saves
// work.
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
		b.memoCleanBefore = true
		start := 0
		for k, end := range s.pieceEnds {
			m.pieces = append(m.pieces, b.memoPiece(start, end, s.pieceRefs[k], pieceChunks(s.Index, start, end)))
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
