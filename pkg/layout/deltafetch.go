package layout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
	"sync/atomic"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/sha2x"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// LocalBases finds a base chunk where a reader already has it (a file of
// the directory a pull upgrades) and reads its desc.Size bytes into dst:
// they are not trusted (the decoded chunk's digest vouches for them, and
// the base is fetched instead when they turn out wrong or it returns an
// error).
type LocalBases func(ctx context.Context, desc ocispec.Descriptor, dst []byte) error

type localBasesKey struct{}

// WithLocalBases returns ctx carrying find: a delta chunk fetched under it
// looks for its base there first.
func WithLocalBases(ctx context.Context, find LocalBases) context.Context {
	return context.WithValue(ctx, localBasesKey{}, find)
}

// DeltaStats count what a delta source fetched (updated atomically).
type DeltaStats struct {
	Decoded    int64 // delta chunks decoded
	DeltaBytes int64 // bytes of delta blobs fetched
	BaseBytes  int64 // bytes of base chunks fetched (not found locally)
	LocalBases int64 // base chunks found locally (and right)
}

// add counts into s, when not nil.
func (s *DeltaStats) add(decoded, deltaBytes, baseBytes, localBases int64) {
	if s == nil {
		return
	}
	atomic.AddInt64(&s.Decoded, decoded)
	atomic.AddInt64(&s.DeltaBytes, deltaBytes)
	atomic.AddInt64(&s.BaseBytes, baseBytes)
	atomic.AddInt64(&s.LocalBases, localBases)
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
	return verify.NewChecked(*bp, d.plainDescriptor(), func() { putBuf(bp) }), nil
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
		putBuf(r.bp)
		r.bp = nil
	}
	return nil
}

// verifyBytes is verify.Bytes; tests count its calls.
var verifyBytes = verify.Bytes

// newChunkHash returns the hash a decoded chunk is verified with (a
// sha2x.Digest, hashed beside other streams under WithHashPairs); tests
// count what it hashes.
var newChunkHash = func() hash.Hash { return sha2x.NewDigest() }

type hashPairsKey struct{}

// WithHashPairs returns ctx under which a delta chunk decoded is hashed
// through pairs: two at a time with the other streams offered to it (other
// chunks decoded, or streamed by the caller), each piece hashed while the
// next is XORed in.
func WithHashPairs(ctx context.Context, pairs *sha2x.Pairer) context.Context {
	return context.WithValue(ctx, hashPairsKey{}, pairs)
}

// decodeBlock is how many bytes of a chunk are XORed in, then hashed, at a
// time: the hash finds them in the processor's cache.
const decodeBlock = 256 << 10

// xorHashed XORs the delta x into b, the base (b becomes the chunk), a
// piece at a time, hashing each piece as soon as it is done, and verifies
// the chunk against desc: the one hash of its bytes.
// Under pairs (not nil) a piece is offered to it, to be hashed beside
// another stream's bytes, while the next piece is XORed in.
func xorHashed(b []byte, x *xdelta, desc ocispec.Descriptor, pairs *sha2x.Pairer) error {
	h := newChunkHash()
	d, _ := h.(*sha2x.Digest)
	if pairs == nil {
		d = nil
	}
	var offer *sha2x.Offer
	defer func() { pairs.Collect(offer) }() // nothing hashes b after a return
	planes := x.planes
	m, step := len(b)/planes, decodeBlock/planes
	for lo := 0; ; lo += step {
		hi := min(lo+step, m)
		x.xorRange(b, lo, hi) // bytes no offer holds
		end := hi * planes
		if hi == m {
			end = len(b)
		}
		pairs.Collect(offer)
		offer = nil
		if d != nil {
			offer = pairs.Offer(d, b[lo*planes:end])
		} else {
			h.Write(b[lo*planes : end])
		}
		if hi == m {
			break
		}
	}
	pairs.Collect(offer)
	offer = nil
	return verify.Digest("chunk", desc, digest.NewDigest(digest.SHA256, h), int64(len(b)))
}

// plainDescriptor is the descriptor of the plain chunk d encodes.
func (d Delta) plainDescriptor() ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: MediaTypeChunk, Digest: d.Chunk, Size: d.Size}
}

