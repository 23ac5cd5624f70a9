package ociarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/internal/verify"
)

// members lists the names of an archive's members in order.
func members(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}

// growthReader passes r on and, once half of it is read, records how large
// the archive's partial file is then.
type growthReader struct {
	r       io.Reader
	n, half int64
	partial string
	sizeAt  int64
}

func (g *growthReader) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	g.n += int64(n)
	if g.sizeAt == 0 && g.n >= g.half {
		if fi, err := os.Stat(g.partial); err == nil {
			g.sizeAt = fi.Size()
		}
	}
	return n, err
}

// A Writer's archive has a layout's members in a layout's order (oci-layout,
// the directories, the blobs as pushed, index.json last), lists the
// manifest under its tag, extracts with every blob checked, and is written
// as a large blob streams in, not after.
func TestWriterArchiveIsALayout(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v1.tar")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	small := testutil.RandBytes(1, 1000)
	big := testutil.RandBytes(2, MaxHeldBlob+4096)
	cfg := []byte("{}")
	blobs := []ocispec.Descriptor{
		content.NewDescriptorFromBytes("application/octet-stream", small),
		content.NewDescriptorFromBytes("application/octet-stream", big),
		content.NewDescriptorFromBytes(ocispec.MediaTypeEmptyJSON, cfg),
	}
	m, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: blobs[2], Layers: blobs[:2]})
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, m)
	for i, b := range [][]byte{small, big, cfg} {
		var r io.Reader = bytes.NewReader(b)
		var g *growthReader
		if len(b) > MaxHeldBlob {
			g = &growthReader{r: r, half: int64(len(b) / 2), partial: path + ".partial"}
			r = g
		}
		if err := w.Push(ctx, blobs[i], r); err != nil {
			t.Fatal(err)
		}
		if g != nil && g.sizeAt < int64(len(b))/4 {
			t.Errorf("half of a %d-byte blob read, the archive held %d bytes: not streamed", len(b), g.sizeAt)
		}
	}
	if err := w.Push(ctx, md, bytes.NewReader(m)); err != nil {
		t.Fatal(err)
	}
	if err := w.Tag(ctx, md, "v1"); err != nil {
		t.Fatal(err)
	}
	if d, err := w.Resolve(ctx, "v1"); err != nil || d.Digest != md.Digest {
		t.Fatalf("resolve v1: %v, %v", d.Digest, err)
	}
	if b, err := content.FetchAll(ctx, w, blobs[1]); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("fetch back the big blob: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the archive has its name before Commit: %v", err)
	}
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	want := []string{"oci-layout", "blobs/", "blobs/sha256/"}
	for _, d := range append(blobs, md) {
		want = append(want, "blobs/sha256/"+d.Digest.Encoded())
	}
	want = append(want, "index.json")
	if got := members(t, path); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("members\n%v\nwant\n%v", got, want)
	}
	dir := t.TempDir()
	f, _ := os.Open(path)
	defer f.Close()
	if err := Extract(ctx, f, fileSize(t, f), dir); err != nil {
		t.Fatalf("extract: %v", err)
	}
	var idx ocispec.Index
	b, _ := os.ReadFile(filepath.Join(dir, "index.json"))
	if err := json.Unmarshal(b, &idx); err != nil || len(idx.Manifests) != 1 || idx.Manifests[0].Digest != md.Digest ||
		idx.Manifests[0].Annotations[ocispec.AnnotationRefName] != "v1" {
		t.Errorf("index.json %s (%v): want the manifest once, tagged v1", b, err)
	}
	if _, err := os.Stat(path + ".partial"); !os.IsNotExist(err) {
		t.Errorf("the partial file is left: %v", err)
	}
}

// A blob whose bytes are not its digest's is refused, held in memory
// (small) or already in the file (large): the file is cut back, so that
// the right bytes pushed next give an archive that extracts. Abort leaves
// no file.
func TestWriterCutsOffARefusedBlob(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "a.tar")
	w, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{1000, MaxHeldBlob + 1} {
		b := testutil.RandBytes(uint64(size), size)
		d := content.NewDescriptorFromBytes("application/octet-stream", b)
		bad := append([]byte{}, b...)
		bad[len(bad)-1] ^= 1
		if err := w.Push(ctx, d, bytes.NewReader(bad)); !errors.Is(err, verify.ErrDigestMismatch) {
			t.Fatalf("push of %d wrong bytes: %v, want a digest mismatch", size, err)
		}
		if ok, _ := w.Exists(ctx, d); ok {
			t.Fatalf("a refused %d-byte blob exists", size)
		}
		if err := w.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatalf("push of the right %d bytes after a refusal: %v", size, err)
		}
	}
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	defer f.Close()
	if err := Extract(ctx, f, fileSize(t, f), t.TempDir()); err != nil {
		t.Fatalf("extract after refusals: %v", err)
	}

	aborted := filepath.Join(t.TempDir(), "b.tar")
	w, err = Create(aborted)
	if err != nil {
		t.Fatal(err)
	}
	w.Push(ctx, content.NewDescriptorFromBytes("application/octet-stream", []byte("x")), strings.NewReader("x"))
	w.Abort()
	if _, err := os.Stat(aborted + ".partial"); !os.IsNotExist(err) {
		t.Errorf("Abort left the partial file: %v", err)
	}
	if err := w.Push(ctx, ocispec.Descriptor{Digest: digest.FromString("y"), Size: 1}, strings.NewReader("y")); err == nil {
		t.Error("a push after Abort succeeded")
	}
}
