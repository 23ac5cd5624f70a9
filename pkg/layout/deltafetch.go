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
	// Streamed are delta chunks served as their base streamed in, for
	// the reader to verify (WithStreamedDeltas); one read to its end
	// counts in Decoded as well.
	Streamed int64
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
	streamed   sync.Map // digest.Digest: the delta chunks streamed once
}

// Local reports whether the wrapped source reads local files.
func (f *deltaSource) Local() bool {
	l, ok := f.src.(interface{ Local() bool })
	return ok && l.Local()
}

// Fetch returns the bytes of chunk desc. Those of a delta chunk come
// decoded and verified, in a *verify.Checked: a consumer need not hash
// them again; under WithStreamedDeltas, the first fetch of a delta chunk
// whose base is fetched whole from the source comes decoded as the base
// streams in, not verified (see WithStreamedDeltas).
func (f *deltaSource) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	d, ok := f.x.DeltaOf(desc.Digest)
	if !ok || desc.Size != d.Size {
		return f.src.Fetch(ctx, desc)
	}
	if f.streams(ctx, d) {
		return f.fetchStreamed(ctx, d)
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
		if rc, ok, err := f.decodeRange(ctx, d, off, n); ok || err != nil {
			return rc, err
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

// rangeGroup is the bytes of 8 elements of the widest planes: a range of a
// delta chunk decoded alone starts and ends on a multiple of it (or at the
// chunk's end), a whole number of groups of 8 elements whatever the planes.
const rangeGroup = 8 * Planes32

// decodeRange decodes bytes off to off+n of the delta chunk d alone, not
// verified (as a range of a plain chunk is not): the delta blob is fetched
// (verified) and decoded while the base's bytes around the range (widened
// to rangeGroup) are fetched as one range request, then the delta's
// elements for them are XORed in. ok is false, nothing fetched, when the
// base cannot be fetched by ranges or a cache of bases holds it (the chunk
// is then decoded whole over it).
func (f *deltaSource) decodeRange(ctx context.Context, d Delta, off, n int64) (rc io.ReadCloser, ok bool, err error) {
	rf, ok := f.baseSource().(oci.RangeFetcher)
	if !ok {
		return nil, false, nil
	}
	if held, err := f.cachedBase(ctx, d); err != nil || held {
		return nil, false, err
	}
	lo := off / rangeGroup * rangeGroup
	hi := min((off+n+rangeGroup-1)/rangeGroup*rangeGroup, d.Size)
	win := make([]byte, hi-lo)
	xd, err := f.withDelta(ctx, d, func() error {
		rc, err := rf.FetchRange(ctx, d.BaseDescriptor(), lo, hi-lo)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.ReadFull(rc, win)
		return err
	}, func() {})
	if err != nil {
		return nil, true, err
	}
	defer xd.release()
	p := int64(xd.planes)
	e1 := int(hi / p)
	if hi == d.Size {
		e1 = xd.m // with the bytes past the last whole element
	}
	xd.xorWindow(win, int(lo/p), e1)
	return io.NopCloser(bytes.NewReader(win[off-lo : off-lo+n])), true, nil
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
	hs := pairs.Stream(h)
	defer hs.Wait() // nothing hashes b after a return
	planes := x.planes
	m, step := len(b)/planes, decodeBlock/planes
	for lo := 0; ; lo += step {
		hi := min(lo+step, m)
		x.xorRange(b, lo, hi) // bytes no offer holds
		end := hi * planes
		if hi == m {
			end = len(b)
		}
		hs.Write(b[lo*planes : end])
		if hi == m {
			break
		}
	}
	hs.Wait()
	return verify.Digest("chunk", desc, digest.NewDigest(digest.SHA256, h), int64(len(b)))
}

// plainDescriptor is the descriptor of the plain chunk d encodes.
func (d Delta) plainDescriptor() ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: MediaTypeChunk, Digest: d.Chunk, Size: d.Size}
}

