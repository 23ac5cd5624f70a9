package push

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

var deltaParams = layout.Params{Min: 512 << 10, Avg: 1 << 20, Max: 2 << 20}

// deltaTrees writes v1 (a 6 MiB raw file) and v2 (the same with one byte
// in 64 KiB changed: chunk boundaries stay) and returns their directories.
func deltaTrees(t *testing.T) (v1, v2 string) {
	t.Helper()
	v1, v2 = t.TempDir(), t.TempDir()
	b := testutil.RandBytes(43, 6<<20)
	testutil.WriteTree(t, v1, map[string][]byte{"w.bin": b})
	c := append([]byte(nil), b...)
	for i := 1000; i < len(c); i += 64 << 10 {
		c[i] ^= 0x5a
	}
	testutil.WriteTree(t, v2, map[string][]byte{"w.bin": c})
	return v1, v2
}

// pushInto pushes dir into store with deltas against base (nil: none).
func pushInto(t *testing.T, store content.Storage, dir string, base *layout.Index, opt Options) *Result {
	t.Helper()
	opt.Params, opt.DeltaBase = deltaParams, base
	res, err := Push(context.Background(), store, DirSource(dir), opt)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func openIndex(t *testing.T, store content.Storage, res *Result) *layout.Index {
	t.Helper()
	v, err := layout.Open(context.Background(), store, res.Root)
	if err != nil {
		t.Fatal(err)
	}
	return v.Index
}

// A push whose every file the stat cache knows, into a repository that
// lacks the version, still stores the chunks as deltas: the same version
// a push that read the files made elsewhere (it used to upload them all
// plain, a version of another digest).
func TestStatCacheHitsStillMakeDeltas(t *testing.T) {
	v1, v2 := deltaTrees(t)
	cacheDir := t.TempDir()
	var first *Result
	for i, store := range []content.Storage{memory.New(), memory.New()} {
		base := pushInto(t, store, v1, nil, Options{})
		cache := statcache.Open(cacheDir, v2, deltaParams)
		cache.TrustRecent()
		res := pushInto(t, store, v2, openIndex(t, store, base), Options{Cache: cache, Destination: "repo" + string(rune('a'+i))})
		if res.DeltaChunks == 0 || res.BytesUploaded > res.Bytes/2 {
			t.Fatalf("push %d: %d delta chunks, %d of %d bytes uploaded; want deltas", i, res.DeltaChunks, res.BytesUploaded, res.Bytes)
		}
		if first == nil {
			first = res
		} else if res.Root.Digest != first.Root.Digest {
			t.Fatalf("push with the stat cache warm: %s, want %s as with it cold", res.Root.Digest, first.Root.Digest)
		}
	}
}

// Bases come from a local copy of the base version where they verify: no
// base byte is fetched; where the copy changed, those bases are fetched.
func TestDeltaBaseDir(t *testing.T) {
	v1, v2 := deltaTrees(t)
	store := memory.New()
	base := openIndex(t, store, pushInto(t, store, v1, nil, Options{}))
	fetched := pushInto(t, store, v2, base, Options{})
	if fetched.DeltaChunks == 0 || fetched.BaseBytesFetched < fetched.DeltaPlainBytes || fetched.BaseBytesLocal != 0 {
		t.Fatalf("without a local copy: %d delta chunks, bases %d fetched, %d local", fetched.DeltaChunks, fetched.BaseBytesFetched, fetched.BaseBytesLocal)
	}

	store2 := memory.New()
	base2 := openIndex(t, store2, pushInto(t, store2, v1, nil, Options{}))
	local := pushInto(t, store2, v2, base2, Options{DeltaBaseDir: DirSource(v1)})
	if local.Root.Digest != fetched.Root.Digest {
		t.Fatalf("with a local copy: %s, want %s", local.Root.Digest, fetched.Root.Digest)
	}
	if local.BaseBytesFetched != 0 || local.BaseBytesLocal < local.DeltaPlainBytes {
		t.Errorf("with a local copy: bases %d fetched, %d local; want all %d local", local.BaseBytesFetched, local.BaseBytesLocal, local.DeltaPlainBytes)
	}

	// A copy changed since: its changed chunks' bases are fetched.
	changed := t.TempDir()
	b, err := os.ReadFile(filepath.Join(v1, "w.bin"))
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	testutil.WriteTree(t, changed, map[string][]byte{"w.bin": b})
	store3 := memory.New()
	base3 := openIndex(t, store3, pushInto(t, store3, v1, nil, Options{}))
	got := pushInto(t, store3, v2, base3, Options{DeltaBaseDir: DirSource(changed)})
	if got.Root.Digest != fetched.Root.Digest || got.BaseBytesFetched == 0 || got.BaseBytesLocal == 0 {
		t.Errorf("with a changed copy: %s, bases %d fetched, %d local; want %s, some of each", got.Root.Digest, got.BaseBytesFetched, got.BaseBytesLocal, fetched.Root.Digest)
	}
}

// gatedDeltas is a store whose pushes of delta blobs wait until want of
// them are in flight (or a while has passed), and that records the most
// in flight at once.
type gatedDeltas struct {
	content.Storage
	want    int
	mu      sync.Mutex
	now     int
	most    int
	closed  bool
	reached chan struct{}
}

func (g *gatedDeltas) Push(ctx context.Context, d ocispec.Descriptor, r io.Reader) error {
	if d.MediaType != layout.MediaTypeChunkDelta {
		return g.Storage.Push(ctx, d, r)
	}
	g.mu.Lock()
	g.now++
	g.most = max(g.most, g.now)
	if g.now == g.want && !g.closed {
		g.closed = true
		close(g.reached)
	}
	g.mu.Unlock()
	select {
	case <-g.reached:
	case <-time.After(2 * time.Second):
	}
	g.mu.Lock()
	g.now--
	g.mu.Unlock()
	return g.Storage.Push(ctx, d, r)
}

// Uploads of deltas overlap as uploads of chunks do: computing a delta
// takes one of a few places, its upload none (on a link, uploads of two
// at a time made a push with deltas slower than one without).
func TestDeltaUploadsOverlap(t *testing.T) {
	v1, v2 := deltaTrees(t)
	mem := memory.New()
	base := openIndex(t, mem, pushInto(t, mem, v1, nil, Options{}))
	g := &gatedDeltas{Storage: mem, want: deltaJobs + 1, reached: make(chan struct{})}
	res := pushInto(t, g, v2, base, Options{Jobs: 8})
	if res.DeltaChunks < g.want {
		t.Fatalf("%d delta chunks, want %d or more for this test", res.DeltaChunks, g.want)
	}
	if g.most < g.want {
		t.Errorf("at most %d delta uploads in flight at once, want %d", g.most, g.want)
	}
}
