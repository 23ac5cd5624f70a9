package modelpack

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// TestHostile: artifacts that would write outside the target, alias a
// file, hide a link, lie about a size or a digest, or explode when
// decompressed are refused with an error that says which and why.
func TestHostile(t *testing.T) {
	bigClaim := tarBytes(t, tarMember{name: "big.bin", data: []byte("x")})
	// Rewrite the member's size field (octal at 124) to claim 256 KiB.
	copy(bigClaim[124:136], []byte("00001000000\x00"))
	fixChecksum(bigClaim[:512])
	cases := []struct {
		name   string
		layers []fixtureLayer
		want   string
		is     error
	}{
		{"raw traversal", []fixtureLayer{rawLayer(KindWeight, "../etc/passwd", []byte("x"))}, "leaves the model's root", ErrInvalid},
		{"raw absolute", []fixtureLayer{rawLayer(KindWeight, "/etc/passwd", []byte("x"))}, "is absolute", ErrInvalid},
		{"raw reserved", []fixtureLayer{rawLayer(KindWeight, ".bdnvol-x", []byte("x"))}, "reserves", ErrInvalid},
		{"raw no path", []fixtureLayer{{mediaType: "application/octet-stream", blob: []byte("x")}}, "neither a model layer", ErrInvalid},
		{"tar traversal", []fixtureLayer{tarLayer(t, KindWeight, PackingTar, tarMember{name: "a/../../x", data: []byte("x")})}, "leaves the model's root", ErrInvalid},
		{"tar symlink", []fixtureLayer{tarLayer(t, KindWeight, PackingTar, tarMember{name: "l", typ: tar.TypeSymlink, link: "/etc/passwd"})}, "is a link", ErrInvalid},
		{"tar hard link", []fixtureLayer{tarLayer(t, KindWeight, PackingTarGzip, tarMember{name: "h", typ: tar.TypeLink, link: "x"})}, "is a link", ErrInvalid},
		{"tar fifo", []fixtureLayer{tarLayer(t, KindWeight, PackingTar, tarMember{name: "f", typ: tar.TypeFifo})}, "not a regular file", ErrInvalid},
		{"tar duplicate", []fixtureLayer{tarLayer(t, KindWeight, PackingTar, tarMember{name: "d", data: []byte("1")}, tarMember{name: "d", data: []byte("2")})}, "is in layer 0 and layer 0", ErrInvalid},
		{"duplicate across layers", []fixtureLayer{rawLayer(KindWeight, "w", []byte("1")), tarLayer(t, KindDoc, PackingTar, tarMember{name: "./w", data: []byte("2")})}, "is in layer 0 and layer 1", ErrInvalid},
		{"file under a file", []fixtureLayer{rawLayer(KindWeight, "w", []byte("1")), rawLayer(KindWeight, "w/x", []byte("2"))}, "", layout.ErrInvalidIndex},
		{"huge claimed size", []fixtureLayer{{mediaType: MediaTypeWeightTar, blob: bigClaim}}, "claims 262144 bytes, and the layer ends after 1536 of them", ErrInvalid},
		{"PAX path traversal", []fixtureLayer{tarLayer(t, KindWeight, PackingTar, tarMember{name: "../../ü", data: []byte("x"), pax: map[string]string{}})}, "leaves the model's root", ErrInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, desc := pushModel(t, c.layers...)
			_, err := layout.OpenWith(context.Background(), st, desc, layout.OpenOptions{Foreign: []layout.ForeignFormat{Format}})
			if err == nil {
				t.Fatal("opened")
			}
			if !strings.Contains(err.Error(), c.want) || (c.is != nil && !errors.Is(err, c.is)) {
				t.Fatalf("error %q: want %q wrapping %v", err, c.want, c.is)
			}
		})
	}
}

// fixChecksum recomputes a tar header block's checksum.
func fixChecksum(h []byte) {
	copy(h[148:156], "        ")
	var sum int
	for _, b := range h {
		sum += int(b)
	}
	copy(h[148:156], []byte(strings.Repeat("0", 6-len(itoa8(sum)))+itoa8(sum)+"\x00 "))
}

func itoa8(n int) string {
	s := ""
	for n > 0 {
		s = string(rune('0'+n%8)) + s
		n /= 8
	}
	return s
}

// TestLayerMismatch: a layer whose bytes are not its digest's fails the
// open, named, and wraps the verification error.
func TestLayerMismatch(t *testing.T) {
	st, desc := pushModel(t, rawLayer(KindWeight, "w.bin", []byte("real bytes")))
	a, err := Fetch(context.Background(), st, desc)
	if err != nil {
		t.Fatal(err)
	}
	real := a.Layers[0].Desc
	a.Layers[0].Desc.Digest = digest.FromString("other bytes")
	_, err = Build(context.Background(), lying{st, a.Layers[0].Desc, real}, a)
	if !errors.Is(err, verify.ErrDigestMismatch) || !strings.Contains(err.Error(), "layer 0") {
		t.Fatalf("error %v: want a digest mismatch of layer 0", err)
	}
}

// TestNotModel: a manifest with another media type is not read as a model.
func TestNotModel(t *testing.T) {
	b, _ := json.Marshal(ocispec.Index{MediaType: ocispec.MediaTypeImageIndex})
	_, err := Parse(ocispec.Descriptor{Digest: digest.FromBytes(b)}, b)
	if !errors.Is(err, ErrNotModel) {
		t.Fatalf("error %v, want ErrNotModel", err)
	}
}

// lying serves the blob real when asked for fake.
type lying struct {
	content.Storage
	fake, real ocispec.Descriptor
}

func (l lying) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	if d.Digest == l.fake.Digest {
		d = l.real
	}
	return l.Storage.Fetch(ctx, d)
}

// TestCheckTarEntryRefusesSparseMembers: a PAX sparse member's bytes in
// the layer are not the file's, so it is refused like a link.
func TestCheckTarEntryRefusesSparseMembers(t *testing.T) {
	h := &tar.Header{Name: "w.bin", Typeflag: tar.TypeReg, Size: 10, PAXRecords: map[string]string{"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}}
	if _, err := tarEntry(h); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "sparse") {
		t.Fatalf("CheckTarEntry of a sparse member: %v", err)
	}
	h.PAXRecords = map[string]string{"path": "w.bin"}
	if p, err := tarEntry(h); err != nil || p != "w.bin" {
		t.Fatalf("CheckTarEntry of a regular member: %q, %v", p, err)
	}
}
