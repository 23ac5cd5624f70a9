package lazy

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// deltaFixture stores a version of one file of two chunks, each stored as
// a delta against a base that is no chunk of it, and returns the file's
// bytes, the source and the version.
func deltaFixture(t *testing.T) ([]byte, *fakeFetcher, *layout.Version) {
	return deltaFixtureOf(t, 1<<20)
}

// deltaFixtureOf is deltaFixture with chunks of size bytes.
func deltaFixtureOf(t *testing.T, size int) ([]byte, *fakeFetcher, *layout.Version) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	x := &layout.Index{Version: layout.FormatVersion, Chunking: layout.DefaultParams}
	deltas := map[digest.Digest]layout.Delta{}
	var file []byte
	var exts []layout.Extent
	for k := range 2 {
		base := randBytes(uint64(21+k), size)
		next := bytes.Clone(base)
		for i := 0; i < len(next); i += 101 {
			next[i] ^= byte(0x11 + k)
		}
		ch := layout.Chunk{Digest: digest.FromBytes(next), Size: int64(len(next))}
		ch.Head, ch.Tail = digest.FromBytes(next[:layout.EdgeBytes]), digest.FromBytes(next[len(next)-layout.EdgeBytes:])
		x.Chunks = append(x.Chunks, ch)
		exts = append(exts, layout.Extent{Chunk: k, Offset: 0, Length: ch.Size})
		file = append(file, next...)
		delta, err := layout.EncodeDelta(next, base, layout.PlanesRaw)
		if err != nil {
			t.Fatal(err)
		}
		bd := content.NewDescriptorFromBytes(layout.MediaTypeChunk, base)
		d := layout.Delta{Chunk: ch.Digest, Size: ch.Size, Digest: digest.FromBytes(delta), DeltaSize: int64(len(delta)), Base: bd.Digest}
		for _, b := range []struct {
			desc ocispec.Descriptor
			data []byte
		}{{bd, base}, {d.Descriptor(), delta}} {
			if err := store.Push(ctx, b.desc, bytes.NewReader(b.data)); err != nil {
				t.Fatal(err)
			}
		}
		deltas[d.Chunk] = d
	}
	x.Files = []layout.File{{Path: "w.bin", Type: layout.TypeFile, Mode: 0o644, Size: int64(len(file)), Digest: digest.FromBytes(file), Extents: exts}}
	s, err := layout.Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, err = s.WithDeltas(deltas, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, store); err != nil {
		t.Fatal(err)
	}
	v, err := layout.Open(ctx, store, s.Root.Desc)
	if err != nil {
		t.Fatal(err)
	}
	return file, &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}, v
}