// decode fetches the delta blob and the base of d at once, decodes the
// chunk in place over the base's buffer (pooled: putBuf it) and verifies
// it: the one hash of the chunk's bytes (decodeOver).
func (f *deltaSource) decode(ctx context.Context, d Delta) (*[]byte, error) {
	var (
		bp    *[]byte
		local bool
	)
	xd, err := f.withDelta(ctx, d, func() (err error) {
		bp, local, err = f.base(ctx, d, true)
		return err
	}, func() { putBuf(bp) })
	if err != nil {
		return nil, err
	}
	return f.decodeOver(ctx, d, xd, bp, local)
}

// withDelta fetches the delta blob of d and decodes it while getBase runs
// (it gets the base, or opens its body), and returns the decoded delta
// (release it). When either fails, undo releases what getBase got.
func (f *deltaSource) withDelta(ctx context.Context, d Delta, getBase func() error, undo func()) (*xdelta, error) {
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
	berr := getBase()
	wg.Wait()
	defer putBuf(dp)
	if derr != nil {
		if berr == nil {
			undo()
		}
		return nil, fmt.Errorf("delta of chunk %s: %w", d.Chunk, derr)
	}
	if berr != nil {
		return nil, fmt.Errorf("base of chunk %s: %w", d.Chunk, berr)
	}
	// A delta blob that does not decode to size bytes lies, whatever the
	// base: the base takes no part in that.
	xd, err := decodeX(*dp, d.Size, d.Format != FormatVersion3)
	if err != nil {
		undo()
		return nil, fmt.Errorf("chunk %s: %w", d.Chunk, err)
	}
	return xd, nil
}

