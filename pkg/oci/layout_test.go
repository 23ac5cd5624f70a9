package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	orasoci "oras.land/oras-go/v2/content/oci"
	"oras.land/oras-go/v2/errdef"
)

// testManifest is a small image manifest with one layer, stored in s.
func testManifest(t *testing.T, s *layoutStore, layer []byte) (ocispec.Descriptor, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	cfg := ocispec.DescriptorEmptyJSON
	cfg.Data = nil
	ld := content.NewDescriptorFromBytes("application/octet-stream", layer)
	for _, b := range []struct {
		d    ocispec.Descriptor
		data []byte
	}{{cfg, []byte("{}")}, {ld, layer}} {
		if err := s.Push(ctx, b.d, bytes.NewReader(b.data)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cfg, Layers: []ocispec.Descriptor{ld},
	})
	if err != nil {
		t.Fatal(err)
	}
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, m)
	if err := s.Push(ctx, md, bytes.NewReader(m)); err != nil {
		t.Fatal(err)
	}
	return md, ld
}

// newLayout creates a layout with one manifest tagged v1.
func newLayout(t *testing.T) (string, ocispec.Descriptor, ocispec.Descriptor) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	s, err := openLayout(context.Background(), dir, true)
	if err != nil {
		t.Fatal(err)
	}
	md, ld := testManifest(t, s, []byte("layer one"))
	if err := s.Tag(context.Background(), md, "v1"); err != nil {
		t.Fatal(err)
	}
	return dir, md, ld
}

// writeIndex replaces index.json of dir with the given descriptors.
func writeIndex(t *testing.T, dir string, ms ...ocispec.Descriptor) {
	t.Helper()
	b, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: ms})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ocispec.ImageIndexFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func tagged(d ocispec.Descriptor, tag string) ocispec.Descriptor {
	d.Annotations = map[string]string{ocispec.AnnotationRefName: tag}
	return d
}

