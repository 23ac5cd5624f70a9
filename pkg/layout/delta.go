package layout

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Format version 3 is version 2 plus chunks stored as deltas: a chunk of a
// version may be stored as the XOR of its bytes with a chunk of the same
// size of another version (its base), split into byte planes and
// compressed with zstd. The pieces still name every chunk by its plain
// digest, which readers verify; a delta table, one more blob, says which
// chunks are deltas, of which base.

// Media types of format version 3.
const (
	// MediaTypeIndexV3 is the media type of the top-level file index of
	// format version 3 (version 2 with a delta table).
	MediaTypeIndexV3 = "application/vnd.bdnvol.index.v3+json"
	// MediaTypeDeltas is the media type of the delta table of a version 3
	// index.
	MediaTypeDeltas = "application/vnd.bdnvol.deltas.v3+json"
	// MediaTypeChunkDelta is the media type of a chunk stored as a delta.
	MediaTypeChunkDelta = "application/vnd.bdnvol.chunk.delta.v1"
)

// FormatVersion3 is the format of a version with delta chunks: version 2's
// index plus a delta table.
const FormatVersion3 = 3

// MaxDeltaTableBytes bounds the delta table blob a reader accepts.
const MaxDeltaTableBytes = 1 << 30

// ErrDelta is wrapped when a delta chunk cannot be decoded, or decodes to
// bytes that are not its chunk.
var ErrDelta = errors.New("layout: bad delta chunk")

// Delta says that a chunk of a version is stored as a delta blob against a
// base chunk (a plain chunk of the same size).
type Delta struct {
	Chunk     digest.Digest `json:"chunk"`     // the plain chunk: what readers verify
	Size      int64         `json:"size"`      // its size, and its base's
	Digest    digest.Digest `json:"digest"`    // the delta blob
	DeltaSize int64         `json:"deltaSize"` // the delta blob's size
	Base      digest.Digest `json:"base"`      // the base chunk, stored plain
	// Format is the format version the delta blob needs, not part of the
	// delta table: FormatVersion3 for a "BDX1" blob, FormatVersion4 (or 0)
	// for one that may be of the sparse encoding. A writer sets it with
	// DeltaFormat; a reader sets it to its index's format version.
	Format int `json:"-"`
}

// Descriptor returns the descriptor of the delta blob, a layer of the
// version.
func (d Delta) Descriptor() ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: MediaTypeChunkDelta, Digest: d.Digest, Size: d.DeltaSize}
}

// BaseDescriptor returns the descriptor of the base chunk.
func (d Delta) BaseDescriptor() ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: MediaTypeChunk, Digest: d.Base, Size: d.Size}
}

// deltaTable is the delta table blob: the delta chunks in the order of the
// version's chunk list.
type deltaTable struct {
	Deltas []Delta `json:"deltas"`
}

// DeltaRef is the top-level index's reference to the delta table.
type DeltaRef struct {
	Digest digest.Digest `json:"digest"`
	Size   int64         `json:"size"`
	Count  int64         `json:"count"` // delta chunks
}

// Planes of a delta: how the XOR of a chunk with its base is split into
// byte planes before compression. Elements are little endian: with 2
// planes, plane 1 holds the high byte of each 16-bit value (bf16 and fp16:
// the sign and most of the exponent), plane 0 the low byte (the mantissa).
const (
	PlanesRaw = 1 // plain XOR (other dtypes, raw files)
	Planes16  = 2 // bf16, fp16
	Planes32  = 4 // fp32
)

// deltaMagic starts every delta blob; the byte after it is the planes.
var deltaMagic = [4]byte{'B', 'D', 'X', '1'}

const deltaHeader = len(deltaMagic) + 1

var (
	encPool = sync.Pool{New: func() any {
		e, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1), zstd.WithLowerEncoderMem(true), zstd.WithEncoderCRC(false))
		return e
	}}
	// decPools hold decoders by size class: class c decodes at most 2^c
	// bytes, so a delta never makes a reader hold more than twice what it
	// decodes (a chunk, or a sparse plane of at most 1.15 times it).
	decPools [30]sync.Pool
)

