package layout

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/atomicfile"
)

// The piece memo (format 1), kept beside the stat records of the tree: what
// the last push of the tree sealed, piece by piece, so that a re-push
// reuses each piece whose content did not change without building,
// checking or storing it again, and does not ask the destination for the
// chunks that version holds.
//
//	header  "BDNVMEM\x00", u32 format
//	body    uvarint-prefixed destination, root digest, uvarint root size,
//	        uvarint-prefixed root media type, chunking (uvarint min, avg, max, pack), piecing (uvarint min,
//	        avg, max, maxBytes), uvarint pieces, then per piece: digest,
//	        uvarint size, uvarint-prefixed first path, uvarint entries,
//	        uvarint bytes, 32-byte fingerprint, uvarint chunks and each
//	        chunk (as in the stat records)
//	trailer SHA-256 of all bytes before it, "BDNVEND\x00"
//
// A memo whose checksum, magic or bounds do not hold is refused: the push
// seals every piece anew and writes it again.
const (
	memoMagic  = "BDNVMEM\x00"
	memoFormat = 1
	// maxMemoBytes bounds the memo read: pieces of a version at the
	// entry limit, with room.
	maxMemoBytes = 1 << 30
)

// errMemo is wrapped when a piece memo is torn or corrupt.
var errMemo = errors.New("layout: piece memo is torn or corrupt")

// pieceMemo is what a push remembers of the version it sealed.
type pieceMemo struct {
	dest     string        // the destination repository
	root     digest.Digest // the version sealed
	rootSize int64
	rootType string // its media type
	chunking Params
	piecing  PieceParams
	pieces   []memoPiece
}

// memoPiece is one piece of the version: its reference, the fingerprint
// of its content (pieceSum), and its chunk table.
type memoPiece struct {
	ref    PieceRef
	sum    [sha256.Size]byte
	chunks []Chunk
}

// memoPath is where the piece memo of the tree is kept.
func (c *StatCache) memoPath() string { return strings.TrimSuffix(c.path, ".rec") + ".memo" }

// loadMemo reads the piece memo of the tree; nil when there is none or it
// is refused.
func (c *StatCache) loadMemo() (*pieceMemo, error) {
	if c == nil {
		return nil, nil
	}
	f, err := os.Open(c.memoPath())
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxMemoBytes+1))
	if err != nil {
		return nil, err
	}
	m, err := decodeMemo(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.memoPath(), err)
	}
	return m, nil
}

// saveMemo writes m atomically, streamed through its checksum.
func (c *StatCache) saveMemo(m *pieceMemo) error {
	if c == nil {
		return nil
	}
	return atomicfile.Write(c.memoPath(), 0o600, func(w io.Writer) error { return encodeMemo(w, m) })
}

// dropMemo removes the piece memo, so that a failed or different push
// leaves none to trust.
func (c *StatCache) dropMemo() {
	if c != nil {
		_ = os.Remove(c.memoPath())
	}
}

