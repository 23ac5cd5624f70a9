package layout

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"hash/maphash"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// chunkTable is the compact in-memory form of an opened index's chunks:
// digests as bytes, in blocks of a fixed size, so that it grows without
// copying and without trusting a declared count. About 104 bytes a chunk
// with edges (40 when their digests are not kept), against about 300 for
// a []Chunk (three digest strings each).
type chunkTable struct {
	recs [][]chunkRec // blocks of chunkBlock records
	// edges are blocks of chunkBlock edge records: the head and tail
	// digests or, when skipEdges and only while the index is read, a keyed
	// fingerprint of both, which a second listing of the chunk is checked
	// against.
	edges     [][]byte
	skipEdges bool
	key       [sha256Len]byte // the fingerprint's key, at random
	n         int             // chunks
	ne        int             // chunks with edges
	find      chunkSet        // chunk indices by digest, while the index is read
}

// chunkRec is one chunk of a chunkTable.
type chunkRec struct {
	sum  [sha256Len]byte
	size uint32 // chunks are at most MaxChunkBytes
	edge int32  // index of its edge record, -1 without
}

const chunkBlock = 4096

func newChunkTable(skipEdges bool) *chunkTable {
	t := &chunkTable{find: newChunkSet(), skipEdges: skipEdges}
	if skipEdges {
		rand.Read(t.key[:])
	}
	return t
}

func (t *chunkTable) len() int { return t.n }

func (t *chunkTable) rec(k int) *chunkRec { return &t.recs[k/chunkBlock][k%chunkBlock] }

// fingerprintLen is the length of an edge fingerprint: under a secret
// random key, a second listing with other edges matches with probability
// 2^-64.
const fingerprintLen = 8

// edgeLen is the length of an edge record.
func (t *chunkTable) edgeLen() int {
	if t.skipEdges {
		return fingerprintLen
	}
	return 2 * sha256Len
}

// appendEdgeRecord appends to dst the edge record of c, which has edges:
// the bytes of its head and tail digests or, when skipEdges, the first
// fingerprintLen bytes of the SHA-256 of the key and both.
func (t *chunkTable) appendEdgeRecord(dst []byte, c Chunk) ([]byte, bool) {
	h, ok1 := SHA256Sum(c.Head)
	tl, ok2 := SHA256Sum(c.Tail)
	if !ok1 || !ok2 {
		return dst, false
	}
	if t.skipEdges {
		var b [3 * sha256Len]byte
		copy(b[:], t.key[:])
		copy(b[sha256Len:], h[:])
		copy(b[2*sha256Len:], tl[:])
		sum := sha256.Sum256(b[:])
		return append(dst, sum[:fingerprintLen]...), true
	}
	return append(append(dst, h[:]...), tl[:]...), true
}

func (t *chunkTable) edgesOf(r *chunkRec) []byte {
	n := t.edgeLen()
	i := int(r.edge) % chunkBlock * n
	return t.edges[int(r.edge)/chunkBlock][i : i+n]
}

// SHA256Sum returns the bytes of a SHA-256 digest in its canonical form
// ("sha256:" and 64 lowercase hex digits, what Validate accepts).
func SHA256Sum(d digest.Digest) (b [sha256Len]byte, ok bool) {
	const prefix = "sha256:"
	s := string(d)
	if len(s) != len(prefix)+2*sha256Len || s[:len(prefix)] != prefix {
		return b, false
	}
	for i := range b {
		hi, ok1 := lowerHex(s[len(prefix)+2*i])
		lo, ok2 := lowerHex(s[len(prefix)+2*i+1])
		if !ok1 || !ok2 {
			return b, false
		}
		b[i] = hi<<4 | lo
	}
	return b, true
}

func lowerHex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

// IsSHA256 reports whether d is a valid SHA-256 digest (what
// d.Validate() and an algorithm of SHA-256 say, without a regexp).
func IsSHA256(d digest.Digest) bool {
	_, ok := SHA256Sum(d)
	return ok
}

// SHA256Digest returns the digest of the SHA-256 sum b.
func SHA256Digest(b *[sha256Len]byte) digest.Digest {
	return digest.Digest("sha256:" + hex.EncodeToString(b[:]))
}

// add appends a checked chunk whose digest is not in the table yet.
func (t *chunkTable) add(c Chunk) error {
	sum, ok := SHA256Sum(c.Digest)
	if !ok || c.Size <= 0 || c.Size > MaxChunkBytes {
		return invalid("chunk %s: bad digest or size %d", c.Digest, c.Size)
	}
	r := chunkRec{sum: sum, size: uint32(c.Size), edge: -1}
	if c.HasEdges() {
		if t.ne%chunkBlock == 0 {
			t.edges = append(t.edges, make([]byte, 0, chunkBlock*t.edgeLen()))
		}
		b := &t.edges[len(t.edges)-1]
		if *b, ok = t.appendEdgeRecord(*b, c); !ok {
			return invalid("chunk %s: bad edge digests", c.Digest)
		}
		r.edge = int32(t.ne)
		t.ne++
	}
	if t.n%chunkBlock == 0 {
		t.recs = append(t.recs, make([]chunkRec, 0, chunkBlock))
	}
	b := &t.recs[len(t.recs)-1]
	*b = append(*b, r)
	t.n++
	t.find.insert(t, t.n-1)
	return nil
}