// deltaVolume opens a volume of ver over src with a cache of its own, both
// closed with the test, and its file w.bin.
func deltaVolume(t *testing.T, ver *layout.Version, src content.Fetcher) (*Volume, *File) {
	t.Helper()
	v, err := New(ver, src, Options{Cache: mustCache(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	f, err := v.Open("w.bin")
	if err != nil {
		t.Fatal(err)
	}
	return v, f
}

// TestDeltaReadKeepsNoBase: a mount's delta chunks, read by a reader and
// fetched ahead of it, are served right and stored, their bases fetched
// past the cache and not stored in it (a reader does not wait while a base
// is written beside its chunk; a base the cache holds is still read from
// it).
func TestDeltaReadKeepsNoBase(t *testing.T) {
	next, src, ver := deltaFixture(t)
	v, f := deltaVolume(t, ver, src)
	c := v.opt.Cache
	if got := readAll(t, f); !bytes.Equal(got, next) {
		t.Fatal("wrong bytes served")
	}
	v.Close() // waits for the fetches ahead
	for k, d := range ver.Index.Deltas() {
		if !c.Contains(d.Chunk) {
			t.Errorf("delta chunk %d not stored", k)
		}
		if c.Contains(d.Base) {
			t.Errorf("the base of delta chunk %d stored in the cache", k)
		}
	}
}

// TestDeltaLyingBaseNeverServed: a mount whose source serves a wrong base
// serves nothing of the delta chunks and stores none of them, however
// their first fetch (streamed, ahead of a reader) and the reader's retry
// (decoded whole) go; the reader's error names the base.
func TestDeltaLyingBaseNeverServed(t *testing.T) {
	_, src, ver := deltaFixture(t)
	for _, d := range ver.Index.Deltas() {
		src.corrupt[d.Base] = true
	}
	v, f := deltaVolume(t, ver, src)
	c := v.opt.Cache
	k, off := f.e.Extents[1].Chunk, f.starts[1]
	d, ok := ver.Index.Delta(k)
	if !ok {
		t.Fatal("no delta chunk")
	}
	// Fetched ahead first (streamed), then read (decoded whole).
	v.fetchAhead(k, 0)
	v.wg.Wait()
	if c.Contains(d.Chunk) {
		t.Fatal("a chunk decoded from a lying base stored")
	}
	buf := make([]byte, 4096)
	n, err := f.ReadAt(buf, off)
	if err == nil || err == io.EOF {
		t.Fatalf("read %d bytes of a chunk decoded from a lying base", n)
	}
	if !strings.Contains(err.Error(), "base") {
		t.Errorf("the error names no base: %v", err)
	}
	if c.Contains(d.Chunk) {
		t.Fatal("a chunk decoded from a lying base stored")
	}
}

// TestDeltaTensorFetchSplitsBases: the chunks of a tensor a reader starts
// (fetched at once, split between the volume's jobs) fetch the bases of
// delta chunks as range requests from the first read on, as a plain
// chunk's once the source has served ranges: the reader waits for them.
func TestDeltaTensorFetchSplitsBases(t *testing.T) {
	next, src, ver := deltaFixtureOf(t, 5<<20)
	rf := &rangeFake{fakeFetcher: src}
	v, f := deltaVolume(t, ver, rf)
	f.fetchChunks(0, f.Size(), true)
	v.wg.Wait()
	for k, d := range ver.Index.Deltas() {
		if whole, ranged := rf.blobStats(d.Base); whole != 0 || ranged != d.Size {
			t.Errorf("base of delta chunk %d: fetched whole %d times, %d bytes by ranges (want 0, %d)", k, whole, ranged, d.Size)
		}
	}
	if got := readAll(t, f); !bytes.Equal(got, next) {
		t.Fatal("wrong bytes served")
	}
}

// TestDeltaChunkEdges: a read near a delta chunk's edge is served from the
// edge (decoded from the delta and a range of the base, verified against
// the chunk's head or tail digest) before the chunk is in, as a plain
// chunk's; an edge decoded from a base range that lies is refused, and
// nothing of it served.
func TestDeltaChunkEdges(t *testing.T) {
	next, src, ver := deltaFixture(t)
	rf := &rangeFake{fakeFetcher: src}
	v, _ := deltaVolume(t, ver, rf)
	k := 1
	c := ver.Index.Chunk(k)
	d, _ := ver.Index.Delta(k)
	head, _, ok := v.edge(context.Background(), k, 0, 4096)
	if !ok || !bytes.Equal(head, next[c.Size:c.Size+layout.EdgeBytes]) {
		t.Fatalf("head edge of a delta chunk: ok %v, equal %v", ok, ok && bytes.Equal(head, next[c.Size:c.Size+layout.EdgeBytes]))
	}
	tail, base, ok := v.edge(context.Background(), k, c.Size-10, c.Size)
	if !ok || base != c.Size-layout.EdgeBytes || !bytes.Equal(tail, next[2*c.Size-layout.EdgeBytes:]) {
		t.Fatalf("tail edge of a delta chunk: ok %v", ok)
	}
	if whole, ranged := rf.blobStats(d.Base); whole != 0 || ranged != 2*layout.EdgeBytes {
		t.Errorf("base: fetched whole %d times, %d bytes by ranges (want 0, %d)", whole, ranged, 2*layout.EdgeBytes)
	}
	if v.opt.Cache.Contains(c.Digest) {
		t.Error("the chunk was loaded for its edges")
	}
	// A base range that lies: no edge.
	rf.spoil = true
	if data, _, ok := v.edge(context.Background(), 0, 0, 4096); ok {
		t.Fatalf("an edge decoded from a spoiled base range served (%d bytes)", len(data))
	}
}
