package layout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// stepBytes returns n random bytes and the same bytes with about one in
// every 40 changed.
func stepBytes(n int, seed uint64) (base, next []byte) {
	r := rand.New(rand.NewPCG(seed, 2))
	base = make([]byte, n)
	for i := range base {
		base[i] = byte(r.Uint32())
	}
	next = bytes.Clone(base)
	for i := range next {
		if r.IntN(40) == 0 {
			next[i] ^= byte(1 + r.IntN(255))
		}
	}
	return base, next
}

// readInSteps reads r to its end through reads of the sizes of steps in
// turn.
func readInSteps(r io.Reader, steps []int) ([]byte, error) {
	var out []byte
	for k := 0; ; k++ {
		p := make([]byte, steps[k%len(steps)])
		n, err := r.Read(p)
		out = append(out, p[:n]...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// TestStreamedDeltaReader: the reader of a delta chunk streamed over its
// base yields the chunk, for dense ("BDX1") and sparse ("BDX2") blobs of
// every number of planes, chunk sizes that are no multiple of the planes
// nor of a piece (from 257 bytes: a "BDX1" frame of fewer leaves its size
// out, and is refused), and reads of any size (a byte, less than a group of 8
// elements, a piece a streaming pull reads).
func TestStreamedDeltaReader(t *testing.T) {
	stepsOf := [][]int{{512 << 10}, {1, 7, 33, 4096 + 5, 100 << 10}, {4097}, {3}}
	for _, size := range []int{257, 1001, 4099, 300_001, 1<<20 + 13} {
		for _, planes := range []int{PlanesRaw, Planes16, Planes32} {
			for _, sparse := range []bool{false, true} {
				base, next := stepBytes(size, uint64(size*planes))
				delta, err := encodeDelta(next, base, planes, sparse)
				if err != nil {
					t.Fatal(err)
				}
				if !sparse && DeltaFormat(delta) != FormatVersion3 || sparse && size > 1000 && DeltaFormat(delta) != FormatVersion4 {
					t.Fatalf("size %d planes %d: a blob of format %d", size, planes, DeltaFormat(delta))
				}
				for _, steps := range stepsOf {
					if len(steps) == 1 && steps[0] == 3 && size > 5000 {
						continue // byte by byte: small chunks only
					}
					name := fmt.Sprintf("size %d planes %d format %d reads %v", size, planes, DeltaFormat(delta), steps)
					xd, err := decodeX(delta, int64(size), true)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					d := Delta{Chunk: digest.FromBytes(next), Size: int64(size), Base: digest.FromBytes(base)}
					s := &streamedDelta{ctx: context.Background(), f: &deltaSource{}, d: d, base: io.NopCloser(bytes.NewReader(base)), xd: xd}
					got, err := readInSteps(s, steps)
					s.Close()
					if err != nil || !bytes.Equal(got, next) {
						t.Fatalf("%s: %v, %d bytes, equal %v", name, err, len(got), bytes.Equal(got, next))
					}
				}
			}
		}
	}
}

// streamVersion stores a version of one file of one chunk, plain, stored
// as the delta blob delta against base, and opens it.
func streamVersion(t *testing.T, plain, base, delta []byte) (*memory.Store, *Version) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	ch := Chunk{Digest: digest.FromBytes(plain), Size: int64(len(plain))}
	ch.Head, ch.Tail = digest.FromBytes(plain[:EdgeBytes]), digest.FromBytes(plain[len(plain)-EdgeBytes:])
	x := &Index{Version: FormatVersion, Chunking: DefaultParams, Chunks: []Chunk{ch}}
	x.Files = []File{{Path: "model.safetensors", Type: TypeFile, Mode: 0o644, Size: ch.Size, Digest: ch.Digest, Extents: []Extent{{0, 0, ch.Size}}}}
	s, err := Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	bd := content.NewDescriptorFromBytes(MediaTypeChunk, base)
	if err := store.Push(ctx, bd, bytes.NewReader(base)); err != nil {
		t.Fatal(err)
	}
	d := Delta{Chunk: ch.Digest, Size: ch.Size, Digest: digest.FromBytes(delta), DeltaSize: int64(len(delta)), Base: bd.Digest, Format: DeltaFormat(delta)}
	if err := store.Push(ctx, d.Descriptor(), bytes.NewReader(delta)); err != nil {
		t.Fatal(err)
	}
	if s, err = s.WithDeltas(map[digest.Digest]Delta{d.Chunk: d}, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, store); err != nil {
		t.Fatal(err)
	}
	v, err := Open(ctx, store, s.Root.Desc)
	if err != nil {
		t.Fatal(err)
	}
	return store, v
}

// TestDeltaFetchStreamed: under WithStreamedDeltas the first fetch of a
// delta chunk whose base is fetched streams it, hashing nothing (the
// reader verifies), and counts it; a second fetch of it decodes it whole
// and verified. Without the option, with a cache of bases, or with a
// local base, the chunk comes decoded whole. A cancelled stream stops.
func TestDeltaFetchStreamed(t *testing.T) {
	var hashed atomic.Int64
	old := newChunkHash
	newChunkHash = func() hash.Hash { return testutil.NewCountingHash(&hashed) }
	t.Cleanup(func() { newChunkHash = old })
	ctx := context.Background()
	sctx := WithStreamedDeltas(ctx)
	for _, sparse := range []bool{false, true} {
		hashed.Store(0)
		base, next := bf16Step(3<<20+6, 0.02, 9)
		delta, err := encodeDelta(next, base, Planes16, sparse)
		if err != nil {
			t.Fatal(err)
		}
		store, v := streamVersion(t, next, base, delta)
		var stats DeltaStats
		src := DeltaSource(store, nil, v.Index, &stats)
		rc, err := src.Fetch(sctx, v.Chunk(0))
		if err != nil {
			t.Fatal(err)
		}
		if verify.CheckedOf(rc) != nil {
			t.Fatalf("sparse %v: a streamed chunk vouched for as verified", sparse)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, next) {
			t.Fatalf("sparse %v: %v, equal %v", sparse, err, bytes.Equal(got, next))
		}
		if stats.Streamed != 1 || stats.Decoded != 1 || stats.BaseBytes != int64(len(base)) || hashed.Load() != 0 {
			t.Errorf("sparse %v: stats %+v, %d bytes hashed: want one chunk streamed, none hashed", sparse, stats, hashed.Load())
		}
		// Fetched again (a retry): decoded whole, verified.
		rc, err = src.Fetch(sctx, v.Chunk(0))
		if err != nil {
			t.Fatal(err)
		}
		if !verify.CheckedOf(rc).Vouches(v.Chunk(0)) || stats.Streamed != 1 || hashed.Load() != int64(len(next)) {
			t.Errorf("sparse %v: a second fetch streamed (%+v) or not verified", sparse, stats)
		}
		rc.Close()
		// Not streamed: without the option, with a local base, with a
		// cache of bases.
		hashed.Store(0)
		local := WithLocalBases(sctx, func(_ context.Context, _ ocispec.Descriptor, dst []byte) error { copy(dst, base); return nil })
		for name, fetch := range map[string]func() (io.ReadCloser, error){
			"no option": func() (io.ReadCloser, error) { return DeltaSource(store, nil, v.Index, &stats).Fetch(ctx, v.Chunk(0)) },
			"local base": func() (io.ReadCloser, error) {
				return DeltaSource(store, nil, v.Index, &stats).Fetch(local, v.Chunk(0))
			},
			"base cache": func() (io.ReadCloser, error) {
				return DeltaSource(store, keepingCache{store}, v.Index, &stats).Fetch(sctx, v.Chunk(0))
			},
		} {
			rc, err := fetch()
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !verify.CheckedOf(rc).Vouches(v.Chunk(0)) {
				t.Errorf("sparse %v, %s: streamed", sparse, name)
			}
			rc.Close()
		}
		if stats.Streamed != 1 {
			t.Errorf("sparse %v: %d streamed, want 1", sparse, stats.Streamed)
		}
		// A stream whose context is cancelled stops at the next piece.
		cctx, cancel := context.WithCancel(sctx)
		rc, err = DeltaSource(store, nil, v.Index, nil).Fetch(cctx, v.Chunk(0))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(rc, make([]byte, 1<<16)); err != nil {
			t.Fatal(err)
		}
		cancel()
		if _, err := io.ReadAll(rc); !errors.Is(err, context.Canceled) {
			t.Errorf("sparse %v: a cancelled stream read on: %v", sparse, err)
		}
		rc.Close()
	}
}

// keepingCache is a BaseCache that holds nothing and keeps nothing.
type keepingCache struct{ content.Fetcher }

func (keepingCache) FetchCached(context.Context, ocispec.Descriptor) (io.ReadCloser, bool, error) {
	return nil, false, nil
}
func (keepingCache) Keep(ocispec.Descriptor, []byte) {}

// longFetcher serves the blob of one digest with a byte more.
type longFetcher struct {
	content.Fetcher
	d digest.Digest
}

func (f longFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := f.Fetcher.Fetch(ctx, desc)
	if err != nil || desc.Digest != f.d {
		return rc, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(rc, strings.NewReader("x")), rc}, nil
}

// TestDeltaFetchStreamedHostile: a streamed chunk over a lying base, or
// of a delta decoding to other bytes, fails its digest (the reader's
// check), and the retry, decoded whole, names the culprit; a base body
// short or long is an error of its size.
func TestDeltaFetchStreamedHostile(t *testing.T) {
	ctx := WithStreamedDeltas(context.Background())
	base, next := bf16Step(1<<20+2, 0.02, 11)
	good := mustDelta(t, next, base, Planes16)
	bd := digest.FromBytes(base)
	fetch := func(src content.Fetcher, v *Version) ([]byte, error) {
		return verify.Fetch(ctx, src, "chunk", v.Chunk(0))
	}
	t.Run("lying base", func(t *testing.T) {
		store, v := streamVersion(t, next, base, good)
		other := bytes.Clone(base)
		other[5] ^= 1
		src := DeltaSource(lyingFetcher{store, bd, other}, nil, v.Index, nil)
		if b, err := fetch(src, v); !errors.Is(err, verify.ErrDigestMismatch) || b != nil {
			t.Fatalf("streamed over a lying base: %v", err)
		}
		if _, err := fetch(src, v); !errors.Is(err, verify.ErrDigestMismatch) || !strings.Contains(err.Error(), "base of chunk") {
			t.Fatalf("the retry of a lying base: %v, want the base named", err)
		}
	})
	t.Run("decodes to other bytes", func(t *testing.T) {
		p := bytes.Clone(next)
		p[100] ^= 0x40
		store, v := streamVersion(t, next, base, mustDelta(t, p, base, Planes16))
		src := DeltaSource(store, nil, v.Index, nil)
		if b, err := fetch(src, v); !errors.Is(err, verify.ErrDigestMismatch) || b != nil {
			t.Fatalf("streamed from a lying delta: %v", err)
		}
		if _, err := fetch(src, v); !strings.Contains(fmt.Sprint(err), "decoded delta") {
			t.Fatalf("the retry of a lying delta: %v, want the delta named", err)
		}
	})
	for name, body := range map[string]func(content.Fetcher) content.Fetcher{
		"short base": func(s content.Fetcher) content.Fetcher { return lyingFetcher{s, bd, base[:len(base)-3]} },
		"long base":  func(s content.Fetcher) content.Fetcher { return longFetcher{s, bd} },
	} {
		t.Run(name, func(t *testing.T) {
			store, v := streamVersion(t, next, base, good)
			var stats DeltaStats
			rc, err := DeltaSource(body(store), nil, v.Index, &stats).Fetch(ctx, v.Chunk(0))
			if err != nil {
				t.Fatal(err)
			}
			defer rc.Close()
			_, err = io.ReadAll(rc)
			var ve *verify.Error
			if !errors.As(err, &ve) || ve.Read == ve.Size || !strings.Contains(err.Error(), "base chunk") {
				t.Fatalf("a %s: %v, want an error of its size", name, err)
			}
			if stats.Streamed != 1 || stats.Decoded != 0 {
				t.Errorf("stats %+v", stats)
			}
		})
	}
}

// heldCache is a BaseCache holding the bases in held (verified, as a
// chunk cache serves them) and counting what it is offered.
type heldCache struct {
	content.Fetcher
	held  map[digest.Digest][]byte
	kept  *atomic.Int64
	asked *atomic.Int64
}

func (c heldCache) FetchCached(_ context.Context, desc ocispec.Descriptor) (io.ReadCloser, bool, error) {
	c.asked.Add(1)
	if b, ok := c.held[desc.Digest]; ok {
		return io.NopCloser(bytes.NewReader(b)), true, nil
	}
	return nil, false, nil
}

func (c heldCache) Keep(ocispec.Descriptor, []byte) { c.kept.Add(1) }

// TestDeltaStreamsPastBaseCache: under WithBasesNotKept a base a cache of
// bases lacks is fetched from the source and never offered to the cache
// (Keep), and under WithStreamedDeltas as well the chunk streams from the
// base's body (the reader verifies it); a base the cache holds is read
// from it and the chunk decoded whole over it, verified. A base that lies
// gets a streamed chunk that is not the chunk's bytes, then a retry's
// error that names the base.
func TestDeltaStreamsPastBaseCache(t *testing.T) {
	ctx := context.Background()
	base, next := bf16Step(3<<20+6, 0.02, 11)
	delta, err := encodeDelta(next, base, Planes16, true)
	if err != nil {
		t.Fatal(err)
	}
	store, v := streamVersion(t, next, base, delta)
	d, _ := v.Index.Delta(0)
	var kept, asked atomic.Int64
	empty := heldCache{store, nil, &kept, &asked}
	full := heldCache{store, map[digest.Digest][]byte{d.Base: base}, &kept, &asked}
	nctx := WithBasesNotKept(ctx)
	sctx := WithStreamedDeltas(nctx)
	for _, c := range []struct {
		name     string
		ctx      context.Context
		bases    heldCache
		streamed int64
	}{
		{"not kept", nctx, empty, 0},
		{"streamed", sctx, empty, 1},
		{"held", sctx, full, 0},
	} {
		var stats DeltaStats
		kept.Store(0)
		asked.Store(0)
		rc, err := DeltaSource(store, c.bases, v.Index, &stats).Fetch(c.ctx, v.Chunk(0))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		checked := verify.CheckedOf(rc).Vouches(v.Chunk(0))
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, next) {
			t.Fatalf("%s: %v, equal %v", c.name, err, bytes.Equal(got, next))
		}
		if stats.Streamed != c.streamed || checked != (c.streamed == 0) {
			t.Errorf("%s: %d streamed (want %d), verified %v", c.name, stats.Streamed, c.streamed, checked)
		}
		if kept.Load() != 0 || asked.Load() == 0 {
			t.Errorf("%s: the base offered to the cache %d times (want none), the cache asked %d times", c.name, kept.Load(), asked.Load())
		}
		if c.bases.held != nil && stats.BaseBytes != 0 {
			t.Errorf("%s: %d base bytes fetched, want none (the cache holds it)", c.name, stats.BaseBytes)
		}
	}
	// A lying base: streamed bytes that are not the chunk, then a retry
	// that names the base.
	lying := longFetcher{store, d.Base}
	src := DeltaSource(lying, heldCache{lying, nil, &kept, &asked}, v.Index, nil)
	rc, err := src.Fetch(sctx, v.Chunk(0))
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if err == nil {
		t.Fatal("a base with a byte more streamed without an error")
	}
	if _, err = src.Fetch(sctx, v.Chunk(0)); err == nil || !strings.Contains(err.Error(), "base of chunk") {
		t.Fatalf("the retry: %v, want an error naming the base", err)
	}
}

// TestDeltaRangeDecodedAlone: a range of a delta chunk (an edge, one in
// the middle, the last bytes past the last whole element) is decoded from
// the delta blob and one range request of its base around it, never the
// base whole, for every number of planes, dense and sparse; a source whose
// base a cache holds decodes the whole chunk over it.
func TestDeltaRangeDecodedAlone(t *testing.T) {
	ctx := context.Background()
	for _, planes := range []int{PlanesRaw, Planes16, Planes32} {
		for _, sparse := range []bool{false, true} {
			base, next := bf16Step(3<<20+7, 0.02, uint64(20+planes))
			delta, err := encodeDelta(next, base, planes, sparse)
			if err != nil {
				t.Fatal(err)
			}
			store, v := streamVersion(t, next, base, delta)
			d, _ := v.Index.Delta(0)
			size := int64(len(next))
			src := &rangeStore{Store: store, whole: map[digest.Digest]int{}, ranges: map[digest.Digest]int{}}
			rf := DeltaSource(src, nil, v.Index, nil).(oci.RangeFetcher)
			spans := [][2]int64{{0, EdgeBytes}, {size - EdgeBytes, EdgeBytes}, {12345, 777}, {size - 3, 3}, {size - 1, 1}, {0, size}}
			for _, sp := range spans {
				rc, err := rf.FetchRange(ctx, v.Chunk(0), sp[0], sp[1])
				if err != nil {
					t.Fatalf("planes %d sparse %v, %d+%d: %v", planes, sparse, sp[0], sp[1], err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || !bytes.Equal(got, next[sp[0]:sp[0]+sp[1]]) {
					t.Fatalf("planes %d sparse %v, %d+%d: %v, equal %v", planes, sparse, sp[0], sp[1], err, bytes.Equal(got, next[sp[0]:sp[0]+sp[1]]))
				}
			}
			if src.whole[d.Base] != 0 || src.ranges[d.Base] != len(spans) {
				t.Errorf("planes %d sparse %v: the base fetched whole %d times, by %d ranges; want 0, %d", planes, sparse, src.whole[d.Base], src.ranges[d.Base], len(spans))
			}
			var kept, asked atomic.Int64
			held := heldCache{src, map[digest.Digest][]byte{d.Base: base}, &kept, &asked}
			rc, err := DeltaSource(src, held, v.Index, nil).(oci.RangeFetcher).FetchRange(ctx, v.Chunk(0), 0, EdgeBytes)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(got, next[:EdgeBytes]) || src.ranges[d.Base] != len(spans) {
				t.Errorf("planes %d sparse %v: over a held base: equal %v, base ranges %d", planes, sparse, bytes.Equal(got, next[:EdgeBytes]), src.ranges[d.Base])
			}
		}
	}
}
