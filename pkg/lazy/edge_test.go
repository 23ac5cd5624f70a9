package lazy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// rangeFake is a fakeFetcher that also serves byte ranges, counting them;
// it can corrupt them or refuse them.
type rangeFake struct {
	*fakeFetcher
	mu         sync.Mutex
	ranges     int
	rangeBytes int64
	byDigest   map[digest.Digest]int64 // range bytes asked of each blob
	spoil      bool                    // flip a byte of every range
	refuse     bool                    // answer every range with an error
}

func (f *rangeFake) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	f.mu.Lock()
	f.ranges++
	f.rangeBytes += n
	if f.byDigest == nil {
		f.byDigest = map[digest.Digest]int64{}
	}
	f.byDigest[desc.Digest] += n
	spoil, refuse := f.spoil, f.refuse
	f.mu.Unlock()
	if refuse {
		// What package oci answers when a registry ignores Range.
		return nil, fmt.Errorf("range GET: %w", errors.ErrUnsupported)
	}
	rc, err := f.src.Fetch(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	b = bytes.Clone(b[off : off+n])
	if spoil {
		b[len(b)/2] ^= 0xff
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// reset forgets every fetch and range counted so far.
func (f *rangeFake) reset() {
	f.fakeFetcher.reset()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ranges, f.rangeBytes, f.byDigest = 0, 0, map[digest.Digest]int64{}
}

// blobStats returns how often d was fetched whole and how many of its
// bytes were asked for as ranges.
func (f *rangeFake) blobStats(d digest.Digest) (whole int, rangeBytes int64) {
	f.fakeFetcher.mu.Lock()
	whole = f.fetches[d]
	f.fakeFetcher.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	return whole, f.byDigest[d]
}

func (f *rangeFake) rangeStats() (int, int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ranges, f.rangeBytes
}

// TestTensorReadUsesNeighbourEdges reads one tensor as the kernel does
// (whole pages), so the first and last page are shared with the tensors
// around it: those bytes must come from verified edges of the neighbouring
// chunks, not from the whole chunks; and a spoiled or refused edge falls
// back to the whole chunk, never to wrong bytes.
func TestTensorReadUsesNeighbourEdges(t *testing.T) {
	const mib = 1 << 20
	p := layout.Params{Min: mib, Avg: 2 * mib, Max: 4 * mib}
	file := safetensors(t, 9, 5*mib+1234, 6*mib+777, 5*mib+99)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "m.safetensors"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		spoil, refuse bool
	}{{"edges", false, false}, {"spoiled edges", true, false}, {"refused ranges", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			store := newFixtureStore(t, dir, p)
			fx := &rangeFake{fakeFetcher: &fakeFetcher{src: store.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}},
				spoil: tc.spoil, refuse: tc.refuse}
			v, err := Open(ctx, fx, store.root, Options{Cache: mustCache(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			f, err := v.Open("m.safetensors")
			if err != nil {
				t.Fatal(err)
			}
			rs := f.regions(ctx) // the header, then the three tensors
			if len(rs) != 4 {
				t.Fatalf("regions %v", rs)
			}
			fx.reset()
			mid := rs[2]
			from := mid.begin / pageSize * pageSize
			to := min((mid.end+pageSize-1)/pageSize*pageSize, f.Size())
			got := make([]byte, to-from)
			for off := from; off < to; off += 128 << 10 {
				end := min(off+128<<10, to)
				if _, err := f.ReadAt(got[off-from:end-from], off); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, file[from:to]) {
				t.Fatal("the pages of the tensor differ from the file")
			}
			v.Close() // waits for background fetches
			whole, wholeBytes := fx.total()
			ranges, rangeBytes := fx.rangeStats()
			t.Logf("%d whole chunks (%d bytes), %d ranges (%d bytes) for a tensor of %d bytes", whole, wholeBytes, ranges, rangeBytes, mid.end-mid.begin)
			if tc.spoil || tc.refuse {
				// Both neighbours came whole, after the edge failed.
				if whole != 4 {
					t.Fatalf("%d whole chunks fetched, want the tensor's 2 and both neighbours", whole)
				}
				// A source without ranges is asked once (twice when the
				// two edges were requested at the same moment).
				if tc.refuse && ranges > 2 {
					t.Fatalf("%d range requests to a source that refused the first", ranges)
				}
				return
			}
			// Each chunk of the tensor came once: whole from a fetch ahead,
			// or as the concurrent ranges of a split fetch when the reader
			// asked for it first (which of the two wins is a race, and both
			// move its bytes once). The neighbours gave just an edge each.
			var tensorBytes, edgeBytes int64
			for k, x := range f.e.Extents {
				d := v.ver.Chunk(x.Chunk)
				w, r := fx.blobStats(d.Digest)
				switch in := f.starts[k] >= mid.begin && f.starts[k] < mid.end; {
				case in && !(w == 1 && r == 0) && !(w == 0 && r == d.Size):
					t.Fatalf("chunk %d of the tensor: fetched whole %d times, %d bytes as ranges; want it once", k, w, r)
				case in:
					tensorBytes += d.Size
				case w != 0:
					t.Fatalf("chunk %d outside the tensor fetched whole %d times", k, w)
				default:
					edgeBytes += r
				}
			}
			if tensorBytes != mid.end-mid.begin {
				t.Fatalf("the tensor's chunks hold %d bytes, want %d", tensorBytes, mid.end-mid.begin)
			}
			if edgeBytes != 2*layout.EdgeBytes {
				t.Fatalf("%d bytes of ranges outside the tensor, want its two neighbours' edges (%d)", edgeBytes, 2*layout.EdgeBytes)
			}
		})
	}
}

type pushed struct {
	store *memory.Store
	root  ocispec.Descriptor
}

// newFixtureStore pushes dir into a memory store.
func newFixtureStore(t *testing.T, dir string, p layout.Params) pushed {
	t.Helper()
	store := memory.New()
	res, err := push.Push(context.Background(), store, push.DirSource(dir), push.Options{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	return pushed{store, res.Root}
}

func mustCache(t *testing.T) *chunkcache.Cache {
	t.Helper()
	c, err := chunkcache.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// A spoiled edge is refused with verify's error (so errors.Is finds
// layout.ErrDigestMismatch) and counted as an edge failure; a good one is
// served and resets the count.
func TestFetchEdgeVerifies(t *testing.T) {
	const mib = 1 << 20
	p := layout.Params{Min: mib, Avg: 2 * mib, Max: 4 * mib}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "m.safetensors"), safetensors(t, 9, 5*mib+1234, 6*mib+777), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	store := newFixtureStore(t, dir, p)
	fx := &rangeFake{fakeFetcher: &fakeFetcher{src: store.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}, spoil: true}
	v, err := Open(ctx, fx, store.root, Options{Cache: mustCache(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	k := -1
	for i, c := range v.ver.Index.AllChunks() {
		if c.Head != "" {
			k = i
			break
		}
	}
	if k < 0 {
		t.Fatal("no chunk has edges")
	}
	c := v.ver.Index.Chunk(k)
	_, err = v.fetchEdge(ctx, k, c, true)
	var ve *verify.Error
	if !errors.Is(err, errEdgeMismatch) || !errors.Is(err, layout.ErrDigestMismatch) || !errors.As(err, &ve) || ve.Want != c.Tail {
		t.Fatalf("spoiled tail edge: %v, want verify's error for %s wrapped in errEdgeMismatch", err, c.Tail)
	}
	if n := v.edgeFailures.Load(); n != 1 {
		t.Fatalf("edge failures %d, want 1", n)
	}
	fx.mu.Lock()
	fx.spoil = false
	fx.mu.Unlock()
	b, err := v.fetchEdge(ctx, k, c, false)
	if err != nil || int64(len(b)) != layout.EdgeBytes || digest.FromBytes(b) != c.Head {
		t.Fatalf("good head edge: %d bytes, %v", len(b), err)
	}
	if n := v.edgeFailures.Load(); n != 0 {
		t.Fatalf("edge failures %d after a good edge, want 0", n)
	}
}
