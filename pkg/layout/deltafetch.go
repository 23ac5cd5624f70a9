package layout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// LocalBases finds a base chunk where a reader already has it (a file of
// the directory a pull upgrades): the bytes it returns are verified
// against the base's digest before use, and the base is fetched instead
// when they fail or it returns an error.
type LocalBases func(ctx context.Context, desc ocispec.Descriptor) ([]byte, error)

type localBasesKey struct{}

// WithLocalBases returns ctx carrying find: a delta chunk fetched under it
// looks for its base there first.
func WithLocalBases(ctx context.Context, find LocalBases) context.Context {
	return context.WithValue(ctx, localBasesKey{}, find)
}

// DeltaStats count what a delta source fetched.
type DeltaStats struct {
	Decoded    int64 // delta chunks decoded
	DeltaBytes int64 // bytes of delta blobs fetched
	BaseBytes  int64 // bytes of base chunks fetched (not found locally)
	LocalBases int64 // base chunks found locally
}

// deltaSource serves the chunks of a version with delta chunks: a plain
// chunk is src's blob; a delta chunk is decoded from its delta blob and
// its base chunk (bases, else src) and verified against its own digest
// before a byte is served.
type deltaSource struct {
	src, bases content.Fetcher
	x          *Index
	stats      *DeltaStats
}

// Local reports whether the wrapped source reads local files.
func (f *deltaSource) Local() bool {
	l, ok := f.src.(interface{ Local() bool })
	return ok && l.Local()
}

// Fetch returns the bytes of chunk desc.
func (f *deltaSource) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	d, ok := f.x.DeltaOf(desc.Digest)
	if !ok || desc.Size != d.Size {
		return f.src.Fetch(ctx, desc)
	}
	b, err := f.decode(ctx, d)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// fetchRange is FetchRange of a deltaRangeSource.
func (f *deltaSource) fetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	if d, ok := f.x.DeltaOf(desc.Digest); ok && desc.Size == d.Size {
		if off < 0 || n < 0 || off+n > d.Size {
			return nil, fmt.Errorf("range %d+%d of chunk %s of %d bytes", off, n, d.Chunk, d.Size)
		}
		b, err := f.decode(ctx, d)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(bytes.NewReader(b[off : off+n])), nil
	}
	rf, ok := f.src.(oci.RangeFetcher)
	if !ok {
		return nil, fmt.Errorf("%s: %w: no ranges", desc.Digest, errors.ErrUnsupported)
	}
	return rf.FetchRange(ctx, desc, off, n)
}

// decode fetches the delta blob and the base of d, decodes the chunk and
// verifies it.
func (f *deltaSource) decode(ctx context.Context, d Delta) ([]byte, error) {
	delta, err := verify.Fetch(ctx, f.src, "delta", d.Descriptor())
	if err != nil {
		return nil, fmt.Errorf("delta of chunk %s: %w", d.Chunk, err)
	}
	base, err := f.base(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("base of chunk %s: %w", d.Chunk, err)
	}
	b, err := DecodeDelta(delta, base, d.Size)
	if err != nil {
		return nil, fmt.Errorf("chunk %s: %w", d.Chunk, err)
	}
	if err := verify.Bytes("chunk", b, ocispec.Descriptor{MediaType: MediaTypeChunk, Digest: d.Chunk, Size: d.Size}); err != nil {
		return nil, fmt.Errorf("decoded delta: %w", err)
	}
	if f.stats != nil {
		f.stats.Decoded++
		f.stats.DeltaBytes += d.DeltaSize
	}
	return b, nil
}

// base returns the verified bytes of d's base: found locally, else fetched.
func (f *deltaSource) base(ctx context.Context, d Delta) ([]byte, error) {
	bd := d.BaseDescriptor()
	if find, ok := ctx.Value(localBasesKey{}).(LocalBases); ok && find != nil {
		if b, err := find(ctx, bd); err == nil && verify.Bytes("base", b, bd) == nil {
			if f.stats != nil {
				f.stats.LocalBases++
			}
			return b, nil
		}
	}
	src := f.bases
	if src == nil {
		src = f.src
	}
	b, err := verify.Fetch(ctx, src, "base chunk", bd)
	if err == nil && f.stats != nil {
		f.stats.BaseBytes += d.Size
	}
	return b, err
}

// DeltaSource returns the fetcher of the chunks of x, whose delta chunks
// it decodes (fetching delta blobs from src and bases from bases, src when
// nil), counting into stats when not nil; src itself when x has no delta.
func DeltaSource(src, bases content.Fetcher, x *Index, stats *DeltaStats) content.Fetcher {
	if len(x.Deltas()) == 0 {
		return src
	}
	d := &deltaSource{src: src, bases: bases, x: x, stats: stats}
	if _, ok := src.(oci.RangeFetcher); ok {
		return &deltaRangeSource{d}
	}
	return d
}

// deltaRangeSource is a deltaSource whose src serves ranges.
type deltaRangeSource struct{ *deltaSource }

// FetchRange returns n bytes at off of chunk desc: of a delta chunk, out of
// the whole chunk decoded and verified; of another, src's range (unverified,
// as oci.RangeFetcher's).
func (f *deltaRangeSource) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	return f.fetchRange(ctx, desc, off, n)
}
