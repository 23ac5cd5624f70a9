package pull

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

func TestPushPullMemory(t *testing.T) {
	ctx := context.Background()
	p := layout.Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}
	src := t.TempDir()
	files := map[string][]byte{"big.bin": testutil.RandBytes(3, 1<<20), "x/small.txt": []byte("hello"), "x/empty": nil}
	for i := range 300 {
		files[fmt.Sprintf("many/%03d", i)] = testutil.RandBytes(uint64(100+i), 1024)
	}
	testutil.WriteTree(t, src, files)
	if err := os.Symlink("../big.bin", filepath.Join(src, "x", "link")); err != nil {
		t.Fatal(err)
	}
	for _, maxLayers := range []int{0, 7} {
		t.Run(fmt.Sprint("maxLayers=", maxLayers), func(t *testing.T) {
			store := memory.New()
			res, err := push.Push(ctx, store, push.DirSource(src), push.Options{Params: p, MaxLayers: maxLayers})
			if err != nil {
				t.Fatal(err)
			}
			// 300 files of 1 KiB pack into a handful of chunks.
			if res.Chunks > 1<<20/int(p.Min)+300*1024/int(p.Min)+4 {
				t.Fatalf("%d chunks: small files were not packed", res.Chunks)
			}
			again, err := push.Push(ctx, store, push.DirSource(src), push.Options{Params: p, MaxLayers: maxLayers})
			if err != nil {
				t.Fatal(err)
			}
			if again.Root.Digest != res.Root.Digest || again.BytesUploaded != 0 {
				t.Fatalf("re-push: digest %s (was %s), %d bytes uploaded", again.Root.Digest, res.Root.Digest, again.BytesUploaded)
			}
			v, err := layout.Open(ctx, store, res.Root)
			if err != nil {
				t.Fatal(err)
			}
			dst := t.TempDir()
			if _, err := Materialise(ctx, store, v, dst, Options{}); err != nil {
				t.Fatal(err)
			}
			for p, want := range files {
				got, err := os.ReadFile(filepath.Join(dst, p))
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("%s differs after pull (%v)", p, err)
				}
			}
			if tgt, err := os.Readlink(filepath.Join(dst, "x", "link")); err != nil || tgt != "../big.bin" {
				t.Fatalf("symlink: %q %v", tgt, err)
			}
			// A second pull reuses every file and fetches nothing.
			r2, err := Materialise(ctx, store, v, dst, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r2.ChunksFetched != 0 {
				t.Fatalf("second pull fetched %d chunks", r2.ChunksFetched)
			}
		})
	}
}

