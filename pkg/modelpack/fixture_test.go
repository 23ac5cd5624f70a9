package modelpack

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/internal/testutil"
)

// A fixture is a model built from the spec in a test: its layers, each
// with the files it holds.
type fixtureLayer struct {
	mediaType string
	blob      []byte
	annot     map[string]string
}

// rawLayer is a .raw layer of one file at p.
func rawLayer(k Kind, p string, data []byte) fixtureLayer {
	return fixtureLayer{mediaType: MediaType(k, PackingRaw), blob: data, annot: map[string]string{AnnotationFilepath: p}}
}

// tarEntry is one tar member of a fixture.
type tarMember struct {
	name string
	data []byte
	typ  byte   // 0: regular file
	link string // for links
	pax  map[string]string
}

// tarBytes writes the members as a tar (PAX where a member asks for it).
func tarBytes(t testing.TB, ms ...tarMember) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range ms {
		h := &tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}
		if m.typ != 0 {
			h.Typeflag, h.Size, h.Linkname = m.typ, 0, m.link
		}
		if m.pax != nil {
			h.PAXRecords, h.Format = m.pax, tar.FormatPAX
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(m.data); err != nil && m.typ == 0 {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tarLayer is a tar layer (packing p) of the members.
func tarLayer(t testing.TB, k Kind, p Packing, ms ...tarMember) fixtureLayer {
	b := tarBytes(t, ms...)
	switch p {
	case PackingTarGzip:
		var z bytes.Buffer
		zw := gzip.NewWriter(&z)
		zw.Write(b)
		zw.Close()
		b = z.Bytes()
	case PackingTarZstd:
		zw, _ := zstd.NewWriter(nil)
		b = zw.EncodeAll(b, nil)
	}
	return fixtureLayer{mediaType: MediaType(k, p), blob: b, annot: map[string]string{AnnotationFilepath: ms[0].name}}
}

// safetensors returns a safetensors file of U8 tensors of the given sizes,
// each filled from seed.
func safetensors(seed uint64, sizes ...int) []byte {
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
	out := make([]byte, 8, 8+len(h)+off)
	binary.LittleEndian.PutUint64(out, uint64(len(h)))
	out = append(out, h...)
	return append(out, testutil.RandBytes(seed, off)...)
}

// pushModel stores the layers and a ModelPack manifest of them in a memory
// store and returns the store and the manifest's descriptor.
func pushModel(t testing.TB, layers ...fixtureLayer) (content.Storage, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	st := memory.New()
	push := func(mt string, b []byte, annot map[string]string) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b)), Annotations: annot}
		if ok, _ := st.Exists(ctx, d); !ok {
			if err := st.Push(ctx, d, bytes.NewReader(b)); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	cfg := push(MediaTypeConfig, []byte(`{"descriptor":{"name":"fixture"},"modelfs":{"type":"layers","diffIds":[]},"config":{}}`), nil)
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: ArtifactType, Config: cfg}
	m.SchemaVersion = 2
	for _, l := range layers {
		m.Layers = append(m.Layers, push(l.mediaType, l.blob, l.annot))
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return st, push(ocispec.MediaTypeImageManifest, b, nil)
}
