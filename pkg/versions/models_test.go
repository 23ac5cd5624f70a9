package versions

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// testModelType is the foreign artifact type of these tests: one of the
// formats a version is opened in (origin.Formats).
const testModelType = modelpack.ArtifactType

// pushManifest stores blobs and an image manifest of them (of artifactType
// at, "" for a plain image) in tg, tagged tag.
func pushManifest(t *testing.T, tg oci.Target, at, tag string, layers ...[]byte) ocispec.Descriptor {
	t.Helper()
	ctx := context.Background()
	put := func(mt string, b []byte) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b))}
		if ok, _ := tg.Exists(ctx, d); !ok {
			if err := tg.Push(ctx, d, bytes.NewReader(b)); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: at, Config: put(ocispec.MediaTypeEmptyJSON, []byte("{}"))}
	m.SchemaVersion = 2
	for _, l := range layers {
		m.Layers = append(m.Layers, put("application/octet-stream", l))
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	d := put(ocispec.MediaTypeImageManifest, b)
	if err := tg.Tag(ctx, d, tag); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestListModels: a foreign model that tags name is listed by ListModels
// with its tags, layers and bytes, and never by List (what retention
// plans from); a plain image and the sealed versions are not models.
func TestListModels(t *testing.T) {
	ctx := context.Background()
	tg := openLayout(t)
	vs := threeVersions(t, tg)
	model := pushManifest(t, tg, testModelType, "model", []byte("weights"), []byte("config!"))
	if err := tg.Tag(ctx, model, "latest"); err != nil {
		t.Fatal(err)
	}
	pushManifest(t, tg, "", "image", []byte("a layer"))
	list, err := List(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	skip := map[digest.Digest]bool{}
	for _, v := range list {
		if v.Digest == model.Digest {
			t.Fatal("List, which gc plans from, lists the model")
		}
		skip[v.Digest] = true
	}
	if len(list) != len(vs) {
		t.Fatalf("List: %d versions, want %d", len(list), len(vs))
	}
	ms, err := ListModels(ctx, tg, skip)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 1 {
		t.Fatalf("ListModels: %+v, want the one model", ms)
	}
	m := ms[0]
	if m.Digest != model.Digest || m.Foreign != testModelType || m.Layers != 2 || m.Bytes != 14 || len(m.Tags) != 2 || m.Tags[0] != "latest" || m.Tags[1] != "model" {
		t.Fatalf("ListModels: %+v", m)
	}
}