// TestLayoutHugeDescriptors: descriptors in index.json that claim terabytes
// (or more than an int can hold) are never allocated for; the other tags of
// the layout stay usable.
func TestLayoutHugeDescriptors(t *testing.T) {
	ctx := context.Background()
	dir, md, _ := newLayout(t)
	bogus := digest.FromString("an unrelated artifact")
	writeIndex(t, dir,
		tagged(md, "v1"),
		tagged(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: bogus, Size: 1 << 40}, "huge"),
		tagged(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: bogus, Size: 1 << 62}, "huger"),
		tagged(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: "sha256:nothex", Size: 10}, "baddigest"),
		tagged(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: bogus, Size: -5}, "negative"),
	)
	// A blob file of the huge size exists (sparse): still not read.
	if err := os.WriteFile(filepath.Join(dir, "blobs", "sha256", bogus.Encoded()), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "blobs", "sha256", bogus.Encoded()), 1<<40); err != nil {
		t.Fatal(err)
	}
	s, err := openLayout(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	tags, err := ListTags(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	// Every tag is listed, as a registry lists them; only v1 resolves.
	if want := []string{"baddigest", "huge", "huger", "negative", "v1"}; !slices.Equal(tags, want) {
		t.Errorf("tags %v, want %v", tags, want)
	}
	if d, err := s.Resolve(ctx, "v1"); err != nil || d.Digest != md.Digest {
		t.Errorf("resolve v1: %v %v", d.Digest, err)
	}
	for _, tag := range []string{"huge", "huger", "baddigest", "negative"} {
		if _, err := s.Resolve(ctx, tag); !errors.Is(err, ErrInvalidLayout) {
			t.Errorf("resolve %s: %v, want ErrInvalidLayout", tag, err)
		}
	}
	if ps, err := s.Predecessors(ctx, md); err != nil || len(ps) != 0 {
		t.Errorf("predecessors: %v %v", ps, err)
	}
	if _, err := s.Fetch(ctx, ocispec.Descriptor{Digest: bogus, Size: 1 << 62}); !errors.Is(err, ErrInvalidLayout) {
		t.Errorf("fetch of a blob of the wrong size: %v, want ErrInvalidLayout", err)
	}
}

// snapshotDir records every name under dir with its type, size, mode,
// modification time and contents.
func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		v := fi.Mode().String() + " " + fi.ModTime().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + digest.FromBytes(b).String()
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLayoutReadWritesNothing: opening a layout for reading and reading
// everything in it creates, changes and removes nothing, not even the lock
// file; an empty directory stays empty.
func TestLayoutReadWritesNothing(t *testing.T) {
	ctx := context.Background()
	dir, md, ld := newLayout(t)
	if err := os.Remove(filepath.Join(dir, indexLockName)); err != nil {
		t.Fatal(err)
	}
	before := snapshotDir(t, dir)
	s, err := openLayout(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, md.Digest.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := ListTags(ctx, s); err != nil {
		t.Fatal(err)
	}
	if b, err := content.FetchAll(ctx, s, ld); err != nil || string(b) != "layer one" {
		t.Fatalf("fetch: %q %v", b, err)
	}
	if ps, err := s.Predecessors(ctx, ld); err != nil || len(ps) != 1 || ps[0].Digest != md.Digest {
		t.Fatalf("predecessors of the layer: %v %v", ps, err)
	}
	if ok, err := s.Exists(ctx, ld); !ok || err != nil {
		t.Fatalf("exists: %v %v", ok, err)
	}
	after := snapshotDir(t, dir)
	if !mapsEqual(before, after) {
		t.Errorf("reading changed the layout:\nbefore %v\nafter  %v", before, after)
	}

	empty := t.TempDir()
	s, err = openLayout(ctx, empty, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, "v1"); !errors.Is(err, errdef.ErrNotFound) {
		t.Errorf("resolve in an empty directory: %v, want not found", err)
	}
	if ents, _ := os.ReadDir(empty); len(ents) != 0 {
		t.Errorf("reading an empty directory created %v", ents)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestLayoutSymlinksRefused: index.json, oci-layout and the lock file are
// never followed through a symlink, for reading or writing.
func TestLayoutSymlinksRefused(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{ocispec.ImageIndexFile, ocispec.ImageLayoutFile, indexLockName} {
		t.Run(name, func(t *testing.T) {
			dir, md, _ := newLayout(t)
			elsewhere := filepath.Join(t.TempDir(), "elsewhere")
			p := filepath.Join(dir, name)
			if err := os.Rename(p, elsewhere); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(elsewhere, p); err != nil {
				t.Fatal(err)
			}
			before, err := os.ReadFile(elsewhere)
			if err != nil {
				t.Fatal(err)
			}
			s, err := openLayout(ctx, dir, false)
			if err == nil && name != indexLockName {
				t.Fatalf("opened a layout whose %s is a symlink", name)
			}
			if err == nil {
				// The lock file is only opened to write, or to read when
				// index.json changed since it was cached.
				s.cached = nil
				if _, err := s.Resolve(ctx, "v1"); !errors.Is(err, ErrInvalidLayout) {
					t.Errorf("read through a symlinked lock file: %v, want ErrInvalidLayout", err)
				}
				if err := s.Tag(ctx, md, "v2"); !errors.Is(err, ErrInvalidLayout) {
					t.Errorf("tag through a symlinked lock file: %v, want ErrInvalidLayout", err)
				}
			} else if !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), name) {
				t.Errorf("error %v does not say %s is refused", err, name)
			}
			if _, err := openLayout(ctx, dir, true); err == nil {
				t.Errorf("opened for writing a layout whose %s is a symlink", name)
			}
			after, err := os.ReadFile(elsewhere)
			if err != nil || !bytes.Equal(before, after) {
				t.Errorf("the symlink's target changed: %q -> %q (%v)", before, after, err)
			}
		})
	}
}

// TestLayoutFIFOs: a FIFO where index.json, oci-layout or a blob should be
// is refused at once instead of blocking in open(2).
func TestLayoutFIFOs(t *testing.T) {
	ctx := context.Background()
	dir, md, ld := newLayout(t)
	within := func(t *testing.T, what string, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still blocked after 10s", what)
			return nil
		}
	}
	mkfifo := func(t *testing.T, p string) {
		t.Helper()
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	blob := filepath.Join(dir, "blobs", "sha256", ld.Digest.Encoded())
	mkfifo(t, blob)
	s, err := openLayout(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	err = within(t, "fetch of a FIFO blob", func() error { _, err := content.FetchAll(ctx, s, ld); return err })
	if !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), ld.Digest.String()) {
		t.Errorf("fetch of a FIFO blob: %v, want ErrInvalidLayout naming it", err)
	}
	err = within(t, "range fetch of a FIFO blob", func() error { _, err := s.FetchRange(ctx, ld, 0, 1); return err })
	if !errors.Is(err, ErrInvalidLayout) {
		t.Errorf("range fetch of a FIFO blob: %v, want ErrInvalidLayout", err)
	}
	mfifo := filepath.Join(dir, "blobs", "sha256", md.Digest.Encoded())
	mkfifo(t, mfifo)
	err = within(t, "resolve of a FIFO manifest", func() error { _, err := s.Predecessors(ctx, ld); return err })
	if !errors.Is(err, ErrInvalidLayout) {
		t.Errorf("predecessors with a FIFO manifest: %v, want ErrInvalidLayout", err)
	}

	for _, name := range []string{ocispec.ImageIndexFile, ocispec.ImageLayoutFile} {
		dir, _, _ := newLayout(t)
		mkfifo(t, filepath.Join(dir, name))
		err := within(t, "open with a FIFO "+name, func() error { _, err := openLayout(ctx, dir, false); return err })
		if !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), name) {
			t.Errorf("open with a FIFO %s: %v, want ErrInvalidLayout naming it", name, err)
		}
	}
}

