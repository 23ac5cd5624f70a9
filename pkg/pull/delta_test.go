package pull

import (
	"bytes"
	"context"
	"errors"
	"hash"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/sha2x"
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

// TestPullDeltaChunkHashedOnce: a pull hashes a delta chunk once: one
// streamed to its file comes decoded piece by piece as its base streams in
// (the delta source hashes nothing: TestDeltaFetchStreamed) and is hashed
// as it is written, as a plain chunk is; one whole to the files it packs
// comes decoded and verified by the delta source and is not hashed again.
// A delta that decodes to other bytes is still refused and nothing is put
// in place.
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
		name   string
		files  []layout.File
		want   map[string][]byte
		hashed int64 // by the pull's writer
	}{
		{"streamed", []layout.File{fileOf("model", all, layout.Extent{Chunk: 0, Offset: 0, Length: size}, layout.Extent{Chunk: 1, Offset: 0, Length: size})},
			map[string][]byte{"model": all}, 2 * size},
		{"packed", []layout.File{
			fileOf("a", plain, layout.Extent{Chunk: 0, Offset: 0, Length: size}),
			fileOf("b", next[:size/2], layout.Extent{Chunk: 1, Offset: 0, Length: size / 2}),
			fileOf("c", next[size/2:], layout.Extent{Chunk: 1, Offset: size / 2, Length: size / 2})},
			map[string][]byte{"a": plain, "b": next[:size/2], "c": next[size/2:]}, size},
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
			if n := hashed.Load(); n != c.hashed {
				t.Errorf("the pull's writer hashed %d bytes, want %d", n, c.hashed)
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

// servingOther serves data for the blob of digest d.
type servingOther struct {
	content.Fetcher
	d    digest.Digest
	data []byte
}

func (f servingOther) Fetch(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	if desc.Digest == f.d {
		return io.NopCloser(bytes.NewReader(f.data)), nil
	}
	return f.Fetcher.Fetch(ctx, desc)
}

// streamedDeltaVersion stores a version whose chunk 0 (plain) packs files
// a and b and whose chunk 1, of a size no multiple of its planes, is a
// delta (made by mk) streamed to file model; it returns the store, the
// version, the base and the chunks.
func streamedDeltaVersion(t *testing.T, mk func(plain, base []byte) []byte) (*memory.Store, *layout.Version, []byte, [][]byte) {
	t.Helper()
	const size = 1<<20 + 3
	r := rand.New(rand.NewPCG(5, 5))
	base := make([]byte, size)
	for i := range base {
		base[i] = byte(r.Uint32())
	}
	next := bytes.Clone(base)
	for i := 0; i < size; i += 61 {
		next[i] ^= 0x21
	}
	plain := bytes.Repeat([]byte{9}, 1<<20)
	fileOf := func(path string, data []byte, exts ...layout.Extent) layout.File {
		return layout.File{Path: path, Type: layout.TypeFile, Mode: 0o644, Size: int64(len(data)), Digest: digest.FromBytes(data), Extents: exts}
	}
	files := []layout.File{
		fileOf("a", plain[:1<<19], layout.Extent{Chunk: 0, Offset: 0, Length: 1 << 19}),
		fileOf("b", plain[1<<19:], layout.Extent{Chunk: 0, Offset: 1 << 19, Length: 1 << 19}),
		fileOf("model", next, layout.Extent{Chunk: 1, Offset: 0, Length: size}),
	}
	store, v := deltaPullVersion(t, files, [][]byte{plain, next}, base, mk)
	return store, v, base, [][]byte{plain, next}
}

// TestPullStreamsDeltaChunk: a cold pull streams a delta chunk whose base
// it fetches (counted in DeltaStats.Streamed), hashing its decoded pieces
// through the pull's Pairer (a stream waiting there is hashed beside
// them), and writes the chunk; a lying base, a base body cut short and a
// delta decoding to other bytes are refused, the retry (decoded whole)
// names the culprit, and the file is not put in place.
func TestPullStreamsDeltaChunk(t *testing.T) {
	ctx := context.Background()
	good := func(p, b []byte) []byte {
		d, err := layout.EncodeDelta(p, b, layout.Planes16)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	store, v, _, chunks := streamedDeltaVersion(t, good)
	var stats layout.DeltaStats
	dst := t.TempDir()
	d, err := openDest(dst)
	if err != nil {
		t.Fatal(err)
	}
	p := newPuller(ctx, layout.DeltaSource(store, nil, v.Index, &stats), v, d, Options{})
	other := sha2x.NewDigest()
	waiting := bytes.Repeat([]byte("another chunk streamed "), 1<<14)
	o := p.pairs.Offer(other, waiting) // only the delta chunk offers: chunk 0 is packed
	err = p.plan()
	if err == nil {
		err = p.transfer()
	}
	if err == nil {
		err = p.finalise()
	}
	d.close(err == nil)
	p.pairs.Collect(o)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "model")); err != nil || !bytes.Equal(got, chunks[1]) {
		t.Fatalf("model: %v, equal %v", err, bytes.Equal(got, chunks[1]))
	}
	if stats.Streamed != 1 || stats.Decoded != 1 {
		t.Errorf("delta stats %+v: want the delta chunk streamed", stats)
	}
	if got, want := digest.NewDigest(digest.SHA256, other), digest.FromBytes(waiting); got != want {
		t.Errorf("the waiting stream hashed to %s, want %s", got, want)
	}
	if o != nil && p.pairs.Paired() < 1 {
		t.Errorf("%d offers hashed in pairs: the streamed chunk was not hashed through the pull's Pairer", p.pairs.Paired())
	}

	cases := []struct {
		name  string
		delta func(p, b []byte) []byte
		src   func(s content.Fetcher, base []byte) content.Fetcher
		blame string
	}{
		{"lying base", good, func(s content.Fetcher, base []byte) content.Fetcher {
			b := bytes.Clone(base)
			b[77] ^= 1
			return servingOther{s, digest.FromBytes(base), b}
		}, "base of chunk"},
		{"short base", good, func(s content.Fetcher, base []byte) content.Fetcher {
			return servingOther{s, digest.FromBytes(base), base[:len(base)-5]}
		}, "base of chunk"},
		{"lying delta", func(p, b []byte) []byte {
			q := bytes.Clone(p)
			q[1000] ^= 1
			return good(q, b)
		}, func(s content.Fetcher, _ []byte) content.Fetcher { return s }, "decoded delta"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store, v, base, _ := streamedDeltaVersion(t, c.delta)
			var stats layout.DeltaStats
			dst := t.TempDir()
			_, err := Materialise(ctx, layout.DeltaSource(c.src(store, base), nil, v.Index, &stats), v, dst, Options{})
			if !errors.Is(err, verify.ErrDigestMismatch) || !strings.Contains(err.Error(), c.blame) {
				t.Fatalf("%v, want a digest mismatch naming %q", err, c.blame)
			}
			if stats.Streamed != 1 {
				t.Errorf("%d streamed, want the first attempt", stats.Streamed)
			}
			if _, err := os.Stat(filepath.Join(dst, "model")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("model put in place: %v", err)
			}
		})
	}
}
