package source

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	"github.com/klauspost/compress/zstd"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/pkg/modelpack"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/push"
)

// randomBytes returns n bytes that do not compress.
func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// tarOf writes the files into an uncompressed tar, in the order given.
func tarOf(t *testing.T, names []string, files map[string][]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(files[n])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// ociLayoutModel stores a ModelPack manifest of the layers (media type,
// blob, file path) in a new OCI layout under tag v1 and returns the
// layout's directory and the source reference.
func ociLayoutModel(t *testing.T, layers ...[3]string) (string, string) {
	t.Helper()
	return ociLayoutManifest(t, modelpack.ArtifactType, modelpack.MediaTypeConfig, layers...)
}

// ociLayoutManifest is ociLayoutModel with the manifest's artifact type
// and config media type given.
func ociLayoutManifest(t *testing.T, artifactType, configType string, layers ...[3]string) (string, string) {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "layout")
	ref, err := oci.ParseRef("oci:" + dir + ":v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	put := func(mt string, b []byte, ann map[string]string) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b)), Annotations: ann}
		if err := tg.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, ArtifactType: artifactType,
		Config: put(configType, []byte(`{}`), nil)}
	m.SchemaVersion = 2
	for _, l := range layers {
		m.Layers = append(m.Layers, put(l[0], []byte(l[1]), map[string]string{modelpack.AnnotationFilepath: l[2]}))
	}
	b, _ := json.Marshal(m)
	md := put(ocispec.MediaTypeImageManifest, b, nil)
	if err := tg.Tag(ctx, md, "v1"); err != nil {
		t.Fatal(err)
	}
	return dir, "oci:" + dir + ":v1"
}