// decode fetches the delta blob and the base of d at once, decodes the
// chunk in place over the base's buffer (pooled: putBuf it) and verifies
// it: the one hash of the chunk's bytes. The base is not hashed on the way:
// the decoded chunk's digest vouches for it. Only when the chunk does not
// verify is the base restored (XORing the same planes in again) and
// hashed, to tell a lying base (a local one is then replaced by the fetched
// one) from a lying delta.
func (f *deltaSource) decode(ctx context.Context, d Delta) (*[]byte, error) {
	var (
		dp   *[]byte
		derr error
		wg   sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		dp, derr = f.fetchDelta(ctx, d)
	}()
	bp, local, berr := f.base(ctx, d, true)
	wg.Wait()
	defer putBuf(dp)
	if derr != nil {
		putBuf(bp)
		return nil, fmt.Errorf("delta of chunk %s: %w", d.Chunk, derr)
	}
	if berr != nil {
		return nil, fmt.Errorf("base of chunk %s: %w", d.Chunk, berr)
	}
	// A delta blob that does not decode to size bytes lies, whatever the
	// base: the base takes no part in that.
	xd, err := decodeX(*dp, d.Size, d.Format != FormatVersion3)
	if err != nil {
		putBuf(bp)
		return nil, fmt.Errorf("chunk %s: %w", d.Chunk, err)
	}
	defer xd.release()
	pairs, _ := ctx.Value(hashPairsKey{}).(*sha2x.Pairer)
	for {
		err := xorHashed(*bp, xd, d.plainDescriptor(), pairs) // the chunk, in place of its base
		if err == nil {
			if local {
				f.stats.add(1, d.DeltaSize, 0, 1)
			} else {
				f.stats.add(1, d.DeltaSize, 0, 0)
			}
			return bp, nil
		}
		xd.xorAll(*bp) // the base again
		berr := verifyBytes("base chunk", *bp, d.BaseDescriptor())
		putBuf(bp)
		switch {
		case berr == nil:
			return nil, fmt.Errorf("decoded delta: %w", err)
		case !local:
			return nil, fmt.Errorf("base of chunk %s: %w", d.Chunk, berr)
		}
		// A local base that lies: fetch the base, and decode again.
		if bp, local, err = f.base(ctx, d, false); err != nil {
			return nil, fmt.Errorf("base of chunk %s: %w", d.Chunk, err)
		}
	}
}

// fetchDelta fetches the delta blob of d, verified, into a pooled buffer.
func (f *deltaSource) fetchDelta(ctx context.Context, d Delta) (*[]byte, error) {
	desc := d.Descriptor()
	rc, err := f.src.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	bp := getBuf(int(desc.Size))
	vr := verify.Reader(rc, "delta", desc)
	if _, err = io.ReadFull(vr, *bp); err == nil {
		if _, err = vr.Read(nil); err == io.EOF { // the verdict, kept by vr
			return bp, nil
		}
	}
	putBuf(bp)
	return nil, err
}