// lookup returns the index of the chunk whose digest has the bytes sum.
func (t *chunkTable) lookup(sum *[sha256Len]byte) (int, bool) { return t.find.lookup(t, sum) }

// equal reports whether chunk k is c, a checked chunk.
func (t *chunkTable) equal(k int, c Chunk) bool {
	r := t.rec(k)
	if sum, _ := SHA256Sum(c.Digest); sum != r.sum || int64(r.size) != c.Size || c.HasEdges() != (r.edge >= 0) {
		return false
	}
	if r.edge >= 0 {
		var buf [2 * sha256Len]byte
		e, _ := t.appendEdgeRecord(buf[:0], c)
		return bytes.Equal(t.edgesOf(r), e)
	}
	return true
}

// chunk returns chunk k; without its edges when they are not kept.
func (t *chunkTable) chunk(k int) Chunk {
	r := t.rec(k)
	c := Chunk{Digest: SHA256Digest(&r.sum), Size: int64(r.size)}
	if r.edge >= 0 && !t.skipEdges {
		e := t.edgesOf(r)
		c.Head, c.Tail = SHA256Digest((*[sha256Len]byte)(e[:sha256Len])), SHA256Digest((*[sha256Len]byte)(e[sha256Len:]))
	}
	return c
}

// chunkSet is an open-addressing set of chunk indices keyed by their
// digests, a few bytes a chunk where a map of digests costs tens. Its hash
// is seeded at random, so a crafted index cannot make probes collide.
type chunkSet struct {
	seed  maphash.Seed
	slots []int32 // chunk index + 1; 0 is empty
	n     int
}

func newChunkSet() chunkSet { return chunkSet{seed: maphash.MakeSeed(), slots: make([]int32, 64)} }

func (s *chunkSet) home(sum *[sha256Len]byte) int {
	return int(maphash.Bytes(s.seed, sum[:]) & uint64(len(s.slots)-1))
}

func (s *chunkSet) lookup(t *chunkTable, sum *[sha256Len]byte) (int, bool) {
	for i := s.home(sum); ; i = (i + 1) & (len(s.slots) - 1) {
		k := s.slots[i] - 1
		if k < 0 {
			return 0, false
		}
		if t.rec(int(k)).sum == *sum {
			return int(k), true
		}
	}
}

// insert adds chunk k of t, which is not in the set, growing the slots to
// keep them at most three quarters full.
func (s *chunkSet) insert(t *chunkTable, k int) {
	if 4*(s.n+1) > 3*len(s.slots) {
		old := s.slots
		s.slots = make([]int32, 2*len(old))
		for _, v := range old {
			if v != 0 {
				s.place(&t.rec(int(v-1)).sum, v)
			}
		}
	}
	s.place(&t.rec(k).sum, int32(k+1))
	s.n++
}

func (s *chunkSet) place(sum *[sha256Len]byte, v int32) {
	i := s.home(sum)
	for s.slots[i] != 0 {
		i = (i + 1) & (len(s.slots) - 1)
	}
	s.slots[i] = v
}

// NumChunks returns the number of chunks of the index.
func (x *Index) NumChunks() int {
	if x.ch != nil && x.Chunks == nil {
		return x.ch.len()
	}
	return len(x.Chunks)
}

// Chunk returns chunk k.
func (x *Index) Chunk(k int) Chunk {
	if x.ch != nil && x.Chunks == nil {
		return x.ch.chunk(k)
	}
	return x.Chunks[k]
}

// ChunkSize returns the size of chunk k.
func (x *Index) ChunkSize(k int) int64 {
	if x.ch != nil && x.Chunks == nil {
		return int64(x.ch.rec(k).size)
	}
	return x.Chunks[k].Size
}

// ChunkDigest returns the digest of chunk k.
func (x *Index) ChunkDigest(k int) digest.Digest {
	if x.ch != nil && x.Chunks == nil {
		return SHA256Digest(&x.ch.rec(k).sum)
	}
	return x.Chunks[k].Digest
}

// ChunkDescriptor returns the descriptor of the blob of chunk k.
func (x *Index) ChunkDescriptor(k int) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: MediaTypeChunk, Digest: x.ChunkDigest(k), Size: x.ChunkSize(k)}
}

// AllChunks returns every chunk as a Chunk: the chunk table in its expanded
// form, which costs about three times the memory of an opened index's.
func (x *Index) AllChunks() []Chunk {
	if x.ch == nil || x.Chunks != nil {
		return x.Chunks
	}
	if x.ch.len() == 0 {
		return nil
	}
	out := make([]Chunk, x.ch.len())
	for k := range out {
		out[k] = x.ch.chunk(k)
	}
	return out
}

// chunkIs reports whether chunk k has the SHA-256 digest whose bytes are
// sum, and the size size, without building its digest.
func (x *Index) chunkIs(k int, sum *[sha256Len]byte, size int64) bool {
	if x.ch == nil || x.Chunks != nil {
		have, _ := SHA256Sum(x.Chunks[k].Digest) // checked by Validate
		return have == *sum && x.Chunks[k].Size == size
	}
	r := x.ch.rec(k)
	return r.sum == *sum && int64(r.size) == size
}
