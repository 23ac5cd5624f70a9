package imagebuild

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

func bins() []Binary {
	return []Binary{
		{OS: "linux", Arch: "arm64", Data: []byte("\x7fELF arm64 bdnvol")},
		{OS: "linux", Arch: "amd64", Data: []byte("\x7fELF amd64 bdnvol")},
	}
}

func digestOf(t *testing.T, idx v1.ImageIndex) v1.Hash {
	t.Helper()
	d, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestIndexReproducible(t *testing.T) {
	opt := Options{Version: "v1.2.3"}
	a, err := Index(bins(), opt)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(a); err != nil {
		t.Fatalf("invalid index: %v", err)
	}
	// Built again, in the other order, some time later: the same digest.
	time.Sleep(1100 * time.Millisecond)
	rev := bins()
	rev[0], rev[1] = rev[1], rev[0]
	b, err := Index(rev, opt)
	if err != nil {
		t.Fatal(err)
	}
	if da, db := digestOf(t, a), digestOf(t, b); da != db {
		t.Fatalf("two builds of the same binaries: %s and %s", da, db)
	}
	// A different binary, version or creation time gives another digest.
	other := bins()
	other[1].Data = append(other[1].Data, '!')
	for name, o := range map[string]struct {
		bins []Binary
		opt  Options
	}{
		"binary":  {other, opt},
		"version": {bins(), Options{Version: "v1.2.4"}},
		"created": {bins(), Options{Version: "v1.2.3", Created: time.Unix(1, 0)}},
	} {
		c, err := Index(o.bins, o.opt)
		if err != nil {
			t.Fatal(err)
		}
		if digestOf(t, c) == digestOf(t, a) {
			t.Errorf("a different %s gave the same digest", name)
		}
	}
}

func TestImageContents(t *testing.T) {
	idx, err := Index(bins(), Options{Version: "v1", Source: "https://example.com/bdnvol"})
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if im.MediaType != types.OCIImageIndex || len(im.Manifests) != 2 {
		t.Fatalf("index: %+v", im)
	}
	for i, arch := range []string{"amd64", "arm64"} {
		desc := im.Manifests[i]
		if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != arch {
			t.Fatalf("manifest %d platform %+v, want linux/%s", i, desc.Platform, arch)
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			t.Fatal(err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != arch || !cf.Created.Time.Equal(time.Unix(0, 0)) ||
			len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/bdnvol" ||
			cf.Config.Labels["org.opencontainers.image.version"] != "v1" {
			t.Fatalf("config of %s: %+v", arch, cf)
		}
		mt, _ := img.MediaType()
		layers, err := img.Layers()
		if err != nil || len(layers) != 1 || mt != types.OCIManifestSchema1 {
			t.Fatalf("%s: %s, %d layers, %v", arch, mt, len(layers), err)
		}
		rc, err := layers[0].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		var names []string
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
			if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(time.Unix(0, 0)) {
				t.Errorf("%s: uid %d gid %d mtime %v", h.Name, h.Uid, h.Gid, h.ModTime)
			}
			switch h.Name {
			case "bdnvol":
				body, _ := io.ReadAll(tr)
				if h.Mode != 0o755 || !bytes.Equal(body, bins()[1-i].Data) {
					t.Errorf("bdnvol: mode %o, %q", h.Mode, body)
				}
			case "tmp/":
				if h.Mode != 0o1777 || h.Typeflag != tar.TypeDir {
					t.Errorf("tmp/: mode %o type %c", h.Mode, h.Typeflag)
				}
			}
		}
		rc.Close()
		if strings.Join(names, ",") != "tmp/,bdnvol" {
			t.Fatalf("layer of %s holds %v", arch, names)
		}
	}
}

func TestIndexErrors(t *testing.T) {
	if _, err := Index(nil, Options{}); !errors.Is(err, ErrNoBinaries) {
		t.Fatalf("no binaries: %v", err)
	}
	b := bins()
	b[1].Arch = "arm64"
	if _, err := Index(b, Options{}); err == nil || !strings.Contains(err.Error(), "linux/arm64 given twice") {
		t.Fatalf("a platform twice: %v", err)
	}
}

func TestLayoutRoundTrip(t *testing.T) {
	idx, err := Index(bins(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "image")
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "stale"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteLayout(dir, idx, "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "blobs", "stale")); !os.IsNotExist(err) {
		t.Fatalf("a stale layout entry survived: %v", err)
	}
	got, err := ReadLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(got); err != nil {
		t.Fatalf("index read back: %v", err)
	}
	if digestOf(t, got) != digestOf(t, idx) {
		t.Fatalf("layout holds %s, wrote %s", digestOf(t, got), digestOf(t, idx))
	}
	if _, err := ReadLayout(t.TempDir()); err == nil {
		t.Fatal("reading an empty directory as a layout succeeded")
	}
}
