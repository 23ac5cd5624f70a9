package lazy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// gate holds requests until want of them are in flight at once, and
// records the most in flight. A request that never sees want peers goes
// on after a long safety delay, so a failing test ends.
type gate struct {
	want int
	mu   sync.Mutex
	in   int
	max  int
	open chan struct{}
	once sync.Once
	// stalled: a request waited out the safety delay, fewer than want
	// in flight with it.
	stalled bool
}

func newGate(want int) *gate { return &gate{want: want, open: make(chan struct{})} }

func (g *gate) enter(ctx context.Context) {
	g.mu.Lock()
	g.in++
	g.max = max(g.max, g.in)
	if g.in >= g.want {
		g.once.Do(func() { close(g.open) })
	}
	g.mu.Unlock()
	select {
	case <-g.open:
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
		g.mu.Lock()
		g.stalled = true
		g.mu.Unlock()
	}
}

func (g *gate) exit() {
	g.mu.Lock()
	g.in--
	g.mu.Unlock()
}

func (g *gate) maxInFlight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.max
}

// gatedFetcher passes fetches of the blobs in gated through a gate, and
// serves ranges (through the gate too when ranges is set), spoiled when
// spoil is set.
type gatedFetcher struct {
	*fakeFetcher
	g      *gate
	gated  map[digest.Digest]bool
	spoil  bool
	ranges bool // pass ranges through the gate too
}

func (f *gatedFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if f.gated[desc.Digest] {
		f.g.enter(ctx)
		defer f.g.exit()
	}
	return f.fakeFetcher.Fetch(ctx, desc)
}

