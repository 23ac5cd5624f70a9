package push

import (
	"context"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// TestReadParams: the parameters read from the top of a version are those
// the opened version passes on, for both formats.
func TestReadParams(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	testutil.WriteVolumeTree(t, dir, map[string][]byte{"a": testutil.RandBytes(1, 100<<10), "b": []byte("b")})
	for _, format := range []int{layout.FormatVersion1, layout.FormatVersion} {
		store := memory.New()
		res, err := Push(ctx, store, DirSource(dir), Options{Params: layout.Params{Min: 8 << 10, Avg: 32 << 10, Max: 128 << 10, Pack: 16 << 10}, FormatVersion: format})
		if err != nil {
			t.Fatal(err)
		}
		v, err := layout.Open(ctx, store, res.Root)
		if err != nil {
			t.Fatal(err)
		}
		got, err := layout.ReadParams(ctx, store, res.Root)
		if err != nil || got != v.Index.InheritedParams() {
			t.Errorf("format %d: read %+v (%v), the version passes on %+v", format, got, err, v.Index.InheritedParams())
		}
	}
	missing := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("nothing"), Size: 7}
	if _, err := layout.ReadParams(ctx, memory.New(), missing); err == nil {
		t.Error("params read from a missing version")
	}
}