func encodeMemo(w io.Writer, m *pieceMemo) error {
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 1<<20)
	b := append([]byte(memoMagic), binary.LittleEndian.AppendUint32(nil, memoFormat)...)
	b = appendString(b, m.dest)
	b = appendDigest(b, m.root)
	b = binary.AppendUvarint(b, uint64(m.rootSize))
	b = appendString(b, m.rootType)
	for _, v := range []int64{m.chunking.Min, m.chunking.Avg, m.chunking.Max, m.chunking.Pack,
		int64(m.piecing.Min), int64(m.piecing.Avg), int64(m.piecing.Max), m.piecing.MaxBytes} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	b = binary.AppendUvarint(b, uint64(len(m.pieces)))
	for _, p := range m.pieces {
		b = appendDigest(b, p.ref.Digest)
		b = binary.AppendUvarint(b, uint64(p.ref.Size))
		b = appendString(b, p.ref.First)
		b = binary.AppendUvarint(b, uint64(p.ref.Entries))
		b = binary.AppendUvarint(b, uint64(p.ref.Bytes))
		b = append(b, p.sum[:]...)
		b = binary.AppendUvarint(b, uint64(len(p.chunks)))
		for _, ch := range p.chunks {
			b = appendChunk(b, ch)
		}
		if len(b) > 64<<10 {
			if _, err := bw.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	if _, err := bw.Write(b); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	_, err := w.Write(append(h.Sum(nil), recEnd...))
	return err
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// memoReader decodes the body of a memo, remembering the first error.
type memoReader struct {
	b   []byte
	err error
}

func (r *memoReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.b)
	if k <= 0 || v > 1<<62 {
		r.err = errMemo
		return 0
	}
	r.b = r.b[k:]
	return v
}

func (r *memoReader) int() int64 { return int64(r.uvarint()) }

func (r *memoReader) string() string {
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		r.err = errMemo
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *memoReader) digest() digest.Digest {
	if r.err != nil {
		return ""
	}
	d, rest, err := decodeDigest(r.b)
	if err != nil {
		r.err = errMemo
		return ""
	}
	r.b = rest
	return d
}

func decodeMemo(b []byte) (*pieceMemo, error) {
	if len(b) > maxMemoBytes || len(b) < len(memoMagic)+4+sha256.Size+len(recEnd) {
		return nil, fmt.Errorf("%w: %d bytes", errMemo, len(b))
	}
	body, trailer := b[:len(b)-sha256.Size-len(recEnd)], b[len(b)-sha256.Size-len(recEnd):]
	if string(body[:len(memoMagic)]) != memoMagic || string(trailer[sha256.Size:]) != recEnd {
		return nil, fmt.Errorf("%w: bad magic", errMemo)
	}
	if sum := sha256.Sum256(body); !bytes.Equal(sum[:], trailer[:sha256.Size]) {
		return nil, fmt.Errorf("%w: checksum mismatch", errMemo)
	}
	if v := binary.LittleEndian.Uint32(body[len(memoMagic):]); v != memoFormat {
		return nil, fmt.Errorf("%w: format %d", errMemo, v)
	}
	r := &memoReader{b: body[len(memoMagic)+4:]}
	m := &pieceMemo{dest: r.string(), root: r.digest(), rootSize: r.int(), rootType: r.string()}
	m.chunking = Params{Min: r.int(), Avg: r.int(), Max: r.int(), Pack: r.int()}
	m.piecing = PieceParams{Min: int(r.int()), Avg: int(r.int()), Max: int(r.int()), MaxBytes: r.int()}
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		return nil, errMemo
	}
	m.pieces = make([]memoPiece, n)
	for i := range m.pieces {
		p := &m.pieces[i]
		p.ref = PieceRef{Digest: r.digest(), Size: r.int(), First: r.string(), Entries: r.int(), Bytes: r.int()}
		if r.err != nil || len(r.b) < sha256.Size {
			return nil, errMemo
		}
		copy(p.sum[:], r.b)
		r.b = r.b[sha256.Size:]
		k := r.uvarint()
		if r.err != nil || k > uint64(len(r.b)) {
			return nil, errMemo
		}
		p.chunks = make([]Chunk, k)
		for j := range p.chunks {
			ch, rest, err := decodeChunk(r.b)
			if err != nil {
				return nil, errMemo
			}
			p.chunks[j], r.b = ch, rest
		}
		if !isSHA256(p.ref.Digest) || p.ref.Entries <= 0 || p.ref.Size <= 0 || checkPath(p.ref.First) != nil ||
			(i > 0 && p.ref.First <= m.pieces[i-1].ref.First) || checkChunks(p.chunks) != nil {
			return nil, fmt.Errorf("%w: piece %d", errMemo, i)
		}
	}
	if r.err != nil || len(r.b) != 0 || !isSHA256(m.root) {
		return nil, errMemo
	}
	return m, nil
}

// chunkSet returns the chunks of the version m describes.
func (m *pieceMemo) chunkSet() map[digest.Digest]bool {
	out := map[digest.Digest]bool{}
	for _, p := range m.pieces {
		for _, c := range p.chunks {
			out[c.Digest] = true
		}
	}
	return out
}
