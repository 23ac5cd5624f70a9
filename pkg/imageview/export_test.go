package imageview

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/opencontainers/go-digest"
)

func TestExportAttachesToTheVolumeAndTagsAnotherRepository(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "config.json"), []byte(`{"a":1}`), 0o644)
	os.WriteFile(filepath.Join(src, "w.bin"), fill(3, 300<<10), 0o644)
	ref := oci.Ref{Layout: filepath.Join(t.TempDir(), "vol")}
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := layout.Push(ctx, tg, layout.DirSource(src), layout.PushOptions{Params: smallParams})
	if err != nil {
		t.Fatal(err)
	}
	out, err := Export(ctx, tg, ref, res.Root, res.Bytes, oci.Ref{}, oci.Options{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := ref.Repo() + "@" + out.Digest
	if out.Image != want || out.Attached != want || out.Volume != ref.Pinned(res.Root.Digest) || out.VolumeDigest != res.Root.Digest ||
		out.VolumeBytes != res.Bytes || len(out.Layers) == 0 || out.LayersUploaded != len(out.Layers) || out.ImageBytes <= out.BytesUploaded/2 {
		t.Fatalf("export: %+v", out)
	}
	views, err := List(ctx, tg, res.Root.Digest)
	if err != nil || len(views) != 1 || views[0].Digest.String() != out.Digest {
		t.Fatalf("views of the volume: %+v, %v", views, err)
	}
	// Again, to another repository with a tag: the same image (it is
	// deterministic), nothing new in the volume's repository, the tag set.
	dst := oci.Ref{Layout: filepath.Join(t.TempDir(), "img"), Tag: "latest"}
	again, err := Export(ctx, tg, ref, res.Root, res.Bytes, dst, oci.Options{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if again.Digest != out.Digest || again.Image != dst.Repo()+":latest@"+out.Digest || again.Attached != want {
		t.Fatalf("export to %s: %+v", dst.Repo(), again)
	}
	if again.LayersUploaded != len(again.Layers) {
		t.Errorf("the new repository lacked every layer, but %d of %d were uploaded", again.LayersUploaded, len(again.Layers))
	}
	dt, err := oci.Open(ctx, dst, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d, err := dt.Resolve(ctx, "latest"); err != nil || d.Digest.String() != out.Digest {
		t.Errorf("tag latest in %s = %v, %v", dst.Repo(), d.Digest, err)
	}
	// A version that is not there is an error naming the reference.
	bad := res.Root
	bad.Digest = digest.Digest("sha256:" + strings.Repeat("0", 64))
	if _, err := Export(ctx, tg, ref, bad, 0, oci.Ref{}, oci.Options{}, Options{}); err == nil || !strings.Contains(err.Error(), ref.Repo()) {
		t.Errorf("missing version: %v", err)
	}
}
