package lazy

import (
	"context"
	"io"
	"slices"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
)

// orderFetcher notes the digests it is asked for, in order.
type orderFetcher struct {
	content.Fetcher
	mu  sync.Mutex
	got []digest.Digest
}

func (o *orderFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	o.mu.Lock()
	o.got = append(o.got, d.Digest)
	o.mu.Unlock()
	return o.Fetcher.Fetch(ctx, d)
}

func TestOnReadTellsChunksInReadOrder(t *testing.T) {
	fx := newFixture(t)
	var mu sync.Mutex
	var seen []int
	v := fx.open(t, t.TempDir(), Options{Readahead: -1, OnRead: func(k int) {
		mu.Lock()
		seen = append(seen, k)
		mu.Unlock()
	}})
	f, err := v.Open("big.bin")
	if err != nil {
		t.Fatal(err)
	}
	if len(f.e.Extents) < 4 {
		t.Fatalf("big.bin has %d extents, want several", len(f.e.Extents))
	}
	// The last extent, then the first, then a read across the second and
	// third.
	last := len(f.e.Extents) - 1
	buf := make([]byte, 10)
	if _, err := f.ReadAt(buf, f.starts[last]); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(buf, f.starts[2]-5); err != nil {
		t.Fatal(err)
	}
	x := f.e.Extents
	want := []int{x[last].Chunk, x[0].Chunk, x[1].Chunk, x[2].Chunk}
	if !slices.Equal(seen, want) {
		t.Fatalf("OnRead told %v, want %v", seen, want)
	}
}

func TestLoadChunksInOrder(t *testing.T) {
	fx := newFixture(t)
	cache, err := chunkcache.Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	of := &orderFetcher{Fetcher: fx.store}
	v, err := Open(context.Background(), of, fx.root, Options{Cache: cache, Jobs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	n := v.ver.NumChunks()
	ks := []int{n - 1, 2, 0, n / 2, -1, n + 3} // out-of-range indices are skipped
	of.mu.Lock()
	of.got = nil
	of.mu.Unlock()
	if err := v.LoadChunks(context.Background(), ks); err != nil {
		t.Fatal(err)
	}
	var want []digest.Digest
	for _, k := range ks[:4] {
		want = append(want, v.ver.Chunk(k).Digest)
	}
	if !slices.Equal(of.got, want) {
		t.Fatalf("fetched %v, want %v", of.got, want)
	}
	// Cached now: a second replay fetches nothing.
	of.got = nil
	if err := v.LoadChunks(context.Background(), ks); err != nil || len(of.got) != 0 {
		t.Fatalf("second LoadChunks fetched %d blobs (%v)", len(of.got), err)
	}
}
