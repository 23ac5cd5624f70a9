package warmstate

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/oci"
)

// treeOf maps each regular file under dir to its bytes.
func treeOf(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A vLLM cache exported as a compat image and imported again is the same
// tree, with its key; exporting it twice gives one digest.
func TestMCVRoundTrip(t *testing.T) {
	for _, kind := range []string{"tag-schema", "layout"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			tg := openTarget(t, kind)
			src := t.TempDir()
			testutil.WriteTree(t, src, map[string][]byte{
				"torch_compile_cache/abc123/rank_0_0/backbone/cache_key_factors.json":                []byte(`{"env":{}}`),
				"torch_compile_cache/abc123/rank_0_0/backbone/artifact_compile_range_1_8_subgraph_0": testutil.RandBytes(3, 300<<10),
				"torch_compile_cache/abc123/rank_1_0/backbone/vllm_compile_cache.py":                 []byte("{}"),
				"modelinfos/x.json": []byte("{}"),
			})
			key := mustKey(t, "engine=vllm,cc=9.0,tp=2")
			d1, err := ExportMCV(ctx, tg, src, MCVTypeVLLM, key)
			if err != nil {
				t.Fatal(err)
			}
			d2, err := ExportMCV(ctx, tg, src, MCVTypeVLLM, key)
			if err != nil || d2.Digest != d1.Digest {
				t.Fatalf("second export: %s, %v; first %s", d2.Digest, err, d1.Digest)
			}
			dst := filepath.Join(t.TempDir(), "out")
			img, err := ImportMCV(ctx, tg, d1, dst, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			if img.Type != MCVTypeVLLM || !img.Key.Equal(key) || img.Labels["cache.vllm.image/entry-count"] != "1" {
				t.Fatalf("imported: %+v", img)
			}
			want, got := treeOf(t, src), treeOf(t, dst)
			if len(want) != len(got) {
				t.Fatalf("files: %d, want %d", len(got), len(want))
			}
			for p, b := range want {
				if got[p] != b {
					t.Fatalf("%s differs", p)
				}
			}
			if img.Labels["cache.vllm.image/cache-size-bytes"] != strconv.FormatInt(img.Bytes, 10) {
				t.Fatalf("size label %s, %d bytes", img.Labels["cache.vllm.image/cache-size-bytes"], img.Bytes)
			}
		})
	}
}

type entry struct {
	h    tar.Header
	body string
}

// pushImage stores a one-layer image built as other tools build it (a
// Docker layer type, ./ names, owners and times) and returns its manifest.
func pushImage(t *testing.T, tg oci.Target, es []entry, labels map[string]string) ocispec.Descriptor {
	t.Helper()
	ctx := context.Background()
	var raw, zb bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range es {
		h := e.h
		h.Size = int64(len(e.body))
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		h.Uid, h.Gid = 1000, 1000
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	gz := gzip.NewWriter(&zb)
	gz.Write(raw.Bytes())
	gz.Close()
	layer := content.NewDescriptorFromBytes(MediaTypeDockerLayer, zb.Bytes())
	body := zb.Bytes()
	if err := pushBytes(ctx, tg, layer, body); err != nil {
		t.Fatal(err)
	}
	cb, _ := json.Marshal(ocispec.Image{Platform: ocispec.Platform{OS: "linux", Architecture: "amd64"},
		Config: ocispec.ImageConfig{Labels: labels}, RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(raw.Bytes())}}})
	cd := content.NewDescriptorFromBytes(ocispec.MediaTypeImageConfig, cb)
	if err := pushBytes(ctx, tg, cd, cb); err != nil {
		t.Fatal(err)
	}
	cd.Data = nil
	mb, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: cd, Layers: []ocispec.Descriptor{layer}})
	md := content.NewDescriptorFromBytes(ocispec.MediaTypeImageManifest, mb)
	if err := pushBytes(ctx, tg, md, mb); err != nil {
		t.Fatal(err)
	}
	return md
}

func reg(name, body string) entry {
	return entry{h: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644}, body: body}
}

// An image built by other tools (a Triton cache, ./ names, a Docker layer
// type, no bdnvol key) imports; hostile or damaged ones are refused.
func TestMCVImport(t *testing.T) {
	ctx := context.Background()
	tg := openTarget(t, "tag-schema")
	triton := map[string]string{"cache.triton.image/entry-count": "1", "cache.triton.image/cache-size-bytes": "11"}
	d := pushImage(t, tg, []entry{
		{h: tar.Header{Typeflag: tar.TypeDir, Name: "./io.triton.cache/", Mode: 0o755}},
		reg("./io.triton.cache/K3Z/add_kernel.cubin", "cubin bytes"),
		reg("./io.triton.manifest/manifest.json", "{}"),
	}, triton)
	dst := filepath.Join(t.TempDir(), "out")
	img, err := ImportMCV(ctx, tg, d, dst, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if img.Type != MCVTypeTriton || img.Key != nil || img.Files != 1 {
		t.Fatalf("imported %+v", img)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "K3Z", "add_kernel.cubin")); string(b) != "cubin bytes" {
		t.Fatalf("kernel: %q", b)
	}
	for name, c := range map[string]struct {
		es     []entry
		labels map[string]string
		max    int64
	}{
		"climbs out": {es: []entry{reg("io.triton.cache/../../escape", "x")}, labels: triton},
		"symlink":    {es: []entry{{h: tar.Header{Typeflag: tar.TypeSymlink, Name: "io.triton.cache/l", Linkname: "/etc"}}}, labels: triton},
		"size label": {es: []entry{reg("io.triton.cache/a", "short")}, labels: triton},
		"too large":  {es: []entry{reg("io.triton.cache/a", "cubin bytes")}, labels: triton, max: 4},
		"no labels":  {es: []entry{reg("io.triton.cache/a", "x")}},
	} {
		t.Run(name, func(t *testing.T) {
			d := pushImage(t, tg, c.es, c.labels)
			max := c.max
			if max == 0 {
				max = 1 << 20
			}
			out := filepath.Join(t.TempDir(), "out")
			_, err := ImportMCV(ctx, tg, d, out, max)
			if err == nil {
				t.Fatal("imported")
			}
			if !errors.Is(err, ErrMCV) {
				t.Fatalf("%v, want ErrMCV", err)
			}
			if _, serr := os.Stat(filepath.Join(filepath.Dir(out), "escape")); serr == nil {
				t.Fatal("a file was written outside the directory")
			}
		})
	}
}

// A layer whose stored bytes no longer match its digest is refused, and
// nothing it held is taken.
func TestMCVImportCorruptLayer(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "repo")
	tg, err := oci.Open(ctx, oci.Ref{Layout: dir}, oci.Options{CreateLayout: true})
	if err != nil {
		t.Fatal(err)
	}
	d := pushImage(t, tg, []entry{reg("io.triton.cache/a", strings.Repeat("kernel ", 1000))},
		map[string]string{"cache.triton.image/entry-count": "1"})
	b, _ := os.ReadFile(filepath.Join(dir, "blobs", "sha256", d.Digest.Encoded()))
	var m ocispec.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	lp := filepath.Join(dir, "blobs", "sha256", m.Layers[0].Digest.Encoded())
	lb, err := os.ReadFile(lp)
	if err != nil {
		t.Fatal(err)
	}
	lb[len(lb)-5] ^= 0xff // the gzip trailer: the tar reads whole, the digest does not match
	if err := os.WriteFile(lp, lb, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ImportMCV(ctx, tg, d, filepath.Join(t.TempDir(), "out"), 1<<20); err == nil {
		t.Fatal("a corrupt layer was imported")
	}
}
