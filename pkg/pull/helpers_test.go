package pull

import (
	"context"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// Helpers copied from pkg/layout's tests, over the exported API (those
// that need no bdnvol package are shared, in internal/testutil).

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

func validIndex() *layout.Index {
	c := layout.Chunk{Digest: digest.FromString("x"), Size: 10}
	return &layout.Index{Version: 1, Chunking: v1Params, Chunks: []layout.Chunk{c}, Files: []layout.File{
		{Path: "d", Type: layout.TypeDir, Mode: 0o755},
		{Path: "d/f", Type: layout.TypeFile, Mode: 0o644, Size: 10, Digest: digest.FromString("f"), Extents: []layout.Extent{{Chunk: 0, Offset: 0, Length: 10}}},
		{Path: "d/l", Type: layout.TypeSymlink, Mode: 0o777, Target: "f"},
	}}
}

// remoteDir is a local directory that claims to be expensive to re-read.
type remoteDir struct{ push.Source }

// pushed pushes files (as testutil.WriteVolumeTree takes them) and opens the
// version.
func pushed(t *testing.T, p layout.Params, files map[string][]byte) (content.Storage, *layout.Version) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	testutil.WriteVolumeTree(t, src, files)
	store := memory.New()
	res, err := push.Push(ctx, store, push.DirSource(src), push.Options{Params: p})
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