// TestLayoutWritesStayOCI: tags, untags and deletes keep index.json a
// layout that oras-go's own reader understands, with the tags as
// org.opencontainers.image.ref.name annotations.
func TestLayoutWritesStayOCI(t *testing.T) {
	ctx := context.Background()
	dir, md, ld := newLayout(t)
	s, err := openLayout(ctx, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	md2, _ := testManifest(t, s, []byte("layer two"))
	for _, tag := range []string{"v2", "latest"} {
		if err := s.Tag(ctx, md2, tag); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Untag(ctx, "latest"); err != nil {
		t.Fatal(err)
	}
	if err := s.Untag(ctx, "latest"); !errors.Is(err, errdef.ErrNotFound) {
		t.Errorf("untag of a missing tag: %v", err)
	}
	if err := s.Tag(ctx, ld, "blob"); err == nil {
		t.Errorf("tagged a layer blob")
	}
	ro, err := orasoci.NewFromFS(ctx, os.DirFS(dir))
	if err != nil {
		t.Fatalf("oras-go cannot read the layout: %v", err)
	}
	var tags []string
	if err := ro.Tags(ctx, "", func(ts []string) error { tags = ts; return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tags, []string{"v1", "v2"}) {
		t.Errorf("oras-go sees tags %v, want [v1 v2]", tags)
	}
	if d, err := ro.Resolve(ctx, "v2"); err != nil || d.Digest != md2.Digest {
		t.Errorf("oras-go resolves v2 to %v (%v)", d.Digest, err)
	}
	ps, err := s.Predecessors(ctx, ld)
	if err != nil || len(ps) != 1 || ps[0].Digest != md.Digest {
		t.Errorf("predecessors of the layer: %v %v", ps, err)
	}
	if err := s.Delete(ctx, md); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, "v1"); !errors.Is(err, errdef.ErrNotFound) {
		t.Errorf("resolve of a deleted manifest's tag: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "blobs", "sha256", md.Digest.Encoded())); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("deleted manifest's blob still there: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, ocispec.ImageIndexFile))
	if err != nil {
		t.Fatal(err)
	}
	var idx ocispec.Index
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	if len(idx.Manifests) != 1 || idx.Manifests[0].Digest != md2.Digest || idx.Manifests[0].Annotations[ocispec.AnnotationRefName] != "v2" {
		t.Errorf("index.json lists %+v, want md2 tagged v2 once", idx.Manifests)
	}
	// A wrong-sized or corrupt push is refused and leaves nothing behind.
	bad := content.NewDescriptorFromBytes("application/octet-stream", []byte("right"))
	if err := s.Push(ctx, bad, strings.NewReader("wrong")); err == nil {
		t.Errorf("pushed bytes that do not match their digest")
	}
	if ok, _ := s.Exists(ctx, bad); ok {
		t.Errorf("a refused push left the blob")
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, ingestDir)); len(ents) != 0 {
		t.Errorf("a refused push left %v in ingest", ents)
	}
}

// TestLayoutOversizedIndex: an index.json over the bound is refused without
// being read.
func TestLayoutOversizedIndex(t *testing.T) {
	dir, _, _ := newLayout(t)
	p := filepath.Join(dir, ocispec.ImageIndexFile)
	if err := os.Truncate(p, MaxLayoutIndexBytes+1); err != nil {
		t.Fatal(err)
	}
	_, err := openLayout(context.Background(), dir, false)
	if !errors.Is(err, ErrInvalidLayout) {
		t.Fatalf("open with a %d-byte index.json: %v, want ErrInvalidLayout", MaxLayoutIndexBytes+1, err)
	}
}

// TestLayoutFetchReadsDeclaredSize: a blob's reader ends at its declared
// size.
func TestLayoutFetchReadsDeclaredSize(t *testing.T) {
	ctx := context.Background()
	dir, _, ld := newLayout(t)
	s, err := openLayout(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := s.Fetch(ctx, ld)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil || int64(len(b)) != ld.Size {
		t.Errorf("read %d bytes (%v), want %d", len(b), err, ld.Size)
	}
}

// TestLayoutConcurrentTags: tags pushed at once through two stores of one
// layout (as by two processes) are all kept.
func TestLayoutConcurrentTags(t *testing.T) {
	ctx := context.Background()
	dir, _, _ := newLayout(t)
	var stores [2]*layoutStore
	for i := range stores {
		s, err := openLayout(ctx, dir, true)
		if err != nil {
			t.Fatal(err)
		}
		stores[i] = s
	}
	errs := make(chan error, 16)
	for i := range 16 {
		go func() {
			s := stores[i%2]
			md, _ := testManifest(t, s, []byte(strings.Repeat("x", i+1)))
			if err := s.Tag(ctx, md, "t"+strings.Repeat("i", i+1)); err != nil {
				errs <- err
				return
			}
			_, err := ListTags(ctx, s)
			errs <- err
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	tags, err := ListTags(ctx, stores[0])
	if err != nil {
		t.Fatal(err)
	}
	if len(tags) != 17 {
		t.Errorf("%d tags, want 17: %v", len(tags), tags)
	}
}

// listTree returns every path under dir with its size, for checking that
// nothing there changed.
func listTree(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out[p] = fi.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLayoutWritersRefuseSymlinkedDirs: ingest/, blobs/ or blobs/sha256/
// planted as a symlink to a directory outside the layout makes Push fail
// with ErrInvalidLayout naming it, writing nothing outside; Delete removes
// nothing outside either.
func TestLayoutWritersRefuseSymlinkedDirs(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{ingestDir, "blobs", "blobs/sha256"} {
		t.Run(name, func(t *testing.T) {
			dir, _, ld := newLayout(t)
			outside := t.TempDir()
			p := filepath.Join(dir, filepath.FromSlash(name))
			if err := os.Rename(p, filepath.Join(outside, "moved")); err != nil && !errors.Is(err, fs.ErrNotExist) {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(outside, "sha256"), 0o755); err != nil {
				t.Fatal(err)
			}
			// What a symlinked blobs/sha256 would lead Delete to.
			victim := filepath.Join(outside, ld.Digest.Encoded())
			if err := os.WriteFile(victim, []byte("layer one"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, "sha256", ld.Digest.Encoded()), []byte("layer one"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, p); err != nil {
				t.Fatal(err)
			}
			before := listTree(t, outside)
			s, err := openLayout(ctx, dir, false)
			if err != nil {
				t.Fatal(err)
			}
			blob := []byte("a new blob")
			err = s.Push(ctx, content.NewDescriptorFromBytes("application/octet-stream", blob), bytes.NewReader(blob))
			if !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), p) {
				t.Errorf("push: %v, want ErrInvalidLayout naming %s", err, p)
			}
			if name != ingestDir {
				if err := s.Delete(ctx, ld); !errors.Is(err, ErrInvalidLayout) {
					t.Errorf("delete: %v, want ErrInvalidLayout", err)
				}
				if _, err := s.Exists(ctx, ld); !errors.Is(err, ErrInvalidLayout) {
					t.Errorf("exists: %v, want ErrInvalidLayout", err)
				}
			}
			if after := listTree(t, outside); !maps.Equal(before, after) {
				t.Errorf("outside the layout changed: %v -> %v", before, after)
			}
		})
	}
}

// TestLayoutExistsRefusesSymlinkedBlob: a symlink (or another non-regular
// file) of the right size at a blob's name is not the blob: Exists says
// false, and Push stores the real blob in its place, leaving the symlink's
// target alone.
func TestLayoutExistsRefusesSymlinkedBlob(t *testing.T) {
	ctx := context.Background()
	dir, _, _ := newLayout(t)
	blob := []byte("the real blob")
	d := content.NewDescriptorFromBytes("application/octet-stream", blob)
	decoy := filepath.Join(t.TempDir(), "decoy")
	if err := os.WriteFile(decoy, []byte("a decoy blob!"), 0o644); err != nil { // same size
		t.Fatal(err)
	}
	bp := filepath.Join(dir, "blobs", "sha256", d.Digest.Encoded())
	if err := os.Symlink(decoy, bp); err != nil {
		t.Fatal(err)
	}
	s, err := openLayout(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Exists(ctx, d); ok || err != nil {
		t.Errorf("exists of a symlinked blob: %v %v, want false", ok, err)
	}
	if err := s.Push(ctx, d, bytes.NewReader(blob)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(bp); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("after push the blob is %v (%v), want a regular file", fi.Mode(), err)
	}
	if b, err := os.ReadFile(bp); err != nil || !bytes.Equal(b, blob) {
		t.Errorf("blob holds %q (%v)", b, err)
	}
	if b, _ := os.ReadFile(decoy); string(b) != "a decoy blob!" {
		t.Errorf("the decoy changed: %q", b)
	}
	if ok, err := s.Exists(ctx, d); !ok || err != nil {
		t.Errorf("exists after push: %v %v", ok, err)
	}
}

// TestLayoutIndexKeys: an index.json with a key twice or a key that matches
// a field only when case is ignored (which encoding/json would take, the
// last duplicate winning) is refused, at the top level, in a descriptor
// and in its annotations; an honest index in any formatting, with keys in
// any order and keys the format does not know, is read.
func TestLayoutIndexKeys(t *testing.T) {
	ctx := context.Background()
	dir, md, _ := newLayout(t)
	desc := func(extra string) string {
		return fmt.Sprintf(`{"mediaType":%q,"digest":%q,"size":%d%s}`, md.MediaType, md.Digest, md.Size, extra)
	}
	tag := `,"annotations":{"org.opencontainers.image.ref.name":"v1"}`
	for _, c := range []struct {
		name, index, want string
	}{
		{"top-level key twice", `{"schemaVersion":2,"manifests":[` + desc(tag) + `],"manifests":[]}`, `"manifests" twice`},
		{"top-level key in another case", `{"schemaVersion":2,"Manifests":[` + desc(tag) + `]}`, `"Manifests"`},
		{"top-level key folded", `{"schemaVersion":2,"mediatype":"application/vnd.oci.image.index.v1+json","manifests":[]}`, `"mediatype"`},
		{"descriptor key twice", `{"schemaVersion":2,"manifests":[` + desc(tag+`,"digest":"sha256:`+strings.Repeat("0", 64)+`"`) + `]}`, `"digest" twice in "manifests[0]"`},
		{"descriptor key in another case", `{"schemaVersion":2,"manifests":[{"mediaType":"` + md.MediaType + `","Digest":"` + md.Digest.String() + `","size":` + fmt.Sprint(md.Size) + tag + `}]}`, `"Digest" in "manifests[0]" is not "digest"`},
		{"annotation twice", `{"schemaVersion":2,"manifests":[` + desc(`,"annotations":{"org.opencontainers.image.ref.name":"v1","org.opencontainers.image.ref.name":"v2"}`) + `]}`, `twice in "manifests[0].annotations"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(dir, ocispec.ImageIndexFile), []byte(c.index), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := openLayout(ctx, dir, false)
			if !errors.Is(err, ErrInvalidLayout) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("open: %v, want ErrInvalidLayout saying %s", err, c.want)
			}
		})
	}
	honest := "{\n  \"manifests\": [\n    {\"size\": " + fmt.Sprint(md.Size) + ", \"digest\": \"" + md.Digest.String() + "\", \"mediaType\": \"" + md.MediaType + "\"" + tag + ", \"platform\": {\"os\": \"linux\", \"architecture\": \"amd64\"}, \"x-tool\": 1}\n  ],\n  \"schemaVersion\": 2, \"x-tool\": {\"a\": 1}\n}\n"
	if err := os.WriteFile(filepath.Join(dir, ocispec.ImageIndexFile), []byte(honest), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := openLayout(ctx, dir, false)
	if err != nil {
		t.Fatalf("open an honest, differently formatted index: %v", err)
	}
	if d, err := s.Resolve(ctx, "v1"); err != nil || d.Digest != md.Digest {
		t.Errorf("resolve v1: %v %v", d.Digest, err)
	}
}

// TestLayoutPredecessorsEscaped: a manifest that names the node only
// through JSON escapes is a predecessor all the same; one that does not
// name it is not.
func TestLayoutPredecessorsEscaped(t *testing.T) {
	ctx := context.Background()
	dir, md, ld := newLayout(t)
	s, err := openLayout(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	// The layer's digest with its "s" escaped, and a manifest of other layers.
	escaped := []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":%q,"config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":%q,"size":2},"layers":[{"mediaType":"application/octet-stream","digest":"\u0073%s","size":%d}]}`,
		ocispec.MediaTypeImageManifest, ocispec.DescriptorEmptyJSON.Digest, ld.Digest.String()[1:], ld.Size))
	other := []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":%q,"config":{"mediaType":"application/vnd.oci.empty.v1+json","digest":%q,"size":2},"layers":[]}`,
		ocispec.MediaTypeImageManifest, ocispec.DescriptorEmptyJSON.Digest))
	var ms []ocispec.Descriptor
	for _, b := range [][]byte{escaped, other} {
		d := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, b)
		if err := s.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, d)
	}
	ps, err := s.Predecessors(ctx, ld)
	if err != nil {
		t.Fatal(err)
	}
	want := []digest.Digest{md.Digest, ms[0].Digest}
	slices.Sort(want)
	var got []digest.Digest
	for _, p := range ps {
		got = append(got, p.Digest)
	}
	if !slices.Equal(got, want) {
		t.Errorf("predecessors of the layer: %v, want %v (the manifest and the one with an escape)", got, want)
	}
}
