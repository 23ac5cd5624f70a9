package modelpack

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// FuzzParseManifest parses arbitrary bytes as a ModelPack manifest (what a
// registry hands a mount, a pull or a sync): it must refuse with an error
// or return layers each of a known packing, a raw layer's file at a path
// CheckPath accepts.
func FuzzParseManifest(f *testing.F) {
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: ArtifactType,
		Config: ocispec.Descriptor{MediaType: MediaTypeConfig, Digest: digest.FromString("{}"), Size: 2},
		Layers: []ocispec.Descriptor{
			{MediaType: MediaTypeWeightRaw, Digest: digest.FromString("w"), Size: 1, Annotations: map[string]string{AnnotationFilepath: "model/w.safetensors"}},
			{MediaType: MediaType(KindWeight, PackingTar), Digest: digest.FromString("t"), Size: 1024, Annotations: map[string]string{AnnotationFilepath: "model"}},
		}}
	m.SchemaVersion = 2
	seed, err := json.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"schemaVersion":2,"layers":[{"mediaType":"application/vnd.cncf.model.weight.v1.raw","digest":"sha256:00","size":-1}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := Parse(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(b), Size: int64(len(b))}, b)
		if err != nil {
			return
		}
		if len(a.Layers) != len(a.Manifest.Layers) || len(a.Layers) > MaxLayers {
			t.Fatalf("%d layers of %d listed", len(a.Layers), len(a.Manifest.Layers))
		}
		for _, l := range a.Layers {
			if l.Packing == "" {
				t.Fatalf("layer %s without a packing", l.Desc.Digest)
			}
			if l.Packing == PackingRaw {
				if _, err := CheckPath(l.Path); err != nil {
					t.Fatalf("raw layer at %q accepted: %v", l.Path, err)
				}
			}
		}
	})
}

// FuzzBuildTar builds a model whose one layer is arbitrary bytes as a tar
// (its headers are the model's file names, modes, types and sizes): Build
// must refuse it with an error or give a map whose index holds as bdnvol's
// own does, every file of it inside the layer.
func FuzzBuildTar(f *testing.F) {
	f.Add(tarBytes(f, tarMember{name: "model/a.bin", data: []byte("aaaa")}, tarMember{name: "model/b/c.json", data: []byte("{}")}))
	f.Add(tarBytes(f, tarMember{name: "x", typ: '2', link: "y"}))
	f.Add(tarBytes(f, tarMember{name: "p", data: []byte("pax"), pax: map[string]string{"path": "long/name"}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, desc := pushModel(t, fixtureLayer{mediaType: MediaType(KindWeight, PackingTar), blob: b, annot: map[string]string{AnnotationFilepath: "model"}})
		a, err := Fetch(context.Background(), st, desc)
		if err != nil {
			t.Fatalf("the fixture's manifest: %v", err)
		}
		m, err := Build(context.Background(), st, a)
		if err != nil {
			return
		}
		if err := m.Index.Validate(); err != nil {
			t.Fatalf("built an index that does not validate: %v", err)
		}
		for _, fl := range m.Files {
			if fl.Offset < 0 || fl.Size < 0 || fl.Offset+fl.Size > int64(len(b)) {
				t.Fatalf("%s at %d+%d outside the %d-byte layer", fl.Path, fl.Offset, fl.Size, len(b))
			}
		}
	})
}