func TestPushRemoteSourceBuffers(t *testing.T) {
	ctx := context.Background()
	p := layout.Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}
	src := t.TempDir()
	files := map[string][]byte{"big.bin": testutil.RandBytes(7, 700<<10), "a/small": []byte("small file")}
	testutil.WriteTree(t, src, files)
	local, remote := memory.New(), memory.New()
	want, err := push.Push(ctx, local, push.DirSource(src), push.Options{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	got, err := push.Push(ctx, remote, remoteDir{push.DirSource(src)}, push.Options{Params: p, Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got.Root.Digest != want.Root.Digest {
		t.Fatalf("remote source sealed %s, local %s", got.Root.Digest, want.Root.Digest)
	}
	v, err := layout.Open(ctx, remote, got.Root)
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if _, err := Materialise(ctx, remote, v, dst, Options{}); err != nil {
		t.Fatal(err)
	}
	for p, data := range files {
		if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("%s differs (%v)", p, err)
		}
	}
}

// flaky serves a chunk wrong the first times it is fetched: bytes flipped,
// or the body cut half-way.
type flaky struct {
	content.Fetcher
	target digest.Digest
	bad    int // fetches of target left to spoil
	cut    bool
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func (f *flaky) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := f.Fetcher.Fetch(ctx, d)
	if err != nil || d.Digest != f.target || f.bad == 0 {
		return rc, err
	}
	f.bad--
	b, _ := io.ReadAll(rc)
	rc.Close()
	if f.cut {
		return io.NopCloser(io.MultiReader(bytes.NewReader(b[:len(b)/2]), errReader{})), nil
	}
	b[len(b)/3] ^= 0xff
	return io.NopCloser(bytes.NewReader(b)), nil
}

func TestPullRefetchesSpoiledChunks(t *testing.T) {
	ctx := context.Background()
	p := layout.Params{Min: 8 << 10, Avg: 32 << 10, Max: 64 << 10}
	src := t.TempDir()
	data := testutil.RandBytes(11, 300<<10)
	testutil.WriteTree(t, src, map[string][]byte{"f.bin": data})
	store := memory.New()
	res, err := push.Push(ctx, store, push.DirSource(src), push.Options{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	v, err := layout.Open(ctx, store, res.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    *flaky
		ok   bool
	}{
		{"flipped once", &flaky{Fetcher: store, target: v.Chunk(1).Digest, bad: 1}, true},
		{"cut twice", &flaky{Fetcher: store, target: v.Chunk(2).Digest, bad: 2, cut: true}, true},
		{"flipped always", &flaky{Fetcher: store, target: v.Chunk(0).Digest, bad: 99}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := t.TempDir()
			_, err := Materialise(ctx, c.f, v, dst, Options{Jobs: 2})
			got, rerr := os.ReadFile(filepath.Join(dst, "f.bin"))
			if c.ok {
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("pull: %v; file matches: %v", err, bytes.Equal(got, data))
				}
				return
			}
			if !errors.Is(err, layout.ErrDigestMismatch) || !strings.Contains(err.Error(), v.Chunk(0).Digest.String()) {
				t.Fatalf("got %v, want a digest mismatch naming the chunk", err)
			}
			if rerr == nil {
				t.Fatal("a file with a corrupt chunk is under its final name")
			}
		})
	}
}

// pullSeeds returns versions in placeholder form (index.json, manifest,
// index blob, data blob) that pull: a version 1 volume whose files share
// its one chunk, and a version 2 volume whose one piece is the data blob.
func pullSeeds(t testing.TB) [][4][]byte {
	index := []byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + testutil.PhManifestDigest + `","size":` + testutil.PhManifestSize + `,"annotations":{"org.opencontainers.image.ref.name":"v1"}}]}`)
	chunk := []byte("0123456789abcdef")
	cd := digest.FromBytes(chunk)
	x1 := &layout.Index{Version: layout.FormatVersion1, Chunking: v1Params, Chunks: []layout.Chunk{{Digest: cd, Size: int64(len(chunk))}}, Files: []layout.File{
		{Path: "a", Type: layout.TypeFile, Mode: 0o644, Size: 16, Digest: cd, Extents: []layout.Extent{{Chunk: 0, Offset: 0, Length: 16}}},
		{Path: "d", Type: layout.TypeDir, Mode: 0o755},
		{Path: "d/e", Type: layout.TypeFile, Mode: 0o600, Digest: digest.FromBytes(nil)},
		{Path: "d/f", Type: layout.TypeFile, Mode: 0o400, Size: 4, Digest: digest.FromBytes(chunk[4:8]), Extents: []layout.Extent{{Chunk: 0, Offset: 4, Length: 4}}},
		{Path: "d/l", Type: layout.TypeSymlink, Mode: 0o777, Target: "../a"},
		{Path: "d/s", Type: layout.TypeDir, Mode: 0o500},
		{Path: "l", Type: layout.TypeSymlink, Mode: 0o777, Target: "d"},
	}}
	s1, err := layout.Seal(x1, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	ib := s1.Blobs[0].Data
	man1 := testutil.Placeholders(testutil.Placeholders(s1.Root.Data, chunk, testutil.PhDataDigest, testutil.PhDataSize), ib, testutil.PhBlobDigest, testutil.PhBlobSize)
	x2 := &layout.Index{Version: layout.FormatVersion, Chunking: layout.DefaultParams, Chunks: []layout.Chunk{}, Files: []layout.File{
		{Path: "d", Type: layout.TypeDir, Mode: 0o750},
		{Path: "d/e", Type: layout.TypeFile, Mode: 0o644, Digest: digest.FromBytes(nil)},
		{Path: "d/l", Type: layout.TypeSymlink, Mode: 0o777, Target: "e"},
	}}
	s2, err := layout.Seal(x2, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(s2.Blobs) != 3 { // top, one piece, empty config
		t.Fatalf("version 2 seed has %d blobs", len(s2.Blobs))
	}
	top, pc := s2.Blobs[0].Data, s2.Blobs[1].Data
	man2 := testutil.Placeholders(testutil.Placeholders(s2.Root.Data, pc, testutil.PhDataDigest, testutil.PhDataSize), top, testutil.PhBlobDigest, testutil.PhBlobSize)
	return [][4][]byte{
		{index, man1, testutil.Placeholders(ib, chunk, testutil.PhDataDigest, testutil.PhDataSize), chunk},
		{index, man2, testutil.Placeholders(top, pc, testutil.PhDataDigest, testutil.PhDataSize), pc},
	}
}

func TestPullSeedsPull(t *testing.T) {
	for i, s := range pullSeeds(t) {
		for _, stepwise := range []bool{false, true} {
			ctx := context.Background()
			dir := t.TempDir()
			testutil.BuildFuzzLayout(t, dir, s[0], s[1], s[2], s[3])
			tg, err := oci.Open(ctx, oci.Ref{Layout: dir}, oci.Options{})
			if err != nil {
				t.Fatal(err)
			}
			d, err := tg.Resolve(ctx, "v1")
			if err != nil {
				t.Fatal(err)
			}
			v, err := layout.Open(ctx, tg, d)
			if err != nil {
				t.Fatalf("seed %d does not open: %v", i, err)
			}
			m := pullMode{stepwise: stepwise, verifyFiles: stepwise}
			dst, planted, err := pullPlanted(t, tg, v, indexPaths(v.Index), []byte{0, 0, 1, 2, 2, 3, 9, 4}, m)
			if err != nil {
				t.Fatalf("seed %d (%+v) does not pull: %v", i, m, err)
			}
			checkTree(t, dst, tg, v.Index, planted, m)
		}
	}
}

// indexPaths returns the paths of the entries of x.
func indexPaths(x *layout.Index) []string {
	paths := make([]string, x.Len())
	for i := range paths {
		paths[i] = x.Path(i)
	}
	return paths
}

// FuzzPullLayout builds an OCI layout from the fuzzer's bytes (index.json,
// a manifest, an index blob and a data blob) and pulls each version of it
// that opens into a directory with links planted at the names the pull
// uses, with openat2 or the stepwise fallback, checking each file's digest
// or not: nothing outside the directory may change, and a pull either
// fails or leaves exactly the version's tree.
func FuzzPullLayout(f *testing.F) {
	plants := [][]byte{{0, 0, 1, 2, 2, 3, 12, 4}, {3, 1, 5, 0, 7, 2, 2, 5}}
	for i, s := range pullSeeds(f) {
		for k, p := range plants {
			f.Add(s[0], s[1], s[2], s[3], p, (i+k)%2 == 1, k == 1)
		}
	}
	f.Fuzz(func(t *testing.T, index, manifest, blob, data, plants []byte, stepwise, verifyFiles bool) {
		dir := t.TempDir()
		testutil.BuildFuzzLayout(t, dir, index, manifest, blob, data)
		fuzzVersions(context.Background(), dir, blob, 5, func(tg oci.Target, _ ocispec.Descriptor, v *layout.Version, err error) {
			if err != nil {
				return
			}
			m := pullMode{stepwise: stepwise, verifyFiles: verifyFiles}
			dst, planted, err := pullPlanted(t, tg, v, indexPaths(v.Index), plants, m)
			if err != nil {
				t.Logf("pull refused: %v", err)
				return
			}
			checkTree(t, dst, tg, v.Index, planted, m)
		})
	})
}
