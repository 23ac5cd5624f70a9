package lazy

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// fakeFetcher serves a memory store, counting fetches per digest, and can
// corrupt or delay chosen blobs.
type fakeFetcher struct {
	src   *memory.Store
	delay time.Duration

	mu      sync.Mutex
	fetches map[digest.Digest]int
	bytes   int64
	corrupt map[digest.Digest]bool
	fail    error // returned by every fetch when set
}

func (f *fakeFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	f.mu.Lock()
	f.fetches[desc.Digest]++
	f.bytes += desc.Size
	flip, fail, delay := f.corrupt[desc.Digest], f.fail, f.delay
	f.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	rc, err := f.src.Fetch(ctx, desc)
	if err != nil || !flip {
		return rc, err
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, err
	}
	b[len(b)/2] ^= 0xff
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (f *fakeFetcher) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fetches, f.bytes = map[digest.Digest]int{}, 0
}

func (f *fakeFetcher) total() (n int, b int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.fetches {
		n += c
	}
	return n, f.bytes
}

// safetensors returns a safetensors file with tensors of the given sizes.
func safetensors(t *testing.T, seed uint64, sizes ...int) []byte {
	t.Helper()
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var off int
	for i, n := range sizes {
		hdr[fmt.Sprintf("t%03d", i)] = map[string]any{"dtype": "U8", "shape": []int{n}, "data_offsets": []int{off, off + n}}
		off += n
	}
	h, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	b = append(b, h...)
	return append(b, randBytes(seed, off)...)
}

func randBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

var testParams = layout.Params{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}

// fixture pushes a small volume into a memory store.
type fixture struct {
	files map[string][]byte
	store *memory.Store
	root  ocispec.Descriptor
	fetch *fakeFetcher
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	files := map[string][]byte{
		"config.json":                      []byte(`{"hidden": 64}`),
		"empty":                            {},
		"big.bin":                          randBytes(1, 700<<10),
		"sub/small.txt":                    []byte("hello\n"),
		"model-00001-of-00001.safetensors": safetensors(t, 2, 1000, 200<<10, 300, 130<<10, 5<<10, 150<<10),
	}
	for p, b := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub/small.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	store := memory.New()
	res, err := push.Push(context.Background(), store, push.DirSource(dir), push.Options{Params: testParams})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{files: files, store: store, root: res.Root,
		fetch: &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}}
}

func (fx *fixture) open(t *testing.T, cacheDir string, opt Options) *Volume {
	t.Helper()
	if opt.Cache == nil {
		c, err := chunkcache.Open(cacheDir, 0)
		if err != nil {
			t.Fatal(err)
		}
		opt.Cache = c
	}
	v, err := Open(context.Background(), fx.fetch, fx.root, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return v
}

func readAll(t *testing.T, f *File) []byte {
	t.Helper()
	b, err := io.ReadAll(io.NewSectionReader(f, 0, f.Size()))
	if err != nil {
		t.Fatalf("%s: %v", f.Path(), err)
	}
	return b
}

func TestReadEveryFile(t *testing.T) {
	fx := newFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	for p, want := range fx.files {
		f, err := v.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, f); !bytes.Equal(got, want) {
			t.Errorf("%s: contents differ (%d bytes, want %d)", p, len(got), len(want))
		}
		// Random reads, crossing extents.
		r := rand.New(rand.NewPCG(3, 4))
		for range 50 {
			if len(want) == 0 {
				break
			}
			off := r.IntN(len(want))
			buf := make([]byte, r.IntN(100<<10)+1)
			n, err := f.ReadAt(buf, int64(off))
			if err != nil && err != io.EOF {
				t.Fatalf("%s at %d: %v", p, off, err)
			}
			if n < len(buf) && (err != io.EOF || off+n != len(want)) {
				t.Fatalf("%s at %d: short read %d, %v", p, off, n, err)
			}
			if !bytes.Equal(buf[:n], want[off:off+n]) {
				t.Fatalf("%s at %d: wrong bytes", p, off)
			}
		}
	}
	if _, err := v.Open("link"); err == nil {
		t.Error("opening a symlink as a file succeeded")
	}
	f, _ := v.Open("big.bin")
	if n, err := f.ReadAt(make([]byte, 10), f.Size()); n != 0 || err != io.EOF {
		t.Errorf("read at EOF: %d, %v", n, err)
	}
}

