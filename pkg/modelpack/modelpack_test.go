package modelpack

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/internal/verify"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// readFile reads the file at p of v through its chunk source, verifying
// every chunk against its digest.
func readFile(t *testing.T, v *layout.Version, src content.Fetcher, p string) []byte {
	t.Helper()
	i, ok := v.Index.Find(p)
	if !ok {
		t.Fatalf("%s: not in the index", p)
	}
	cs := v.ChunkSource(src)
	var out []byte
	for k := range v.Index.NumExtents(i) {
		x := v.Index.Extent(i, k)
		b, err := verify.Fetch(context.Background(), cs, "chunk", v.Chunk(x.Chunk))
		if err != nil {
			t.Fatalf("%s: chunk %d: %v", p, x.Chunk, err)
		}
		out = append(out, b[x.Offset:x.Offset+x.Length]...)
	}
	return out
}

// TestOpenEveryPacking opens a model with raw, tar (PAX names), tar+gzip
// and tar+zstd layers of every kind through layout.OpenWith and reads every
// file back, byte for byte, through the version's chunk source.
func TestOpenEveryPacking(t *testing.T) {
	long := strings.Repeat("d", 120) + "/tokenizer.json" // needs a PAX path
	files := map[string][]byte{
		"model.safetensors":      safetensors(1, 3<<20, 5<<20, 100),
		"README.md":              []byte("# fixture\n"),
		"shard/a.bin":            testutil.RandBytes(2, 70_000),
		long:                     testutil.RandBytes(3, 5000),
		"config.json":            []byte(`{"architectures":["X"]}`),
		"code/run.py":            []byte("print(1)\n"),
		"empty":                  nil,
		"data/pax-ütf8-name.txt": []byte("u"),
	}
	st, desc := pushModel(t,
		rawLayer(KindWeight, "model.safetensors", files["model.safetensors"]),
		rawLayer(KindDoc, "README.md", files["README.md"]),
		tarLayer(t, KindWeight, PackingTar, tarMember{name: "shard/a.bin", data: files["shard/a.bin"]}, tarMember{name: long, data: files[long]}),
		tarLayer(t, KindWeightConfig, PackingTarGzip, tarMember{name: "config.json", data: files["config.json"]}, tarMember{name: "empty"}),
		tarLayer(t, KindCode, PackingTarZstd, tarMember{name: "code/run.py", data: files["code/run.py"]}),
		tarLayer(t, KindDataset, PackingTar, tarMember{name: "data/pax-ütf8-name.txt", data: files["data/pax-ütf8-name.txt"], pax: map[string]string{"comment": "x"}}),
	)
	v, err := layout.OpenWith(context.Background(), st, desc, layout.OpenOptions{Foreign: []layout.ForeignFormat{Format}})
	if err != nil {
		t.Fatal(err)
	}
	if v.Foreign != ArtifactType || v.Root.Digest != desc.Digest {
		t.Fatalf("opened as %q %s", v.Foreign, v.Root.Digest)
	}
	for p, want := range files {
		if got := readFile(t, v, st, p); !bytes.Equal(got, want) {
			t.Errorf("%s: read %d bytes, want %d", p, len(got), len(want))
		}
	}
	if i, ok := v.Index.Find("shard"); !ok || v.Index.File(i).Type != layout.TypeDir {
		t.Errorf("parent directory shard missing")
	}
	// The safetensors file is cut at its tensors: the 5 MiB tensor is one chunk.
	i, _ := v.Index.Find("model.safetensors")
	var sizes []int64
	for k := range v.Index.NumExtents(i) {
		sizes = append(sizes, v.Index.Extent(i, k).Length)
	}
	if !contains(sizes, 5<<20) || !contains(sizes, 3<<20) {
		t.Errorf("safetensors chunks %v: want one of 3 MiB and one of 5 MiB", sizes)
	}
}

// TestLazyFlags: files of raw and tar layers are lazy, of compressed ones not.
func TestLazyFlags(t *testing.T) {
	st, desc := pushModel(t,
		rawLayer(KindWeight, "w.bin", []byte("w")),
		tarLayer(t, KindDoc, PackingTar, tarMember{name: "doc.md", data: []byte("d")}),
		tarLayer(t, KindCode, PackingTarGzip, tarMember{name: "c.py", data: []byte("c")}),
	)
	a, err := Fetch(context.Background(), st, desc)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Build(context.Background(), st, a)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range m.Files {
		got[f.Path] = f.Lazy
	}
	if !got["w.bin"] || !got["doc.md"] || got["c.py"] {
		t.Fatalf("lazy flags %v", got)
	}
}

