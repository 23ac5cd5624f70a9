package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote/credentials"
)

// The conformance suite states what bdnvol needs of a Target, through the
// public API only, and runs it against every backend: the registry target
// (go-containerregistry's in-memory registry over HTTP) and the OCI-layout
// target. A new backend passes when TestConformance<Backend> calling
// runConformance with its constructor passes, unchanged.

// conformanceCase is one behaviour every Target must have; each case gets
// a fresh, empty repository.
type conformanceCase struct {
	name string
	run  func(t *testing.T, tg Target)
}

func runConformance(t *testing.T, newTarget func(t *testing.T) Target) {
	for _, c := range conformanceCases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newTarget(t)) })
	}
}

func TestConformanceRegistry(t *testing.T) {
	runConformance(t, func(t *testing.T) Target {
		srv := httptest.NewServer(quietRegistry())
		t.Cleanup(srv.Close)
		ref, err := ParseRef(strings.TrimPrefix(srv.URL, "http://") + "/conformance/vol")
		if err != nil {
			t.Fatal(err)
		}
		tg, err := Open(context.Background(), ref, Options{Credentials: credentials.NewMemoryStore(), Retry: RetryPolicy{Base: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return tg
	})
}

func TestConformanceLayout(t *testing.T) {
	runConformance(t, func(t *testing.T) Target {
		ref, err := ParseRef("oci:" + filepath.Join(t.TempDir(), "vol"))
		if err != nil {
			t.Fatal(err)
		}
		tg, err := Open(context.Background(), ref, Options{CreateLayout: true})
		if err != nil {
			t.Fatal(err)
		}
		return tg
	})
}

// Test content, from fixed bytes.
const conformanceChunkType = "application/vnd.bdnvol.chunk.v1"

func conformanceBytes(seed uint32, n int) []byte {
	b := make([]byte, n)
	x := seed
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

func pushBlob(t *testing.T, tg Target, mediaType string, b []byte) ocispec.Descriptor {
	t.Helper()
	desc := content.NewDescriptorFromBytes(mediaType, b)
	if err := tg.Push(context.Background(), desc, bytes.NewReader(b)); err != nil {
		t.Fatalf("push %s: %v", desc.Digest, err)
	}
	return desc
}

func fetchAll(t *testing.T, f interface {
	Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error)
}, desc ocispec.Descriptor) []byte {
	t.Helper()
	rc, err := f.Fetch(context.Background(), desc)
	if err != nil {
		t.Fatalf("fetch %s: %v", desc.Digest, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", desc.Digest, err)
	}
	return b
}

// pushManifest stores a one-layer manifest (its config and layer too) and
// returns its descriptor and bytes; seed makes manifests differ.
func pushManifest(t *testing.T, tg Target, seed uint32) (ocispec.Descriptor, []byte) {
	t.Helper()
	cfg := ocispec.DescriptorEmptyJSON
	if ok, err := tg.Exists(context.Background(), cfg); err != nil {
		t.Fatal(err)
	} else if !ok {
		pushBlob(t, tg, cfg.MediaType, cfg.Data)
	}
	cfg.Data = nil
	layer := pushBlob(t, tg, conformanceChunkType, conformanceBytes(seed, 1000))
	b, err := json.Marshal(ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: "application/vnd.bdnvol.volume.v1",
		Config:       cfg,
		Layers:       []ocispec.Descriptor{layer},
	})
	if err != nil {
		t.Fatal(err)
	}
	return pushBlob(t, tg, ocispec.MediaTypeImageManifest, b), b
}

func wantNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("%s: error %v does not wrap ErrNotFound", what, err)
	}
}

func missingDesc(mediaType string) ocispec.Descriptor {
	return content.NewDescriptorFromBytes(mediaType, []byte("never pushed"))
}

var conformanceCases = []conformanceCase{
	{"BlobPushExistsFetch", func(t *testing.T, tg Target) {
		ctx := context.Background()
		for i, n := range []int{1, 1000, 3 << 20} {
			data := conformanceBytes(uint32(i), n)
			desc := pushBlob(t, tg, conformanceChunkType, data)
			ok, err := tg.Exists(ctx, desc)
			if err != nil || !ok {
				t.Fatalf("exists %s after push: %v, %v", desc.Digest, ok, err)
			}
			if got := fetchAll(t, tg, desc); !bytes.Equal(got, data) {
				t.Fatalf("blob of %d bytes fetched as %d different bytes", n, len(got))
			}
		}
	}},
	{"EmptyBlob", func(t *testing.T, tg Target) {
		desc := pushBlob(t, tg, conformanceChunkType, nil)
		if got := fetchAll(t, tg, desc); len(got) != 0 {
			t.Fatalf("empty blob fetched as %d bytes", len(got))
		}
	}},
	{"PushAgainKeepsTheBlob", func(t *testing.T, tg Target) {
		data := conformanceBytes(9, 2000)
		desc := pushBlob(t, tg, conformanceChunkType, data)
		if err := tg.Push(context.Background(), desc, bytes.NewReader(data)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
			t.Fatalf("second push of %s: %v (want success or ErrAlreadyExists)", desc.Digest, err)
		}
		if got := fetchAll(t, tg, desc); !bytes.Equal(got, data) {
			t.Fatal("blob changed after a second push")
		}
	}},
	{"MissingBlob", func(t *testing.T, tg Target) {
		ctx := context.Background()
		desc := missingDesc(conformanceChunkType)
		ok, err := tg.Exists(ctx, desc)
		if err != nil || ok {
			t.Fatalf("exists of a missing blob: %v, %v", ok, err)
		}
		rc, err := tg.Fetch(ctx, desc)
		if err == nil {
			rc.Close()
		}
		wantNotFound(t, "fetch of a missing blob", err)
	}},
	{"PushDigestMismatchIsRefusedAndStoresNothing", func(t *testing.T, tg Target) {
		ctx := context.Background()
		data := conformanceBytes(3, 4096)
		desc := content.NewDescriptorFromBytes(conformanceChunkType, data)
		bad := bytes.Clone(data)
		bad[100] ^= 1
		if err := tg.Push(ctx, desc, bytes.NewReader(bad)); err == nil {
			t.Fatalf("push of bytes that do not match %s succeeded", desc.Digest)
		}
		if ok, err := tg.Exists(ctx, desc); err != nil || ok {
			t.Fatalf("after a refused push, exists = %v, %v", ok, err)
		}
		if got := pushBlob(t, tg, conformanceChunkType, data); got.Digest != desc.Digest {
			t.Fatal("digest changed")
		}
		if got := fetchAll(t, tg, desc); !bytes.Equal(got, data) {
			t.Fatal("the good push after a refused one reads back different bytes")
		}
	}},
	{"PushSizeMismatchIsRefused", func(t *testing.T, tg Target) {
		ctx := context.Background()
		data := conformanceBytes(4, 4096)
		desc := content.NewDescriptorFromBytes(conformanceChunkType, data)
		if err := tg.Push(ctx, desc, bytes.NewReader(data[:4000])); err == nil {
			t.Fatalf("push of %d of the %d bytes of %s succeeded", 4000, len(data), desc.Digest)
		}
		if ok, err := tg.Exists(ctx, desc); err != nil || ok {
			t.Fatalf("after a short push, exists = %v, %v", ok, err)
		}
	}},
	{"FetchRange", func(t *testing.T, tg Target) {
		ctx := context.Background()
		rf, ok := tg.(RangeFetcher)
		if !ok {
			t.Fatalf("%T is not a RangeFetcher", tg)
		}
		data := conformanceBytes(5, 100_000)
		desc := pushBlob(t, tg, conformanceChunkType, data)
		for _, r := range [][2]int64{{0, 1}, {0, 100_000}, {12_345, 6789}, {99_999, 1}, {50_000, 50_000}} {
			rc, err := rf.FetchRange(ctx, desc, r[0], r[1])
			if err != nil {
				t.Fatalf("range %d+%d: %v", r[0], r[1], err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
				t.Fatalf("range %d+%d: %d bytes (%v), not the blob's", r[0], r[1], len(got), err)
			}
		}
		for _, r := range [][2]int64{{-1, 10}, {0, 0}, {99_990, 11}, {100_000, 1}} {
			if rc, err := rf.FetchRange(ctx, desc, r[0], r[1]); err == nil {
				rc.Close()
				t.Fatalf("range %d+%d outside a blob of %d bytes was served", r[0], r[1], desc.Size)
			} else if !strings.Contains(err.Error(), desc.Digest.String()) {
				t.Fatalf("range error %q does not name the blob", err)
			}
		}
		rc, err := rf.FetchRange(ctx, missingDesc(conformanceChunkType), 0, 1)
		if err == nil {
			rc.Close()
		}
		wantNotFound(t, "range of a missing blob", err)
	}},
	{"ManifestTagResolveFetch", func(t *testing.T, tg Target) {
		ctx := context.Background()
		m, b := pushManifest(t, tg, 1)
		if err := tg.Tag(ctx, m, "v1"); err != nil {
			t.Fatal(err)
		}
		for _, ref := range []string{"v1", m.Digest.String()} {
			got, err := tg.Resolve(ctx, ref)
			if err != nil {
				t.Fatalf("resolve %s: %v", ref, err)
			}
			if got.Digest != m.Digest || got.Size != m.Size || got.MediaType != m.MediaType {
				t.Fatalf("resolve %s: %+v, want %+v", ref, got, m)
			}
		}
		if got := fetchAll(t, tg, m); !bytes.Equal(got, b) {
			t.Fatal("manifest bytes changed")
		}
	}},
	{"TagMovesAndTagBytes", func(t *testing.T, tg Target) {
		ctx := context.Background()
		m1, _ := pushManifest(t, tg, 1)
		m2, b2 := pushManifest(t, tg, 2)
		if err := tg.Tag(ctx, m1, "main"); err != nil {
			t.Fatal(err)
		}
		if err := TagBytes(ctx, tg, m2, b2, "main"); err != nil {
			t.Fatal(err)
		}
		if got, err := tg.Resolve(ctx, "main"); err != nil || got.Digest != m2.Digest {
			t.Fatalf("main resolves to %s (%v) after the move, want %s", got.Digest, err, m2.Digest)
		}
		if err := TagBytes(ctx, tg, m1, nil, "old"); err != nil {
			t.Fatal(err)
		}
		if got, err := tg.Resolve(ctx, "old"); err != nil || got.Digest != m1.Digest {
			t.Fatalf("old resolves to %s (%v), want %s", got.Digest, err, m1.Digest)
		}
	}},
	{"MissingTagAndManifest", func(t *testing.T, tg Target) {
		ctx := context.Background()
		_, err := tg.Resolve(ctx, "nope")
		wantNotFound(t, "resolve of a missing tag", err)
		missing := missingDesc(ocispec.MediaTypeImageManifest)
		_, err = tg.Resolve(ctx, missing.Digest.String())
		wantNotFound(t, "resolve of a missing manifest digest", err)
		ref, _ := ParseRef("oci:/x:nope")
		_, err = Resolve(ctx, tg, ref)
		wantNotFound(t, "oci.Resolve of a missing tag", err)
		if err := tg.Tag(ctx, missing, "dangling"); err == nil {
			t.Fatal("tagging a manifest that is not stored succeeded")
		}
		if _, err := tg.Resolve(ctx, "dangling"); err == nil {
			t.Fatal("a failed tag left the tag behind")
		}
	}},
	{"TagsListing", func(t *testing.T, tg Target) {
		ctx := context.Background()
		tags, err := ListTags(ctx, tg)
		if err != nil || len(tags) != 0 {
			t.Fatalf("tags of an empty repository: %v, %v", tags, err)
		}
		m, _ := pushManifest(t, tg, 1)
		want := []string{"a", "b-1", "v1.0", "z"}
		for _, tag := range []string{"z", "a", "v1.0", "b-1"} {
			if err := tg.Tag(ctx, m, tag); err != nil {
				t.Fatal(err)
			}
		}
		tags, err = ListTags(ctx, tg)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(tags)
		if !slices.Equal(tags, want) {
			t.Fatalf("tags %v, want %v", tags, want)
		}
		// Listing after a tag resumes after it.
		var after []string
		if err := tg.Tags(ctx, "b-1", func(ts []string) error { after = append(after, ts...); return nil }); err != nil {
			t.Fatal(err)
		}
		slices.Sort(after)
		if !slices.Equal(after, []string{"v1.0", "z"}) {
			t.Fatalf("tags after b-1: %v", after)
		}
	}},
	{"DeleteManifest", func(t *testing.T, tg Target) {
		ctx := context.Background()
		keep, _ := pushManifest(t, tg, 1)
		gone, _ := pushManifest(t, tg, 2)
		if err := tg.Tag(ctx, keep, "keep"); err != nil {
			t.Fatal(err)
		}
		if err := tg.Delete(ctx, gone); err != nil {
			t.Fatalf("delete %s: %v", gone.Digest, err)
		}
		if ok, err := tg.Exists(ctx, gone); err != nil || ok {
			t.Fatalf("exists after delete: %v, %v", ok, err)
		}
		_, err := tg.Resolve(ctx, gone.Digest.String())
		wantNotFound(t, "resolve of a deleted manifest", err)
		if got, err := tg.Resolve(ctx, "keep"); err != nil || got.Digest != keep.Digest {
			t.Fatalf("the other manifest's tag: %s, %v", got.Digest, err)
		}
		wantNotFound(t, "delete of a deleted manifest", tg.Delete(ctx, gone))
	}},
	{"ProtectiveTagging", func(t *testing.T, tg Target) {
		ctx := context.Background()
		m, b := pushManifest(t, tg, 4)
		prot, err := TagVersion(ctx, tg, m, b, []string{"main"}, conformanceTime)
		if err != nil {
			t.Fatal(err)
		}
		if _, hex, ok := ParseProtectiveTag(prot); !ok || hex != m.Digest.Encoded()[:12] {
			t.Fatalf("protective tag %q", prot)
		}
		again, err := TagVersion(ctx, tg, m, b, []string{"main"}, conformanceTime.Add(time.Second))
		if err != nil || again != prot {
			t.Fatalf("tagging the same version again gave %q (%v), want the existing %q", again, err, prot)
		}
		if got := NewestSealedTag(ctx, tg); got != prot {
			t.Fatalf("newest sealed tag %q, want %q", got, prot)
		}
	}},
}

var conformanceTime = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
