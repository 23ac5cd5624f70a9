package statcache

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
	"github.com/bdnvol/bdnvol/internal/bounded"
	"github.com/bdnvol/bdnvol/pkg/layout"
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

// PieceMemo is what a push remembers of the version it sealed.
type PieceMemo struct {
	Dest     string        // the destination repository
	Root     digest.Digest // the version sealed
	RootSize int64
	RootType string // its media type
	Chunking layout.Params
	Piecing  layout.PieceParams
	Pieces   []MemoPiece
}

// MemoPiece is one piece of the version: its reference, the fingerprint
// of its content (pieceSum), and its chunk table.
type MemoPiece struct {
	Ref    layout.PieceRef
	Sum    [sha256.Size]byte
	Chunks []layout.Chunk
}

// MemoPath is where the piece memo of the tree is kept.
func (c *Cache) MemoPath() string { return strings.TrimSuffix(c.path, ".rec") + ".memo" }

// LoadMemo reads the piece memo of the tree; nil when there is none or it
// is refused.
func (c *Cache) LoadMemo() (*PieceMemo, error) {
	if c == nil {
		return nil, nil
	}
	b, err := bounded.ReadFile(c.MemoPath(), maxMemoBytes)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if errors.Is(err, bounded.ErrTooLarge) || errors.Is(err, bounded.ErrNotRegular) {
		return nil, fmt.Errorf("%s: %w: %v", c.MemoPath(), errMemo, err)
	}
	if err != nil {
		return nil, err
	}
	m, err := decodeMemo(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.MemoPath(), err)
	}
	return m, nil
}

// SaveMemo writes m atomically, streamed through its checksum.
func (c *Cache) SaveMemo(m *PieceMemo) error {
	if c == nil {
		return nil
	}
	return atomicfile.Write(c.MemoPath(), 0o600, func(w io.Writer) error { return encodeMemo(w, m) })
}

// DropMemo removes the piece memo, so that a failed or different push
// leaves none to trust.
func (c *Cache) DropMemo() {
	if c != nil {
		_ = os.Remove(c.MemoPath())
	}
}

func encodeMemo(w io.Writer, m *PieceMemo) error {
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 1<<20)
	b := append([]byte(memoMagic), binary.LittleEndian.AppendUint32(nil, memoFormat)...)
	b = AppendString(b, m.Dest)
	b = appendDigest(b, m.Root)
	b = binary.AppendUvarint(b, uint64(m.RootSize))
	b = AppendString(b, m.RootType)
	for _, v := range []int64{m.Chunking.Min, m.Chunking.Avg, m.Chunking.Max, m.Chunking.Pack,
		int64(m.Piecing.Min), int64(m.Piecing.Avg), int64(m.Piecing.Max), m.Piecing.MaxBytes} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	b = binary.AppendUvarint(b, uint64(len(m.Pieces)))
	for _, p := range m.Pieces {
		b = appendDigest(b, p.Ref.Digest)
		b = binary.AppendUvarint(b, uint64(p.Ref.Size))
		b = AppendString(b, p.Ref.First)
		b = binary.AppendUvarint(b, uint64(p.Ref.Entries))
		b = binary.AppendUvarint(b, uint64(p.Ref.Bytes))
		b = append(b, p.Sum[:]...)
		b = binary.AppendUvarint(b, uint64(len(p.Chunks)))
		for _, ch := range p.Chunks {
			b = AppendChunk(b, ch)
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

// AppendString appends s as the records and the piece memo encode it:
// uvarint length, bytes.
func AppendString(b []byte, s string) []byte {
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

func decodeMemo(b []byte) (*PieceMemo, error) {
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
	m := &PieceMemo{Dest: r.string(), Root: r.digest(), RootSize: r.int(), RootType: r.string()}
	m.Chunking = layout.Params{Min: r.int(), Avg: r.int(), Max: r.int(), Pack: r.int()}
	m.Piecing = layout.PieceParams{Min: int(r.int()), Avg: int(r.int()), Max: int(r.int()), MaxBytes: r.int()}
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		return nil, errMemo
	}
	m.Pieces = make([]MemoPiece, n)
	for i := range m.Pieces {
		p := &m.Pieces[i]
		p.Ref = layout.PieceRef{Digest: r.digest(), Size: r.int(), First: r.string(), Entries: r.int(), Bytes: r.int()}
		if r.err != nil || len(r.b) < sha256.Size {
			return nil, errMemo
		}
		copy(p.Sum[:], r.b)
		r.b = r.b[sha256.Size:]
		k := r.uvarint()
		if r.err != nil || k > uint64(len(r.b)) {
			return nil, errMemo
		}
		p.Chunks = make([]layout.Chunk, k)
		for j := range p.Chunks {
			ch, rest, err := decodeChunk(r.b)
			if err != nil {
				return nil, errMemo
			}
			p.Chunks[j], r.b = ch, rest
		}
		if !layout.IsSHA256(p.Ref.Digest) || p.Ref.Entries <= 0 || p.Ref.Size <= 0 || layout.CheckPath(p.Ref.First) != nil ||
			(i > 0 && p.Ref.First <= m.Pieces[i-1].Ref.First) || layout.CheckChunks(p.Chunks) != nil {
			return nil, fmt.Errorf("%w: piece %d", errMemo, i)
		}
	}
	if r.err != nil || len(r.b) != 0 || !layout.IsSHA256(m.Root) {
		return nil, errMemo
	}
	return m, nil
}

// ChunkSet returns the chunks of the version m describes.
func (m *PieceMemo) ChunkSet() map[digest.Digest]bool {
	out := map[digest.Digest]bool{}
	for _, p := range m.Pieces {
		for _, c := range p.Chunks {
			out[c.Digest] = true
		}
	}
	return out
}
