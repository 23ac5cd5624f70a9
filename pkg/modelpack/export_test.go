package modelpack

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/imageview"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// configSchema is the spec's JSON schema of the config (testdata/README.md).
//
//go:embed testdata/config-schema.json
var configSchema []byte

// stFile is a safetensors file of the given tensors, each name: dtype,
// elements, 2 bytes per element (BF16) or 4 (F32).
func stFile(seed uint64, tensors ...string) []byte {
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var data []byte
	for i := 0; i+1 < len(tensors); i += 2 {
		var n int
		fmt.Sscan(tensors[i+1], &n)
		dt, w := "BF16", 2
		if i == 2 {
			dt, w = "F32", 4
		}
		hdr[tensors[i]] = map[string]any{"dtype": dt, "shape": []int{n}, "data_offsets": []int{len(data), len(data) + n*w}}
		data = append(data, testutil.RandBytes(seed+uint64(i), n*w)...)
	}
	h, _ := json.Marshal(hdr)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(out, h...), data...)
}

// version pushes a small model into an OCI layout and returns the target,
// its reference and the version.
func version(t *testing.T) (oci.Target, oci.Ref, ocispec.Descriptor, string) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	testutil.WriteVolumeTree(t, src, map[string][]byte{
		"config.json":                      []byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama"}`),
		"README.md":                        []byte("# a model\n"),
		"model-00001-of-00002.safetensors": stFile(1, "a", "300000", "b", "1000", "c", "400000"),
		"model-00002-of-00002.safetensors": stFile(9, "d", "700000"),
		"sub/tokenizer.json":               []byte(`{"v":1}`),
		"embeddings.dat":                   testutil.RandBytes(5, 200<<10),
	})
	ref := oci.Ref{Layout: filepath.Join(t.TempDir(), "vol")}
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := push.Push(ctx, tg, push.DirSource(src), push.Options{Params: layout.Params{Min: 64 << 10, Avg: 128 << 10, Max: 256 << 10}})
	if err != nil {
		t.Fatal(err)
	}
	return tg, ref, res.Root, src
}

// TestExportDeterministicAndValid exports a version twice (the second time
// to another repository): the same manifest digest; one .raw layer per
// file, named by both annotations, with the file's digest; a config that
// the spec's schema accepts, filled from config.json and the safetensors
// headers; the view listed by Views.
func TestExportDeterministicAndValid(t *testing.T) {
	ctx := context.Background()
	tg, ref, root, src := version(t)
	out, err := Export(ctx, tg, ref, root, oci.Ref{}, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	other := oci.Ref{Layout: filepath.Join(t.TempDir(), "other"), Tag: "v1"}
	again, err := Export(ctx, tg, ref, root, other, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if again.Digest != out.Digest || out.Layers != 6 || out.SharedLayers != 1 || out.BytesUploaded == 0 {
		t.Fatalf("exports differ or are short:\n%+v\n%+v", out, again)
	}
	t.Logf("view: %d layers, %d bytes, %d layers (%d bytes) shared with the version, %d bytes uploaded", out.Layers, out.Bytes, out.SharedLayers, out.SharedBytes, out.BytesUploaded)
	mdesc, err := tg.Resolve(ctx, out.Digest)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := content.FetchAll(ctx, tg, mdesc)
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		t.Fatal(err)
	}
	if m.ArtifactType != ArtifactType || m.Config.MediaType != MediaTypeConfig || m.Subject == nil || m.Subject.Digest != root.Digest {
		t.Fatalf("manifest: %s", mb)
	}
	for _, l := range m.Layers {
		p := l.Annotations[AnnotationFilepath]
		want, err := os.ReadFile(filepath.Join(src, p))
		if err != nil || l.Annotations[AnnotationTitle] != p {
			t.Fatalf("layer %s names %q (title %q): %v", l.Digest, p, l.Annotations[AnnotationTitle], err)
		}
		got, err := content.FetchAll(ctx, tg, l)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("layer of %s: %d bytes, want the file's %d (%v)", p, len(got), len(want), err)
		}
		if _, packing, ok := ParseMediaType(l.MediaType); !ok || packing != PackingRaw {
			t.Fatalf("layer of %s: media type %s", p, l.MediaType)
		}
		// As modctl writes it: the base name, typeflag 0.
		var fm map[string]any
		if err := json.Unmarshal([]byte(l.Annotations[AnnotationFileMetadata]), &fm); err != nil || fm["name"] != path.Base(p) || fm["typeflag"] != float64(0) {
			t.Errorf("layer of %s: file metadata %s, want name %q and typeflag 0", p, l.Annotations[AnnotationFileMetadata], path.Base(p))
		}
	}
	cb, err := content.FetchAll(ctx, tg, m.Config)
	if err != nil {
		t.Fatal(err)
	}
	validate(t, cb)
	var c Config
	json.Unmarshal(cb, &c)
	want := ModelConfig{Architecture: "transformer", Format: "safetensors", ParamSize: "1.4M", Precision: "bfloat16,float32"}
	if c.Config != want || c.Descriptor.Family != "llama" || len(c.ModelFS.DiffIDs) != 6 {
		t.Fatalf("config: %s", cb)
	}
	views, err := Views(ctx, tg, root.Digest)
	if err != nil || len(views) != 1 || views[0].Digest.String() != out.Digest {
		t.Fatalf("views: %+v %v", views, err)
	}
}