// decodeOver decodes the chunk of d in place over bp, its base's bytes
// (found locally when local), with the decoded delta xd, which it
// releases, and verifies it. The base is not hashed on the way: the
// decoded chunk's digest vouches for it. Only when the chunk does not
// verify is the base restored (XORing the same planes in again) and
// hashed, to tell a lying base (a local one is then replaced by the
// fetched one) from a lying delta.
func (f *deltaSource) decodeOver(ctx context.Context, d Delta, xd *xdelta, bp *[]byte, local bool) (*[]byte, error) {
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
	if tryLocal {
		if bp := findLocal(ctx, bd); bp != nil {
			return bp, true, nil
		}
	}
	bp = getBuf(int(bd.Size))
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
			keep = !basesNotKept(ctx)
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

// findLocal returns the bytes of the base bd in a pooled buffer, not
// verified, when the LocalBases of ctx find it; else nil.
func findLocal(ctx context.Context, bd ocispec.Descriptor) *[]byte {
	find, ok := ctx.Value(localBasesKey{}).(LocalBases)
	if !ok || find == nil {
		return nil
	}
	bp := getBuf(int(bd.Size))
	if find(ctx, bd, *bp) != nil {
		putBuf(bp)
		return nil
	}
	return bp
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

// FetchRange returns n bytes at off of chunk desc, unverified (as
// oci.RangeFetcher's): of a delta chunk, decoded from the delta blob and
// a range of its base around them (out of the whole chunk decoded and
// verified when its base cannot be fetched by ranges or a cache of bases
// holds it); of another, src's range.
func (f *deltaRangeSource) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	return f.fetchRange(ctx, desc, off, n)
}

type streamedDeltasKey struct{}

// WithStreamedDeltas returns ctx under which a delta chunk whose base must
// be fetched whole from the source (not found through LocalBases, not
// fetched by ranges under WithBaseParts, not offered to a BaseCache) is
// served as its base streams in: the delta blob is fetched and decoded
// first, then each piece of the base read is XORed with the delta's
// planes for its elements and handed on, never the whole chunk in memory.
// Those bytes are not verified: the reader must hash them and refuse the
// chunk unless they match its digest, as it does a plain chunk's. Only
// the first fetch of a chunk is streamed: a later one (a retry after a
// mismatch) decodes it whole and verified, which tells a lying base from
// a lying delta. A source of local files (fetched once, not retried) is
// not streamed.
func WithStreamedDeltas(ctx context.Context) context.Context {
	return context.WithValue(ctx, streamedDeltasKey{}, true)
}

// streams reports whether the delta chunk d may be streamed under ctx
// (WithStreamedDeltas), its base fetched whole from the source: not a
// local source, no cache of bases, no split by ranges.
func (f *deltaSource) streams(ctx context.Context, d Delta) bool {
	if on, _ := ctx.Value(streamedDeltasKey{}).(bool); !on || f.Local() {
		return false
	}
	if _, ok := f.bases.(BaseCache); ok && !basesNotKept(ctx) {
		return false
	}
	if parts, ok := ctx.Value(basePartsKey{}).(int); ok && parts > 1 && d.Size >= splitBaseMin {
		if _, ok := f.baseSource().(oci.RangeFetcher); ok {
			return false
		}
	}
	return true
}

// baseSource is where bases are fetched from: bases, else src; src past
// a BaseCache (a base it holds is read from it before this is asked).
func (f *deltaSource) baseSource() content.Fetcher {
	if _, ok := f.bases.(BaseCache); ok || f.bases == nil {
		return f.src
	}
	return f.bases
}

type basesNotKeptKey struct{}

// WithBasesNotKept returns ctx under which a delta chunk's base that a
// BaseCache of the source does not hold is fetched from the source and not
// offered to the cache (Keep): a reader waiting for the chunk does not wait
// while the base is written as well, and a chunk fetched under
// WithStreamedDeltas may stream from its base's body (a base the cache
// holds is read from it, the chunk decoded whole over it).
func WithBasesNotKept(ctx context.Context) context.Context {
	return context.WithValue(ctx, basesNotKeptKey{}, true)
}

// basesNotKept reports whether ctx is under WithBasesNotKept.
func basesNotKept(ctx context.Context) bool {
	on, _ := ctx.Value(basesNotKeptKey{}).(bool)
	return on
}

// cachedBase reports whether the BaseCache of f (if any) holds the base of d.
func (f *deltaSource) cachedBase(ctx context.Context, d Delta) (bool, error) {
	bc, ok := f.bases.(BaseCache)
	if !ok {
		return false, nil
	}
	rc, ok, err := bc.FetchCached(ctx, d.BaseDescriptor())
	if ok {
		rc.Close()
	}
	return ok, err
}

// fetchStreamed serves the delta chunk d under WithStreamedDeltas: its
// delta blob is fetched and decoded while its base is found locally (the
// chunk is then decoded over it, whole and verified) or, on the chunk's
// first fetch, its base's body opened: the reader returned XORs each piece
// of the base read into the chunk's bytes (not verified). A later fetch
// decodes the chunk whole.
func (f *deltaSource) fetchStreamed(ctx context.Context, d Delta) (io.ReadCloser, error) {
	var (
		bp    *[]byte
		local bool
		rc    io.ReadCloser
	)
	xd, err := f.withDelta(ctx, d, func() (err error) {
		if bp = findLocal(ctx, d.BaseDescriptor()); bp != nil {
			local = true
			return nil
		}
		// A base a cache holds (WithBasesNotKept): decoded over, whole.
		if ok, err := f.cachedBase(ctx, d); err != nil || ok {
			if err == nil {
				bp, local, err = f.base(ctx, d, false)
			}
			return err
		}
		if _, again := f.streamed.LoadOrStore(d.Chunk, true); again {
			bp, local, err = f.base(ctx, d, false)
			return err
		}
		rc, err = f.baseSource().Fetch(ctx, d.BaseDescriptor())
		return err
	}, func() {
		putBuf(bp)
		if rc != nil {
			rc.Close()
		}
	})
	if err != nil {
		return nil, err
	}
	if rc != nil {
		f.stats.addStreamed()
		return &streamedDelta{ctx: ctx, f: f, d: d, base: rc, xd: xd}, nil
	}
	if bp, err = f.decodeOver(ctx, d, xd, bp, local); err != nil {
		return nil, err
	}
	return verify.NewChecked(*bp, d.plainDescriptor(), func() { putBuf(bp) }), nil
}

// addStreamed counts a chunk streamed into s, when not nil.
func (s *DeltaStats) addStreamed() {
	if s != nil {
		atomic.AddInt64(&s.Streamed, 1)
	}
}

// streamedDelta reads a delta chunk as its base's body streams in: each
// read fills the caller's buffer from the base (a whole number of groups
// of 8 elements, or the rest of the chunk) and XORs the delta's planes for
// those elements into it. A body that is short or long ends in an error;
// the bytes are not verified.
type streamedDelta struct {
	ctx   context.Context
	f     *deltaSource
	d     Delta
	base  io.ReadCloser
	xd    *xdelta
	off   int    // bytes of the chunk decoded
	pend  []byte // bytes decoded into small, not yet read
	small [9 * Planes32]byte
	err   error // io.EOF once every byte is decoded
}

// span returns how many bytes, k, the next piece has when c bytes fit,
// and the element it ends at, hi: the rest of the chunk when it fits,
// else a whole number of groups of 8 elements short of the last element
// (the bytes past the last whole element go with it); k is 0 when c holds
// no group.
func (s *streamedDelta) span(c int) (k, hi int) {
	x := s.xd
	if rest := x.size - s.off; rest <= c {
		return rest, x.m
	}
	lo := s.off / x.planes
	e := (c / x.planes) &^ 7
	if lo+e >= x.m {
		e -= 8
	}
	if e <= 0 {
		return 0, 0
	}
	return e * x.planes, lo + e
}

// Read reads the next bytes of the chunk.
func (s *streamedDelta) Read(p []byte) (int, error) {
	if len(s.pend) > 0 {
		n := copy(p, s.pend)
		s.pend = s.pend[n:]
		return n, nil
	}
	if s.err != nil {
		return 0, s.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	win := p
	k, hi := s.span(len(p))
	if k == 0 { // too small a buffer for a group of elements
		k, hi = s.span(len(s.small))
		win = s.small[:]
	}
	if err := s.piece(win[:k], hi); err != nil {
		s.err = err
		return 0, err
	}
	if &win[0] == &s.small[0] {
		n := copy(p, s.small[:k])
		s.pend = s.small[n:k]
		return n, nil
	}
	return k, nil
}

// piece reads the next len(win) bytes of the base into win and XORs the
// delta's elements up to hi into them; after the last it checks that the
// base has no byte more.
func (s *streamedDelta) piece(win []byte, hi int) error {
	if err := s.ctx.Err(); err != nil {
		return err
	}
	bd := s.d.BaseDescriptor()
	if n, err := io.ReadFull(s.base, win); err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("base of chunk %s: %w", s.d.Chunk, verify.Digest("base chunk", bd, "", int64(s.off+n)))
	} else if err != nil {
		return fmt.Errorf("base of chunk %s: %w", s.d.Chunk, err)
	}
	s.xd.xorWindow(win, s.off/s.xd.planes, hi)
	s.off += len(win)
	if s.off < s.xd.size {
		return nil
	}
	if verify.End("base chunk", bd, s.base, bd.Digest, bd.Size) != nil {
		return fmt.Errorf("base of chunk %s: %w", s.d.Chunk, verify.Digest("base chunk", bd, "", bd.Size+1))
	}
	s.f.stats.add(1, s.d.DeltaSize, s.d.Size, 0)
	s.err = io.EOF
	return nil
}

// Close releases the delta and closes the base's body.
func (s *streamedDelta) Close() error {
	if s.xd == nil {
		return nil
	}
	s.xd.release()
	s.xd = nil
	s.err = errors.New("layout: read of a closed delta chunk")
	return s.base.Close()
}
