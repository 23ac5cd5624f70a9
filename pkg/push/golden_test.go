package push

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// The golden files pin the format: a small fixed tree, sealed, must give
// exactly the index and manifest bytes under testdata/golden/. Any change
// to walking, chunking, packing, the index encoding or sealing fails
// TestGolden here instead of silently changing every version's digest.
//
// After a deliberate format change, regenerate them and review the diff:
//
//	go test ./pkg/layout -run TestGolden -update
var update = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// goldenParams are small so that the one larger file is cut into several chunks.
var goldenParams = layout.Params{Min: 4 << 10, Avg: 8 << 10, Max: 16 << 10}

// goldenBytes returns n bytes of a fixed sequence; it must never change.
func goldenBytes(seed uint32, n int) []byte {
	b := make([]byte, n)
	x := seed
	for i := range b {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

// goldenSafetensors is a tiny safetensors file: two F32 tensors.
func goldenSafetensors() []byte {
	header := []byte(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}}`)
	var out bytes.Buffer
	binary.Write(&out, binary.LittleEndian, uint64(len(header)))
	out.Write(header)
	out.Write(goldenBytes(7, 32))
	return out.Bytes()
}

// writeGoldenTree writes the fixed tree under dir, with explicit modes so
// that the umask does not matter.
func writeGoldenTree(t *testing.T, dir string) {
	t.Helper()
	files := []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{"README.md", []byte("golden volume\n"), 0o644},
		{"model/weights.safetensors", goldenSafetensors(), 0o644},
		{"model/blob.bin", goldenBytes(1, 40<<10), 0o600},
		{"run.sh", []byte("#!/bin/sh\necho hi\n"), 0o755},
		{"empty", nil, 0o644},
	}
	for _, d := range []string{"model", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.path))
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("model/weights.safetensors", filepath.Join(dir, "latest")); err != nil {
		t.Fatal(err)
	}
	for d, mode := range map[string]os.FileMode{"model": 0o755, "logs": 0o750} {
		if err := os.Chmod(filepath.Join(dir, d), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// compareGolden checks got against testdata/golden/name, or rewrites it
// with -update.
func compareGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (regenerate with: go test ./pkg/layout -run TestGolden -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s changed: the format's encoding differs from the golden file.\n got: %s\nwant: %s\n"+
			"If the change is deliberate, regenerate with: go test ./pkg/layout -run TestGolden -update",
			path, got, want)
	}
}

func fetchBytes(t *testing.T, store content.Fetcher, desc ocispec.Descriptor) []byte {
	t.Helper()
	rc, err := store.Fetch(context.Background(), desc)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestGolden(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	writeGoldenTree(t, src)

	for _, tc := range []struct {
		name      string
		root      string // golden file of the root's bytes
		maxLayers int
		format    int
		prefix    string // of the golden files of the index and parts
	}{
		{"single", "manifest", 0, layout.FormatVersion1, ""},          // one manifest
		{"parts", "parts-root", 3, layout.FormatVersion1, ""},         // an image index of part manifests
		{"v2", "v2-manifest", 0, layout.FormatVersion, "v2-"},         // format version 2, one manifest
		{"v2-parts", "v2-parts-root", 3, layout.FormatVersion, "v2-"}, // format version 2, parts
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := memory.New()
			params := goldenParams
			if tc.format == layout.FormatVersion {
				params.Pack = 2 << 10
			}
			res, err := Push(ctx, store, DirSource(src), Options{Params: params, MaxLayers: tc.maxLayers, FormatVersion: tc.format})
			if err != nil {
				t.Fatal(err)
			}
			// The tree must exercise every kind of entry and several chunks.
			kinds := map[string]int{}
			for _, f := range res.Index.AllFiles() {
				kinds[f.Type]++
			}
			if kinds[layout.TypeFile] != 5 || kinds[layout.TypeDir] != 2 || kinds[layout.TypeSymlink] != 1 || res.Chunks < 3 {
				t.Fatalf("the golden tree sealed to %v entries by type and %d chunks", kinds, res.Chunks)
			}

			ib, err := res.Index.Encode()
			if err != nil {
				t.Fatal(err)
			}
			if tc.format == layout.FormatVersion1 {
				compareGolden(t, "index.json", ib)
			} else {
				// The index blobs are the layers before the first chunk.
				s, err := layout.Seal(res.Index, tc.maxLayers, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(s.Blobs) != 3 {
					t.Fatalf("the golden tree sealed to %d metadata blobs, want a top-level index, one piece and the config", len(s.Blobs))
				}
				compareGolden(t, "v2-index.json", s.Blobs[0].Data)
				compareGolden(t, "v2-piece-0.json", s.Blobs[1].Data)
			}
			compareGolden(t, tc.root+".json", res.RootBytes)
			compareGolden(t, tc.root+".digest", []byte(res.Root.Digest.String()+"\n"))

			// What the store holds is those bytes, and reads back as the tree.
			v, err := layout.Open(ctx, store, res.Root)
			if err != nil {
				t.Fatal(err)
			}
			if got := fetchBytes(t, store, res.Root); !bytes.Equal(got, res.RootBytes) {
				t.Fatal("stored root differs from the pushed root bytes")
			}
			if got, err := v.Index.Encode(); err != nil || !bytes.Equal(got, ib) {
				t.Fatalf("index read back re-encodes differently (%v)", err)
			}
			if tc.maxLayers > 0 {
				var idx ocispec.Index
				if err := json.Unmarshal(res.RootBytes, &idx); err != nil {
					t.Fatal(err)
				}
				for i, m := range idx.Manifests {
					compareGolden(t, fmt.Sprintf("%sparts-manifest-%d.json", tc.prefix, i), fetchBytes(t, store, m))
				}
			}
		})
	}
}
