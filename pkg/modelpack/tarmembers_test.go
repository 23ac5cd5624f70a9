package modelpack

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// member is one tar member as GNU tar, modctl or Python's tarfile write
// them: a type, a mode and, for files, bytes.
type member struct {
	name   string
	typ    byte
	mode   int64
	data   string
	link   string
	format tar.Format
}

func tarOf(t *testing.T, ms []member) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range ms {
		h := &tar.Header{Name: m.name, Typeflag: m.typ, Mode: m.mode, Linkname: m.link, ModTime: time.Unix(1, 0), Format: m.format}
		if m.typ == tar.TypeReg {
			h.Size = int64(len(m.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(m.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func packed(t *testing.T, p Packing, b []byte) []byte {
	switch p {
	case PackingTarGzip:
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write(b)
		zw.Close()
		return z.Bytes()
	case PackingTarZstd:
		zw, _ := zstd.NewWriter(nil)
		return zw.EncodeAll(b, nil)
	}
	return b
}

// TestTarMembers: a layer made from a directory (GNU tar's "./",
// "./scripts/", modctl's directory entries), with PAX and GNU long names,
// lists every regular file, in every tar packing and as a plain OCI image
// layer, with the mode its header gives (group write kept). Directories
// are skipped, never the end of the listing.
func TestTarMembers(t *testing.T) {
	long := strings.Repeat("d", 90) + "/" + strings.Repeat("f", 60) + ".bin"
	ms := []member{
		{name: "./", typ: tar.TypeDir, mode: 0o755},
		{name: "./README.md", typ: tar.TypeReg, mode: 0o664, data: "# model\n"},
		{name: "./scripts/", typ: tar.TypeDir, mode: 0o775},
		{name: "./scripts/convert.sh", typ: tar.TypeReg, mode: 0o775, data: "#!/bin/sh\n"},
		{name: "weights/", typ: tar.TypeDir, mode: 0o755},
		{name: "weights/model.safetensors", typ: tar.TypeReg, mode: 0o644, data: strings.Repeat("w", 5000)},
		{name: "pax/" + long, typ: tar.TypeReg, mode: 0o640, data: "pax", format: tar.FormatPAX},
		{name: "gnu/" + long, typ: tar.TypeReg, mode: 0o600, data: "gnu", format: tar.FormatGNU},
		{name: "empty/", typ: tar.TypeDir, mode: 0o755},
		{name: "last.txt", typ: tar.TypeReg, mode: 0o444, data: "end"},
	}
	want := map[string]uint32{
		"README.md": 0o664, "scripts/convert.sh": 0o775, "weights/model.safetensors": 0o644,
		"pax/" + long: 0o640, "gnu/" + long: 0o600, "last.txt": 0o444,
	}
	raw := tarOf(t, ms)
	layers := map[string]fixtureLayer{}
	for _, p := range []Packing{PackingTar, PackingTarGzip, PackingTarZstd} {
		layers[string(p)] = fixtureLayer{mediaType: MediaType(KindCode, p), blob: packed(t, p, raw)}
	}
	layers["oci image layer"] = fixtureLayer{mediaType: mediaTypeImageTar, blob: raw}
	layers["oci image layer+gzip"] = fixtureLayer{mediaType: mediaTypeImageTarGzip, blob: packed(t, PackingTarGzip, raw)}
	for name, l := range layers {
		t.Run(name, func(t *testing.T) {
			st, desc := pushModel(t, l)
			a, err := Fetch(t.Context(), st, desc)
			if err != nil {
				t.Fatal(err)
			}
			m, err := Build(t.Context(), st, a)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]uint32{}
			for _, f := range m.Files {
				got[f.Path] = f.Mode
			}
			if len(got) != len(want) {
				var names []string
				for p := range got {
					names = append(names, p)
				}
				sort.Strings(names)
				t.Fatalf("%d files listed, want %d: %q", len(got), len(want), names)
			}
			for p, mode := range want {
				if g, ok := got[p]; !ok || g != mode {
					t.Errorf("%s: listed %v with mode %o, want mode %o", p, ok, g, mode)
				}
			}
		})
	}
}

// TestTarLinksRefused: a hard link or a symlink in a model layer is
// refused with an error that names it, never skipped in silence.
func TestTarLinksRefused(t *testing.T) {
	for _, typ := range []byte{tar.TypeLink, tar.TypeSymlink} {
		raw := tarOf(t, []member{
			{name: "a.bin", typ: tar.TypeReg, mode: 0o644, data: "a"},
			{name: "b.bin", typ: typ, mode: 0o644, link: "a.bin"},
		})
		st, desc := pushModel(t, fixtureLayer{mediaType: MediaType(KindWeight, PackingTar), blob: raw})
		a, err := Fetch(t.Context(), st, desc)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Build(t.Context(), st, a)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `"b.bin" is a link`) {
			t.Errorf("tar type %q: Build = %v, want a refusal naming b.bin as a link", typ, err)
		}
	}
}

// TestLegacyCNAI: a model in the pre-CNCF names (application/vnd.cnai.model.*
// media types, org.cnai.model.filepath and file metadata) opens as
// ModelPack's Format like a CNCF one: every file, with the mode its metadata
// gives (group write kept).
func TestLegacyCNAI(t *testing.T) {
	ctx := t.Context()
	st := memory.New()
	push := func(mt string, b []byte, annot map[string]string) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b)), Annotations: annot}
		if err := st.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	weights := strings.Repeat("w", 3000)
	code := tarOf(t, []member{{name: "./", typ: tar.TypeDir, mode: 0o755}, {name: "./run.py", typ: tar.TypeReg, mode: 0o775, data: "print()\n"}})
	m := ocispec.Manifest{
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: LegacyArtifactType,
		Config:       push(LegacyMediaTypeConfig, []byte(`{"descriptor":{"name":"legacy"},"modelfs":{"type":"layers","diffIds":[]},"config":{}}`), nil),
		Layers: []ocispec.Descriptor{
			push("application/vnd.cnai.model.weight.v1.raw", []byte(weights), map[string]string{
				LegacyAnnotationFilepath:     "model.safetensors",
				LegacyAnnotationFileMetadata: `{"name":"model.safetensors","mode":436,"size":3000,"typeflag":0}`,
			}),
			push("application/vnd.cnai.model.code.v1.tar", code, map[string]string{LegacyAnnotationFilepath: "run.py"}),
		},
	}
	m.SchemaVersion = 2
	b, _ := json.Marshal(m)
	desc := push(ocispec.MediaTypeImageManifest, b, nil)
	v, err := layout.OpenWith(ctx, st, desc, layout.OpenOptions{Foreign: []layout.ForeignFormat{Format}})
	if err != nil {
		t.Fatalf("a pre-CNCF model: %v", err)
	}
	got := map[string]uint32{}
	for _, f := range v.Index.AllFiles() {
		if f.Type == layout.TypeFile {
			got[f.Path] = f.Mode
		}
	}
	if len(got) != 2 || got["model.safetensors"] != 0o664 || got["run.py"] != 0o775 {
		t.Errorf("files %v, want model.safetensors 0664 (436) and run.py 0775 (509)", got)
	}
}
