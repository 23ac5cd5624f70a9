package layout

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/opencontainers/go-digest"
)

// Format version 2 stores the file index in pieces: the sorted entries are
// cut into runs whose ends depend on the entries' paths only, each run is a
// blob with its own chunk table, and a small top-level index lists the
// pieces. A changed file changes the piece around it and the top-level
// index; every other piece is the same blob as before and is not uploaded
// again.

// Limits of a version 2 index, enforced before anything is held.
const (
	MaxTopIndexBytes = 16 << 20      // largest top-level index blob accepted
	MaxPieceBytes    = MaxIndexBytes // largest index piece accepted
)

// PieceParams are the parameters a writer cuts the entries into pieces
// with; readers do not depend on them.
type PieceParams struct {
	Min      int   `json:"min"`      // entries before a cut may happen
	Avg      int   `json:"avg"`      // about the average entries per piece
	Max      int   `json:"max"`      // entries after which a cut always happens
	MaxBytes int64 `json:"maxBytes"` // estimated bytes after which a cut always happens
}

// DefaultPieceParams give pieces of about 500 entries (50–150 KB for small files).
var DefaultPieceParams = PieceParams{Min: 128, Avg: 512, Max: 2048, MaxBytes: 512 << 10}

// topIndex is the top-level index blob of format version 2.
type topIndex struct {
	Version  int         `json:"version"`
	Chunking Params      `json:"chunking"`
	Piecing  PieceParams `json:"piecing"`
	Entries  int64       `json:"entries"`
	Bytes    int64       `json:"bytes"`
	Chunks   int64       `json:"chunks"`
	Pieces   []PieceRef  `json:"pieces"`
	// Deltas is the delta table of a version 3 index; nil in version 2.
	Deltas *DeltaRef `json:"deltas,omitempty"`
}

// PieceRef describes one piece of a version 2 index.
type PieceRef struct {
	Digest  digest.Digest `json:"digest"`
	Size    int64         `json:"size"`
	First   string        `json:"first"`   // path of its first entry
	Entries int64         `json:"entries"` // number of entries
	Bytes   int64         `json:"bytes"`   // bytes of its regular files
}

// piece is one piece blob: its chunk table (in order of first use in the
// piece) and its entries, whose extents name chunks of that table.
type piece struct {
	Chunks []Chunk `json:"chunks"`
	Files  []File  `json:"files"`
}

// canonicalJSON encodes v as the format's JSON: no insignificant
// whitespace, HTML characters not escaped.
func canonicalJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// pathHash is the first 8 bytes of SHA-256(path), big endian.
func pathHash(p string) uint64 {
	h := sha256.Sum256([]byte(p))
	return binary.BigEndian.Uint64(h[:8])
}

// chunkCost estimates the encoded bytes of a chunk in a piece's table.
const chunkCost = 240

// PieceEntry is what the piecing rule reads of an entry.
type PieceEntry struct {
	Path, Target string
	DigestLen    int // bytes of its digest as encoded; 0 for a directory or symlink
	Extents      int // number of extents
}

// cost estimates the encoded bytes of an entry, for the byte limit of a
// piece; it is a function of the entry only.
func (e *PieceEntry) cost() int64 {
	return int64(64 + len(e.Path) + len(e.Target) + e.DigestLen + 24*e.Extents)
}

// PieceRun is a sorted run of entries as the piecing rule reads them: an
// index sealed whole, or a push's walk sealed piece by piece. K names a
// chunk within the run: two extents of one chunk give equal keys.
type PieceRun[K comparable] interface {
	Len() int
	// PieceEntry returns entry i, calling chunk with the key of the chunk
	// of each of its extents.
	PieceEntry(i int, chunk func(K)) PieceEntry
}

// CutPieces returns the ends (exclusive entry numbers) of the pieces the
// entries of r are cut into, and whether the last piece ended by the
// cutting rule (not because the entries ran out). A piece ends after an
// entry whose path hashes under a threshold (once it holds pp.Min
// entries), or at pp.Max entries, or at about pp.MaxBytes encoded bytes:
// the same entries give the same pieces, whoever cuts them.
func CutPieces[K comparable](r PieceRun[K], pp PieceParams) ([]int, bool) {
	var threshold uint64 = ^uint64(0)
	if pp.Avg > pp.Min {
		threshold = ^uint64(0) / uint64(pp.Avg-pp.Min)
	}
	var ends []int
	n, cost := 0, int64(0)
	seen := map[K]bool{}
	chunk := func(k K) {
		if !seen[k] {
			seen[k] = true
			cost += chunkCost
		}
	}
	for i := range r.Len() {
		e := r.PieceEntry(i, chunk)
		n++
		cost += e.cost()
		if n >= pp.Max || cost >= pp.MaxBytes || (n >= pp.Min && pathHash(e.Path) < threshold) {
			ends = append(ends, i+1)
			n, cost = 0, 0
			clear(seen)
		}
	}
	if n > 0 {
		ends = append(ends, r.Len())
		return ends, false
	}
	return ends, true
}

