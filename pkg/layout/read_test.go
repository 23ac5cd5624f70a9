package layout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// localFetcher is a testutil.CountingFetcher that says it reads local files.
type localFetcher struct{ *testutil.CountingFetcher }

func (localFetcher) Local() bool { return true }

// partedVersion seals and stores a version of 25 chunks in parts of 10
// layers.
func partedVersion(t *testing.T) (*memory.Store, *Sealed) {
	t.Helper()
	x := &Index{Version: 1, Chunking: v1Params}
	store := memory.New()
	ctx := context.Background()
	for i := range 25 {
		data := []byte(fmt.Sprint("chunk ", i))
		c := Chunk{Digest: digest.FromBytes(data), Size: int64(len(data))}
		x.Chunks = append(x.Chunks, c)
		x.Files = append(x.Files, File{Path: fmt.Sprintf("f%02d", i), Type: TypeFile, Mode: 0o644, Size: c.Size, Digest: c.Digest, Extents: []Extent{{i, 0, c.Size}}})
		if err := store.Push(ctx, c.Descriptor(), bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Seal(x, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, store); err != nil {
		t.Fatal(err)
	}
	return store, s
}

// pushJSON stores v as a manifest of the given media type.
func pushJSON(t *testing.T, store *memory.Store, mediaType string, v any) ocispec.Descriptor {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	d := content.NewDescriptorFromBytes(mediaType, b)
	if err := store.Push(context.Background(), d, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestOpenParts(t *testing.T) {
	store, s := partedVersion(t)
	v, err := Open(context.Background(), store, s.Root.Desc)
	if err != nil {
		t.Fatal(err)
	}
	if v.NumChunks() != 25 || v.Chunk(24).Digest != s.Chunks[24].Digest {
		t.Fatalf("%d chunks", v.NumChunks())
	}
	want := map[digest.Digest]bool{s.Root.Desc.Digest: true}
	for _, b := range append(append([]Blob{}, s.Blobs...), s.Parts...) {
		want[b.Desc.Digest] = true
	}
	got := map[digest.Digest]bool{}
	for _, m := range v.Meta {
		got[m.Digest] = true
	}
	if len(got) != len(want) {
		t.Fatalf("meta %v, want %v", got, want)
	}
	for d := range want {
		if !got[d] {
			t.Errorf("meta lacks %s", d)
		}
	}
}

// TestOpenRefusesDuplicateParts: an index listing one part many times is
// refused before any part is fetched.
func TestOpenRefusesDuplicateParts(t *testing.T) {
	store, s := partedVersion(t)
	var root ocispec.Index
	if err := json.Unmarshal(s.Root.Data, &root); err != nil {
		t.Fatal(err)
	}
	root.Manifests = []ocispec.Descriptor{root.Manifests[0], root.Manifests[0], root.Manifests[0], root.Manifests[0], root.Manifests[0], root.Manifests[0], root.Manifests[0]}
	rd := pushJSON(t, store, ocispec.MediaTypeImageIndex, root)
	src := &testutil.CountingFetcher{Fetcher: store}
	_, err := Open(context.Background(), src, rd)
	if !errors.Is(err, ErrInvalidIndex) || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("open: %v, want ErrInvalidIndex for a part listed twice", err)
	}
	if n := src.Total(); n != 1 {
		t.Errorf("%d fetches, want 1 (the root)", n)
	}
}

// TestOpenBoundsLayers: a part listing more layers than a manifest can
// hold is refused while it is decoded, without holding them all.
func TestOpenBoundsLayers(t *testing.T) {
	store, s := partedVersion(t)
	var root ocispec.Index
	if err := json.Unmarshal(s.Root.Data, &root); err != nil {
		t.Fatal(err)
	}
	var part bytes.Buffer
	part.WriteString(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"` + ArtifactTypePart + `","layers":[`)
	for i := range maxManifestLayers + 1 {
		if i > 0 {
			part.WriteByte(',')
		}
		part.WriteString("{}")
	}
	part.WriteString("]}")
	pd := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, part.Bytes())
	if err := store.Push(context.Background(), pd, bytes.NewReader(part.Bytes())); err != nil {
		t.Fatal(err)
	}
	root.Manifests = append(root.Manifests, pd)
	rd := pushJSON(t, store, ocispec.MediaTypeImageIndex, root)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := Open(context.Background(), store, rd)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint("more than ", maxManifestLayers)) {
		t.Fatalf("open: %v, want a refusal of more than %d layers", err, maxManifestLayers)
	}
	if a := after.TotalAlloc - before.TotalAlloc; a > 256<<20 {
		t.Errorf("allocated %d MiB to refuse it", a>>20)
	}
}

// TestOpenLocalNotRefetched: a corrupt blob from a source of local files is
// read once; from a remote source it is fetched again.
func TestOpenLocalNotRefetched(t *testing.T) {
	store, s := partedVersion(t)
	idx := s.Blobs[0].Desc
	bad := ocispec.Descriptor{MediaType: idx.MediaType, Digest: digest.FromString("another index"), Size: idx.Size}
	// Store the index bytes under another digest: they do not match it.
	corrupt := &mismatch{Fetcher: store, as: bad.Digest, real: idx}
	var root ocispec.Index
	if err := json.Unmarshal(s.Root.Data, &root); err != nil {
		t.Fatal(err)
	}
	var part ocispec.Manifest
	if err := json.Unmarshal(s.Parts[0].Data, &part); err != nil {
		t.Fatal(err)
	}
	part.Layers[0] = bad
	root.Manifests[0] = pushJSON(t, store, ocispec.MediaTypeImageManifest, part)
	root.Manifests[0].ArtifactType = ArtifactTypePart
	rd := pushJSON(t, store, ocispec.MediaTypeImageIndex, root)

	local := localFetcher{&testutil.CountingFetcher{Fetcher: corrupt}}
	if _, err := Open(context.Background(), local, rd); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("open: %v, want ErrDigestMismatch", err)
	}
	if n := local.Count(bad.Digest); n != 1 {
		t.Errorf("a local corrupt file index was read %d times, want 1", n)
	}
	remote := &testutil.CountingFetcher{Fetcher: corrupt}
	if _, err := Open(context.Background(), remote, rd); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("open: %v, want ErrDigestMismatch", err)
	}
	if n := remote.Count(bad.Digest); n != fetchAttempts {
		t.Errorf("a remote corrupt file index was fetched %d times, want %d", n, fetchAttempts)
	}
}

// mismatch serves the bytes of real when asked for the digest as.
type mismatch struct {
	content.Fetcher
	as   digest.Digest
	real ocispec.Descriptor
}

func (m *mismatch) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	if d.Digest == m.as {
		return m.Fetcher.Fetch(ctx, m.real)
	}
	return m.Fetcher.Fetch(ctx, d)
}

// TestDecodeManifestStrict: duplicate keys and trailing data are refused.
func TestDecodeManifestStrict(t *testing.T) {
	for _, s := range []string{
		`{"layers":[],"layers":[]}`,
		`{"mediaType":"a"} {}`,
		`[]`,
		`{"layers":{}}`,
	} {
		if _, err := decodeManifest(strings.NewReader(s), 10, 0); err == nil {
			t.Errorf("decoded %s", s)
		}
	}
	m, err := decodeManifest(strings.NewReader(`{"mediaType":"m","other":{"x":[1,2]},"layers":null,"manifests":[{"digest":"sha256:x","size":1}]}`), 10, 0)
	if err != nil || m.MediaType != "m" || len(m.Manifests) != 1 || m.NumLayers != 0 {
		t.Fatalf("%+v %v", m, err)
	}
}

// TestOpenCorruptManifest: a part manifest whose bytes are not its digest's
// (and not JSON either) is refused as a mismatch, not decoded: read once
// from local files, fetched again from a remote source.
func TestOpenCorruptManifest(t *testing.T) {
	store, s := partedVersion(t)
	var root ocispec.Index
	if err := json.Unmarshal(s.Root.Data, &root); err != nil {
		t.Fatal(err)
	}
	chunk := s.Chunks[0]
	bad := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("another part"), Size: chunk.Size, ArtifactType: ArtifactTypePart}
	root.Manifests[0] = bad
	rd := pushJSON(t, store, ocispec.MediaTypeImageIndex, root)
	corrupt := &mismatch{Fetcher: store, as: bad.Digest, real: chunk}

	local := localFetcher{&testutil.CountingFetcher{Fetcher: corrupt}}
	if _, err := Open(context.Background(), local, rd); !errors.Is(err, ErrDigestMismatch) || errors.Is(err, ErrNotVolume) {
		t.Fatalf("open: %v, want ErrDigestMismatch", err)
	}
	if n := local.Count(bad.Digest); n != 1 {
		t.Errorf("a local corrupt manifest was read %d times, want 1", n)
	}
	remote := &testutil.CountingFetcher{Fetcher: corrupt}
	if _, err := Open(context.Background(), remote, rd); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("open: %v, want ErrDigestMismatch", err)
	}
	if n := remote.Count(bad.Digest); n != fetchAttempts {
		t.Errorf("a remote corrupt manifest was fetched %d times, want %d", n, fetchAttempts)
	}
}