// TestOCISourceTarReadOutOfOrder imports a tar layer (too large to be
// kept in memory) whose files the push packs in another order than the
// tar's (small files, in path order): the layer's hash is completed by
// streaming its rest before Verify passes, and the index holds the files
// byte for byte.
func TestOCISourceTarReadOutOfOrder(t *testing.T) {
	files := map[string][]byte{
		"z.bin":   bytes.Repeat([]byte("z"), 100_000),
		"a.bin":   []byte("first by path, after z.bin in the tar"),
		"big.bin": randomBytes(t, 5<<20),
		"m.raw":   bytes.Repeat([]byte("m"), 600_000),
	}
	tb := tarOf(t, []string{"z.bin", "a.bin", "big.bin"}, files)
	_, ref := ociLayoutModel(t,
		[3]string{modelpack.MediaTypeWeightTar, string(tb), "."},
		[3]string{modelpack.MediaTypeWeightRaw, string(files["m.raw"]), "m.raw"})
	src, err := Open(context.Background(), ref, Options{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := pushSource(t, src)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(context.Background(), src, res.Index); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, res.Index, files)
	if src.Revision() == "" || src.String() != ref+"@"+src.Revision() {
		t.Errorf("source %s at revision %q", src, src.Revision())
	}
}

// TestOCISourceCorruptTarFileFails edits one byte inside a file of a tar
// layer of a layout (the tar headers intact): the import fails with
// ErrDigestMismatch, by the push or at Verify, never silently.
func TestOCISourceCorruptTarFileFails(t *testing.T) {
	files := map[string][]byte{"w.bin": randomBytes(t, 5<<20), "c.json": []byte(`{"x":1}`)}
	tb := tarOf(t, []string{"c.json", "w.bin"}, files)
	dir, ref := ociLayoutModel(t, [3]string{modelpack.MediaTypeWeightTar, string(tb), "."})
	blob := filepath.Join(dir, "blobs", "sha256", digest.FromBytes(tb).Encoded())
	bad := append([]byte(nil), tb...)
	bad[len(bad)-2048-1000] ^= 1 // inside w.bin, the tar's last member
	if err := os.WriteFile(blob, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := Open(context.Background(), ref, Options{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := pushSource(t, src)
	if err == nil {
		err = Verify(context.Background(), src, res.Index)
	}
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("import of a corrupt tar layer: %v, want ErrDigestMismatch", err)
	}
}

// TestOCISourceImageWithCompressedLayers imports a plain OCI image (no
// artifact type, an image config) whose layers are an uncompressed tar, a
// gzip tar and a zstd tar: every file is in the index byte for byte, and
// Verify passes.
func TestOCISourceImageWithCompressedLayers(t *testing.T) {
	files := map[string][]byte{
		"models/w.safetensors": bytes.Repeat([]byte("w"), 400_000),
		"models/config.json":   []byte(`{"a":1}`),
		"code/run.py":          []byte("print(1)\n"),
		"docs/README.md":       bytes.Repeat([]byte("readme "), 50_000),
		"data/noise.bin":       randomBytes(t, 5<<20), // a zstd layer too large to keep: streamed
		"data/tail.txt":        []byte("after the noise"),
	}
	plain := tarOf(t, []string{"models/w.safetensors"}, files)
	var gz, zs bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarOf(t, []string{"models/config.json", "code/run.py"}, files))
	zw.Close()
	ze, err := zstd.NewWriter(&zs)
	if err != nil {
		t.Fatal(err)
	}
	ze.Write(tarOf(t, []string{"docs/README.md"}, files))
	ze.Close()
	var big bytes.Buffer
	zb, _ := zstd.NewWriter(&big)
	zb.Write(tarOf(t, []string{"data/tail.txt", "data/noise.bin"}, files))
	zb.Close()
	_, ref := ociLayoutManifest(t, "", ocispec.MediaTypeImageConfig,
		[3]string{ocispec.MediaTypeImageLayer, string(plain), ""},
		[3]string{ocispec.MediaTypeImageLayerGzip, gz.String(), ""},
		[3]string{ocispec.MediaTypeImageLayerZstd, zs.String(), ""},
		[3]string{ocispec.MediaTypeImageLayerZstd, big.String(), ""})
	src, err := Open(context.Background(), ref, Options{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := pushSource(t, src)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(context.Background(), src, res.Index); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, res.Index, files)
}

// TestOCISourceRefs checks which references name OCI sources and that a
// reference without a tag or digest is refused.
func TestOCISourceRefs(t *testing.T) {
	for _, bad := range []string{"oci://", "oci://host/repo", "oci:", "oci://host"} {
		if _, err := Open(context.Background(), bad, Options{}); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Open(%q): %v, want ErrUnsupported", bad, err)
		}
	}
	for _, ok := range []string{"oci://host/repo:v1", "oci://host:5000/a/b@sha256:" + digest.FromString("x").Encoded(), "oci:/tmp/x:v1"} {
		if _, err := Open(context.Background(), ok, Options{}); err != nil {
			t.Errorf("Open(%q): %v", ok, err)
		}
	}
	if got, err := Pin(context.Background(), "hf://org/model", Options{}); err != nil || got != "hf://org/model" {
		t.Errorf("Pin of a Hub source: %q, %v", got, err)
	}
	var _ push.Remote = (*ociSource)(nil)
}

// TestOCISourceRefusesABdnvolVersion: a bdnvol version named as an oci://
// source is refused with the command that copies it.
func TestOCISourceRefusesABdnvolVersion(t *testing.T) {
	_, ref := ociLayoutManifest(t, "", "application/vnd.bdnvol.config.v1+json",
		[3]string{"application/vnd.bdnvol.index.v2+json", "{}", ""})
	src, err := Open(context.Background(), ref, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Walk(context.Background()); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "bdnvol copy") {
		t.Fatalf("Walk of a bdnvol version: %v", err)
	}
}

// blobReads counts the GETs of each blob of a registry and the bytes it
// sent for them.
type blobReads struct {
	h     http.Handler
	mu    sync.Mutex
	gets  map[string]int
	bytes map[string]int64
}

func (b *blobReads) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/") {
		b.h.ServeHTTP(w, r)
		return
	}
	d := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	cw := &countingWriter{ResponseWriter: w}
	b.h.ServeHTTP(cw, r)
	b.mu.Lock()
	b.gets[d]++
	b.bytes[d] += cw.n
	b.mu.Unlock()
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// TestOCISourceCompressedLayerReadOnce: a sync of a gzip tar layer of many
// small files around a large compressible one (too large to keep in
// memory) fetches and decompresses the layer once, at the walk, not once
// more for every file; the files are in the index byte for byte, and an
// excluded file is left out.
func TestOCISourceCompressedLayerReadOnce(t *testing.T) {
	ctx := context.Background()
	// Half the small files come first: kept in memory until zeros.bin
	// overflows the walk's budget, then spooled with the others.
	files := map[string][]byte{"zeros.bin": make([]byte, 80<<20)}
	var names []string
	for i := range 20 {
		if i == 10 {
			names = append(names, "zeros.bin")
		}
		n := fmt.Sprintf("small/%02d.json", i)
		files[n] = []byte(fmt.Sprintf(`{"file":%d}`, i))
		names = append(names, n)
	}
	files["skip.txt"] = []byte("excluded")
	files["empty"] = []byte{}
	names = append(names, "skip.txt", "empty")
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarOf(t, names, files))
	zw.Close()
	delete(files, "skip.txt")

	br := &blobReads{h: ggcr.New(ggcr.Logger(log.New(io.Discard, "", 0))), gets: map[string]int{}, bytes: map[string]int64{}}
	srv := httptest.NewServer(br)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, err := oci.ParseRef(host + "/models/m:v1")
	if err != nil {
		t.Fatal(err)
	}
	tg, err := oci.Open(ctx, ref, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	put := func(mt string, b []byte) ocispec.Descriptor {
		d := ocispec.Descriptor{MediaType: mt, Digest: digest.FromBytes(b), Size: int64(len(b))}
		if err := tg.Push(ctx, d, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		return d
	}
	layer := put(ocispec.MediaTypeImageLayerGzip, gz.Bytes())
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: put(ocispec.MediaTypeImageConfig, []byte(`{}`)), Layers: []ocispec.Descriptor{layer}}
	m.SchemaVersion = 2
	mb, _ := json.Marshal(m)
	if err := tg.Tag(ctx, put(ocispec.MediaTypeImageManifest, mb), "v1"); err != nil {
		t.Fatal(err)
	}
	br.gets, br.bytes = map[string]int{}, map[string]int64{}

	src, err := Open(ctx, "oci://"+host+"/models/m:v1", Options{Exclude: []string{"skip.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	defer Close(src)
	res, err := pushSource(t, src)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(ctx, src, res.Index); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, res.Index, files)
	br.mu.Lock()
	defer br.mu.Unlock()
	if g, n := br.gets[layer.Digest.String()], br.bytes[layer.Digest.String()]; g != 1 || n != layer.Size {
		t.Fatalf("the layer of %d bytes was fetched %d times, %d bytes in all; want once", layer.Size, g, n)
	}
}

// TestOCISourceCompressedLayerOnlyEmptyFilesSelected: of a large gzip
// layer, only an empty file is selected: nothing is spooled, and the
// file is still read (empty).
func TestOCISourceCompressedLayerOnlyEmptyFilesSelected(t *testing.T) {
	files := map[string][]byte{"noise.bin": randomBytes(t, 5<<20), "empty": {}}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarOf(t, []string{"noise.bin", "empty"}, files))
	zw.Close()
	_, ref := ociLayoutManifest(t, "", ocispec.MediaTypeImageConfig, [3]string{ocispec.MediaTypeImageLayerGzip, gz.String(), ""})
	src, err := Open(context.Background(), ref, Options{Exclude: []string{"noise.bin"}})
	if err != nil {
		t.Fatal(err)
	}
	defer Close(src)
	res, err := pushSource(t, src)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(context.Background(), src, res.Index); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, res.Index, map[string][]byte{"empty": {}})
}
