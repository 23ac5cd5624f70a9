package modelpack

import (
	"context"
	"errors"
	"fmt"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// Fetcher returns a fetcher of the map's chunks reading from src, the
// fetcher of the artifact's repository: a chunk of a raw or uncompressed
// tar layer is one range request of that layer (when src can serve ranges),
// a chunk of a compressed layer is read by streaming the layer from its
// start. The bytes are not verified here: every reader of a version checks
// each chunk against its digest, which Build computed from the verified
// layer. Other descriptors (manifests, config) are fetched from src.
func (m *Map) Fetcher(src content.Fetcher) content.Fetcher {
	return &pieceFetcher{m: m, src: src}
}

type pieceFetcher struct {
	m   *Map
	src content.Fetcher
}

// Local reports whether the source reads local files (see chunkcache).
func (f *pieceFetcher) Local() bool {
	l, ok := f.src.(interface{ Local() bool })
	return ok && l.Local()
}

// Fetch returns the bytes of the chunk desc, or of any other blob of src.
func (f *pieceFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	p, ok := f.m.Pieces[desc.Digest]
	if !ok || desc.MediaType != layout.MediaTypeChunk {
		return f.src.Fetch(ctx, desc)
	}
	if desc.Size != p.Size {
		return nil, fmt.Errorf("chunk %s: %w: %d bytes asked, the map has %d", desc.Digest, ErrInvalid, desc.Size, p.Size)
	}
	return f.piece(ctx, p)
}

// FetchRange returns n bytes at off of the chunk desc (an edge, for a lazy
// reader), not verified: one range request of its layer, or for a
// compressed layer a stream of it.
func (f *pieceFetcher) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	p, ok := f.m.Pieces[desc.Digest]
	if !ok || off < 0 || n <= 0 || off+n > p.Size {
		return nil, fmt.Errorf("chunk %s: range %d+%d: %w", desc.Digest, off, n, errors.ErrUnsupported)
	}
	p.Offset, p.Size = p.Offset+off, n
	return f.piece(ctx, p)
}

// NoSplit tells a lazy reader to fetch each chunk with one request: a
// chunk is one tensor, one range of a layer.
func (f *pieceFetcher) NoSplit() bool { return true }

// piece reads piece p: one range request of its layer when the layer and
// src allow it, else (a compressed layer, a source or registry without
// ranges) by streaming the layer.
func (f *pieceFetcher) piece(ctx context.Context, p Piece) (io.ReadCloser, error) {
	l := f.m.Artifact.Layers[p.Layer]
	if rf, ok := f.src.(oci.RangeFetcher); ok && l.Packing.RangeReadable() {
		rc, err := rf.FetchRange(ctx, l.Desc, p.Offset, p.Size)
		if !errors.Is(err, errors.ErrUnsupported) {
			return rc, err
		}
	}
	return f.stream(ctx, l, p)
}

// stream reads piece p by reading its layer from the start.
func (f *pieceFetcher) stream(ctx context.Context, l Layer, p Piece) (io.ReadCloser, error) {
	rc, err := f.src.Fetch(ctx, l.Desc)
	if err != nil {
		return nil, err
	}
	r, closeFn, err := decompress(l, rc)
	if err != nil {
		rc.Close()
		return nil, err
	}
	if _, err := io.CopyN(io.Discard, r, p.Offset); err != nil {
		closeFn()
		rc.Close()
		return nil, fmt.Errorf("layer %s: skipping to %d: %w", l.Desc.Digest, p.Offset, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(r, p.Size), closerFunc(func() error { closeFn(); return rc.Close() })}, nil
}

type closerFunc func() error

func (c closerFunc) Close() error { return c() }
