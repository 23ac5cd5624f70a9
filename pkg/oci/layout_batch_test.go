package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
)

// storedManifest stores (unlisted) a small manifest distinct by n.
func storedManifest(t *testing.T, s *layoutStore, n int) (ocispec.Descriptor, []byte) {
	t.Helper()
	m, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: ocispec.Descriptor{MediaType: ocispec.MediaTypeEmptyJSON, Digest: ocispec.DescriptorEmptyJSON.Digest, Size: 2},
		Layers: []ocispec.Descriptor{}, Annotations: map[string]string{"n": fmt.Sprint(n)}})
	d := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, m)
	if err := s.Store(context.Background(), d, bytes.NewReader(m)); err != nil {
		t.Fatal(err)
	}
	return d, m
}

// Tagging 2,000 tags through Update rewrites index.json once, and the
// index is the one a Push and a Tag per tag leave (moved tags, a tag given
// twice, a manifest listed untagged); a cancelled context changes nothing.
func TestTagAllRewritesTheIndexOnce(t *testing.T) {
	ctx := context.Background()
	dir, md, _ := newLayout(t)
	s, err := openLayout(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	other, om := storedManifest(t, s, 1)
	var reqs []TagRequest
	for i := range 2000 {
		reqs = append(reqs, TagRequest{Desc: other, Manifest: om, Tag: fmt.Sprintf("t%04d", i)})
	}
	reqs = append(reqs, TagRequest{Desc: other, Tag: "v1"}, TagRequest{Desc: md, Tag: "t0007"})
	// The same as one Tag at a time (the first 20, and the last two), in a
	// copy of the layout: one at a time takes minutes for all.
	few := append(append([]TagRequest{}, reqs[:20]...), reqs[len(reqs)-2:]...)
	fewDir := filepath.Join(t.TempDir(), "few")
	if err := os.CopyFS(fewDir, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	fs, err := openLayout(ctx, fewDir, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Update(ctx, []ocispec.Descriptor{other}, few); err != nil {
		t.Fatal(err)
	}

	seq := filepath.Join(t.TempDir(), "seq")
	if err := os.CopyFS(seq, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	ss, err := openLayout(ctx, seq, false)
	if err != nil {
		t.Fatal(err)
	}
	before := indexWrites.Load()
	if err := ss.Push(ctx, other, bytes.NewReader(om)); err != nil {
		t.Fatal(err)
	}
	for _, r := range few {
		if err := ss.Tag(ctx, r.Desc, r.Tag); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("one Push and one Tag per tag: %d rewrites of index.json", indexWrites.Load()-before)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	before = indexWrites.Load()
	if err := s.Update(cancelled, []ocispec.Descriptor{other}, reqs); !errors.Is(err, context.Canceled) {
		t.Fatalf("Update with a cancelled context: %v", err)
	}
	if err := TagAll(cancelled, s, reqs); !errors.Is(err, context.Canceled) {
		t.Fatalf("TagAll with a cancelled context: %v", err)
	}
	if n := indexWrites.Load() - before; n != 0 {
		t.Fatalf("a cancelled update rewrote index.json %d times", n)
	}
	if _, err := s.Resolve(ctx, "t0000"); err == nil {
		t.Fatal("a cancelled update tagged t0000")
	}

	before = indexWrites.Load()
	if err := s.Update(ctx, []ocispec.Descriptor{other}, reqs); err != nil {
		t.Fatal(err)
	}
	if n := indexWrites.Load() - before; n != 1 {
		t.Errorf("Update of %d tags rewrote index.json %d times, want 1", len(reqs), n)
	}
	a, _ := os.ReadFile(filepath.Join(fewDir, "index.json"))
	b, _ := os.ReadFile(filepath.Join(seq, "index.json"))
	if !bytes.Equal(a, b) {
		t.Errorf("index.json after Update differs from one Tag per tag:\n%.600s\n%.600s", a, b)
	}
	for tag, want := range map[string]digest.Digest{"t0000": other.Digest, "t1999": other.Digest, "v1": other.Digest, "t0007": md.Digest} {
		if d, err := s.Resolve(ctx, tag); err != nil || d.Digest != want {
			t.Errorf("%s resolves to %s (%v), want %s", tag, d.Digest, err, want)
		}
	}
	// A manifest not stored is refused, and nothing changes.
	missing := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("none"), Size: 10}
	if err := TagAll(ctx, s, []TagRequest{{Desc: md, Tag: "x"}, {Desc: missing, Tag: "y"}}); err == nil {
		t.Error("a tag of a missing manifest was accepted")
	}
	if _, err := s.Resolve(ctx, "x"); err == nil {
		t.Error("a refused batch tagged x")
	}
}

// ReferrersBySubject finds, in one pass, what Referrers finds per subject.
func TestReferrersBySubjectAgreesWithReferrers(t *testing.T) {
	ctx := context.Background()
	dir, md, _ := newLayout(t)
	s, err := openLayout(ctx, dir, false)
	if err != nil {
		t.Fatal(err)
	}
	subj := plain(md)
	for i, at := range []string{"application/x-a", ""} {
		m, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
			ArtifactType: at, Config: ocispec.Descriptor{MediaType: "application/x-config", Digest: ocispec.DescriptorEmptyJSON.Digest, Size: 2},
			Layers: []ocispec.Descriptor{}, Subject: &subj, Annotations: map[string]string{"i": fmt.Sprint(i)}})
		d := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, m)
		if err := s.Push(ctx, d, bytes.NewReader(m)); err != nil {
			t.Fatal(err)
		}
	}
	want, err := Referrers(ctx, s, md, "")
	if err != nil || len(want) != 2 {
		t.Fatalf("Referrers: %v, %v", want, err)
	}
	all, err := s.ReferrersBySubject(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(all[md.Digest])
	b, _ := json.Marshal(want)
	if len(all) != 1 || !bytes.Equal(a, b) {
		t.Errorf("ReferrersBySubject %d subjects, of %s:\n%s\nReferrers:\n%s", len(all), md.Digest, a, b)
	}
}
