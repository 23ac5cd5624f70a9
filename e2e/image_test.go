package e2e

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestMakeImageReproducible builds the container image twice with the
// image tool (as make image does, for this machine's architecture), checks
// both builds give the same digest, pushes it to a registry, and runs the
// binary the image holds.
func TestMakeImageReproducible(t *testing.T) {
	tool := filepath.Join(t.TempDir(), "mkimage")
	build := exec.Command("go", "build", "-o", tool, "./internal/tools/mkimage")
	build.Dir = ".."
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./internal/tools/mkimage: %v\n%s", err, out)
	}
	platform := "linux/" + runtime.GOARCH
	mk := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(tool, append([]string{"-platforms", platform, "-version", "e2e"}, args...)...)
		cmd.Dir = ".."
		cmd.Env = append(os.Environ(), "GOWORK=off")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("mkimage %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		}
		return strings.TrimSpace(stdout.String())
	}
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	da, db := mk("-out", a), mk("-out", b)
	if !strings.HasPrefix(da, "sha256:") || da != db {
		t.Fatalf("two builds of the same source: %q and %q", da, db)
	}
	for _, dir := range []string{a, b} {
		p, err := layout.FromPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		top, err := p.ImageIndex()
		if err != nil {
			t.Fatal(err)
		}
		im, err := top.IndexManifest()
		if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Digest.String() != da {
			t.Fatalf("layout %s does not name %s: %+v %v", dir, da, im, err)
		}
	}

	// Push: the registry holds the same index.
	reg := newGGCR(t)
	pushed := mk("-out", filepath.Join(t.TempDir(), "c"), "-push", reg.Host+"/bdnvol/bdnvol:e2e")
	if pushed != reg.Host+"/bdnvol/bdnvol@"+da {
		t.Fatalf("push printed %q, want %s/bdnvol/bdnvol@%s", pushed, reg.Host, da)
	}
	ref, err := name.ParseReference(reg.Host + "/bdnvol/bdnvol:e2e")
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := idx.Digest(); err != nil || d.String() != da {
		t.Fatalf("the registry's index is %s (%v), built %s", d, err, da)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Platform == nil || im.Manifests[0].Platform.Architecture != runtime.GOARCH {
		t.Fatalf("index manifest: %+v %v", im, err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil || strings.Join(cf.Config.Entrypoint, " ") != "/bdnvol" || cf.OS != "linux" {
		t.Fatalf("config: %+v %v", cf, err)
	}

	// The binary in the image is static and runs anywhere: run it here.
	bin := filepath.Join(t.TempDir(), "bdnvol")
	mustWrite(t, bin, binaryOf(t, img))
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "e2e") {
		t.Fatalf("the image's /bdnvol version: %v\n%s", err, out)
	}
}

// binaryOf returns the contents of /bdnvol in img's only layer.
func binaryOf(t *testing.T, img v1.Image) []byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers: %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatal("no bdnvol in the layer")
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "bdnvol" {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
}
