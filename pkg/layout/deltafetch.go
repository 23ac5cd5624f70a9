package layout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

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

// Fetch returns the bytes of chunk desc. Those of a delta chunk come
// decoded and verified, in a *verify.Checked: a consumer need not hash
// them again.
func (f *deltaSource) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	d, ok := f.x.DeltaOf(desc.Digest)
	if !ok || desc.Size != d.Size {
		return f.src.Fetch(ctx, desc)
	}
	bp, err := f.decode(ctx, d)
	if err != nil {
		return nil, err
	}
	return verify.NewChecked(*bp, d.plainDescriptor(), func() { chunkBufs.Put(bp) }), nil
}

// fetchRange is FetchRange of a deltaRangeSource.
func (f *deltaSource) fetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	if d, ok := f.x.DeltaOf(desc.Digest); ok && desc.Size == d.Size {
		if off < 0 || n < 0 || off+n > d.Size {
			return nil, fmt.Errorf("range %d+%d of chunk %s of %d bytes", off, n, d.Chunk, d.Size)
		}
		bp, err := f.decode(ctx, d)
		if err != nil {
			return nil, err
		}
		return &pooledReader{Reader: bytes.NewReader((*bp)[off : off+n]), bp: bp}, nil
	}
	rf, ok := f.src.(oci.RangeFetcher)
	if !ok {
		return nil, fmt.Errorf("%s: %w: no ranges", desc.Digest, errors.ErrUnsupported)
	}
	return rf.FetchRange(ctx, desc, off, n)
}

// pooledReader reads a pooled chunk buffer, which Close returns.
type pooledReader struct {
	*bytes.Reader
	bp *[]byte
}

// Close returns the buffer to the pool.
func (r *pooledReader) Close() error {
	if r.bp != nil {
		chunkBufs.Put(r.bp)
		r.bp = nil
	}
	return nil
}

// chunkBufs hold the buffers decoded chunks are written to: reused, a
// chunk's decode does not fault in fresh pages each time.
var chunkBufs = sync.Pool{New: func() any { return new([]byte) }}

// verifyBytes is verify.Bytes; tests count its calls.
var verifyBytes = verify.Bytes

// plainDescriptor is the descriptor of the plain chunk d encodes.
func (d Delta) plainDescriptor() ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: MediaTypeChunk, Digest: d.Chunk, Size: d.Size}
}

// decode fetches the delta blob and the base of d (at once), decodes the
// chunk into a pooled buffer and verifies it: the one hash of the chunk's
// bytes. The base is not hashed on the way: the decoded chunk's digest
// vouches for it. Only when the chunk does not verify is the base hashed,
// to tell a lying base (a local one is then replaced by the fetched one)
// from a lying delta.
func (f *deltaSource) decode(ctx context.Context, d Delta) (*[]byte, error) {
	var (
		delta []byte
		derr  error
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		delta, derr = verify.Fetch(ctx, f.src, "delta", d.Descriptor())
	}()
	base, local, berr := f.base(ctx, d, true)
	wg.Wait()
	defer func() { f.release(base, local) }()
	if derr != nil {
		return nil, fmt.Errorf("delta of chunk %s: %w", d.Chunk, derr)
	}
	if berr != nil {
		return nil, fmt.Errorf("base of chunk %s: %w", d.Chunk, berr)
	}
	bp := chunkBufs.Get().(*[]byte)
	out, err := DecodeDeltaTo(*bp, delta, base, d.Size)
	if err == nil {
		*bp = out
		err = verifyBytes("chunk", out, d.plainDescriptor())
		if err != nil {
			err = fmt.Errorf("decoded delta: %w", err)
		}
	}
	if err != nil && verifyBytes("base", base, d.BaseDescriptor()) != nil {
		if !local {
			chunkBufs.Put(bp)
			return nil, fmt.Errorf("base of chunk %s: %w", d.Chunk, verifyBytes("base chunk", base, d.BaseDescriptor()))
		}
		// A local base that lies: fetch the base, and decode again.
		if f.stats != nil {
			f.stats.LocalBases--
		}
		f.release(base, local)
		if base, local, err = f.base(ctx, d, false); err != nil {
			chunkBufs.Put(bp)
			return nil, fmt.Errorf("base of chunk %s: %w", d.Chunk, err)
		}
		if out, err = DecodeDeltaTo(*bp, delta, base, d.Size); err == nil {
			*bp = out
			if err = verifyBytes("chunk", out, d.plainDescriptor()); err != nil {
				err = fmt.Errorf("decoded delta: %w", err)
			}
		}
	}
	if err != nil {
		chunkBufs.Put(bp)
		if errors.Is(err, ErrDelta) {
			return nil, fmt.Errorf("chunk %s: %w", d.Chunk, err)
		}
		return nil, err
	}
	if f.stats != nil {
		f.stats.Decoded++
		f.stats.DeltaBytes += d.DeltaSize
	}
	return bp, nil
}

// base returns the bytes of d's base, of its size but not yet verified:
// found locally (when tryLocal; local reports it), else fetched.
func (f *deltaSource) base(ctx context.Context, d Delta, tryLocal bool) (b []byte, local bool, err error) {
	bd := d.BaseDescriptor()
	if find, ok := ctx.Value(localBasesKey{}).(LocalBases); ok && find != nil && tryLocal {
		if b, err := find(ctx, bd); err == nil && int64(len(b)) == bd.Size {
			if f.stats != nil {
				f.stats.LocalBases++
			}
			return b, true, nil
		}
	}
	src := f.bases
	if src == nil {
		src = f.src
	}
	rc, err := src.Fetch(ctx, bd)
	if err != nil {
		return nil, false, err
	}
	defer rc.Close()
	bp := chunkBufs.Get().(*[]byte)
	if int64(cap(*bp)) < bd.Size {
		*bp = make([]byte, bd.Size)
	}
	b = (*bp)[:bd.Size]
	if n, err := io.ReadFull(rc, b); err == io.EOF || err == io.ErrUnexpectedEOF {
		chunkBufs.Put(bp)
		return nil, false, verify.Digest("base chunk", bd, "", int64(n))
	} else if err != nil {
		chunkBufs.Put(bp)
		return nil, false, err
	}
	if n, _ := rc.Read(make([]byte, 1)); n > 0 {
		chunkBufs.Put(bp)
		return nil, false, verify.Digest("base chunk", bd, "", bd.Size+1)
	}
	if f.stats != nil {
		f.stats.BaseBytes += d.Size
	}
	return b, false, nil
}

// release returns a fetched base's buffer to the pool (a local base's is
// the finder's).
func (f *deltaSource) release(base []byte, local bool) {
	if base != nil && !local {
		chunkBufs.Put(&base)
	}
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
