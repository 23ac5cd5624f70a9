//go:build linux

package replicate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"
	"unsafe"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/pkg/oci"
)

// renameWatch counts the files renamed into a directory (inotify
// IN_MOVED_TO): a layout replaces index.json by a rename of a new temporary
// file each time it rewrites it.
type renameWatch struct {
	fd   int
	mask uint32 // the events counted
}

func watchRenames(t *testing.T, dir string) *renameWatch {
	// The creations of the temporary files, each named afresh, part the
	// renames, which the kernel would otherwise merge into one event.
	return watchEvents(t, dir, unix.IN_CREATE|unix.IN_MOVED_TO, unix.IN_MOVED_TO)
}

// watchEvents watches dir for the events of mask and counts those of count.
func watchEvents(t *testing.T, dir string, mask, count uint32) *renameWatch {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		t.Fatal(err)
	}
	return &renameWatch{fd: fd, mask: count}
}

// count returns how many events of w's mask happened to name ("": any) in
// the directory since the last call.
func (w *renameWatch) count(t *testing.T, name string) int {
	t.Helper()
	n := 0
	buf := make([]byte, 64<<10)
	for {
		k, err := unix.Read(w.fd, buf)
		if errors.Is(err, unix.EAGAIN) || k <= 0 {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= k; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				t.Fatalf("inotify queue overflow: more than %d events", n)
			}
			nb := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			if ev.Mask&w.mask != 0 && (name == "" || string(bytes.TrimRight(nb, "\x00")) == name) {
				n++
			}
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// manyTagsLayout returns a layout holding one small image manifest under
// n tags (as an extracted archive would).
func manyTagsLayout(t *testing.T, n int) (string, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	ref := "oci:" + filepath.Join(t.TempDir(), "src")
	s := side(t, ref)
	cfg := []byte("{}")
	layer := []byte("layer")
	cd := content.NewDescriptorFromBytes(ocispec.MediaTypeEmptyJSON, cfg)
	ld := content.NewDescriptorFromBytes(ocispec.MediaTypeImageLayer, layer)
	m, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cd, Layers: []ocispec.Descriptor{ld}})
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, m)
	for _, b := range []struct {
		d ocispec.Descriptor
		b []byte
	}{{cd, cfg}, {ld, layer}, {md, m}} {
		if err := s.Target.Push(ctx, b.d, bytes.NewReader(b.b)); err != nil {
			t.Fatal(err)
		}
	}
	var reqs []oci.TagRequest
	for i := range n {
		reqs = append(reqs, oci.TagRequest{Desc: md, Tag: fmt.Sprintf("t%05d", i)})
	}
	if err := oci.TagAll(ctx, s.Target, reqs); err != nil {
		t.Fatal(err)
	}
	return ref, md
}

// Importing a layout of 2,000 tags (an extracted archive) into a layout
// rewrites the destination's index.json once, for the manifest and every
// tag together.
func TestCopyAllTagsRewritesTheIndexOnce(t *testing.T) {
	ctx := context.Background()
	src, md := manyTagsLayout(t, 2000)
	dstDir := filepath.Join(t.TempDir(), "dst")
	dst := side(t, "oci:"+dstDir)
	w := watchRenames(t, dstDir)
	rep, err := CopyAll(ctx, side(t, src), dst, Options{Referrers: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := w.count(t, "index.json"); n != 1 {
		t.Errorf("the import of 2,000 tags rewrote index.json %d times, want 1", n)
	}
	if len(rep.Tags) != 2000 {
		t.Errorf("%d tags copied, want 2000", len(rep.Tags))
	}
	for _, tag := range []string{"t00000", "t01999"} {
		if d, err := dst.Target.Resolve(ctx, tag); err != nil || d.Digest != md.Digest {
			t.Errorf("%s at the destination: %s, %v", tag, d.Digest, err)
		}
	}
}

// cancellingTarget cancels a context as soon as the copy starts tagging.
type cancellingTarget struct {
	oci.Target
	cancel func()
}

func (c cancellingTarget) Tag(ctx context.Context, d ocispec.Descriptor, ref string) error {
	c.cancel()
	return c.Target.Tag(ctx, d, ref)
}

func (c cancellingTarget) Store(ctx context.Context, d ocispec.Descriptor, r io.Reader) error {
	return c.Target.(oci.Batcher).Store(ctx, d, r)
}

func (c cancellingTarget) Update(ctx context.Context, list []ocispec.Descriptor, tags []oci.TagRequest) error {
	c.cancel()
	return c.Target.(oci.Batcher).Update(ctx, list, tags)
}

// A copy cancelled (SIGTERM) once it starts tagging a layout stops there:
// it returns the cancellation and tags nothing.
func TestCopyAllTagsStopsWhenCancelled(t *testing.T) {
	src, _ := manyTagsLayout(t, 200)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dst := side(t, "oci:"+filepath.Join(t.TempDir(), "dst"))
	_, err := CopyAll(ctx, side(t, src), Side{Ref: dst.Ref, Target: cancellingTarget{Target: dst.Target, cancel: cancel}}, Options{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("a copy cancelled while tagging: %v, want the cancellation", err)
	}
	tags, err := oci.ListTags(context.Background(), dst.Target)
	if err != nil || len(tags) != 0 {
		t.Errorf("the cancelled copy left %d tags (%v)", len(tags), err)
	}
}

// Importing a layout of many versions (an extracted archive) with their
// referrers reads each manifest of it a few times, not once for every
// version: the referrers of all are found in one pass.
func TestCopyAllReadsLayoutManifestsOnce(t *testing.T) {
	ctx := context.Background()
	const n = 150
	srcDir := filepath.Join(t.TempDir(), "src")
	src := side(t, "oci:"+srcDir)
	for i := range n {
		pushLayers(t, src, fmt.Sprintf("v%03d", i), fmt.Sprintf("weights %d", i))
	}
	w := watchEvents(t, filepath.Join(srcDir, "blobs", "sha256"), unix.IN_OPEN, unix.IN_OPEN)
	if _, err := CopyAll(ctx, src, side(t, "oci:"+filepath.Join(t.TempDir(), "dst")), Options{Referrers: true}); err != nil {
		t.Fatal(err)
	}
	opens := w.count(t, "")
	t.Logf("%d versions: %d opens of the source's blobs", n, opens)
	if opens > 10*n {
		t.Errorf("the copy of %d versions opened the source's blobs %d times", n, opens)
	}
}