// rangeStore is a memory store that serves ranges and counts requests.
type rangeStore struct {
	content.Storage
	mu     sync.Mutex
	ranges [][2]int64
	whole  int
}

func (r *rangeStore) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	r.mu.Lock()
	r.whole++
	r.mu.Unlock()
	return r.Storage.Fetch(ctx, d)
}

func (r *rangeStore) FetchRange(ctx context.Context, d ocispec.Descriptor, off, n int64) (io.ReadCloser, error) {
	b, err := content.FetchAll(ctx, r.Storage, d)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.ranges = append(r.ranges, [2]int64{off, n})
	r.mu.Unlock()
	return io.NopCloser(bytes.NewReader(b[off : off+n])), nil
}

// TestTensorIsOneRange: a tensor in the middle of a raw layer, and a file
// inside an uncompressed tar, are each read with one range request of
// exactly their bytes; a compressed layer's file streams the layer.
func TestTensorIsOneRange(t *testing.T) {
	w := safetensors(4, 2<<20, 6<<20, 2<<20)
	inTar := testutil.RandBytes(5, 3<<20)
	mem, desc := pushModel(t,
		rawLayer(KindWeight, "w.safetensors", w),
		tarLayer(t, KindWeight, PackingTar, tarMember{name: "t.bin", data: inTar}),
		tarLayer(t, KindDoc, PackingTarGzip, tarMember{name: "z.md", data: []byte("zz")}),
	)
	st := &rangeStore{Storage: mem}
	v, err := layout.OpenWith(context.Background(), st, desc, layout.OpenOptions{Foreign: []layout.ForeignFormat{Format}})
	if err != nil {
		t.Fatal(err)
	}
	st.ranges, st.whole = nil, 0
	i, _ := v.Index.Find("w.safetensors")
	x := v.Index.Extent(i, 2) // header, t000, t001: the 6 MiB tensor
	if x.Length != 6<<20 {
		t.Fatalf("extent 2 is %d bytes, want the 6 MiB tensor", x.Length)
	}
	if _, err := verify.Fetch(context.Background(), v.ChunkSource(st), "chunk", v.Chunk(x.Chunk)); err != nil {
		t.Fatal(err)
	}
	hdr := v.Index.Extent(i, 0).Length
	if len(st.ranges) != 1 || st.whole != 0 || st.ranges[0] != [2]int64{hdr + 2<<20, 6 << 20} {
		t.Fatalf("tensor read as ranges %v and %d whole fetches; want one range at %d of 6 MiB", st.ranges, st.whole, hdr+2<<20)
	}
	st.ranges = nil
	if got := readFile(t, v, st, "t.bin"); !bytes.Equal(got, inTar) || len(st.ranges) != 1 || st.ranges[0][0] != 512 {
		t.Fatalf("tar member read as ranges %v (want one at 512)", st.ranges)
	}
	st.ranges, st.whole = nil, 0
	if got := readFile(t, v, st, "z.md"); string(got) != "zz" || len(st.ranges) != 0 || st.whole != 1 {
		t.Fatalf("gzip member read with %d ranges, %d whole fetches", len(st.ranges), st.whole)
	}
}

// TestEdges: chunks of at least layout.EdgeMinChunk bytes carry the
// digests of their first and last layout.EdgeBytes, as a push gives them.
func TestEdges(t *testing.T) {
	w := safetensors(6, 3<<20+12345, 2<<20)
	st, desc := pushModel(t, rawLayer(KindWeight, "w.safetensors", w))
	v, err := layout.OpenWith(context.Background(), st, desc, layout.OpenOptions{Foreign: []layout.ForeignFormat{Format}})
	if err != nil {
		t.Fatal(err)
	}
	i, _ := v.Index.Find("w.safetensors")
	var off int64
	edges := 0
	for k := range v.Index.NumExtents(i) {
		x := v.Index.Extent(i, k)
		c := v.Index.AllChunks()[x.Chunk]
		b := w[off : off+x.Length]
		off += x.Length
		if c.Size < layout.EdgeMinChunk {
			if c.HasEdges() {
				t.Errorf("chunk of %d bytes has edges", c.Size)
			}
			continue
		}
		edges++
		if c.Head != digest.FromBytes(b[:layout.EdgeBytes]) || c.Tail != digest.FromBytes(b[len(b)-layout.EdgeBytes:]) {
			t.Errorf("chunk %d of %d bytes: wrong edge digests", k, c.Size)
		}
	}
	if edges != 2 {
		t.Fatalf("%d chunks with edges, want the two tensors", edges)
	}
}
