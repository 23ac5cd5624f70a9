package push

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
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
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

func TestPushRefusesEscapingSymlink(t *testing.T) {
	src := t.TempDir()
	if err := os.Symlink("/etc/passwd", filepath.Join(src, "evil")); err != nil {
		t.Fatal(err)
	}
	_, err := Push(context.Background(), memory.New(), DirSource(src), Options{})
	if !errors.Is(err, layout.ErrUnsupportedFile) || !strings.Contains(err.Error(), "evil") {
		t.Fatalf("got %v", err)
	}
}

// remoteDir is a local directory that claims to be expensive to re-read.
type remoteDir struct{ Source }

func (remoteDir) Remote() bool { return true }

// checkEdges asserts that every chunk of the version at root carries edge
// digests exactly when it is large enough, and that they are right.
func checkEdges(t *testing.T, store content.Fetcher, root ocispec.Descriptor) (withEdges int) {
	t.Helper()
	ctx := context.Background()
	v, err := layout.Open(ctx, store, root)
	if err != nil {
		t.Fatal(err)
	}
	for k, c := range v.Index.AllChunks() {
		if (c.Size >= layout.EdgeMinChunk) != c.HasEdges() || (c.Head == "") != (c.Tail == "") {
			t.Fatalf("chunk %d of %d bytes: head %q tail %q", k, c.Size, c.Head, c.Tail)
		}
		if !c.HasEdges() {
			continue
		}
		withEdges++
		b, err := content.FetchAll(ctx, store, v.Chunk(k))
		if err != nil {
			t.Fatal(err)
		}
		if digest.FromBytes(b[:layout.EdgeBytes]) != c.Head || digest.FromBytes(b[len(b)-layout.EdgeBytes:]) != c.Tail {
			t.Fatalf("chunk %d: wrong edge digests", k)
		}
	}
	return withEdges
}

func TestChunkEdges(t *testing.T) {
	ctx := context.Background()
	p := layout.Params{Min: 1 << 20, Avg: 2 << 20, Max: 4 << 20}
	src := t.TempDir()
	// A safetensors file (cuts at tensors, fixed pieces in big ones), a
	// file cut by FastCDC, and small files packed past EdgeMinChunk.
	hdr := []byte(`{"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,5000000]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[5000000,9000123]}}`)
	st := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	st = append(append(st, hdr...), testutil.RandBytes(11, 9000123)...)
	files := map[string][]byte{"m.safetensors": st, "cdc.bin": testutil.RandBytes(12, 9<<20)}
	for i := range 40 {
		files[fmt.Sprintf("small/%02d", i)] = testutil.RandBytes(uint64(200+i), 100<<10)
	}
	testutil.WriteTree(t, src, files)
	store := memory.New()
	res, err := Push(ctx, store, DirSource(src), Options{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	if n := checkEdges(t, store, res.Root); n < 6 {
		t.Fatalf("only %d chunks carry edges", n)
	}
	// A remote source (chunks held in memory) and a push from the stat
	// cache seal the same index.
	remote := memory.New()
	again, err := Push(ctx, remote, remoteDir{DirSource(src)}, Options{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	cache := statcache.Open(t.TempDir(), src, p)
	first, err := Push(ctx, memory.New(), DirSource(src), Options{Params: p, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	cached, err := Push(ctx, memory.New(), DirSource(src), Options{Params: p, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]digest.Digest{"remote": again.Root.Digest, "stat cache": cached.Root.Digest, "first": first.Root.Digest} {
		if d != res.Root.Digest {
			t.Errorf("%s push sealed %s, want %s", name, d, res.Root.Digest)
		}
	}
}
