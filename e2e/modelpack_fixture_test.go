package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ModelPack fixtures, written here from the spec (github.com/modelpack/
// model-spec, docs/spec.md) with nothing of bdnvol's: an independent
// writer, and the files each fixture holds as the independent answer.

const (
	mpArtifact = "application/vnd.cncf.model.manifest.v1+json"
	mpConfig   = "application/vnd.cncf.model.config.v1+json"
	mpFilepath = "org.cncf.model.filepath"
)

// mpType is the layer media type of kind (weight, weight.config, doc,
// code, dataset) packed as packing (raw, tar, tar+gzip, tar+zstd).
func mpType(kind, packing string) string {
	return "application/vnd.cncf.model." + kind + ".v1." + packing
}

// mpLayer is one layer of a fixture.
type mpLayer struct {
	mediaType string
	blob      []byte
	path      string // the file-path annotation
}

// mpModel is a fixture: its blobs, manifest and the files it holds.
type mpModel struct {
	layers   []mpLayer
	config   []byte
	manifest []byte
	digest   string
	files    map[string][]byte
}

// mpMember is a tar member; a link when link is set.
type mpMember struct {
	name string
	data []byte
	typ  byte
	link string
	mode int64 // 0644 when 0
}

// mpTar writes members into a tar, PAX where a name needs it; gzip it
// when gz.
func mpTar(t testing.TB, gz bool, ms ...mpMember) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range ms {
		h := &tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if m.mode != 0 {
			h.Mode = m.mode
		}
		if m.typ != 0 {
			h.Typeflag, h.Size, h.Linkname = m.typ, 0, m.link
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(m.data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if !gz {
		return buf.Bytes()
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(buf.Bytes())
	zw.Close()
	return z.Bytes()
}

// mpSafetensors returns a safetensors file of U8 tensors of the given
// sizes (zeros but for a stamp at each tensor's start and end, so that it
// compresses on disk) and the offset of each tensor in the file.
func mpSafetensors(sizes ...int) ([]byte, []int64) {
	hdr := map[string]any{}
	var off int
	for i, n := range sizes {
		hdr[fmt.Sprintf("t%03d", i)] = map[string]any{"dtype": "U8", "shape": []int{n}, "data_offsets": []int{off, off + n}}
		off += n
	}
	h, _ := json.Marshal(hdr)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := make([]byte, 8+len(h)+off)
	binary.LittleEndian.PutUint64(out, uint64(len(h)))
	copy(out[8:], h)
	var starts []int64
	pos := 8 + len(h)
	for i, n := range sizes {
		starts = append(starts, int64(pos))
		stamp := []byte(fmt.Sprintf("tensor %d begins", i))
		copy(out[pos:], stamp)
		copy(out[pos+n-len(stamp):], stamp)
		for k := 4096; k < n; k += 4096 {
			out[pos+k] = byte(i*7 + k/4096)
		}
		pos += n
	}
	return out, starts
}

// newModel builds the manifest of layers, with files the files they hold.
func newModel(t testing.TB, files map[string][]byte, layers ...mpLayer) *mpModel {
	t.Helper()
	m := &mpModel{layers: layers, files: files, config: []byte(`{"descriptor":{"name":"e2e"},"config":{},"modelfs":{"type":"layers","diffIds":[]}}`)}
	var ls []descriptorAnn
	for _, l := range layers {
		ls = append(ls, descriptorAnn{descriptor{MediaType: l.mediaType, Digest: digestOf(l.blob), Size: int64(len(l.blob))}, map[string]string{mpFilepath: l.path}})
	}
	b, err := json.Marshal(struct {
		SchemaVersion int             `json:"schemaVersion"`
		MediaType     string          `json:"mediaType"`
		ArtifactType  string          `json:"artifactType"`
		Config        descriptor      `json:"config"`
		Layers        []descriptorAnn `json:"layers"`
	}{2, mtManifest, mpArtifact, descriptor{MediaType: mpConfig, Digest: digestOf(m.config), Size: int64(len(m.config))}, ls})
	if err != nil {
		t.Fatal(err)
	}
	m.manifest, m.digest = b, digestOf(b)
	return m
}

// descriptorAnn is a descriptor with annotations.
type descriptorAnn struct {
	descriptor
	Annotations map[string]string `json:"annotations,omitempty"`
}

// push stores the model in tg under name:tag and returns its reference by digest.
func (m *mpModel) push(t testing.TB, tg target, name, tag string) string {
	t.Helper()
	if tg.reg != nil {
		uploadBlob(t, tg.reg, name, m.config)
		for _, l := range m.layers {
			uploadBlob(t, tg.reg, name, l.blob)
		}
		putManifest(t, tg.reg, name, tag, mtManifest, m.manifest)
		return tg.repo(name) + "@" + m.digest
	}
	dir := filepath.Join(tg.root, name)
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	put := func(b []byte) {
		mustWrite(t, filepath.Join(blobs, strings.TrimPrefix(digestOf(b), "sha256:")), b)
	}
	put(m.config)
	put(m.manifest)
	for _, l := range m.layers {
		put(l.blob)
	}
	mustWrite(t, filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`))
	ib, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": mtIndex, "manifests": []descriptorAnn{{
		descriptor{MediaType: mtManifest, ArtifactType: mpArtifact, Digest: m.digest, Size: int64(len(m.manifest))},
		map[string]string{"org.opencontainers.image.ref.name": tag},
	}}})
	mustWrite(t, filepath.Join(dir, "index.json"), ib)
	return tg.repo(name) + "@" + m.digest
}

// mixedModel is a model with every packing bdnvol reads and every kind of
// layer: a safetensors weight as .raw, weights in a tar (a PAX long name),
// configs in a tar+gzip, docs and code as .raw.
func mixedModel(t testing.TB) *mpModel {
	w, _ := mpSafetensors(3<<20, 2<<20, 4096)
	long := strings.Repeat("l", 130) + "/shard.bin"
	files := map[string][]byte{
		"model.safetensors": w,
		"shards/a.bin":      bytes.Repeat([]byte("a"), 300_000),
		long:                []byte("long name"),
		"config.json":       []byte(`{"architectures":["E2E"]}`),
		"tokenizer.json":    []byte(`{"v":1}`),
		"README.md":         []byte("# e2e model\n"),
		"src/infer.py":      []byte("print('hi')\n"),
	}
	return newModel(t, files,
		mpLayer{mpType("weight", "raw"), w, "model.safetensors"},
		mpLayer{mpType("weight", "tar"), mpTar(t, false, mpMember{name: "shards/a.bin", data: files["shards/a.bin"]}, mpMember{name: long, data: files[long]}), "shards"},
		mpLayer{mpType("weight.config", "tar+gzip"), mpTar(t, true, mpMember{name: "config.json", data: files["config.json"]}, mpMember{name: "tokenizer.json", data: files["tokenizer.json"]}), "config.json"},
		mpLayer{mpType("doc", "raw"), files["README.md"], "README.md"},
		mpLayer{mpType("code", "raw"), files["src/infer.py"], "src/infer.py"},
	)
}