func (f *gatedFetcher) FetchRange(ctx context.Context, desc ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	if f.ranges {
		f.g.enter(ctx)
		defer f.g.exit()
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
	if f.spoil {
		b[0] ^= 1
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func pushOne(t *testing.T, name string, data []byte, p layout.Params) (pushed, *layout.Version) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
	px := newFixtureStore(t, dir, p)
	ver, err := layout.Open(context.Background(), px.store, px.root)
	if err != nil {
		t.Fatal(err)
	}
	return px, ver
}

// TestSequentialReaderKeepsJobsChunksInFlight: once a reader reads on
// sequentially, the volume keeps Jobs chunk fetches in flight ahead of it
// (by default, whatever the chunk size), not one window of bytes.
func TestSequentialReaderKeepsJobsChunksInFlight(t *testing.T) {
	const mib = 1 << 20
	data := randBytes(5, 24*mib)
	px, ver := pushOne(t, "data.bin", data, layout.Params{Min: 512 << 10, Avg: mib, Max: mib})
	if ver.NumChunks() < 20 {
		t.Fatalf("premise: 1 MiB chunks, got %d", ver.NumChunks())
	}
	const jobs = 8
	g := newGate(jobs)
	gated := map[digest.Digest]bool{}
	for _, c := range ver.ChunkDescriptors()[2:] {
		gated[c.Digest] = true
	}
	fetch := &gatedFetcher{fakeFetcher: &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}, g: g, gated: gated}
	v, err := New(ver, fetch, Options{Cache: mustCache(t), Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	f, err := v.Open("data.bin")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(data))
	buf := make([]byte, 128<<10)
	for off := int64(0); off < int64(len(data)); off += int64(len(buf)) {
		n, err := f.ReadAt(buf, off)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("contents differ")
	}
	if m := g.maxInFlight(); m < jobs || g.stalled {
		t.Errorf("at most %d chunk fetches in flight ahead of a sequential reader (stalled: %v), want %d (jobs) as soon as it reads on", m, g.stalled, jobs)
	}
}

// TestLargeChunkReadIsSplit: a read that waits for one large chunk gets it
// as several concurrent range requests, verified whole; spoiled ranges are
// never served: the chunk is fetched whole instead, and when that is wrong
// too the read fails.
func TestLargeChunkReadIsSplit(t *testing.T) {
	const mib = 1 << 20
	data := randBytes(6, 8*mib)
	px, ver := pushOne(t, "one.bin", data, layout.Params{Min: 4 * mib, Avg: 8 * mib, Max: 8 * mib})
	if ver.NumChunks() != 1 {
		t.Fatalf("premise: one 8 MiB chunk, got %d", ver.NumChunks())
	}
	parts := int(8 * mib / splitPart)
	for _, tc := range []struct {
		name           string
		spoil, corrupt bool
		wantErr        bool
	}{{"good ranges", false, false, false}, {"spoiled ranges", true, false, false}, {"spoiled ranges and chunk", true, true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(parts)
			ff := &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{ver.Chunk(0).Digest: tc.corrupt}}
			fetch := &gatedFetcher{fakeFetcher: ff, g: g, gated: map[digest.Digest]bool{}, spoil: tc.spoil, ranges: true}
			v, err := New(ver, fetch, Options{Cache: mustCache(t), Jobs: 8, Readahead: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer v.Close()
			// As after a first split fetch: ranges work, no probe first.
			v.rangesOK.Store(true)
			f, err := v.Open("one.bin")
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4096)
			n, err := f.ReadAt(buf, 5*mib+123)
			if tc.wantErr {
				if err == nil {
					t.Fatal("read served bytes of a chunk whose every copy was wrong")
				}
				return
			}
			if err != nil || n != len(buf) || !bytes.Equal(buf, data[5*mib+123:5*mib+123+4096]) {
				t.Fatalf("read: %d, %v, right bytes %v", n, err, bytes.Equal(buf, data[5*mib+123:5*mib+123+4096]))
			}
			if m := g.maxInFlight(); m < parts {
				t.Errorf("%d range requests in flight at once, want %d", m, parts)
			}
			whole, _ := ff.total()
			if tc.spoil && whole != 1 {
				t.Errorf("spoiled ranges: %d whole fetches, want 1", whole)
			}
			if !tc.spoil && whole != 0 {
				t.Errorf("good ranges: %d whole fetches, want 0", whole)
			}
		})
	}
}

// TestSplitProbesFirst: until a source has served a split fetch, the first
// range request goes alone; a source that refuses ranges is asked once and
// the chunk comes whole.
func TestSplitProbesFirst(t *testing.T) {
	const mib = 1 << 20
	data := randBytes(7, 8*mib)
	px, ver := pushOne(t, "one.bin", data, layout.Params{Min: 4 * mib, Avg: 8 * mib, Max: 8 * mib})
	fx := &rangeFake{fakeFetcher: &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}, refuse: true}
	v, err := New(ver, fx, Options{Cache: mustCache(t), Jobs: 8, Readahead: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	f, err := v.Open("one.bin")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	if _, err := f.ReadAt(buf, 3*mib); err != nil || !bytes.Equal(buf, data[3*mib:3*mib+4096]) {
		t.Fatalf("read: %v", err)
	}
	if ranges, _ := fx.rangeStats(); ranges != 1 {
		t.Errorf("%d range requests to a source that refuses them, want 1", ranges)
	}
	if whole, _ := fx.total(); whole != 1 {
		t.Errorf("%d whole fetches, want 1", whole)
	}
}

// TestReaderFromFileStartKeepsJobsChunksInFlight: a reader that reads a
// safetensors file from its start (cat, cp) through the header and a small
// first tensor into a large one gets Jobs chunk fetches in flight as soon
// as it is leadIn into the large tensor, not a window that doubles.
func TestReaderFromFileStartKeepsJobsChunksInFlight(t *testing.T) {
	const mib = 1 << 20
	data := safetensors(t, 8, 3<<10, 15*mib, 15*mib)
	px, ver := pushOne(t, "model.safetensors", data, layout.Params{Min: 512 << 10, Avg: mib, Max: mib})
	const jobs = 8
	g := newGate(jobs)
	gated := map[digest.Digest]bool{}
	var off int64
	for _, x := range ver.Index.File(0).Extents {
		if off >= 3*mib {
			gated[ver.Chunk(x.Chunk).Digest] = true
		}
		off += x.Length
	}
	fetch := &gatedFetcher{fakeFetcher: &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}, g: g, gated: gated}
	v, err := New(ver, fetch, Options{Cache: mustCache(t), Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	f, err := v.Open("model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, len(data))
	buf := make([]byte, 256<<10)
	for off := int64(0); off < int64(len(data)); off += int64(len(buf)) {
		n, err := f.ReadAt(buf, off)
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("contents differ")
	}
	if m := g.maxInFlight(); m < jobs || g.stalled {
		t.Errorf("at most %d chunk fetches in flight ahead of a reader from the file's start (stalled: %v), want %d (jobs)", m, g.stalled, jobs)
	}
}

// TestReadaheadQueuesBehindJobs: while Jobs fetches ahead of a sequential
// reader are on the link, as many more chunks wait behind them, so a fetch
// that completes is followed at once by the next, whatever the reader does.
func TestReadaheadQueuesBehindJobs(t *testing.T) {
	const mib = 1 << 20
	data := randBytes(9, 40*mib)
	px, ver := pushOne(t, "data.bin", data, layout.Params{Min: 512 << 10, Avg: mib, Max: mib})
	const jobs = 4
	g := newGate(1 << 30) // opened by the test
	gated := map[digest.Digest]bool{}
	for _, c := range ver.ChunkDescriptors()[12:] {
		gated[c.Digest] = true
	}
	fetch := &gatedFetcher{fakeFetcher: &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}, g: g, gated: gated}
	v, err := New(ver, fetch, Options{Cache: mustCache(t), Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	f, err := v.Open("data.bin")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 128<<10)
		for off := int64(0); off < int64(len(data)); off += int64(len(buf)) {
			if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
				done <- err
				return
			}
		}
		done <- nil
	}()
	// Wait for Jobs gated fetches on the link, then count the chunks
	// requested: those on the link and those queued behind them.
	deadline := time.Now().Add(2 * time.Second)
	for {
		g.mu.Lock()
		in := g.in
		g.mu.Unlock()
		if in >= jobs || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let readahead queue what it will
	g.mu.Lock()
	in := g.in
	g.mu.Unlock()
	v.mu.Lock()
	requested := len(v.pending)
	v.mu.Unlock()
	g.once.Do(func() { close(g.open) })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if in < jobs {
		t.Errorf("%d fetches on the link, want Jobs (%d)", in, jobs)
	}
	if requested < 2*jobs {
		t.Errorf("%d chunks requested ahead of the reader, want %d (Jobs on the link and Jobs queued)", requested, 2*jobs)
	}
}

// TestTensorReadSplitsItsChunks: a read at the start of a tensor held by
// fewer chunks than Jobs fetches all of them at once as range requests,
// Jobs in all, not one connection per chunk; the bytes are right.
func TestTensorReadSplitsItsChunks(t *testing.T) {
	const mib = 1 << 20
	data := safetensors(t, 10, 3<<10, 16*mib, 3<<10)
	px, ver := pushOne(t, "model.safetensors", data, layout.Params{Min: 4 * mib, Avg: 8 * mib, Max: 8 * mib})
	const jobs = 8
	g := newGate(jobs)
	ff := &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}
	fetch := &gatedFetcher{fakeFetcher: ff, g: g, gated: map[digest.Digest]bool{}}
	v, err := New(ver, fetch, Options{Cache: mustCache(t), Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	v.rangesOK.Store(true) // as after the header's edge
	f, err := v.Open("model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	rs := f.regions(context.Background())
	if len(rs) != 4 {
		t.Fatalf("%d regions, want the header and 3 tensors", len(rs))
	}
	fetch.ranges = true // the tensor's ranges go through the gate
	r := rs[2]
	k := sort.Search(len(f.starts), func(k int) bool { return f.starts[k] > r.begin }) - 1
	last := sort.Search(len(f.starts), func(k int) bool { return f.starts[k] >= r.end })
	if n := last - k; n < 2 || n >= jobs {
		t.Fatalf("premise: the tensor spans %d chunks", n)
	}
	ff.reset()
	got := make([]byte, r.end-r.begin)
	for off := int64(0); off < int64(len(got)); off += mib {
		end := min(off+mib, int64(len(got)))
		if _, err := f.ReadAt(got[off:end], r.begin+off); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, data[r.begin:r.end]) {
		t.Fatal("tensor bytes differ")
	}
	if m := g.maxInFlight(); m < jobs || g.stalled {
		t.Errorf("%d range requests in flight at once (stalled: %v), want %d (jobs)", m, g.stalled, jobs)
	}
	for i := k; i < last; i++ {
		if n := ff.fetches[ver.Chunk(f.e.Extents[i].Chunk).Digest]; n != 0 {
			t.Errorf("chunk %d of the tensor fetched whole %d times, want only ranges", i, n)
		}
	}
}

// TestHeaderInOneRoundTrip: a safetensors header that spans several chunks
// is read with one round trip to the source (its length and its bytes
// together), not the length first and the rest after it.
func TestHeaderInOneRoundTrip(t *testing.T) {
	sizes := make([]int, 400)
	for i := range sizes {
		sizes[i] = 64
	}
	data := safetensors(t, 11, sizes...)
	px, ver := pushOne(t, "model.safetensors", data, layout.Params{Min: 4 << 10, Avg: 8 << 10, Max: 16 << 10})
	g := newGate(2)
	gated := map[digest.Digest]bool{}
	for _, c := range ver.ChunkDescriptors() {
		gated[c.Digest] = true
	}
	fetch := &gatedFetcher{fakeFetcher: &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}, g: g, gated: gated, ranges: true}
	v, err := New(ver, fetch, Options{Cache: mustCache(t), Jobs: 8, Readahead: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	f, err := v.Open("model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	hdrLen := int64(binary.LittleEndian.Uint64(data))
	if first := f.e.Extents[0].Length; first >= 8+hdrLen {
		t.Fatalf("premise: the header (%d bytes) spans chunks, the first has %d", 8+hdrLen, first)
	}
	if rs := f.regions(context.Background()); len(rs) != len(sizes)+1 {
		t.Fatalf("%d regions, want the header and %d tensors", len(rs), len(sizes))
	}
	if g.stalled || g.maxInFlight() < 2 {
		t.Errorf("the header's chunks came one after the other (at most %d fetches at once)", g.maxInFlight())
	}
}

// TestStreamingReaderFetchesNextFile: a reader that reads a whole file
// sequentially gets the first chunks of the next file fetched before it
// opens it (at most aheadChunks*Jobs of them); a reader of part of a file
// does not.
func TestStreamingReaderFetchesNextFile(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	a, b := randBytes(12, 12*mib), randBytes(13, 24*mib)
	for name, data := range map[string][]byte{"a.bin": a, "b.bin": b} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	px := newFixtureStore(t, dir, layout.Params{Min: 512 << 10, Avg: mib, Max: mib})
	ver, err := layout.Open(context.Background(), px.store, px.root)
	if err != nil {
		t.Fatal(err)
	}
	const jobs = 4
	for _, whole := range []bool{true, false} {
		ff := &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}
		v, err := New(ver, ff, Options{Cache: mustCache(t), Jobs: jobs})
		if err != nil {
			t.Fatal(err)
		}
		f, err := v.Open("a.bin")
		if err != nil {
			t.Fatal(err)
		}
		n := int64(len(a))
		if !whole {
			n = 4 * mib
		}
		buf := make([]byte, 128<<10)
		for off := int64(0); off < n; off += int64(len(buf)) {
			if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
				t.Fatal(err)
			}
		}
		waitAhead(v) // Close cancels the fetches still queued
		v.Close()
		nb, _ := v.Lookup("b.bin")
		got := 0
		for k, x := range ver.Index.File(nb).Extents {
			if ff.fetches[ver.Chunk(x.Chunk).Digest] > 0 {
				if k >= aheadChunks*jobs {
					t.Errorf("whole %v: chunk %d of the next file fetched, want only its first %d", whole, k, aheadChunks*jobs)
				}
				got++
			}
		}
		switch {
		case whole && got < 3*jobs:
			t.Errorf("reading a whole file fetched %d chunks of the next file, want the window's %d (its first Jobs chunks, often small, leave the link idle before the reader gets there)", got, 3*jobs)
		case !whole && got > 0:
			t.Errorf("reading 4 MiB of a 12 MiB file fetched %d chunks of the next file", got)
		}
	}
}

// TestHeaderProbeNeverFetchesLargeChunkWhole: reading the header reads the
// head edge of the large chunk after it, at the same time, when the source
// serves ranges; from a source without ranges it fetches none of it.
func TestHeaderProbeNeverFetchesLargeChunkWhole(t *testing.T) {
	const mib = 1 << 20
	data := safetensors(t, 14, 5*mib, mib)
	for _, refuse := range []bool{false, true} {
		px, ver := pushOne(t, "model.safetensors", data, layout.Params{Min: mib, Avg: 2 * mib, Max: 4 * mib})
		fx := &rangeFake{fakeFetcher: &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}, refuse: refuse}
		v, err := New(ver, fx, Options{Cache: mustCache(t), Jobs: 8, Readahead: -1})
		if err != nil {
			t.Fatal(err)
		}
		f, err := v.Open("model.safetensors")
		if err != nil {
			t.Fatal(err)
		}
		x := f.e.Extents
		if len(x) < 2 || x[0].Length >= headProbe || !ver.Index.Chunk(x[1].Chunk).HasEdges() {
			t.Fatalf("premise: a small first chunk and a large one with edges after it: %+v", x)
		}
		if rs := f.regions(context.Background()); len(rs) != 3 {
			t.Fatalf("refuse %v: %d regions, want the header and 2 tensors", refuse, len(rs))
		}
		v.Close()
		d := ver.Chunk(x[1].Chunk).Digest
		whole, rangeBytes := fx.blobStats(d)
		if whole != 0 {
			t.Errorf("refuse %v: the large chunk after the header fetched whole %d times", refuse, whole)
		}
		if !refuse && rangeBytes != layout.EdgeBytes {
			t.Errorf("%d bytes of the large chunk fetched as ranges, want its head edge (%d)", rangeBytes, layout.EdgeBytes)
		}
	}
}

// TestReadaheadCarriesAcrossFiles: a reader that reads a file through to
// its end and then starts on the next gets the next file's read-ahead
// window at the size it had reached, from that file's first read (up to
// aheadChunks*Jobs chunks ahead), rather than starting small again; a
// reader that opens the second file first gets no window from its first read.
func TestReadaheadCarriesAcrossFiles(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	a, b := randBytes(22, 12*mib), randBytes(23, 24*mib)
	for name, data := range map[string][]byte{"a.bin": a, "b.bin": b} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	px := newFixtureStore(t, dir, layout.Params{Min: 512 << 10, Avg: mib, Max: mib})
	ver, err := layout.Open(context.Background(), px.store, px.root)
	if err != nil {
		t.Fatal(err)
	}
	const jobs = 4
	for _, afterA := range []bool{true, false} {
		ff := &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}
		v, err := New(ver, ff, Options{Cache: mustCache(t), Jobs: jobs})
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 128<<10)
		if afterA {
			f, err := v.Open("a.bin")
			if err != nil {
				t.Fatal(err)
			}
			for off := int64(0); off < int64(len(a)); off += int64(len(buf)) {
				if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
					t.Fatal(err)
				}
			}
		}
		fb, err := v.Open("b.bin")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fb.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
		waitAhead(v)
		v.Close()
		nb, _ := v.Lookup("b.bin")
		got := 0
		for _, x := range ver.Index.File(nb).Extents {
			if ff.fetches[ver.Chunk(x.Chunk).Digest] > 0 {
				got++
			}
		}
		switch {
		case afterA && got < aheadChunks*jobs:
			t.Errorf("after a whole file, the next file's first read left %d of its chunks fetched, want the window of %d", got, aheadChunks*jobs)
		case !afterA && got > 1:
			t.Errorf("a first read of a file opened on its own fetched %d chunks, want the one it reads", got)
		}
	}
}

// TestReadaheadStreamsWhenFirstReadsSwap reads a safetensors file from its
// start in requests of 128 KiB, as the kernel sends a mount's sequential
// reader, with the first two requests served in the other order (the
// kernel sends readahead requests concurrently): the run still began in
// the header, so the reader reads the file through and the window goes
// past the first tensor, as it does when they come in order.
func TestReadaheadStreamsWhenFirstReadsSwap(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	data := safetensors(t, 31, 6*mib, 3*mib, 3*mib, 3*mib, 3*mib, 3*mib, 3*mib)
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	first := int64(8+binary.LittleEndian.Uint64(data)) + 6*mib // the first tensor's end
	px := newFixtureStore(t, dir, layout.Params{Min: 512 << 10, Avg: mib, Max: mib})
	ver, err := layout.Open(context.Background(), px.store, px.root)
	if err != nil {
		t.Fatal(err)
	}
	const req = 128 << 10 // the kernel's read requests on a mount
	for _, swap := range []bool{false, true} {
		ff := &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}
		v, err := New(ver, ff, Options{Cache: mustCache(t), Jobs: 4})
		if err != nil {
			t.Fatal(err)
		}
		f, err := v.Open("model.safetensors")
		if err != nil {
			t.Fatal(err)
		}
		var offs []int64 // 2 MiB from the start
		for i := range int64(16) {
			offs = append(offs, i*req)
		}
		if swap {
			offs[0], offs[1] = offs[1], offs[0]
		}
		buf := make([]byte, req)
		for _, off := range offs {
			if _, err := f.ReadAt(buf, off); err != nil {
				t.Fatal(err)
			}
		}
		waitAhead(v)
		v.Close()
		past := 0 // chunks wholly past the first tensor and the page after it
		var off int64
		for _, x := range f.e.Extents {
			if off >= first+pageSize && ff.fetches[ver.Chunk(x.Chunk).Digest] > 0 {
				past++
			}
			off += x.Length
		}
		if past == 0 {
			t.Errorf("first two reads swapped=%v: the readahead fetched nothing past the first tensor (at %d), want a window going on into the file", swap, first)
		}
	}
}

