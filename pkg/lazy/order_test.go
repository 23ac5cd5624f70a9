package lazy

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
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

// countingRanges is a rangeFake that counts the requests open at once.
type countingRanges struct {
	*rangeFake
	mu       sync.Mutex
	in, most int
	hold     func(d digest.Digest) // called before each range request, when set
}

func (c *countingRanges) enter() {
	c.mu.Lock()
	c.in++
	c.most = max(c.most, c.in)
	c.mu.Unlock()
	time.Sleep(2 * time.Millisecond) // let concurrent requests overlap
}

func (c *countingRanges) exit() {
	c.mu.Lock()
	c.in--
	c.mu.Unlock()
}

func (c *countingRanges) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	c.enter()
	defer c.exit()
	return c.rangeFake.Fetch(ctx, d)
}

func (c *countingRanges) FetchRange(ctx context.Context, d ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	if c.hold != nil {
		c.hold(d.Digest)
	}
	c.enter()
	defer c.exit()
	return c.rangeFake.FetchRange(ctx, d, off, n)
}

// TestLoadChunksSplitsTheHead replays a profile of large chunks: the
// first (what a reader starting now waits for first) come as range
// requests, the rest whole, and never more than Jobs requests at once.
func TestLoadChunksSplitsTheHead(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "big.bin"), randBytes(41, 60*mib), 0o644); err != nil {
		t.Fatal(err)
	}
	px := newFixtureStore(t, dir, layout.Params{Min: 4 * mib, Avg: 5 * mib, Max: 6 * mib})
	ver, err := layout.Open(context.Background(), px.store, px.root)
	if err != nil {
		t.Fatal(err)
	}
	src := &countingRanges{rangeFake: &rangeFake{fakeFetcher: &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}}}
	const jobs = 4
	v, err := New(ver, src, Options{Cache: mustCache(t), Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	n := ver.NumChunks()
	if n < 8 {
		t.Fatalf("the fixture has %d chunks, want at least 8", n)
	}
	var ks []int // not in index order; the file's short tail chunk last
	for k := n - 2; k >= 0; k-- {
		ks = append(ks, k)
	}
	ks = append(ks, n-1)
	if err := v.LoadChunks(context.Background(), ks); err != nil {
		t.Fatal(err)
	}
	first, last := ver.Chunk(ks[0]), ver.Chunk(ks[n-1])
	if whole, rb := src.blobStats(first.Digest); whole != 0 || rb != first.Size {
		t.Errorf("the first chunk of the order was fetched whole %d times and as %d bytes of ranges, want only ranges of its %d bytes", whole, rb, first.Size)
	}
	if whole, rb := src.blobStats(last.Digest); whole != 1 || rb != 0 {
		t.Errorf("the last chunk of the order was fetched whole %d times and as %d bytes of ranges, want once whole", whole, rb)
	}
	if src.most > jobs {
		t.Errorf("%d requests were open at once, want at most Jobs (%d)", src.most, jobs)
	}
}

// TestLoadChunksOverlapsTheHead replays a profile whose first chunks are
// large: the second chunk's range requests go out while the first's are
// still open (the link is not left idle while a chunk is verified and
// stored), and each head chunk comes as Jobs/2 ranges.
func TestLoadChunksOverlapsTheHead(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "big.bin"), randBytes(43, 20*mib), 0o644); err != nil {
		t.Fatal(err)
	}
	px := newFixtureStore(t, dir, layout.Params{Min: 4 * mib, Avg: 5 * mib, Max: 6 * mib})
	ver, err := layout.Open(context.Background(), px.store, px.root)
	if err != nil {
		t.Fatal(err)
	}
	if ver.NumChunks() < 3 || ver.Chunk(0).Size < splitMin || ver.Chunk(1).Size < splitMin {
		t.Fatalf("the fixture has %d chunks, want at least 3 of at least %d bytes", ver.NumChunks(), splitMin)
	}
	first, second := ver.Chunk(0).Digest, ver.Chunk(1).Digest
	src := &countingRanges{rangeFake: &rangeFake{fakeFetcher: &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}}}
	secondAsked := make(chan struct{})
	var once sync.Once
	overlapped := true
	var mu sync.Mutex
	src.hold = func(d digest.Digest) {
		switch d {
		case second:
			once.Do(func() { close(secondAsked) })
		case first:
			select {
			case <-secondAsked:
			case <-time.After(10 * time.Second):
				mu.Lock()
				overlapped = false
				mu.Unlock()
			}
		}
	}
	const jobs = 8
	v, err := New(ver, src, Options{Cache: mustCache(t), Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	ks := make([]int, ver.NumChunks())
	for k := range ks {
		ks[k] = k
	}
	if err := v.LoadChunks(context.Background(), ks); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !overlapped {
		t.Error("the first chunk's range requests waited for 10 s and no range of the second chunk was asked: the head's chunks came one after another")
	}
	for _, d := range []digest.Digest{first, second} {
		if whole, rb := src.blobStats(d); whole != 0 || rb != ver.Chunk(map[digest.Digest]int{first: 0, second: 1}[d]).Size {
			t.Errorf("head chunk %s was fetched whole %d times and as %d bytes of ranges, want only ranges", d, whole, rb)
		}
	}
	src.rangeFake.mu.Lock()
	ranges := src.ranges
	src.rangeFake.mu.Unlock()
	if ranges < 2*jobs/2 {
		t.Errorf("%d range requests for the head, want at least %d (Jobs/2 for each of two chunks)", ranges, jobs)
	}
	if src.most > jobs {
		t.Errorf("%d requests were open at once, want at most Jobs (%d)", src.most, jobs)
	}
	for k := range ver.NumChunks() {
		if !v.opt.Cache.Contains(ver.Chunk(k).Digest) {
			t.Errorf("chunk %d is not cached after LoadChunks", k)
		}
	}
}
