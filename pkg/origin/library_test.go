package origin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/pull"
)

// TestPullOpensModelPackAsALibrary: pull.Pull, called as a library by a
// program that imports neither the CLI nor pkg/modelpack, materialises a
// ModelPack model: the formats a version is opened in come with the
// package that opens it (origin.Formats), not with a registration the CLI
// made. (It lives here, not in pkg/pull, whose tests link pkg/modelpack
// through pkg/versions.) The manifest is written by hand, as the spec
// says, so that nothing here imports pkg/modelpack.
func TestPullOpensModelPackAsALibrary(t *testing.T) {
	ctx := context.Background()
	ref, err := oci.ParseRef("oci:" + filepath.Join(t.TempDir(), "models") + ":m1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	put := func(mt string, b []byte, annot map[string]string) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b)), Annotations: annot}
		if err := tg.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	weights := bytes.Repeat([]byte("weights!"), 40<<10)
	cfg := put("application/vnd.cncf.model.config.v1+json",
		[]byte(`{"descriptor":{"name":"library"},"modelfs":{"type":"layers","diffIds":[]},"config":{}}`), nil)
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: "application/vnd.cncf.model.manifest.v1+json", Config: cfg,
		Layers: []ocispec.Descriptor{put("application/vnd.cncf.model.weight.v1.raw", weights, map[string]string{"org.cncf.model.filepath": "model/w.bin"})}}
	m.SchemaVersion = 2
	mb, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	root := put(ocispec.MediaTypeImageManifest, mb, nil)
	if err := tg.Tag(ctx, root, "m1"); err != nil {
		t.Fatal(err)
	}

	dir := filepath.Join(t.TempDir(), "out")
	res, err := pull.Pull(ctx, ref, dir, pull.Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatalf("pull of a ModelPack model: %v", err)
	}
	if res.Digest != root.Digest.String() {
		t.Errorf("pulled %s, want the manifest's digest %s", res.Digest, root.Digest)
	}
	got, err := os.ReadFile(filepath.Join(dir, "model", "w.bin"))
	if err != nil || !bytes.Equal(got, weights) {
		t.Fatalf("model/w.bin: %d bytes (%v), want the layer's %d", len(got), err, len(weights))
	}
}