// decoderPool returns the pool of decoders of the size class of size (at
// least 1 MiB, at most 2 × MaxChunkBytes).
func decoderPool(size int64) *sync.Pool {
	c := 20
	for int64(1)<<c < size {
		c++
	}
	return &decPools[c]
}

func init() {
	for c := range decPools {
		limit := uint64(1) << c
		decPools[c].New = func() any {
			d, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(limit), zstd.WithDecoderMaxWindow(max(limit, zstd.MinWindowSize)))
			return d
		}
	}
}

// EncodeDelta returns the delta blob of plain against base (of the same
// length), its XOR split into planes (PlanesRaw, Planes16 or Planes32):
// of the sparse encoding ("BDX2", format version 4) when a plane is
// smaller in sparse form, else a "BDX1" blob (DeltaFormat tells which).
func EncodeDelta(plain, base []byte, planes int) ([]byte, error) {
	return encodeDelta(plain, base, planes, true)
}

// encodeDelta is EncodeDelta; without sparse it writes a "BDX1" blob.
func encodeDelta(plain, base []byte, planes int, sparse bool) ([]byte, error) {
	if len(plain) != len(base) {
		return nil, fmt.Errorf("layout: delta of %d bytes against a base of %d", len(plain), len(base))
	}
	if planes != PlanesRaw && planes != Planes16 && planes != Planes32 {
		return nil, fmt.Errorf("layout: %d delta planes", planes)
	}
	x := make([]byte, len(plain))
	split(x, plain, base, planes)
	enc := encPool.Get().(*zstd.Encoder)
	defer encPool.Put(enc)
	if sparse {
		if out := encodeSparse(enc, x, planes); out != nil {
			return out, nil
		}
	}
	out := make([]byte, deltaHeader, deltaHeader+len(plain)/8)
	copy(out, deltaMagic[:])
	out[len(deltaMagic)] = byte(planes)
	return enc.EncodeAll(x, out), nil
}

// split writes to dst the XOR of a and b, byte i of every element to plane
// i (planes one after another; the bytes after the last whole element go
// to the end as they are).
func split(dst, a, b []byte, planes int) {
	n := len(a)
	if planes == PlanesRaw {
		for i := range n {
			dst[i] = a[i] ^ b[i]
		}
		return
	}
	m := n / planes
	for p := range planes {
		d := dst[p*m : (p+1)*m]
		for i := range d {
			j := i*planes + p
			d[i] = a[j] ^ b[j]
		}
	}
	for j := m * planes; j < n; j++ {
		dst[j] = a[j] ^ b[j]
	}
}

// join undoes split: dst = base XOR the planes x (dst may be base: the
// chunk is then decoded in place).
func join(dst, x, base []byte, planes int) {
	n := len(base)
	dst = dst[:n]
	if n > 0 && &dst[0] != &base[0] {
		copy(dst, base)
	}
	xorPlanes(dst, x, planes)
}

// xorPlanes XORs the planes x into dst (undoing split over dst's bytes; done
// twice, it gives dst back).
func xorPlanes(dst, x []byte, planes int) {
	xorPlanesRange(dst, x, planes, 0, len(dst)/planes)
}

// xorPlanesRange is xorPlanes over elements lo to hi of dst only (lo a
// multiple of 8; hi too unless it is the last element, len(dst)/planes,
// when the bytes after the last whole element are XORed as well), so that
// a reader can XOR in, and hash, a piece of the chunk while it is in the
// processor's cache.
func xorPlanesRange(dst, x []byte, planes, lo, hi int) {
	n := len(dst)
	end := hi * planes
	if hi == n/planes {
		end = n
	}
	xorPlanesWindow(dst[lo*planes:end], x[:n], planes, lo, hi)
}