// indexRun is an index as the piecing rule reads it, chunks named by
// their numbers.
type indexRun struct{ x *Index }

func (r indexRun) Len() int { return r.x.Len() }

func (r indexRun) PieceEntry(i int, chunk func(int)) PieceEntry {
	f := r.x.File(i)
	for _, e := range f.Extents {
		chunk(e.Chunk)
	}
	return PieceEntry{Path: f.Path, Target: f.Target, DigestLen: len(f.Digest), Extents: len(f.Extents)}
}

// cutPieces returns the ends (exclusive entry indices) of the pieces of x.
func cutPieces(x *Index, pp PieceParams) []int {
	ends, _ := CutPieces[int](indexRun{x}, pp)
	return ends
}

// encodePiece encodes entries [start, end) of x as a piece blob, with its
// reference and its chunk table (in order of first use in the piece).
func encodePiece(x *Index, start, end int) ([]byte, PieceRef, []Chunk, error) {
	p := piece{Chunks: []Chunk{}, Files: make([]File, end-start)}
	local := map[int]int{}
	var bytes int64
	for i := start; i < end; i++ {
		f := x.File(i)
		bytes += f.Size
		if len(f.Extents) > 0 {
			exts := make([]Extent, len(f.Extents))
			for k, e := range f.Extents {
				l, ok := local[e.Chunk]
				if !ok {
					l = len(p.Chunks)
					local[e.Chunk] = l
					p.Chunks = append(p.Chunks, x.Chunk(e.Chunk))
				}
				exts[k] = Extent{Chunk: l, Offset: e.Offset, Length: e.Length}
			}
			f.Extents = exts
		}
		p.Files[i-start] = f
	}
	b, err := canonicalJSON(p)
	if err != nil {
		return nil, PieceRef{}, nil, err
	}
	if len(b) > MaxPieceBytes {
		return nil, PieceRef{}, nil, fmt.Errorf("layout: index piece of %d bytes at %q exceeds %d", len(b), p.Files[0].Path, MaxPieceBytes)
	}
	ref := PieceRef{Digest: digest.FromBytes(b), Size: int64(len(b)), First: p.Files[0].Path, Entries: int64(end - start), Bytes: bytes}
	return b, ref, p.Chunks, nil
}

// encodeV2 returns the top-level index and the pieces of x in format
// version 2.
func encodeV2(x *Index, pp PieceParams) (top []byte, pieces [][]byte, err error) {
	top, _, _, err = encodeV2Pieces(x, pp, func(b []byte) error {
		pieces = append(pieces, b)
		return nil
	})
	return top, pieces, err
}

// encodeV2Pieces is encodeV2 handing each piece to piece as it is
// encoded, and returning where each piece ends (an exclusive entry
// number) and the pieces' references.
func encodeV2Pieces(x *Index, pp PieceParams, piece func([]byte) error) (top []byte, ends []int, refs []PieceRef, err error) {
	if err := x.Validate(); err != nil {
		return nil, nil, nil, err
	}
	t := topIndex{Version: FormatVersion, Chunking: x.Chunking, Piecing: pp,
		Entries: int64(x.Len()), Bytes: x.Bytes(), Chunks: int64(x.NumChunks()), Pieces: []PieceRef{}}
	start := 0
	ends = cutPieces(x, pp)
	for _, end := range ends {
		b, ref, _, err := encodePiece(x, start, end)
		if err != nil {
			return nil, nil, nil, err
		}
		if err := piece(b); err != nil {
			return nil, nil, nil, err
		}
		t.Pieces = append(t.Pieces, ref)
		start = end
	}
	top, err = encodeTop(&t)
	return top, ends, t.Pieces, err
}

// encodeTop encodes a top-level index, within its limit.
func encodeTop(t *topIndex) ([]byte, error) {
	top, err := canonicalJSON(t)
	if err != nil {
		return nil, err
	}
	if len(top) > MaxTopIndexBytes {
		return nil, fmt.Errorf("layout: top-level index of %d bytes exceeds %d", len(top), MaxTopIndexBytes)
	}
	return top, nil
}

// strictDecode decodes b into v refusing unknown fields and trailing data,
// then checks that b is v's canonical encoding.
func strictDecode(b []byte, v any, what string) error {
	// A canonical encoding has no unknown field and no trailing data, so
	// json.Unmarshal, which holds no copy of b, decodes it to what the
	// strict decoder would. Anything else is decoded again strictly, for
	// the error.
	if json.Unmarshal(b, v) == nil && canonicalIs(v, b) {
		return nil
	}
	reflect.ValueOf(v).Elem().SetZero()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInvalidIndex, what, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: %s: trailing data", ErrInvalidIndex, what)
	}
	c, err := canonCompare(v, b)
	if err != nil {
		return err
	}
	if at, ok := c.result(); !ok {
		return fmt.Errorf("%w: %s not in the canonical encoding (differs at byte %d)", ErrInvalidIndex, what, at)
	}
	return nil
}

