package layout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"io"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// CutFile cuts the file r, of size bytes at the path name, into chunks as
// a push with the parameters p does (at tensor boundaries for a
// safetensors or GGUF file whose header reads, else content-defined), and calls fn
// with each chunk's offset and digest. It stops early if ctx is cancelled,
// or at the first read error (returning nil: what was cut is reported).
func CutFile(ctx context.Context, r io.ReaderAt, name string, size int64, p Params, fn func(off int64, d digest.Digest)) error {
	cuts, ok := FormatCuts(r, name, size, p)
	cutStream(ctx, io.NewSectionReader(r, 0, size), cuts, !ok, p, false, func(off int64, c Chunk) { fn(off, c.Digest) })
	return nil
}

// CutStream is CutFile for a file read once, from its start: the
// safetensors header (at most SafetensorsHeaderLimit bytes) or GGUF header
// (at most GGUFHeaderLimit) is kept in memory while it is parsed. fn gets
// each chunk with its size and, for a chunk of at least EdgeMinChunk bytes,
// its edge digests. Unlike CutFile it returns the error that ended the stream
// early (a short stream is io.ErrUnexpectedEOF), so that a caller that
// verifies the stream sees the failure.
func CutStream(ctx context.Context, r io.Reader, name string, size int64, p Params, fn func(off int64, c Chunk)) error {
	var cuts []int64
	cdc := true
	if tensorheader.IsSafetensors(name) && size >= 8 {
		var head [8]byte
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return err
		}
		prefix := head[:]
		if n := int64(binary.LittleEndian.Uint64(head[:])); n > 0 && n <= tensorheader.SafetensorsHeaderLimit && 8+n <= size {
			hdr := make([]byte, 8+n)
			copy(hdr, head[:])
			if _, err := io.ReadFull(r, hdr[8:]); err != nil {
				return err
			}
			prefix = hdr
			if hdrEnd, ts, err := tensorheader.ParseSafetensorsHeader(hdr[8:], size); err == nil {
				cuts, cdc = tensorBoundaries(hdrEnd, ts, size, p), false
			}
		}
		r = io.MultiReader(bytes.NewReader(prefix), r)
	}
	if tensorheader.IsGGUF(name) {
		// The bytes the parser read (and read ahead) are kept and cut first.
		var seen bytes.Buffer
		if h, err := tensorheader.ReadGGUFHeaderFrom(io.TeeReader(io.LimitReader(r, size), &seen), size, tensorheader.GGUFHeaderLimit); err == nil {
			cuts, cdc = tensorBoundaries(h.DataStart, h.Ranges(size), size, p), false
		}
		r = io.MultiReader(&seen, r)
	}
	n, err := cutStream(ctx, io.LimitReader(r, size), cuts, cdc, p, true, fn)
	if err == nil && n < size {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// cutStream cuts what r gives at cuts (content-defined between them when
// cdc), calling fn per chunk (with edge digests when edges), and returns
// the bytes read and the error that stopped it (nil at the end of r).
func cutStream(ctx context.Context, r io.Reader, cuts []int64, cdc bool, p Params, edges bool, fn func(off int64, c Chunk)) (int64, error) {
	cut := NewCutter(p)
	h := sha256.New()
	var e edgeHash
	var pos, start int64
	emit := func() {
		if pos > start {
			c := Chunk{Digest: digest.NewDigest(digest.SHA256, h), Size: pos - start}
			if edges && c.Size >= EdgeMinChunk {
				c.Head, c.Tail = e.digests()
			}
			fn(start, c)
		}
		h.Reset()
		cut.Reset()
		e.reset()
		start = pos
	}
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return pos, err
		}
		n, rerr := io.ReadFull(r, buf)
		data := buf[:n]
		for len(data) > 0 {
			lim, forced := len(data), false
			for len(cuts) > 0 && cuts[0] <= pos {
				cuts = cuts[1:]
			}
			if len(cuts) > 0 && cuts[0]-pos <= int64(lim) {
				lim, forced = int(cuts[0]-pos), true
			}
			k, end := lim, false
			if cdc {
				k, end = cut.Next(data[:lim])
			}
			h.Write(data[:k])
			if edges {
				e.write(data[:k])
			}
			pos += int64(k)
			data = data[k:]
			if end || (forced && k == lim) {
				emit()
			}
		}
		if rerr != nil {
			emit()
			if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
				return pos, nil
			}
			return pos, rerr
		}
	}
}

// edgeHash hashes the first EdgeBytes of a chunk as they come and keeps its
// last EdgeBytes (a ring starting at at), for the chunk's edge digests.
type edgeHash struct {
	head hash.Hash
	n    int64 // bytes of the chunk so far
	ring []byte
	at   int
}

func (e *edgeHash) reset() {
	if e.head != nil {
		e.head.Reset()
	}
	e.n, e.at = 0, 0
}

func (e *edgeHash) write(p []byte) {
	if e.head == nil {
		e.head, e.ring = sha256.New(), make([]byte, EdgeBytes)
	}
	if e.n < EdgeBytes {
		e.head.Write(p[:min(int64(len(p)), EdgeBytes-e.n)])
	}
	e.n += int64(len(p))
	if len(p) >= EdgeBytes {
		copy(e.ring, p[len(p)-EdgeBytes:])
		e.at = 0
		return
	}
	if k := copy(e.ring[e.at:], p); k < len(p) {
		copy(e.ring, p[k:])
	}
	e.at = (e.at + len(p)) % EdgeBytes
}

// digests returns the head and tail digests of a chunk of at least
// EdgeBytes bytes.
func (e *edgeHash) digests() (head, tail digest.Digest) {
	t := sha256.New()
	t.Write(e.ring[e.at:])
	t.Write(e.ring[:e.at])
	return digest.NewDigest(digest.SHA256, e.head), digest.NewDigest(digest.SHA256, t)
}