// xorPlanesWindow XORs elements lo to hi of the planes x (of a whole
// chunk of len(x) bytes) into win, which holds those elements only (win[0]
// is byte 0 of element lo), and the bytes after the last whole element
// when hi is the last element; lo is a multiple of 8, hi too unless it is
// the last element. It XORs in only the words of x that are not zero (most
// of them are, in the delta of a small step), 8 elements of every plane at
// a time.
func xorPlanesWindow(win, x []byte, planes, lo, hi int) {
	n := len(x)
	m := n / planes
	i := lo
	switch planes {
	case PlanesRaw:
		for ; i+8 <= hi; i += 8 {
			if w := binary.LittleEndian.Uint64(x[i:]); w != 0 {
				d := win[i-lo : i-lo+8]
				binary.LittleEndian.PutUint64(d, w^binary.LittleEndian.Uint64(d))
			}
		}
	case Planes16:
		p0, p1 := x[:m], x[m:2*m]
		// Eight elements at a time: the bytes of each plane spread to
		// every other byte of two words.
		for ; i+8 <= hi; i += 8 {
			a := binary.LittleEndian.Uint64(p0[i:])
			b := binary.LittleEndian.Uint64(p1[i:])
			if a|b == 0 {
				continue
			}
			d := win[2*(i-lo) : 2*(i-lo)+16]
			w0 := spread16(uint32(a)) | spread16(uint32(b))<<8
			w1 := spread16(uint32(a>>32)) | spread16(uint32(b>>32))<<8
			binary.LittleEndian.PutUint64(d[:8], w0^binary.LittleEndian.Uint64(d[:8]))
			binary.LittleEndian.PutUint64(d[8:], w1^binary.LittleEndian.Uint64(d[8:]))
		}
	case Planes32:
		p0, p1, p2, p3 := x[:m], x[m:2*m], x[2*m:3*m], x[3*m:4*m]
		// Eight elements at a time; only a group with a changed byte is
		// joined, a byte at a time.
		for ; i+8 <= hi; i += 8 {
			if binary.LittleEndian.Uint64(p0[i:])|binary.LittleEndian.Uint64(p1[i:])|
				binary.LittleEndian.Uint64(p2[i:])|binary.LittleEndian.Uint64(p3[i:]) == 0 {
				continue
			}
			d := win[4*(i-lo) : 4*(i-lo)+32]
			for e := range 8 {
				d[4*e] ^= p0[i+e]
				d[4*e+1] ^= p1[i+e]
				d[4*e+2] ^= p2[i+e]
				d[4*e+3] ^= p3[i+e]
			}
		}
	}
	for ; i < hi; i++ {
		for p := range planes {
			win[(i-lo)*planes+p] ^= x[p*m+i]
		}
	}
	if hi == m {
		for j := m * planes; j < n; j++ {
			win[j-lo*planes] ^= x[j]
		}
	}
}

// spread16 puts byte i of v at byte 2i of the result.
func spread16(v uint32) uint64 {
	x := uint64(v)
	x = (x | x<<16) & 0x0000ffff0000ffff
	x = (x | x<<8) & 0x00ff00ff00ff00ff
	return x
}

// DecodeDelta returns the chunk the delta blob delta encodes against base,
// which must be size bytes; it decodes at most size bytes (a delta that
// holds more, or fewer, is refused with ErrDelta). The caller verifies the
// result against the chunk's digest.
func DecodeDelta(delta, base []byte, size int64) ([]byte, error) {
	return DecodeDeltaTo(nil, delta, base, size)
}

// DecodeDeltaTo is DecodeDelta writing the chunk to dst's storage when it
// holds size bytes (else to a new slice), which it returns. dst may be
// base itself: the chunk is then decoded in place, over the base.
func DecodeDeltaTo(dst, delta, base []byte, size int64) ([]byte, error) {
	if int64(len(base)) != size {
		return nil, fmt.Errorf("%w: a base of %d bytes for a chunk of %d", ErrDelta, len(base), size)
	}
	xd, err := decodeX(delta, size, true)
	if err != nil {
		return nil, err
	}
	defer xd.release()
	out := dst[:0]
	if int64(cap(out)) < size {
		out = make([]byte, size)
	}
	out = out[:size]
	if &out[0] != &base[0] {
		copy(out, base)
	}
	xd.xorAll(out)
	return out, nil
}

