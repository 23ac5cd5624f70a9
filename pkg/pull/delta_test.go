package pull

import (
	"bytes"
	"context"
	"errors"
	"hash"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// countChunkHashing makes the pull's chunk hash count into the returned
// counter for the rest of the test.
func countChunkHashing(t *testing.T) *atomic.Int64 {
	var n atomic.Int64
	old := newChunkHash
	newChunkHash = func() hash.Hash { return testutil.NewCountingHash(&n) }
	t.Cleanup(func() { newChunkHash = old })
	return &n
}

// deltaPullVersion stores a version 3 version of files over chunks, chunk
// 1 stored as a delta (made by mk) against a base that is no chunk of it.
func deltaPullVersion(t *testing.T, files []layout.File, chunks [][]byte, base []byte, mk func(plain, base []byte) []byte) (*memory.Store, *layout.Version) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	x := &layout.Index{Version: layout.FormatVersion, Chunking: layout.DefaultParams, Files: files}
	for i, c := range chunks {
		ch := layout.Chunk{Digest: digest.FromBytes(c), Size: int64(len(c))}
		ch.Head, ch.Tail = digest.FromBytes(c[:layout.EdgeBytes]), digest.FromBytes(c[len(c)-layout.EdgeBytes:])
		x.Chunks = append(x.Chunks, ch)
		if i != 1 {
			if err := store.Push(ctx, ch.Descriptor(), bytes.NewReader(c)); err != nil {
				t.Fatal(err)
			}
		}
	}
	s, err := layout.Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	bd := content.NewDescriptorFromBytes(layout.MediaTypeChunk, base)
	if err := store.Push(ctx, bd, bytes.NewReader(base)); err != nil {
		t.Fatal(err)
	}
	delta := mk(chunks[1], base)
	d := layout.Delta{Chunk: x.Chunks[1].Digest, Size: int64(len(base)), Digest: digest.FromBytes(delta), DeltaSize: int64(len(delta)), Base: bd.Digest}
	if err := store.Push(ctx, d.Descriptor(), bytes.NewReader(delta)); err != nil {
		t.Fatal(err)
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
	return store, v
}

// TestPullDeltaChunkHashedOnce: a pull writes a delta chunk, decoded and
// verified by the delta source, without hashing it again (streamed to one
// file, or whole to the files it packs), while a plain chunk is hashed as
// it is written; a delta that decodes to other bytes is still refused and
// nothing is put in place.
func TestPullDeltaChunkHashedOnce(t *testing.T) {
	const size = 1 << 20
	r := rand.New(rand.NewPCG(3, 3))
	base := make([]byte, size)
	for i := range base {
		base[i] = byte(r.Uint32())
	}
	next := bytes.Clone(base)
	for i := 0; i < size; i += 97 {
		next[i] ^= 0x5a
	}
	plain := bytes.Repeat([]byte{7}, size)
	all := append(bytes.Clone(plain), next...)
	fileOf := func(path string, data []byte, exts ...layout.Extent) layout.File {
		return layout.File{Path: path, Type: layout.TypeFile, Mode: 0o644, Size: int64(len(data)), Digest: digest.FromBytes(data), Extents: exts}
	}
	cases := []struct {
		name  string
		files []layout.File
		want  map[string][]byte
	}{
		{"streamed", []layout.File{fileOf("model", all, layout.Extent{Chunk: 0, Offset: 0, Length: size}, layout.Extent{Chunk: 1, Offset: 0, Length: size})},
			map[string][]byte{"model": all}},
		{"packed", []layout.File{
			fileOf("a", plain, layout.Extent{Chunk: 0, Offset: 0, Length: size}),
			fileOf("b", next[:size/2], layout.Extent{Chunk: 1, Offset: 0, Length: size / 2}),
			fileOf("c", next[size/2:], layout.Extent{Chunk: 1, Offset: size / 2, Length: size / 2})},
			map[string][]byte{"a": plain, "b": next[:size/2], "c": next[size/2:]}},
	}
	good := func(p, b []byte) []byte {
		d, err := layout.EncodeDelta(p, b, layout.PlanesRaw)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hashed := countChunkHashing(t)
			store, v := deltaPullVersion(t, c.files, [][]byte{plain, next}, base, good)
			dst := t.TempDir()
			if _, err := Materialise(context.Background(), v.ChunkSource(store), v, dst, Options{}); err != nil {
				t.Fatal(err)
			}
			for name, want := range c.want {
				if got, err := os.ReadFile(filepath.Join(dst, name)); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("%s: %v, equal %v", name, err, bytes.Equal(got, want))
				}
			}
			if n := hashed.Load(); n != size {
				t.Errorf("the pull's writer hashed %d bytes, want %d (the plain chunk only: the delta chunk was verified when decoded)", n, size)
			}
		})
		t.Run(c.name+"/hostile", func(t *testing.T) {
			store, v := deltaPullVersion(t, c.files, [][]byte{plain, next}, base, func(p, b []byte) []byte {
				q := bytes.Clone(p)
				q[1000] ^= 1
				return good(q, b)
			})
			dst := t.TempDir()
			_, err := Materialise(context.Background(), v.ChunkSource(store), v, dst, Options{})
			if !errors.Is(err, verify.ErrDigestMismatch) {
				t.Fatalf("a delta decoding to other bytes: %v", err)
			}
			for name := range c.want {
				if name == "a" {
					continue // the plain chunk's file, whole and verified, may be in place
				}
				if _, err := os.Stat(filepath.Join(dst, name)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s put in place after a bad delta: %v", name, err)
				}
			}
		})
	}
}
