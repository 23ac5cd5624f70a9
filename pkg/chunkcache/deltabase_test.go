package chunkcache

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// deltaVersion stores a version of one file of one chunk, stored as a
// delta against a base that is no chunk of it, and returns the store, the
// version, the chunk and the base.
func deltaVersion(t *testing.T) (*memory.Store, *layout.Version, []byte, []byte) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	base := randBytes(21, 1<<20)
	next := bytes.Clone(base)
	for i := 0; i < len(next); i += 101 {
		next[i] ^= 0x11
	}
	ch := layout.Chunk{Digest: digest.FromBytes(next), Size: int64(len(next))}
	ch.Head, ch.Tail = digest.FromBytes(next[:layout.EdgeBytes]), digest.FromBytes(next[len(next)-layout.EdgeBytes:])
	x := &layout.Index{Version: layout.FormatVersion, Chunking: layout.DefaultParams, Chunks: []layout.Chunk{ch},
		Files: []layout.File{{Path: "model", Type: layout.TypeFile, Mode: 0o644, Size: ch.Size, Digest: ch.Digest, Extents: []layout.Extent{{Chunk: 0, Offset: 0, Length: ch.Size}}}}}
	s, err := layout.Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
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
	if s, err = s.WithDeltas(map[digest.Digest]layout.Delta{d.Chunk: d}, 0, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, store); err != nil {
		t.Fatal(err)
	}
	v, err := layout.Open(ctx, store, s.Root.Desc)
	if err != nil {
		t.Fatal(err)
	}
	return store, v, next, base
}

// TestDeltaBaseKeptUnhashed: a delta chunk loaded through the cache, its
// base read through the cache too (as a mount reads them), costs one hash,
// the decoded chunk's: the cache stores the chunk without hashing it again
// and keeps the base, fetched once, without hashing it. The kept base is
// hashed when it is first opened, and served from the cache from then on;
// a kept base whose bytes are wrong is dropped when opened and fetched
// again.
func TestDeltaBaseKeptUnhashed(t *testing.T) {
	ctx := context.Background()
	hashed := countHashing(t)
	store, v, next, base := deltaVersion(t)
	src := &fakeFetcher{src: store, fetches: map[digest.Digest]int{}, corrupt: map[digest.Digest]bool{}}
	c, err := Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	chunks := v.ChunkSourceBases(src, c.Fetcher(src))
	desc := v.Chunk(0)
	d, _ := v.Index.Delta(0)
	bd := d.BaseDescriptor()
	load := func() {
		t.Helper()
		ch, err := c.Load(ctx, chunks, desc)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(io.NewSectionReader(ch, 0, desc.Size))
		ch.Close()
		if !bytes.Equal(got, next) {
			t.Fatal("wrong bytes served")
		}
	}
	load()
	if n := hashed.Load(); n != 0 || src.fetches[d.Base] != 1 || !c.Contains(d.Base) {
		t.Fatalf("cold: the cache hashed %d bytes (want none), the base fetched %d times (want 1), kept %v", n, src.fetches[d.Base], c.Contains(d.Base))
	}
	// Decoded again over the kept base: hashed once, now, and not fetched.
	c.Remove(desc.Digest)
	load()
	load()
	if n := hashed.Load(); n != bd.Size || src.fetches[d.Base] != 1 {
		t.Errorf("over the kept base: hashed %d bytes (want the base's %d, once), the base fetched %d times (want 1)", n, bd.Size, src.fetches[d.Base])
	}
	// A kept base that is not the base: dropped when opened, fetched again.
	c2, err := Open(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	wrong := bytes.Clone(base)
	wrong[3] ^= 1
	c2.keep(bd, wrong)
	ch, err := c2.Load(ctx, src, bd)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(io.NewSectionReader(ch, 0, bd.Size))
	ch.Close()
	if !bytes.Equal(got, base) || c2.Stats().Corrupt != 1 || src.fetches[d.Base] != 2 {
		t.Errorf("a wrong kept base: right bytes %v, corrupt %d, fetched %d times", bytes.Equal(got, base), c2.Stats().Corrupt, src.fetches[d.Base])
	}
}