// decodeX decodes the delta blob delta of a chunk of size bytes, into a
// pooled buffer (release it): a "BDX1" blob, or when sparse (the blob is
// of a version of format 4) a "BDX2" one. Anything else is refused with
// ErrDelta.
func decodeX(delta []byte, size int64, sparse bool) (*xdelta, error) {
	if size <= 0 || size > MaxChunkBytes {
		return nil, fmt.Errorf("%w: a chunk of %d bytes", ErrDelta, size)
	}
	if DeltaFormat(delta) == FormatVersion4 {
		if !sparse {
			return nil, fmt.Errorf("%w: a delta of the sparse encoding (format version 4) in a version of format 3", ErrDelta)
		}
		return decodeSparse(delta, size)
	}
	xp, planes, err := decodePlanes(delta, size)
	if err != nil {
		return nil, err
	}
	return &xdelta{size: int(size), planes: planes, m: int(size) / planes, buf: xp, flat: *xp}, nil
}

// decodePlanes decodes the frame of the delta blob delta of a chunk of
// size bytes into a pooled buffer (putBuf it): the XOR of the chunk with
// its base, in planes. It decodes at most size bytes: a frame that holds
// more or fewer is refused with ErrDelta.
func decodePlanes(delta []byte, size int64) (*[]byte, int, error) {
	if size <= 0 || size > MaxChunkBytes {
		return nil, 0, fmt.Errorf("%w: a chunk of %d bytes", ErrDelta, size)
	}
	if len(delta) < deltaHeader || !bytes.Equal(delta[:len(deltaMagic)], deltaMagic[:]) {
		return nil, 0, fmt.Errorf("%w: not a delta blob", ErrDelta)
	}
	planes := int(delta[len(deltaMagic)])
	if planes != PlanesRaw && planes != Planes16 && planes != Planes32 {
		return nil, 0, fmt.Errorf("%w: %d planes", ErrDelta, planes)
	}
	// The frame must say it holds size bytes; the decoder of its size
	// class refuses to produce more than twice that, and anything but size
	// bytes is refused after.
	var h zstd.Header
	if err := h.Decode(delta[deltaHeader:]); err != nil || !h.HasFCS || h.FrameContentSize != uint64(size) {
		return nil, 0, fmt.Errorf("%w: the frame does not hold %d bytes", ErrDelta, size)
	}
	pool := decoderPool(size)
	dec := pool.Get().(*zstd.Decoder)
	defer pool.Put(dec)
	// Into a buffer with room to spare past size: the decoder's fast path.
	xp := getBuf(int(size) + planesSlack)
	x, err := dec.DecodeAll(delta[deltaHeader:], (*xp)[:0])
	switch {
	case err != nil:
		putBuf(xp)
		return nil, 0, fmt.Errorf("%w: %v", ErrDelta, err)
	case int64(len(x)) != size:
		putBuf(xp)
		return nil, 0, fmt.Errorf("%w: decodes to %d bytes, not %d", ErrDelta, len(x), size)
	}
	*xp = x
	return xp, planes, nil
}

// encodeDeltaTable encodes the delta table of ds.
func encodeDeltaTable(ds []Delta) ([]byte, error) {
	b, err := canonicalJSON(deltaTable{Deltas: ds})
	if err != nil {
		return nil, err
	}
	if len(b) > MaxDeltaTableBytes {
		return nil, fmt.Errorf("layout: delta table of %d bytes exceeds %d", len(b), MaxDeltaTableBytes)
	}
	return b, nil
}

// checkDelta checks one entry of a delta table, the chunk's own number
// being k (its size is size, and isDelta tells whether a chunk of the
// version is itself a delta).
func checkDelta(d Delta, size int64, baseIsDelta bool) error {
	if !IsSHA256(d.Chunk) || !IsSHA256(d.Digest) || !IsSHA256(d.Base) {
		return invalid("delta of chunk %q: bad digest", d.Chunk)
	}
	if d.Size != size || d.Size <= 0 || d.Size > MaxChunkBytes {
		return invalid("delta of chunk %s: size %d, the chunk has %d", d.Chunk, d.Size, size)
	}
	if d.DeltaSize < int64(deltaHeader) || d.DeltaSize > d.Size {
		return invalid("delta of chunk %s: a delta of %d bytes", d.Chunk, d.DeltaSize)
	}
	if d.Base == d.Chunk || d.Digest == d.Chunk || d.Digest == d.Base {
		return invalid("delta of chunk %s: its base or delta is the chunk", d.Chunk)
	}
	if baseIsDelta {
		return invalid("delta of chunk %s: its base %s is a delta (a base is stored plain)", d.Chunk, d.Base)
	}
	return nil
}