func validate(t *testing.T, cb []byte) {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(configSchema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	if err := c.AddResource("config-schema.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("config-schema.json")
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(cb))
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(inst); err != nil {
		t.Fatalf("config does not validate against the spec's schema: %v\n%s", err, cb)
	}
	// The validator must be able to fail.
	bad, _ := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(`{"descriptor":{},"config":{"paramSize":1},"modelfs":{"type":"layers","diffIds":[]}}`)))
	if sch.Validate(bad) == nil {
		t.Fatal("the schema accepted a config with a numeric paramSize and no diffIds")
	}
}

func TestParamSize(t *testing.T) {
	for n, want := range map[uint64]string{500: "0.5K", 1_400_000: "1.4M", 6_738_415_616: "6.7B", 1_000_000_000_000: "1.0T"} {
		if got := ParamSize(n); got != want {
			t.Errorf("ParamSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestExportGGUFConfig: the config of a GGUF model comes from its header:
// format, architecture, parameter count, plain types as precision and
// quantized ggml types as quantization.
func TestExportGGUFConfig(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	g := testutil.GGUF([]string{"general.architecture", "qwen2"}, 32, []testutil.GGUFTensor{
		{Name: "tok_embd.weight", Type: 8, Dims: []uint64{64, 1000}, Data: testutil.RandBytes(1, 64000/32*34)},
		{Name: "output_norm.weight", Type: 0, Dims: []uint64{64}, Data: testutil.RandBytes(2, 256)},
	})
	testutil.WriteVolumeTree(t, src, map[string][]byte{"model.gguf": g})
	ref := oci.Ref{Layout: filepath.Join(t.TempDir(), "vol")}
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := push.Push(ctx, tg, push.DirSource(src), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := Export(ctx, tg, ref, res.Root, oci.Ref{}, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := ModelConfig{Architecture: "qwen2", Format: "gguf", ParamSize: "64.1K", Precision: "float32", Quantization: "Q8_0"}
	if out.Config != want {
		t.Fatalf("config %+v, want %+v", out.Config, want)
	}
}

// TestExportRefuses: a version with no regular file (a symlink only) has
// no ModelPack view, and a destination naming a digest is refused.
func TestExportRefuses(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	testutil.WriteVolumeTree(t, src, map[string][]byte{"link@": []byte("elsewhere")})
	ref := oci.Ref{Layout: filepath.Join(t.TempDir(), "vol")}
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := push.Push(ctx, tg, push.DirSource(src), push.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Export(ctx, tg, ref, res.Root, oci.Ref{}, oci.Options{}); !errors.Is(err, ErrNothingToExport) {
		t.Errorf("a symlink-only version: got %v, want ErrNothingToExport", err)
	}
	dst := oci.Ref{Layout: ref.Layout, Digest: res.Root.Digest}
	if _, err := Export(ctx, tg, ref, res.Root, dst, oci.Options{}); !errors.Is(err, imageview.ErrDestinationDigest) {
		t.Errorf("a destination with a digest: got %v, want ErrDestinationDigest", err)
	}
}
