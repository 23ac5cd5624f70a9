package imageview

import (
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

var smallParams = layout.Params{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}

func fill(seed byte, n int) []byte {
	b := make([]byte, n)
	x := uint32(seed) + 1
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// pushVersion seals files into a fresh OCI layout and opens the version.
func pushVersion(t *testing.T, files map[string][]byte) (oci.Target, *layout.Version) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	for p, b := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tg, err := oci.Open(ctx, oci.Ref{Layout: filepath.Join(t.TempDir(), "lay")}, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := push.Push(ctx, tg, push.DirSource(dir), push.Options{Params: smallParams})
	if err != nil {
		t.Fatal(err)
	}
	ver, err := layout.Open(ctx, tg, res.Root)
	if err != nil {
		t.Fatal(err)
	}
	return tg, ver
}

func TestPlan(t *testing.T) {
	x := &layout.Index{Files: []layout.File{
		{Path: "a", Type: layout.TypeDir},
		{Path: "a/big1", Type: layout.TypeFile, Size: 3 << 20},
		{Path: "a/big2", Type: layout.TypeFile, Size: 3 << 20},
		{Path: "a/huge", Type: layout.TypeFile, Size: 20 << 20},
		{Path: "a/link", Type: layout.TypeSymlink},
		{Path: "config.json", Type: layout.TypeFile, Size: 100},
		{Path: "tokenizer.json", Type: layout.TypeFile, Size: 5 << 20},
		{Path: "z", Type: layout.TypeFile, Size: 2 << 20},
	}}
	got := Plan(x, 8<<20)
	want := [][]int{{0, 4, 5, 6}, {1, 2}, {3}, {7}}
	if len(got) != len(want) {
		t.Fatalf("plan %v, want %v", got, want)
	}
	for i := range want {
		if len(got[i]) != len(want[i]) {
			t.Fatalf("plan %v, want %v", got, want)
		}
		for j := range want[i] {
			if got[i][j] != want[i][j] {
				t.Fatalf("plan %v, want %v", got, want)
			}
		}
	}
}

func TestPlanBoundsLayers(t *testing.T) {
	x := &layout.Index{}
	for i := range 300 {
		x.Files = append(x.Files, layout.File{Path: fmt.Sprintf("s%03d", i), Type: layout.TypeFile, Size: 5 << 30})
	}
	p := Plan(x, 512<<20)
	if len(p) > MaxLayers || len(p) < MaxLayers/2 {
		t.Fatalf("%d layers for 300 files of 5 GiB: want at most %d, not far fewer", len(p), MaxLayers)
	}
}

func TestBuildDeterministicAndAttached(t *testing.T) {
	ctx := context.Background()
	files := map[string][]byte{
		"config.json":       []byte(`{"x":1}`),
		"tokenizer.json":    fill(1, 3000),
		"w/a.safetensors":   fill(2, 1<<20+5),
		"w/b.safetensors":   fill(3, 2<<20),
		"w/notes/readme.md": []byte("hi\n"),
	}
	tg, ver := pushVersion(t, files)
	opt := Options{LayerBytes: 1 << 20}
	a, err := Build(ctx, tg, ver, []Dest{tg}, opt)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Layers) != 3 || a.BytesUploaded == 0 {
		t.Fatalf("%d layers, %d bytes uploaded: want 3 (small files, then one per big file)", len(a.Layers), a.BytesUploaded)
	}
	// Into another store: the same digest, and nothing re-uploaded when
	// built again into the first.
	other, err := oci.Open(ctx, oci.Ref{Layout: filepath.Join(t.TempDir(), "other")}, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(ctx, tg, ver, []Dest{other}, opt)
	if err != nil {
		t.Fatal(err)
	}
	if a.Manifest.Digest != b.Manifest.Digest {
		t.Fatalf("two builds: %s and %s", a.Manifest.Digest, b.Manifest.Digest)
	}
	c, err := Build(ctx, tg, ver, []Dest{tg}, opt)
	if err != nil {
		t.Fatal(err)
	}
	if c.BytesUploaded != 0 {
		t.Errorf("rebuild into the same store uploaded %d bytes", c.BytesUploaded)
	}
	// The manifest: subject and annotation.
	var m ocispec.Manifest
	if err := json.Unmarshal(a.ManifestBytes, &m); err != nil {
		t.Fatal(err)
	}
	if m.Subject == nil || m.Subject.Digest != ver.Root.Digest || m.Annotations[AnnotationVolumeDigest] != ver.Root.Digest.String() {
		t.Fatalf("subject %v annotations %v", m.Subject, m.Annotations)
	}
	if VolumeOf(a.ManifestBytes) != ver.Root.Digest {
		t.Errorf("VolumeOf: %q", VolumeOf(a.ManifestBytes))
	}
	// Listed as a referrer of the version in the layout.
	views, err := List(ctx, tg, ver.Root.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if len(views) != 1 || views[0].Digest != a.Manifest.Digest {
		t.Fatalf("views %v, want %s", views, a.Manifest.Digest)
	}
	if vs, err := List(ctx, other, ver.Root.Digest); err != nil || len(vs) != 1 {
		t.Fatalf("views in the other store %v, %v", vs, err)
	}
}

func TestBuildRefusesCorruptChunk(t *testing.T) {
	ctx := context.Background()
	tg, ver := pushVersion(t, map[string][]byte{"x.bin": fill(9, 100<<10)})
	// Serve another chunk's bytes in place of the first: the fetch fails
	// verification and nothing is pushed.
	bad := badFetcher{Fetcher: tg, bad: ver.Chunk(0).Digest}
	dst, err := oci.Open(ctx, oci.Ref{Layout: filepath.Join(t.TempDir(), "dst")}, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Build(ctx, bad, ver, []Dest{dst}, Options{}); !errors.Is(err, verify.ErrDigestMismatch) || !strings.Contains(err.Error(), ver.Chunk(0).Digest.String()) {
		t.Fatalf("build from a corrupt chunk: %v, want verify's mismatch naming %s", err, ver.Chunk(0).Digest)
	}
	if _, err := (Options{Root: "../x"}).withDefaults(); err == nil {
		t.Error("accepted root ../x")
	}
}

type badFetcher struct {
	content.Fetcher
	bad digest.Digest
}

func (f badFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	rc, err := f.Fetcher.Fetch(ctx, d)
	if err != nil || d.Digest != f.bad {
		return rc, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	b[len(b)/2] ^= 1
	return io.NopCloser(bytes.NewReader(b)), nil
}

// A file whose chunks are right but whose index digest is not is refused
// as ErrCorrupt, with verify's error naming the file.
func TestBuildRefusesWrongFileDigest(t *testing.T) {
	ctx := context.Background()
	tg, ver := pushVersion(t, map[string][]byte{"x.bin": fill(9, 100<<10)})
	ver.Index.Files = ver.Index.AllFiles() // entries this test can change
	for i := range ver.Index.Files {
		if ver.Index.Files[i].Path == "x.bin" {
			ver.Index.Files[i].Digest = digest.FromString("something else")
		}
	}
	dst, err := oci.Open(ctx, oci.Ref{Layout: filepath.Join(t.TempDir(), "dst")}, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Build(ctx, tg, ver, []Dest{dst}, Options{})
	var ve *verify.Error
	if !errors.Is(err, ErrCorrupt) || !errors.As(err, &ve) || ve.What != "file x.bin" {
		t.Fatalf("build with a wrong file digest: %v, want ErrCorrupt and verify's error for file x.bin", err)
	}
}