func TestCorruptChunkNeverServedOrCached(t *testing.T) {
	fx := newFixture(t)
	cacheDir := t.TempDir()
	v := fx.open(t, cacheDir, Options{Readahead: -1})
	f, _ := v.Open("big.bin")
	want := fx.files["big.bin"]
	x := f.e.Extents[1]
	bad := v.ver.Chunk(x.Chunk).Digest
	fx.fetch.mu.Lock()
	fx.fetch.corrupt[bad] = true
	fx.fetch.mu.Unlock()

	buf := make([]byte, len(want))
	n, err := f.ReadAt(buf, 0)
	var ce *chunkcache.ChunkInvalidError
	if !errors.As(err, &ce) || !errors.Is(err, layout.ErrDigestMismatch) || ce.Want != bad {
		t.Fatalf("read over a corrupt chunk: n=%d err=%v, want a ChunkInvalidError for %s", n, err, bad)
	}
	if n != int(f.starts[1]) || !bytes.Equal(buf[:n], want[:n]) {
		t.Fatalf("read returned %d bytes, want the %d verified bytes before the corrupt chunk", n, f.starts[1])
	}
	if v.opt.Cache.Contains(bad) {
		t.Fatal("a corrupt chunk was cached")
	}
	if st := v.opt.Cache.Stats(); st.Corrupt == 0 {
		t.Errorf("stats: %+v, want a corrupt count", st)
	}
	// Again: still an error, never the wrong bytes.
	if _, err := f.ReadAt(buf[:x.Length], f.starts[1]); err == nil {
		t.Fatal("second read of a corrupt chunk succeeded")
	}
	fx.fetch.mu.Lock()
	delete(fx.fetch.corrupt, bad)
	fx.fetch.mu.Unlock()
	if got := readAll(t, f); !bytes.Equal(got, want) {
		t.Fatal("contents differ once the chunk is served right")
	}
}

func TestCorruptCacheEntryRefetched(t *testing.T) {
	fx := newFixture(t)
	cacheDir := t.TempDir()
	v := fx.open(t, cacheDir, Options{})
	f, _ := v.Open("big.bin")
	readAll(t, f)
	v.Close()
	// Damage one entry on disk, as a crash or bit rot would.
	d := v.ver.Chunk(f.e.Extents[0].Chunk).Digest
	p := filepath.Join(cacheDir, "sha256", d.Encoded())
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	fx.fetch.reset()
	v2 := fx.open(t, cacheDir, Options{})
	f2, _ := v2.Open("big.bin")
	if got := readAll(t, f2); !bytes.Equal(got, fx.files["big.bin"]) {
		t.Fatal("a damaged cache entry was served")
	}
	if fx.fetch.fetches[d] != 1 {
		t.Errorf("damaged entry fetched %d times, want 1", fx.fetch.fetches[d])
	}
	if n, _ := fx.fetch.total(); n != 1 {
		t.Errorf("%d fetches, want only the damaged chunk", n)
	}
}

func TestSharedCacheFetchesNothing(t *testing.T) {
	fx := newFixture(t)
	cacheDir := t.TempDir()
	v1 := fx.open(t, cacheDir, Options{})
	for p := range fx.files {
		f, _ := v1.Open(p)
		readAll(t, f)
	}
	fx.fetch.reset()
	v2 := fx.open(t, cacheDir, Options{})
	for p, want := range fx.files {
		f, _ := v2.Open(p)
		if !bytes.Equal(readAll(t, f), want) {
			t.Fatalf("%s differs", p)
		}
	}
	if n, b := fx.fetch.total(); n != 0 {
		t.Fatalf("second volume on the same cache fetched %d blobs (%d bytes)", n, b)
	}
}

func TestSingleFlight(t *testing.T) {
	fx := newFixture(t)
	fx.fetch.delay = 50 * time.Millisecond
	v := fx.open(t, t.TempDir(), Options{Readahead: -1})
	fx.fetch.reset()
	f, _ := v.Open("big.bin")
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			buf := make([]byte, 100)
			if _, err := f.ReadAt(buf, 10); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n, _ := fx.fetch.total(); n != 1 {
		t.Fatalf("16 concurrent reads of one chunk made %d fetches", n)
	}
}

func TestEvictionKeepsBound(t *testing.T) {
	fx := newFixture(t)
	c, err := chunkcache.Open(t.TempDir(), 200<<10)
	if err != nil {
		t.Fatal(err)
	}
	v := fx.open(t, "", Options{Cache: c})
	f, _ := v.Open("big.bin")
	if got := readAll(t, f); !bytes.Equal(got, fx.files["big.bin"]) {
		t.Fatal("contents differ under eviction")
	}
	v.Close()
	if c.Size() > 200<<10 {
		t.Fatalf("cache holds %d bytes, bound is %d", c.Size(), 200<<10)
	}
	if c.Stats().Evictions == 0 {
		t.Fatal("nothing was evicted")
	}
	var disk int64
	des, _ := os.ReadDir(filepath.Join(c.Dir(), "sha256"))
	for _, e := range des {
		info, _ := e.Info()
		disk += info.Size()
	}
	if disk > 200<<10 {
		t.Fatalf("%d bytes on disk, bound is %d", disk, 200<<10)
	}
	// Reopening indexes what is there and keeps the bound.
	c2, err := chunkcache.Open(c.Dir(), 100<<10)
	if err != nil {
		t.Fatal(err)
	}
	if c2.Size() > 100<<10 {
		t.Fatalf("reopened cache holds %d bytes", c2.Size())
	}
}