// indexMediaType returns the media type of a top-level index of format
// version v (2, 3 or 4).
func indexMediaType(v int) string {
	switch v {
	case FormatVersion3:
		return MediaTypeIndexV3
	case FormatVersion4:
		return MediaTypeIndexV4
	}
	return MediaTypeIndexV2
}

// FormatVersion returns the format version of the version x was read
// from: its index's version, or 3 or 4 for one with delta chunks.
func (x *Index) FormatVersion() int {
	if len(x.deltas) > 0 && x.deltas[0].Format != 0 {
		return x.deltas[0].Format
	}
	if len(x.deltas) > 0 {
		return FormatVersion4
	}
	return x.Version
}

// Delta returns the delta chunk k is stored as, if it is one.
func (x *Index) Delta(k int) (Delta, bool) {
	if x.deltaAt == nil {
		return Delta{}, false
	}
	i, ok := x.deltaAt[k]
	if !ok {
		return Delta{}, false
	}
	return x.deltas[i], true
}

// DeltaOf returns the delta the chunk of digest d is stored as, if any.
func (x *Index) DeltaOf(d digest.Digest) (Delta, bool) {
	if x.deltaOf == nil {
		return Delta{}, false
	}
	i, ok := x.deltaOf[d]
	if !ok {
		return Delta{}, false
	}
	return x.deltas[i], true
}

// Deltas returns the delta chunks of the index in chunk order (none for a
// version without deltas).
func (x *Index) Deltas() []Delta { return x.deltas }

// setDeltas sets the deltas of x, in chunk order, whose chunk numbers are
// at.
func (x *Index) setDeltas(ds []Delta, at []int) {
	x.deltas = ds
	x.deltaAt = make(map[int]int, len(ds))
	x.deltaOf = make(map[digest.Digest]int, len(ds))
	for i, d := range ds {
		x.deltaAt[at[i]] = i
		x.deltaOf[d.Chunk] = i
	}
	x.plain = make(map[digest.Digest]bool, x.NumChunks()-len(ds))
	for k := range x.NumChunks() {
		if _, ok := x.deltaAt[k]; !ok {
			x.plain[x.ChunkDigest(k)] = true
		}
	}
}

// Bases returns the descriptors of the base chunks of x's deltas that are
// not chunks of x themselves, each once, in order of first use: the layers
// after the chunk layers, so that the version keeps its bases alive.
func (x *Index) Bases() []ocispec.Descriptor {
	if len(x.deltas) == 0 {
		return nil
	}
	seen := map[digest.Digest]bool{}
	var out []ocispec.Descriptor
	for _, d := range x.deltas {
		if seen[d.Base] || x.hasChunk(d.Base) {
			continue
		}
		seen[d.Base] = true
		out = append(out, d.BaseDescriptor())
	}
	return out
}

// hasChunk reports whether d is a chunk of x, stored plain.
func (x *Index) hasChunk(d digest.Digest) bool {
	if _, ok := x.deltaOf[d]; ok {
		return false
	}
	return x.plain != nil && x.plain[d]
}

// LayerDescriptor returns the layer that stores chunk k: its delta blob for
// a delta chunk, else the chunk.
func (x *Index) LayerDescriptor(k int) ocispec.Descriptor {
	if d, ok := x.Delta(k); ok {
		return d.Descriptor()
	}
	return x.ChunkDescriptor(k)
}

