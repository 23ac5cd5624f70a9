package layout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"io"

	"github.com/opencontainers/go-digest"
)

// CutFile cuts the file r, of size bytes at the path name, into chunks as
// a push with the parameters p does (at tensor boundaries for a
// safetensors or GGUF file whose header reads, else content-defined), and calls fn
// with each chunk's offset and digest. It stops early if ctx is cancelled,
// or at the first read error (returning nil: what was cut is reported).
func CutFile(ctx context.Context, r io.ReaderAt, name string, size int64, p Params, fn func(off int64, d digest.Digest)) error {
	cuts, ok := formatCuts(r, name, size, p)
	cutStream(ctx, io.NewSectionReader(r, 0, size), cuts, !ok, p, fn)
	return nil
}

// CutStream is CutFile for a file read once, from its start: the
// safetensors header (at most SafetensorsHeaderLimit bytes) or GGUF header
// (at most GGUFHeaderLimit) is kept in memory while it is parsed. Unlike CutFile it returns the error that ended
// the stream early (a short stream is io.ErrUnexpectedEOF), so that a caller
// that verifies the stream sees the failure.
func CutStream(ctx context.Context, r io.Reader, name string, size int64, p Params, fn func(off int64, d digest.Digest)) error {
	var cuts []int64
	cdc := true
	if IsSafetensors(name) && size >= 8 {
		var head [8]byte
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return err
		}
		prefix := head[:]
		if n := int64(binary.LittleEndian.Uint64(head[:])); n > 0 && n <= SafetensorsHeaderLimit && 8+n <= size {
			hdr := make([]byte, 8+n)
			copy(hdr, head[:])
			if _, err := io.ReadFull(r, hdr[8:]); err != nil {
				return err
			}
			prefix = hdr
			if hdrEnd, ts, err := ParseSafetensorsHeader(hdr[8:], size); err == nil {
				cuts, cdc = tensorBoundaries(hdrEnd, ts, size, p), false
			}
		}
		r = io.MultiReader(bytes.NewReader(prefix), r)
	}
	if IsGGUF(name) {
		// The bytes the parser read (and read ahead) are kept and cut first.
		var seen bytes.Buffer
		if h, err := ReadGGUFHeaderFrom(io.TeeReader(io.LimitReader(r, size), &seen), size, GGUFHeaderLimit); err == nil {
			cuts, cdc = tensorBoundaries(h.DataStart, h.Ranges(size), size, p), false
		}
		r = io.MultiReader(&seen, r)
	}
	n, err := cutStream(ctx, io.LimitReader(r, size), cuts, cdc, p, fn)
	if err == nil && n < size {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// cutStream cuts what r gives at cuts (content-defined between them when
// cdc), calling fn per chunk, and returns the bytes read and the error that
// stopped it (nil at the end of r).
func cutStream(ctx context.Context, r io.Reader, cuts []int64, cdc bool, p Params, fn func(off int64, d digest.Digest)) (int64, error) {
	cut := newCutter(p)
	h := sha256.New()
	var pos, start int64
	emit := func() {
		if pos > start {
			fn(start, digest.NewDigest(digest.SHA256, h))
		}
		h.Reset()
		cut.reset()
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
				k, end = cut.next(data[:lim])
			}
			h.Write(data[:k])
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