// canonCompare compares the canonical encoding of v with b as it is
// written, without holding it.
func canonCompare(v any, b []byte) (*canonCheck, error) {
	c := &canonCheck{b: b, at: -1}
	enc := json.NewEncoder(c)
	enc.SetEscapeHTML(false)
	return c, enc.Encode(v)
}

// canonicalIs reports whether b is the canonical encoding of v.
func canonicalIs(v any, b []byte) bool {
	c, err := canonCompare(v, b)
	_, ok := c.result()
	return err == nil && ok
}

// canonCheck compares what a json.Encoder writes, less its final newline,
// with b.
type canonCheck struct {
	b  []byte
	n  int // bytes written
	at int // the first written byte that differs from b, -1 while none
}

func (c *canonCheck) Write(p []byte) (int, error) {
	for i := 0; c.at < 0 && i < len(p); i++ {
		if pos := c.n + i; pos >= len(c.b) || c.b[pos] != p[i] {
			c.at = pos
		}
	}
	c.n += len(p)
	return len(p), nil
}

// result reports whether the encoding was b and, if not, the first byte at
// which they differ (or the length of the shorter).
func (c *canonCheck) result() (int, bool) {
	end := c.n - 1 // the length of the encoding
	if c.at >= 0 && c.at < end {
		return c.at, false
	}
	return min(end, len(c.b)), end == len(c.b)
}

// decodeTop parses and checks a top-level index of format version 2.
func decodeTop(b []byte) (*topIndex, error) {
	if len(b) > MaxTopIndexBytes {
		return nil, invalid("top-level index of %d bytes exceeds the limit", len(b))
	}
	var t topIndex
	if err := strictDecode(b, &t, "top-level index"); err != nil {
		return nil, err
	}
	switch {
	case t.Version == FormatVersion && t.Deltas == nil:
	case (t.Version == FormatVersion3 || t.Version == FormatVersion4) && t.Deltas != nil:
		d := t.Deltas
		if !IsSHA256(d.Digest) || d.Size <= 0 || d.Size > MaxDeltaTableBytes || d.Count <= 0 || d.Count > t.Chunks {
			return nil, invalid("top-level index: bad delta table reference (%d bytes, %d deltas)", d.Size, d.Count)
		}
	case t.Version > FormatVersion4:
		return nil, invalid("top-level index of format version %d, newer than this bdnvol reads (up to %d): upgrade bdnvol", t.Version, FormatVersion4)
	default:
		return nil, invalid("top-level index of version %d", t.Version)
	}
	if t.Entries < 0 || t.Entries > MaxEntries || t.Chunks < 0 || t.Chunks > MaxChunks || t.Bytes < 0 {
		return nil, invalid("top-level index totals out of range (%d entries, %d chunks, %d bytes)", t.Entries, t.Chunks, t.Bytes)
	}
	var entries, total int64
	for i, p := range t.Pieces {
		if p.Digest.Validate() != nil || p.Digest.Algorithm() != digest.SHA256 {
			return nil, invalid("piece %d: bad digest %q", i, p.Digest)
		}
		if p.Size <= 0 || p.Size > MaxPieceBytes {
			return nil, invalid("piece %s: bad size %d", p.Digest, p.Size)
		}
		if p.Entries <= 0 || p.Entries > MaxEntries || p.Bytes < 0 {
			return nil, invalid("piece %s: %d entries, %d bytes", p.Digest, p.Entries, p.Bytes)
		}
		if err := CheckPath(p.First); err != nil {
			return nil, invalid("piece %s: first path: %v", p.Digest, err)
		}
		if i > 0 && p.First <= t.Pieces[i-1].First {
			return nil, invalid("piece %s: first path %q not after %q", p.Digest, p.First, t.Pieces[i-1].First)
		}
		entries += p.Entries
		total += p.Bytes
		if entries > t.Entries || total < 0 || total > t.Bytes {
			return nil, invalid("pieces hold more than the %d entries and %d bytes of the index", t.Entries, t.Bytes)
		}
	}
	if entries != t.Entries || total != t.Bytes {
		return nil, invalid("pieces hold %d entries and %d bytes, the index says %d and %d", entries, total, t.Entries, t.Bytes)
	}
	return &t, nil
}

// v2Reader assembles an Index from its pieces, checking each piece as it
// comes against the top-level index and the pieces before it.
type v2Reader struct {
	top  *topIndex
	x    *Index
	next int // index of the next piece
}