// base returns the bytes of d's base in a pooled buffer, of its size but
// not yet verified: found locally (when tryLocal; local reports it), else
// fetched.
func (f *deltaSource) base(ctx context.Context, d Delta, tryLocal bool) (bp *[]byte, local bool, err error) {
	bd := d.BaseDescriptor()
	bp = getBuf(int(bd.Size))
	if find, ok := ctx.Value(localBasesKey{}).(LocalBases); ok && find != nil && tryLocal {
		if find(ctx, bd, *bp) == nil {
			return bp, true, nil
		}
	}
	src := f.bases
	if src == nil {
		src = f.src
	}
	// A cache of bases serves the bases it holds; one it does not hold is
	// fetched from src past it and offered to it unverified, not hashed
	// for it on the way (the cache hashes it when it is opened).
	bc, keep := f.bases.(BaseCache)
	cached := false
	if keep {
		rc, ok, err := bc.FetchCached(ctx, bd)
		if err != nil {
			putBuf(bp)
			return nil, false, err
		}
		if ok {
			keep, cached = false, true
			src = fetched{rc}
		} else {
			src = f.src
		}
	}
	if parts, ok := ctx.Value(basePartsKey{}).(int); ok && !cached && parts > 1 && bd.Size >= splitBaseMin {
		if rf, ok := src.(oci.RangeFetcher); ok && fetchRanges(ctx, rf, bd, *bp, parts) == nil {
			f.stats.add(0, 0, d.Size, 0)
			if keep {
				bc.Keep(bd, *bp)
			}
			return bp, false, nil
		}
		// No ranges from src, or one failed: the base whole, below.
	}
	rc, err := src.Fetch(ctx, bd)
	if err != nil {
		putBuf(bp)
		return nil, false, err
	}
	defer rc.Close()
	if n, err := io.ReadFull(rc, *bp); err == io.EOF || err == io.ErrUnexpectedEOF {
		putBuf(bp)
		return nil, false, verify.Digest("base chunk", bd, "", int64(n))
	} else if err != nil {
		putBuf(bp)
		return nil, false, err
	}
	if verify.End("base chunk", bd, rc, bd.Digest, bd.Size) != nil {
		putBuf(bp)
		return nil, false, verify.Digest("base chunk", bd, "", bd.Size+1)
	}
	if !cached {
		f.stats.add(0, 0, d.Size, 0)
	}
	if keep {
		bc.Keep(bd, *bp) // before the chunk is decoded over it
	}
	return bp, false, nil
}

type basePartsKey struct{}

// WithBaseParts returns ctx under which the base of a delta chunk that
// must be fetched, when it has at least 4 MiB and its source serves
// ranges, is fetched as up to parts (at most 8) concurrent range requests
// of about 2 MiB: for a reader that waits for the chunk, as a mount splits
// a plain chunk. The bytes are checked as a whole base's are: by the
// decoded chunk's digest.
func WithBaseParts(ctx context.Context, parts int) context.Context {
	return context.WithValue(ctx, basePartsKey{}, parts)
}

// splitBaseMin, splitBasePart and maxBaseParts shape a base fetched by
// ranges: only a base of splitBaseMin bytes or more, in parts of about
// splitBasePart, at most maxBaseParts of them.
const (
	splitBaseMin  = 4 << 20
	splitBasePart = 2 << 20
	maxBaseParts  = 8
)

// fetchRanges reads the bytes of desc into dst as up to parts concurrent
// range requests of rf. It fails when a request fails or a range does not
// have its length.
func fetchRanges(ctx context.Context, rf oci.RangeFetcher, desc ocispec.Descriptor, dst []byte, parts int) error {
	n := int(min(int64(min(parts, maxBaseParts)), (desc.Size+splitBasePart-1)/splitBasePart))
	size := (desc.Size + int64(n) - 1) / int64(n)
	g, gctx := errgroup.WithContext(ctx)
	for i := range n {
		off := int64(i) * size
		m := min(size, desc.Size-off)
		g.Go(func() error {
			rc, err := rf.FetchRange(gctx, desc, off, m)
			if err != nil {
				return err
			}
			defer rc.Close()
			if _, err := io.ReadFull(rc, dst[off:off+m]); err != nil {
				return err
			}
			if k, _ := rc.Read(make([]byte, 1)); k > 0 {
				return fmt.Errorf("blob %s: range %d+%d has more bytes", desc.Digest, off, m)
			}
			return nil
		})
	}
	return g.Wait()
}

// BaseCache is a fetcher of base chunks that keeps them (a chunk cache in
// front of a source): FetchCached serves a base it holds, verified, and
// reports ok false, fetching nothing, when it holds none; Keep offers it
// the bytes of a base fetched past it, not verified, which it must verify
// before it serves them.
type BaseCache interface {
	content.Fetcher
	FetchCached(ctx context.Context, desc ocispec.Descriptor) (rc io.ReadCloser, ok bool, err error)
	Keep(desc ocispec.Descriptor, b []byte)
}

// fetched is a fetcher of one body already opened.
type fetched struct{ rc io.ReadCloser }

// Fetch returns the body.
func (f fetched) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) { return f.rc, nil }

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
