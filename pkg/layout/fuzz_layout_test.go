package layout

import (
	"bytes"
	"context"
	"runtime"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// fuzzSeeds returns a valid one-manifest version in placeholder form, and
// variants with hostile sizes and shapes.
func fuzzSeeds(t testing.TB) [][3][]byte {
	x := validIndex()
	s, err := Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	idx := s.Blobs[0]
	man := bytes.ReplaceAll(s.Root.Data, []byte(idx.Desc.Digest), []byte(testutil.PhBlobDigest))
	index := []byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + testutil.PhManifestDigest + `","size":` + testutil.PhManifestSize + `,"annotations":{"org.opencontainers.image.ref.name":"v1"}}]}`)
	huge := bytes.ReplaceAll(index, []byte(testutil.PhManifestSize), []byte("1099511627776"))
	parts := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","artifactType":"` + ArtifactTypeVolume + `","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + testutil.PhBlobDigest + `","size":` + testutil.PhBlobSize + `},{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + testutil.PhBlobDigest + `","size":` + testutil.PhBlobSize + `}]}`)
	nested := []byte(`{"mediaType":"application/vnd.oci.image.manifest.v1+json","artifactType":"` + ArtifactTypeVolume + `","manifests":[{"digest":"` + testutil.PhBlobDigest + `","size":4611686018427387904}],"layers":[{"mediaType":"` + MediaTypeIndex + `","digest":"` + testutil.PhBlobDigest + `","size":` + testutil.PhBlobSize + `}]}`)
	// An empty version 2 volume: its top-level index lists no pieces.
	s2, err := Seal(&Index{Version: FormatVersion, Chunking: DefaultParams}, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	top := s2.Blobs[0]
	man2 := bytes.ReplaceAll(s2.Root.Data, []byte(top.Desc.Digest), []byte(testutil.PhBlobDigest))
	return [][3][]byte{
		{index, man, idx.Data},
		{index, man2, top.Data},
		{huge, man, idx.Data},
		{index, parts, s.Root.Data},
		{index, nested, idx.Data},
		{[]byte(`{"manifests":[{"digest":"sha256:x","size":-1}]}`), nil, nil},
	}
}

func TestFuzzSeedsOpen(t *testing.T) {
	seeds := fuzzSeeds(t)
	for i := range 2 { // a version 1 and a version 2 volume
		dir := t.TempDir()
		testutil.BuildFuzzLayout(t, dir, seeds[i][0], seeds[i][1], seeds[i][2])
		ctx := context.Background()
		tg, err := oci.Open(ctx, oci.Ref{Layout: dir}, oci.Options{})
		if err != nil {
			t.Fatal(err)
		}
		d, err := tg.Resolve(ctx, "v1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Open(ctx, tg, d); err != nil {
			t.Fatalf("valid seed %d does not open: %v", i, err)
		}
	}
}

// FuzzOpenLayout builds an OCI layout from the fuzzer's bytes (index.json,
// a manifest, a blob) and opens, resolves, reads and walks it: it must
// return errors, never panic or allocate without bound. Its inputs are
// large, so `make fuzz` bounds the minimizing of new ones
// (-fuzzminimizetime), which would otherwise take the whole run.
func FuzzOpenLayout(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, index, manifest, blob []byte) {
		dir := t.TempDir()
		testutil.BuildFuzzLayout(t, dir, index, manifest, blob)
		ctx := context.Background()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		defer func() {
			runtime.ReadMemStats(&after)
			if a := after.TotalAlloc - before.TotalAlloc; a > 256<<20 {
				t.Fatalf("allocated %d MiB for a layout of %d bytes", a>>20, len(index)+len(manifest)+len(blob))
			}
		}()
		_, _ = oci.LayoutReachable(ctx, dir)
		fuzzVersions(ctx, dir, blob, 9, func(tg oci.Target, d ocispec.Descriptor, v *Version, err error) {
			if err == nil {
				if err := v.Index.Validate(); err != nil {
					t.Fatalf("Open returned an invalid index: %v", err)
				}
			}
			_, _ = tg.Predecessors(ctx, d)
		})
	})
}

// fuzzVersions opens the layout dir and calls fn with each of its first n
// references (its tags, then the digest of blob) that resolve, and the
// version Open makes of it (or Open's error).
func fuzzVersions(ctx context.Context, dir string, blob []byte, n int, fn func(tg oci.Target, d ocispec.Descriptor, v *Version, err error)) {
	tg, err := oci.Open(ctx, oci.Ref{Layout: dir}, oci.Options{})
	if err != nil {
		return
	}
	tags, err := oci.ListTags(ctx, tg)
	if err != nil {
		return
	}
	refs := append(tags, digest.FromBytes(blob).String())
	for _, ref := range refs[:min(n, len(refs))] {
		d, err := tg.Resolve(ctx, ref)
		if err != nil {
			continue
		}
		v, err := Open(ctx, tg, d)
		fn(tg, d, v, err)
	}
}