// newV2Reader reads an index whose top-level index is top, keeping the
// chunks' edge digests unless skipEdges.
func newV2Reader(top *topIndex, skipEdges bool) *v2Reader {
	return &v2Reader{
		top: top,
		x: &Index{Version: FormatVersion, Chunking: top.Chunking, ent: newEntries(int(min(top.Entries, 1<<20))),
			ch: newChunkTable(skipEdges)},
	}
}

// add decodes, checks and appends the next piece.
func (r *v2Reader) add(b []byte) error {
	ref := r.top.Pieces[r.next]
	var p piece
	if err := strictDecode(b, &p, "piece "+ref.Digest.String()); err != nil {
		return err
	}
	if int64(len(p.Files)) != ref.Entries {
		return invalid("piece %s holds %d entries, the index says %d", ref.Digest, len(p.Files), ref.Entries)
	}
	if p.Files[0].Path != ref.First {
		return invalid("piece %s starts at %q, the index says %q", ref.Digest, p.Files[0].Path, ref.First)
	}
	if len(p.Chunks) > MaxChunks {
		return invalid("piece %s: %d chunks", ref.Digest, len(p.Chunks))
	}
	if err := CheckChunks(p.Chunks); err != nil {
		return fmt.Errorf("piece %s: %w", ref.Digest, err)
	}
	// Chunks are listed in order of first use in the piece, each used;
	// global[l] is the index's number of the piece's chunk l.
	global := make([]int, 0, len(p.Chunks))
	var bytes int64
	x := r.x
	ent, ch := x.ent, x.ch
	for i := range p.Files {
		f := &p.Files[i]
		n := ent.len()
		prev := ""
		if n > 0 {
			prev = ent.path(n - 1)
		}
		if err := checkEntry(n, f, prev, p.Chunks, ent.isDir); err != nil {
			return fmt.Errorf("piece %s: %w", ref.Digest, err)
		}
		bytes += f.Size
		for k, e := range f.Extents {
			if e.Chunk > len(global) {
				return invalid("piece %s: %q uses chunk %d before chunk %d", ref.Digest, f.Path, e.Chunk, len(global))
			}
			if e.Chunk == len(global) {
				c := p.Chunks[e.Chunk]
				sum, _ := SHA256Sum(c.Digest) // checked by checkChunks
				g, ok := ch.lookup(&sum)
				if !ok {
					if ch.len() >= MaxChunks {
						return invalid("more than %d chunks", MaxChunks)
					}
					g = ch.len()
					if err := ch.add(c); err != nil {
						return err
					}
				} else if !ch.equal(g, c) {
					return invalid("piece %s: chunk %s differs from its earlier listing", ref.Digest, c.Digest)
				}
				global = append(global, g)
			}
			f.Extents[k].Chunk = global[e.Chunk]
		}
		if err := ent.add(f); err != nil {
			return err
		}
	}
	if len(global) != len(p.Chunks) {
		return invalid("piece %s lists %d chunks and uses %d", ref.Digest, len(p.Chunks), len(global))
	}
	if bytes != ref.Bytes {
		return invalid("piece %s holds %d bytes, the index says %d", ref.Digest, bytes, ref.Bytes)
	}
	r.next++
	return nil
}

// done checks that every piece was read and the totals match.
func (r *v2Reader) done() (*Index, error) {
	if r.next != len(r.top.Pieces) {
		return nil, invalid("%d of %d index pieces", r.next, len(r.top.Pieces))
	}
	if int64(r.x.ch.len()) != r.top.Chunks {
		return nil, invalid("pieces name %d chunks, the index says %d", r.x.ch.len(), r.top.Chunks)
	}
	r.x.pieces = r.top.Pieces
	return r.x, nil
}

// DecodeIndexV2 decodes a version 2 index from its top-level blob and its
// pieces in order, checking them as Open does. It is for tools and tests
// that hold the blobs; Open reads them from a store.
func DecodeIndexV2(top []byte, pieces [][]byte) (*Index, error) {
	t, err := decodeTop(top)
	if err != nil {
		return nil, err
	}
	if len(pieces) != len(t.Pieces) {
		return nil, invalid("%d pieces for the %d the index lists", len(pieces), len(t.Pieces))
	}
	r := newV2Reader(t, false)
	for i, b := range pieces {
		if digest.FromBytes(b) != t.Pieces[i].Digest || int64(len(b)) != t.Pieces[i].Size {
			return nil, invalid("piece %d does not match %s", i, t.Pieces[i].Digest)
		}
		if err := r.add(b); err != nil {
			return nil, err
		}
	}
	return r.done()
}

// Pieces returns the piece references of an index opened from a version 2
// version, in entry order (nil for any other): piece k holds the entries
// after those of the pieces before it.
func (x *Index) Pieces() []PieceRef { return x.pieces }
