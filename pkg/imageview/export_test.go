package imageview

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
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
	res, err := push.Push(ctx, tg, push.DirSource(src), push.Options{Params: smallParams})
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

// A name starting with ".wh." is an OCI whiteout to a container runtime: the
// mounted image would hide files and differ from the version. Export refuses
// it, naming the file, before it uploads anything.
func TestExportRefusesWhiteoutNames(t *testing.T) {
	for name, want := range map[string]string{".wh.config.json": `".wh.config.json"`, "sub/.wh..wh..opq": `"sub/.wh..wh..opq"`, ".wh.dir/w.bin": `".wh.dir"`} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			src := t.TempDir()
			os.WriteFile(filepath.Join(src, "config.json"), []byte(`{"a":1}`), 0o644)
			os.MkdirAll(filepath.Join(src, filepath.Dir(name)), 0o755)
			os.WriteFile(filepath.Join(src, name), fill(5, 2<<20), 0o644)
			ref := oci.Ref{Layout: filepath.Join(t.TempDir(), "vol")}
			tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
			if err != nil {
				t.Fatal(err)
			}
			res, err := push.Push(ctx, tg, push.DirSource(src), push.Options{Params: smallParams})
			if err != nil {
				t.Fatal(err)
			}
			blobs := func(root string) int {
				es, _ := os.ReadDir(filepath.Join(root, "blobs", "sha256"))
				return len(es)
			}
			before := blobs(ref.Layout)
			dst := oci.Ref{Layout: filepath.Join(t.TempDir(), "img"), Tag: "latest"}
			_, err = Export(ctx, tg, ref, res.Root, res.Bytes, dst, oci.Options{}, Options{})
			if !errors.Is(err, ErrWhiteoutName) || !strings.Contains(err.Error(), want) {
				t.Fatalf("export of a version holding %s: %v", name, err)
			}
			if n := blobs(ref.Layout); n != before {
				t.Errorf("the volume's repository went from %d to %d blobs", before, n)
			}
			if n := blobs(dst.Layout); n != 0 {
				t.Errorf("%d blobs uploaded to %s", n, dst.Layout)
			}
		})
	}
	if _, err := (Options{Root: "models/.wh.x"}).withDefaults(); !errors.Is(err, ErrWhiteoutName) {
		t.Errorf("root models/.wh.x: %v", err)
	}
}