// WithDeltas reseals s, a version 2 version, as format version 3 with the
// chunks of ds stored as deltas (ds by plain chunk digest; chunks of s not
// in ds stay plain, entries of ds not chunks of s are ignored). The layers
// are the top-level index, the pieces, the delta table, then one layer per
// chunk (its delta blob for a delta chunk), then the base chunks that are
// not chunks of the version, each once. Without a delta s is returned as
// it is. maxLayers and extra are as Seal's.
func (s *Sealed) WithDeltas(ds map[digest.Digest]Delta, maxLayers int, extra map[string]string) (*Sealed, error) {
	if len(ds) == 0 || len(s.Blobs) == 0 || s.Blobs[0].Desc.MediaType != MediaTypeIndexV2 {
		return s, nil
	}
	var t topIndex
	if err := strictDecode(s.Blobs[0].Data, &t, "top-level index"); err != nil {
		return nil, err
	}
	plain := make(map[digest.Digest]bool, len(s.Chunks))
	var list []Delta
	for _, c := range s.Chunks {
		if d, ok := ds[c.Digest]; ok && d.Chunk == c.Digest && d.Size == c.Size {
			list = append(list, d)
		} else {
			plain[c.Digest] = true
		}
	}
	if len(list) == 0 {
		return s, nil
	}
	isDelta := make(map[digest.Digest]bool, len(list))
	for _, d := range list {
		isDelta[d.Chunk] = true
	}
	for _, d := range list {
		if err := checkDelta(d, d.Size, isDelta[d.Base]); err != nil {
			return nil, err
		}
	}
	tb, err := encodeDeltaTable(list)
	if err != nil {
		return nil, err
	}
	table := blobOf(MediaTypeDeltas, tb)
	// Format 3 when every delta blob is of the first encoding: a reader of
	// format 3 reads it; else 4, which such a reader refuses.
	t.Version = FormatVersion3
	for _, d := range list {
		if d.Format != FormatVersion3 {
			t.Version = FormatVersion4
		}
	}
	t.Deltas = &DeltaRef{Digest: table.Desc.Digest, Size: table.Desc.Size, Count: int64(len(list))}
	top, err := encodeTop(&t)
	if err != nil {
		return nil, err
	}
	if maxLayers <= 0 {
		maxLayers = DefaultMaxLayers
	}
	n := &Sealed{Index: s.Index, pieceEnds: s.pieceEnds, pieceRefs: s.pieceRefs, reused: s.reused, files: s.files, bytes: s.bytes}
	// Blobs: top-level index, pieces, delta table, empty config.
	n.Blobs = append([]Blob{blobOf(indexMediaType(t.Version), top)}, s.Blobs[1:len(s.Blobs)-1]...)
	n.Blobs = append(n.Blobs, table, s.Blobs[len(s.Blobs)-1])
	layers := make([]ocispec.Descriptor, 0, len(n.Blobs)+len(s.Chunks))
	layers = append(layers, n.Blobs[0].Desc)
	for _, r := range s.pieceRefs {
		layers = append(layers, ocispec.Descriptor{MediaType: MediaTypePiece, Digest: r.Digest, Size: r.Size})
	}
	layers = append(layers, table.Desc)
	n.Chunks = make([]ocispec.Descriptor, 0, len(s.Chunks))
	for _, c := range s.Chunks {
		if d, ok := ds[c.Digest]; ok && d.Chunk == c.Digest && d.Size == c.Size {
			n.Chunks = append(n.Chunks, d.Descriptor())
		} else {
			n.Chunks = append(n.Chunks, c)
		}
	}
	seen := map[digest.Digest]bool{}
	var bases []ocispec.Descriptor
	for _, d := range list {
		if !seen[d.Base] && !plain[d.Base] {
			seen[d.Base] = true
			bases = append(bases, d.BaseDescriptor())
		}
	}
	chunks := len(s.Chunks)
	n.Chunks = append(n.Chunks, bases...)
	n.bases = bases
	if err := n.seal(layers, s.Blobs[len(s.Blobs)-1].Desc, s.files, s.bytes, maxLayers, extra); err != nil {
		return nil, err
	}
	n.Chunks = n.Chunks[:chunks] // the chunk layers; the bases follow them in the manifests
	n.deltas = list
	return n, nil
}