func TestStoreFailureStillServes(t *testing.T) {
	fx := newFixture(t)
	dir := t.TempDir()
	c, err := chunkcache.Open(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Nowhere to write: the tmp directory is a file now.
	os.RemoveAll(filepath.Join(dir, "tmp"))
	if err := os.WriteFile(filepath.Join(dir, "tmp"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	v := fx.open(t, "", Options{Cache: c})
	f, _ := v.Open("big.bin")
	if got := readAll(t, f); !bytes.Equal(got, fx.files["big.bin"]) {
		t.Fatal("contents differ when the cache cannot store")
	}
	if c.Stats().StoreErrors == 0 {
		t.Fatal("no store errors counted")
	}
}

func TestFetchErrorThenRecovery(t *testing.T) {
	fx := newFixture(t)
	v := fx.open(t, t.TempDir(), Options{FetchTimeout: 100 * time.Millisecond})
	f, _ := v.Open("big.bin")
	fx.fetch.mu.Lock()
	fx.fetch.fail = errors.New("registry down")
	fx.fetch.mu.Unlock()
	if _, err := f.ReadAt(make([]byte, 10), 0); err == nil {
		t.Fatal("read succeeded with the registry down")
	}
	fx.fetch.mu.Lock()
	fx.fetch.fail = nil
	fx.fetch.delay = time.Second
	fx.fetch.mu.Unlock()
	start := time.Now()
	if _, err := f.ReadAt(make([]byte, 10), 0); err == nil || time.Since(start) > 900*time.Millisecond {
		t.Fatalf("slow fetch: err=%v after %v, want a timeout after 100ms", err, time.Since(start))
	}
	fx.fetch.mu.Lock()
	fx.fetch.delay = 0
	fx.fetch.mu.Unlock()
	// Recovery: a read may still join the slow fetch started above (its
	// second has to run out) or, on a loaded machine, miss the 100ms bound
	// once; within a few seconds every read must succeed with the right bytes.
	var got []byte
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, err = io.ReadAll(io.NewSectionReader(f, 0, f.Size()))
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("no recovery after the registry came back: %v", err)
	}
	if !bytes.Equal(got, fx.files["big.bin"]) {
		t.Fatal("contents differ after recovery")
	}
}

func TestPrefetchAll(t *testing.T) {
	fx := newFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	if err := v.Prefetch(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	fx.fetch.reset()
	for p, want := range fx.files {
		f, _ := v.Open(p)
		if !bytes.Equal(readAll(t, f), want) {
			t.Fatalf("%s differs", p)
		}
	}
	if n, _ := fx.fetch.total(); n != 0 {
		t.Fatalf("%d fetches after prefetching everything", n)
	}
	m, err := MatchGlobs("*.json, sub/*")
	if err != nil {
		t.Fatal(err)
	}
	if !m("config.json") || !m("sub/small.txt") || m("big.bin") {
		t.Error("MatchGlobs matched wrongly")
	}
}

func TestTensorReadFetchesLittle(t *testing.T) {
	fx := newFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	f, _ := v.Open("model-00001-of-00001.safetensors")
	st := fx.files["model-00001-of-00001.safetensors"]
	if err := v.PrefetchHeaders(context.Background()); err != nil {
		t.Fatal(err)
	}
	rs := f.regions(context.Background())
	if len(rs) != 7 {
		t.Fatalf("%d regions, want header and 6 tensors", len(rs))
	}
	fx.fetch.reset()
	r := rs[4] // the 130 KiB tensor in the middle
	buf := make([]byte, r.end-r.begin)
	for off := int64(0); off < int64(len(buf)); off += 16 << 10 {
		end := min(off+16<<10, int64(len(buf)))
		if _, err := f.ReadAt(buf[off:end], r.begin+off); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(buf, st[r.begin:r.end]) {
		t.Fatal("tensor bytes differ")
	}
	v.Close() // wait for readahead
	_, b := fx.fetch.total()
	if limit := (r.end - r.begin) + 2*testParams.Max; b > limit {
		t.Fatalf("reading a %d-byte tensor fetched %d bytes, limit %d", r.end-r.begin, b, limit)
	}
}
