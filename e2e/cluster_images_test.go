package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// imageFile is one entry of a single-layer image: a file, or a symlink.
type imageFile struct {
	path string
	mode int64
	data []byte
	link string
}

// writeImageTar writes an image of one layer holding files, with the given
// entrypoint, as a docker archive tagged ref (what `ctr images import` reads).
func writeImageTar(t *testing.T, out, ref string, files []imageFile, entrypoint []string) string {
	t.Helper()
	var layerBuf bytes.Buffer
	tw := tar.NewWriter(&layerBuf)
	dirs := map[string]bool{}
	epoch := time.Unix(0, 0)
	for _, f := range files {
		for d := filepath.Dir(f.path); d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev"} {
		dirs[d] = true
	}
	for d := range dirs {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: epoch}); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: f.mode, ModTime: epoch}
		if f.link != "" {
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layerBytes := layerBuf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = []string{"PATH=/bin"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return writeTagged(t, out, ref, img)
}

func writeTagged(t *testing.T, out, ref string, img v1.Image) string {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(out, filepath.Base(tag.RepositoryStr())+".tar")
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		t.Fatal(err)
	}
	return path
}

// imageBuilds are the builds behind the images, started early (they take a
// while on a loaded machine) and waited for when the images are imported.
type imageBuilds struct {
	out           string
	pause, bdnvol *exec.Cmd
	pauseOut      bytes.Buffer
	bdnvolOut     bytes.Buffer
}

// startImageBuilds starts building the pause program and bdnvol's image
// (as make image does, for this machine's platform only) into out.
func startImageBuilds(t *testing.T, out string) *imageBuilds {
	t.Helper()
	b := &imageBuilds{out: out}
	src := filepath.Join(out, "pause.go")
	if err := os.WriteFile(src, []byte(`package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	b.pause = exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(out, "pause"), src)
	b.pause.Dir = out
	b.pause.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=", "GO111MODULE=off")
	b.pause.Stdout, b.pause.Stderr = &b.pauseOut, &b.pauseOut
	b.bdnvol = exec.Command("go", "run", "./internal/tools/mkimage", "-version", "e2e", "-platforms", "linux/"+runtime.GOARCH,
		"-out", filepath.Join(out, "bdnvol-layout"))
	b.bdnvol.Dir = ".."
	b.bdnvol.Env = append(os.Environ(), "GOWORK=off")
	b.bdnvol.Stdout, b.bdnvol.Stderr = &b.bdnvolOut, &b.bdnvolOut
	for _, c := range []*exec.Cmd{b.pause, b.bdnvol} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if c.ProcessState == nil {
				c.Process.Kill()
				c.Wait()
			}
		})
	}
	return b
}

// images waits for the builds and writes the three image archives.
func (b *imageBuilds) images(t *testing.T) map[string]string {
	t.Helper()
	if err := b.pause.Wait(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, &b.pauseOut)
	}
	if err := b.bdnvol.Wait(); err != nil {
		t.Fatalf("mkimage: %v\n%s", err, &b.bdnvolOut)
	}
	return map[string]string{
		imgPause:   buildPauseImage(t, b.out),
		imgBusybox: buildBusyboxImage(t, b.out),
		imgBdnvol:  buildBdnvolImage(t, b.out),
	}
}

// buildPauseImage builds the pod sandbox image: a static program that waits
// for a signal.
func buildPauseImage(t *testing.T, out string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(out, "pause"))
	if err != nil {
		t.Fatal(err)
	}
	return writeImageTar(t, out, imgPause, []imageFile{{path: "pause", mode: 0o755, data: data}}, []string{"/pause"})
}

// buildBusyboxImage builds the test pods' image from the host's static busybox.
func buildBusyboxImage(t *testing.T, out string) string {
	t.Helper()
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	files := []imageFile{{path: "bin/busybox", mode: 0o755, data: data}}
	for _, applet := range []string{"sh", "cat", "ls", "id", "sleep", "touch", "echo", "grep", "sha256sum", "stat", "wc", "test", "true", "mount", "date", "cmp", "head", "dd"} {
		files = append(files, imageFile{path: "bin/" + applet, mode: 0o777, link: "busybox"})
	}
	return writeImageTar(t, out, imgBusybox, files, nil)
}

// buildBdnvolImage tags the image mkimage built imgBdnvol.
func buildBdnvolImage(t *testing.T, out string) string {
	t.Helper()
	dir := filepath.Join(out, "bdnvol-layout")
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	// The layout's index points at the multi-platform index, which points
	// at the one image built.
	var img v1.Image
	var find func(ix v1.ImageIndex)
	find = func(ix v1.ImageIndex) {
		m, err := ix.IndexManifest()
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range m.Manifests {
			if img != nil {
				return
			}
			if d.MediaType.IsIndex() {
				child, err := ix.ImageIndex(d.Digest)
				if err != nil {
					t.Fatal(err)
				}
				find(child)
			} else if d.MediaType.IsImage() && (d.Platform == nil || d.Platform.Architecture == runtime.GOARCH) {
				if img, err = ix.Image(d.Digest); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	find(idx)
	if img == nil {
		t.Fatalf("no linux/%s image in %s", runtime.GOARCH, dir)
	}
	return writeTagged(t, out, imgBdnvol, img)
}
