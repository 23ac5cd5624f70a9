package pull

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
)

// Helpers copied from pkg/layout's tests, over the exported API.

// buildFuzzLayout writes an OCI layout to dir: data as is, blob with the
// data's placeholders filled in, manifest with the blob's and the data's,
// index.json with all three's. The data blob (a chunk or an index piece) is
// written only when there is one.
func buildFuzzLayout(t *testing.T, dir string, index, manifest, blob []byte, data ...[]byte) {
	t.Helper()
	var dataBlob []byte
	if len(data) > 0 {
		dataBlob = data[0]
	}
	fill := func(b []byte, rs [][2]string) []byte {
		for _, r := range rs {
			b = bytes.ReplaceAll(b, []byte(r[0]), []byte(r[1]))
		}
		return b
	}
	dd := digest.FromBytes(dataBlob)
	rs := [][2]string{{phDataDigest, string(dd)}, {phDataSize, strconv.Itoa(len(dataBlob))}}
	blob = fill(blob, rs)
	bd := digest.FromBytes(blob)
	rs = append(rs, [2]string{phBlobDigest, string(bd)}, [2]string{phBlobSize, strconv.Itoa(len(blob))})
	manifest = fill(manifest, rs)
	md := digest.FromBytes(manifest)
	index = fill(index, append(rs, [2]string{phManifestDigest, string(md)}, [2]string{phManifestSize, strconv.Itoa(len(manifest))}))
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		filepath.Join(dir, ocispec.ImageLayoutFile):                        []byte(`{"imageLayoutVersion":"1.0.0"}`),
		filepath.Join(dir, ocispec.ImageIndexFile):                         index,
		filepath.Join(blobs, bd.Encoded()):                                 blob,
		filepath.Join(blobs, md.Encoded()):                                 manifest,
		filepath.Join(blobs, ocispec.DescriptorEmptyJSON.Digest.Encoded()): []byte("{}"),
	}
	if len(data) > 0 {
		files[filepath.Join(blobs, dd.Encoded())] = dataBlob
	}
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fuzzVersions opens the layout dir and calls fn with each of its first n
// references (its tags, then the digest of blob) that resolve, and the
// version Open makes of it (or Open's error).
func fuzzVersions(ctx context.Context, dir string, blob []byte, n int, fn func(tg oci.Target, d ocispec.Descriptor, v *layout.Version, err error)) {
	tg, err := oci.Open(ctx, oci.Ref{Layout: dir}, oci.Options{})
	if err != nil {
		return
	}
	tags, err := oci.ListTags(ctx, tg)
	if err != nil {
		return
	}
	refs := append(tags, digest.FromBytes(blob).String())
	for _, ref := range refs[:min(n, len(refs))] {
		d, err := tg.Resolve(ctx, ref)
		if err != nil {
			continue
		}
		v, err := layout.Open(ctx, tg, d)
		fn(tg, d, v, err)
	}
}

// placeholders rewrites b with the placeholders of the descriptor of blob
// (its digest, and its size where it follows the digest, as in a
// descriptor, a chunk or a piece reference).
func placeholders(b, blob []byte, ds, ss string) []byte {
	d := digest.FromBytes(blob)
	b = bytes.ReplaceAll(b, []byte(`"`+d+`","size":`+digest.Digest(strconv.Itoa(len(blob)))), []byte(`"`+ds+`","size":`+ss))
	return bytes.ReplaceAll(b, []byte(d), []byte(ds))
}

const (
	phBlobDigest     = "@BD@"
	phBlobSize       = "@BS@"
	phManifestDigest = "@MD@"
	phManifestSize   = "@MS@"
	phDataDigest     = "@DD@"
	phDataSize       = "@DS@"
)

func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

func validIndex() *layout.Index {
	c := layout.Chunk{Digest: digest.FromString("x"), Size: 10}
	return &layout.Index{Version: 1, Chunking: v1Params, Chunks: []layout.Chunk{c}, Files: []layout.File{
		{Path: "d", Type: layout.TypeDir, Mode: 0o755},
		{Path: "d/f", Type: layout.TypeFile, Mode: 0o644, Size: 10, Digest: digest.FromString("f"), Extents: []layout.Extent{{Chunk: 0, Offset: 0, Length: 10}}},
		{Path: "d/l", Type: layout.TypeSymlink, Mode: 0o777, Target: "f"},
	}}
}

func writeTree(t *testing.T, root string, files map[string][]byte) {
	t.Helper()
	for p, data := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// remoteDir is a local directory that claims to be expensive to re-read.
type remoteDir struct{ layout.Source }

// writeVolumeTree writes files under root (path -> bytes; "->target" as
// the bytes of a path ending in "@" makes a symlink).
func writeVolumeTree(t *testing.T, root string, files map[string][]byte) {
	t.Helper()
	regular := map[string][]byte{}
	for name, data := range files {
		if strings.HasSuffix(name, "@") {
			full := filepath.Join(root, strings.TrimSuffix(name, "@"))
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(string(data), full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		regular[name] = data
	}
	writeTree(t, root, regular)
}

// pushed pushes files (as writeVolumeTree takes them) and opens the
// version.
func pushed(t *testing.T, p layout.Params, files map[string][]byte) (content.Storage, *layout.Version) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	writeVolumeTree(t, src, files)
	store := memory.New()
	res, err := layout.Push(ctx, store, layout.DirSource(src), layout.PushOptions{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	v, err := layout.Open(ctx, store, res.Root)
	if err != nil {
		t.Fatal(err)
	}
	return store, v
}

// v1Params are DefaultParams as format version 1 records them (no pack size).
var v1Params = layout.Params{Min: layout.DefaultParams.Min, Avg: layout.DefaultParams.Avg, Max: layout.DefaultParams.Max}

// expand turns an opened index into its expanded form, for tests that
// change its entries.
func expand(x *layout.Index) {
	x.Files = x.AllFiles()
}

// countingFetcher counts the fetches of each digest.
type countingFetcher struct {
	content.Fetcher
	mu sync.Mutex
	n  map[digest.Digest]int
}

func (c *countingFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	c.mu.Lock()
	if c.n == nil {
		c.n = map[digest.Digest]int{}
	}
	c.n[d.Digest]++
	c.mu.Unlock()
	return c.Fetcher.Fetch(ctx, d)
}

func (c *countingFetcher) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.n {
		n += v
	}
	return n
}

func (remoteDir) Remote() bool { return true }

// chunkDescriptor is the descriptor of the chunk c.
func chunkDescriptor(c layout.Chunk) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: c.Digest, Size: c.Size}
}

// fetchAttempts is how many times a chunk is fetched at most (layout's
// FetchRetrying).
const fetchAttempts = 3

// racyMargin is the stat cache's: how long after a change a stat key
// proves a file unchanged.
const racyMargin = 100 * time.Millisecond