// holdFetcher holds fetches of one blob until release is closed.
type holdFetcher struct {
	*fakeFetcher
	held    digest.Digest
	release chan struct{}
}

func (h *holdFetcher) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if desc.Digest == h.held {
		select {
		case <-h.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return h.fakeFetcher.Fetch(ctx, desc)
}

// TestReadaheadOutlastsASlowChunk: a sequential reader waiting for one
// slow chunk still has fetches going on behind it, up to aheadChunks*Jobs
// chunks ahead, so the link stays busy while the smaller chunks after a
// large one finish first; and it reads the right bytes once it comes.
func TestReadaheadOutlastsASlowChunk(t *testing.T) {
	const mib = 1 << 20
	dir := t.TempDir()
	data := randBytes(31, 26*mib)
	if err := os.WriteFile(filepath.Join(dir, "big.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	px := newFixtureStore(t, dir, layout.Params{Min: 512 << 10, Avg: mib, Max: mib})
	ver, err := layout.Open(context.Background(), px.store, px.root)
	if err != nil {
		t.Fatal(err)
	}
	const jobs, slow = 4, 6
	ext := ver.Index.File(0).Extents
	if len(ext) < slow+4*jobs+1 {
		t.Fatalf("premise: %d chunks, want at least %d", len(ext), slow+4*jobs+1)
	}
	hf := &holdFetcher{
		fakeFetcher: &fakeFetcher{src: px.store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}},
		held:        ver.Chunk(ext[slow].Chunk).Digest,
		release:     make(chan struct{}),
	}
	v, err := New(ver, hf, Options{Cache: mustCache(t), Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	f, err := v.Open("big.bin")
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		got := make([]byte, len(data))
		for off := 0; off < len(data); off += 128 << 10 {
			if _, err := f.ReadAt(got[off:min(len(data), off+128<<10)], int64(off)); err != nil && err != io.EOF {
				read <- err
				return
			}
		}
		if !bytes.Equal(got, data) {
			read <- errors.New("the bytes read differ from the file's")
			return
		}
		read <- nil
	}()
	behind := func() int { // chunks after the slow one fetched
		hf.mu.Lock()
		defer hf.mu.Unlock()
		n := 0
		for _, x := range ext[slow+1:] {
			if hf.fetches[ver.Chunk(x.Chunk).Digest] > 0 {
				n++
			}
		}
		return n
	}
	n, last, since := 0, -1, time.Now()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && n < 3*jobs; time.Sleep(10 * time.Millisecond) {
		if n = behind(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > 3*time.Second {
			break // settled
		}
	}
	close(hf.release)
	if n < 3*jobs {
		t.Errorf("while the reader waited for chunk %d, %d chunks after it were fetched, want at least %d (3*Jobs)", slow, n, 3*jobs)
	}
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader did not finish once the slow chunk came")
	}
}

// waitAhead waits (up to 30 s) until v has no fetch ahead queued or
// running, so that a Close after it cancels none.
func waitAhead(v *Volume) {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		v.mu.Lock()
		busy := len(v.pending)
		v.mu.Unlock()
		if busy == 0 {
			return
		}
	}
}
