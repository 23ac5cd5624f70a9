package layout

import (
	"fmt"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// What a writer of versions (the push engine) builds a version with: an
// index assembled entry by entry in its compact form, and a version 2
// version sealed piece by piece, some pieces taken from the version
// before unchanged.

// IndexBuilder assembles an index entry by entry, in its compact form (a
// million entries are not held as Files first). Its chunk table lists
// chunks in order of first use.
type IndexBuilder struct {
	x   *Index
	ent *entries
	ch  *chunkTable
}

// NewIndexBuilder returns a builder of an index of format version and
// chunking parameters p, sized for n entries.
func NewIndexBuilder(version int, p Params, n int) *IndexBuilder {
	ent := newEntries(n)
	return &IndexBuilder{x: &Index{Version: version, Chunking: p, ent: ent}, ent: ent, ch: newChunkTable(false)}
}

// ChunkNumber returns the number of c in the index's chunk table, adding
// it first if it is not there.
func (b *IndexBuilder) ChunkNumber(c Chunk) (int, error) {
	sum, ok := SHA256Sum(c.Digest)
	if !ok {
		return 0, invalid("chunk %s: bad digest", c.Digest)
	}
	if k, ok := b.ch.lookup(&sum); ok {
		return k, nil
	}
	if err := b.ch.add(c); err != nil {
		return 0, err
	}
	return b.ch.len() - 1, nil
}

// Add appends entry f, whose extents name chunks by ChunkNumber; it keeps
// no reference to f.
func (b *IndexBuilder) Add(f *File) error { return b.ent.add(f) }

// Index returns the index built, not checked (Validate checks it).
func (b *IndexBuilder) Index() *Index {
	if b.ch.len() > 0 {
		b.x.ch = b.ch
	}
	return b.x
}

// Compact moves x into its compact form and lets go of what only building
// it needed (the chunk lookup), as an index is held once sealed.
func (x *Index) Compact() error { return x.compact(false) }

// ValidateRun checks the entries of x, a run of a version's entries, as
// Validate checks a whole index; isDir reports whether a path outside the
// run is a directory of the version.
func (x *Index) ValidateRun(isDir func(p string) bool) error {
	chunks := x.AllChunks()
	if err := CheckChunks(chunks); err != nil {
		return err
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

// Files returns the number of entries of the sealed version.
func (s *Sealed) Files() int { return s.files }

// Bytes returns the bytes of the sealed version's regular files.
func (s *Sealed) Bytes() int64 { return s.bytes }

// PieceEnds returns where the index pieces of a version 2 version end
// (exclusive entry numbers), when it was sealed from a whole index.
func (s *Sealed) PieceEnds() []int { return s.pieceEnds }

// PieceRefs returns the references of the index pieces of a version 2
// version.
func (s *Sealed) PieceRefs() []PieceRef { return s.pieceRefs }

// Reused returns how many of PieceRefs a PieceSealer took from the
// version before.
func (s *Sealed) Reused() int { return s.reused }

// PieceSealer seals a version 2 version from its pieces in entry order,
// each encoded anew from a run of entries or taken unchanged from the
// version before (whose blobs are stored already). It gives the version
// sealing the whole index gives, with the same digest, when the runs are
// the pieces CutPieces cuts.
type PieceSealer struct {
	chunking Params
	spill    *Spill
	refs     []PieceRef
	blobs    []Blob
	chunks   []ocispec.Descriptor
	seen     map[digest.Digest]bool
	reused   int
}

// NewPieceSealer returns a sealer of a version of chunking parameters p;
// with spill, the pieces it encodes are written there, not held.
func NewPieceSealer(p Params, spill *Spill) *PieceSealer {
	return &PieceSealer{chunking: p, spill: spill, seen: map[digest.Digest]bool{}}
}

func (p *PieceSealer) addChunks(cs []Chunk) {
	for _, c := range cs {
		if !p.seen[c.Digest] {
			p.seen[c.Digest] = true
			p.chunks = append(p.chunks, c.Descriptor())
		}
	}
}

// Reuse appends a piece of the version before: its reference and its
// chunk table.
func (p *PieceSealer) Reuse(ref PieceRef, chunks []Chunk) {
	p.reused++
	p.refs = append(p.refs, ref)
	p.addChunks(chunks)
}

// Encode appends the entries of x (checked: ValidateRun) as one piece and
// returns its reference and its chunk table.
func (p *PieceSealer) Encode(x *Index) (PieceRef, []Chunk, error) {
	data, ref, cs, err := encodePiece(x, 0, x.Len())
	if err != nil {
		return PieceRef{}, nil, err
	}
	bl, err := p.spill.blob(data)
	if err != nil {
		return PieceRef{}, nil, err
	}
	p.blobs = append(p.blobs, bl)
	p.refs = append(p.refs, ref)
	p.addChunks(cs)
	return ref, cs, nil
}

// Seal seals the version of the pieces appended, which must hold entries
// entries, with at most maxLayers layers per manifest (<= 0:
// DefaultMaxLayers) and the root annotations extra.
func (p *PieceSealer) Seal(entries int, maxLayers int, extra map[string]string) (*Sealed, error) {
	t := topIndex{Version: FormatVersion, Chunking: p.chunking, Piecing: DefaultPieceParams,
		Chunks: int64(len(p.chunks)), Pieces: p.refs}
	if t.Pieces == nil {
		t.Pieces = []PieceRef{}
	}
	for _, r := range p.refs {
		t.Entries += r.Entries
		t.Bytes += r.Bytes
	}
	if t.Entries != int64(entries) {
		return nil, fmt.Errorf("layout: pieces hold %d entries, the walk %d", t.Entries, entries)
	}
	if t.Entries > MaxEntries || t.Chunks > MaxChunks {
		return nil, invalid("%d entries and %d chunks exceed the limits", t.Entries, t.Chunks)
	}
	top, err := encodeTop(&t)
	if err != nil {
		return nil, err
	}
	empty := emptyConfig()
	s := &Sealed{Chunks: p.chunks, pieceRefs: p.refs, reused: p.reused}
	s.Blobs = append(append([]Blob{blobOf(MediaTypeIndexV2, top)}, p.blobs...), empty)
	layers := make([]ocispec.Descriptor, 0, 1+len(p.refs))
	layers = append(layers, s.Blobs[0].Desc)
	for _, r := range p.refs {
		layers = append(layers, ocispec.Descriptor{MediaType: MediaTypePiece, Digest: r.Digest, Size: r.Size})
	}
	if maxLayers <= 0 {
		maxLayers = DefaultMaxLayers
	}
	if maxLayers < 2 {
		return nil, fmt.Errorf("layout: max layers must be at least 2")
	}
	if err := s.seal(layers, empty.Desc, int(t.Entries), t.Bytes, maxLayers, extra); err != nil {
		return nil, err
	}
	return s, nil
}
