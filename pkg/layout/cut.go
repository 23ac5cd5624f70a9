package layout

import (
	"context"
	"crypto/sha256"
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
	cdc := !ok
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
	sr := io.NewSectionReader(r, 0, size)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, rerr := io.ReadFull(sr, buf)
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
			break
		}
	}
	emit()
	return nil
}
