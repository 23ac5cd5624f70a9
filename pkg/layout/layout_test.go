package layout

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bdnvol/bdnvol/internal/testutil"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content/memory"
)

// cutAll returns the chunk lengths the cutter gives for data.
func cutAll(p Params, data []byte) []int {
	c := newCutter(p)
	var out []int
	cur := 0
	for len(data) > 0 {
		n, end := c.next(data)
		cur += n
		data = data[n:]
		if end {
			out = append(out, cur)
			cur = 0
		}
	}
	if cur > 0 {
		out = append(out, cur)
	}
	return out
}

func TestCutterBoundsAndResync(t *testing.T) {
	p := Params{Min: 16 << 10, Avg: 64 << 10, Max: 256 << 10}
	data := testutil.RandBytes(1, 8<<20)
	sizes := cutAll(p, data)
	total := 0
	for i, s := range sizes {
		total += s
		if s > int(p.Max) || (s < int(p.Min) && i != len(sizes)-1) {
			t.Fatalf("chunk %d has %d bytes, outside [%d,%d]", i, s, p.Min, p.Max)
		}
	}
	if total != len(data) {
		t.Fatalf("chunks cover %d of %d bytes", total, len(data))
	}
	avg := total / len(sizes)
	if avg < int(p.Avg)/2 || avg > int(p.Avg)*2 {
		t.Fatalf("average chunk %d far from %d", avg, p.Avg)
	}
	// Insert 100 bytes in the middle: all but a couple of chunks survive.
	mid := len(data) / 2
	edited := append(append(append([]byte{}, data[:mid]...), testutil.RandBytes(2, 100)...), data[mid:]...)
	set := func(d []byte) map[digest.Digest]bool {
		m := map[digest.Digest]bool{}
		off := 0
		for _, s := range cutAll(p, d) {
			m[digest.FromBytes(d[off:off+s])] = true
			off += s
		}
		return m
	}
	a, b := set(data), set(edited)
	lost := 0
	for d := range a {
		if !b[d] {
			lost++
		}
	}
	if lost > 3 {
		t.Fatalf("an insertion changed %d of %d chunks", lost, len(a))
	}
}

func TestTensorBoundaries(t *testing.T) {
	p := Params{Min: 100, Avg: 200, Max: 400}
	// header ends at 50; tensors: small 10, small 95, big 1000, small 20
	ts := []Tensor{{"a", 50, 60}, {"b", 60, 155}, {"c", 155, 1155}, {"d", 1155, 1175}}
	got := tensorBoundaries(50, ts, 1175, p)
	want := []int64{50, 155, 555, 955, 1155}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("cuts %v, want %v", got, want)
	}
}

func TestSafetensorsHeader(t *testing.T) {
	hdr := []byte(`{"__metadata__":{"x":"y"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}`)
	size := int64(8 + len(hdr) + 8)
	end, ts, err := ParseSafetensorsHeader(hdr, size)
	if err != nil {
		t.Fatal(err)
	}
	if end != int64(8+len(hdr)) || len(ts) != 2 || ts[0].Name != "a" || ts[1].Begin != end+4 {
		t.Fatalf("got end %d tensors %+v", end, ts)
	}
	for _, bad := range []string{
		`{"a":{"data_offsets":[0,100]}}`,                          // past the end
		`{"a":{"data_offsets":[4,2]}}`,                            // reversed
		`{"a":{"data_offsets":[0,6]},"b":{"data_offsets":[4,8]}}`, // overlap
		`not json`,
	} {
		if _, _, err := ParseSafetensorsHeader([]byte(bad), int64(8+len(bad)+8)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func validIndex() *Index {
	c := Chunk{Digest: digest.FromString("x"), Size: 10}
	return &Index{Version: 1, Chunking: v1Params, Chunks: []Chunk{c}, Files: []File{
		{Path: "d", Type: TypeDir, Mode: 0o755},
		{Path: "d/f", Type: TypeFile, Mode: 0o644, Size: 10, Digest: digest.FromString("f"), Extents: []Extent{{0, 0, 10}}},
		{Path: "d/l", Type: TypeSymlink, Mode: 0o777, Target: "f"},
	}}
}

func TestValidate(t *testing.T) {
	if err := validIndex().Validate(); err != nil {
		t.Fatal(err)
	}
	cases := map[string]func(x *Index){
		"dotdot":          func(x *Index) { x.Files[1].Path = "d/../../f" },
		"absolute":        func(x *Index) { x.Files[1].Path = "/etc/passwd" },
		"nul":             func(x *Index) { x.Files[1].Path = "d/f\x00" },
		"duplicate":       func(x *Index) { x.Files[2].Path = "d/f" },
		"unsorted":        func(x *Index) { x.Files[1], x.Files[2] = x.Files[2], x.Files[1] },
		"no parent":       func(x *Index) { x.Files = x.Files[1:] },
		"symlink out":     func(x *Index) { x.Files[2].Target = "../../etc" },
		"symlink abs":     func(x *Index) { x.Files[2].Target = "/etc" },
		"symlink chain":   func(x *Index) { x.Files[2].Target = "x/../.." },
		"under symlink":   func(x *Index) { x.Files = append(x.Files, File{Path: "d/l/x", Type: TypeDir, Mode: 0o755}) },
		"extent past":     func(x *Index) { x.Files[1].Extents[0] = Extent{0, 5, 10} },
		"missing chunk":   func(x *Index) { x.Files[1].Extents[0] = Extent{1, 0, 10} },
		"short extents":   func(x *Index) { x.Files[1].Size = 11 },
		"mode bits":       func(x *Index) { x.Files[1].Mode = 0o4755 },
		"bad type":        func(x *Index) { x.Files[1].Type = "fifo" },
		"version":         func(x *Index) { x.Version = 3 },
		"dup chunk":       func(x *Index) { x.Chunks = append(x.Chunks, x.Chunks[0]) },
		"huge chunk":      func(x *Index) { x.Chunks[0].Size = MaxChunkBytes + 1 },
		"dir with extent": func(x *Index) { x.Files[0].Extents = []Extent{{0, 0, 1}} },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			x := validIndex()
			mutate(x)
			if err := x.Validate(); !errors.Is(err, ErrInvalidIndex) {
				t.Fatalf("got %v, want ErrInvalidIndex", err)
			}
		})
	}
}

func TestDecodeIndexRoundTrip(t *testing.T) {
	b, err := validIndex().Encode()
	if err != nil {
		t.Fatal(err)
	}
	x, err := DecodeIndex(b)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := x.Encode()
	if !bytes.Equal(b, b2) {
		t.Fatalf("re-encoding changed the index:\n%s\n%s", b, b2)
	}
	if _, err := DecodeIndex(append(b, []byte(`{}`)...)); err == nil {
		t.Fatal("accepted trailing data")
	}
	if _, err := DecodeIndex([]byte(strings.Replace(string(b), `"version":1`, `"version":1,"extra":1`, 1))); err == nil {
		t.Fatal("accepted an unknown field")
	}
}

func TestPushRefusesEscapingSymlink(t *testing.T) {
	src := t.TempDir()
	if err := os.Symlink("/etc/passwd", filepath.Join(src, "evil")); err != nil {
		t.Fatal(err)
	}
	_, err := Push(context.Background(), memory.New(), DirSource(src), PushOptions{})
	if !errors.Is(err, ErrUnsupportedFile) || !strings.Contains(err.Error(), "evil") {
		t.Fatalf("got %v", err)
	}
}

func TestSealSplitsParts(t *testing.T) {
	x := &Index{Version: 1, Chunking: v1Params}
	for i := range 25 {
		x.Chunks = append(x.Chunks, Chunk{Digest: digest.FromString(fmt.Sprint(i)), Size: 1})
		x.Files = append(x.Files, File{Path: fmt.Sprintf("f%02d", i), Type: TypeFile, Mode: 0o644, Size: 1, Digest: digest.FromString("y"), Extents: []Extent{{i, 0, 1}}})
	}
	s, err := Seal(x, 10, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Parts) != 3 || s.Root.Desc.MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Fatalf("%d parts, root %s", len(s.Parts), s.Root.Desc.MediaType)
	}
	var root struct {
		ArtifactType string `json:"artifactType"`
	}
	if err := json.Unmarshal(s.Root.Data, &root); err != nil || root.ArtifactType != ArtifactTypeVolume {
		t.Fatalf("root artifactType %q (%v)", root.ArtifactType, err)
	}
	s2, _ := Seal(x, 10, nil)
	if s2.Root.Desc.Digest != s.Root.Desc.Digest {
		t.Fatal("sealing is not deterministic")
	}
}

// remoteDir is a local directory that claims to be expensive to re-read.
type remoteDir struct{ Source }

func (remoteDir) Remote() bool { return true }

// A 1 TiB volume in 8 MiB chunks seals as an index of parts, every part
// manifest under the registries' 4 MiB limit.
func TestSealTebibyteVolume(t *testing.T) {
	const chunks = 1 << 17 // 1 TiB / 8 MiB
	x := &Index{Version: 1, Chunking: v1Params, Chunks: make([]Chunk, chunks)}
	f := File{Path: "weights.bin", Type: TypeFile, Mode: 0o644, Size: chunks << 23, Digest: digest.FromString("w"), Extents: make([]Extent, chunks)}
	for i := range x.Chunks {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(i))
		x.Chunks[i] = Chunk{Digest: digest.FromBytes(b[:]), Size: 8 << 20}
		f.Extents[i] = Extent{Chunk: i, Length: 8 << 20}
	}
	x.Files = []File{f}
	s, err := Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := (chunks + 1 + DefaultMaxLayers - 1) / DefaultMaxLayers; len(s.Parts) != want {
		t.Fatalf("%d parts, want %d", len(s.Parts), want)
	}
	for _, p := range s.Parts {
		if len(p.Data) >= MaxManifestBytes {
			t.Fatalf("part of %d bytes", len(p.Data))
		}
	}
	store := memory.New()
	ctx := context.Background()
	for _, b := range append(append(s.Blobs, s.Parts...), s.Root) {
		if err := store.Push(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatal(err)
		}
	}
	v, err := Open(ctx, store, s.Root.Desc)
	if err != nil {
		t.Fatal(err)
	}
	if v.NumChunks() != chunks || v.Index.Bytes() != 1<<40 {
		t.Fatalf("opened %d chunks, %d bytes", v.NumChunks(), v.Index.Bytes())
	}
}

// checkEdges asserts that every chunk of the version at root carries edge
// digests exactly when it is large enough, and that they are right.
func checkEdges(t *testing.T, store content.Fetcher, root ocispec.Descriptor) (withEdges int) {
	t.Helper()
	ctx := context.Background()
	v, err := Open(ctx, store, root)
	if err != nil {
		t.Fatal(err)
	}
	for k, c := range v.Index.AllChunks() {
		if (c.Size >= EdgeMinChunk) != c.HasEdges() || (c.Head == "") != (c.Tail == "") {
			t.Fatalf("chunk %d of %d bytes: head %q tail %q", k, c.Size, c.Head, c.Tail)
		}
		if !c.HasEdges() {
			continue
		}
		withEdges++
		b, err := content.FetchAll(ctx, store, v.Chunk(k))
		if err != nil {
			t.Fatal(err)
		}
		if digest.FromBytes(b[:EdgeBytes]) != c.Head || digest.FromBytes(b[len(b)-EdgeBytes:]) != c.Tail {
			t.Fatalf("chunk %d: wrong edge digests", k)
		}
	}
	return withEdges
}

func TestChunkEdges(t *testing.T) {
	ctx := context.Background()
	p := Params{Min: 1 << 20, Avg: 2 << 20, Max: 4 << 20}
	src := t.TempDir()
	// A safetensors file (cuts at tensors, fixed pieces in big ones), a
	// file cut by FastCDC, and small files packed past EdgeMinChunk.
	hdr := []byte(`{"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,5000000]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[5000000,9000123]}}`)
	st := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	st = append(append(st, hdr...), testutil.RandBytes(11, 9000123)...)
	files := map[string][]byte{"m.safetensors": st, "cdc.bin": testutil.RandBytes(12, 9<<20)}
	for i := range 40 {
		files[fmt.Sprintf("small/%02d", i)] = testutil.RandBytes(uint64(200+i), 100<<10)
	}
	testutil.WriteTree(t, src, files)
	store := memory.New()
	res, err := Push(ctx, store, DirSource(src), PushOptions{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	if n := checkEdges(t, store, res.Root); n < 6 {
		t.Fatalf("only %d chunks carry edges", n)
	}
	// A remote source (chunks held in memory) and a push from the stat
	// cache seal the same index.
	remote := memory.New()
	again, err := Push(ctx, remote, remoteDir{DirSource(src)}, PushOptions{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	cache := OpenStatCache(t.TempDir(), src, p)
	first, err := Push(ctx, memory.New(), DirSource(src), PushOptions{Params: p, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	cached, err := Push(ctx, memory.New(), DirSource(src), PushOptions{Params: p, Cache: cache})
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]digest.Digest{"remote": again.Root.Digest, "stat cache": cached.Root.Digest, "first": first.Root.Digest} {
		if d != res.Root.Digest {
			t.Errorf("%s push sealed %s, want %s", name, d, res.Root.Digest)
		}
	}
}

func TestValidateEdges(t *testing.T) {
	big := func() *Index {
		x := validIndex()
		x.Chunks[0].Size = EdgeMinChunk
		x.Files[1].Size = EdgeMinChunk
		x.Files[1].Extents[0].Length = EdgeMinChunk
		x.Chunks[0].Head, x.Chunks[0].Tail = digest.FromString("h"), digest.FromString("t")
		return x
	}
	if err := big().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(x *Index){
		"small chunk": func(x *Index) { x.Chunks[0].Size = EdgeMinChunk - 1; x.Files[1].Size--; x.Files[1].Extents[0].Length-- },
		"head only":   func(x *Index) { x.Chunks[0].Tail = "" },
		"bad digest":  func(x *Index) { x.Chunks[0].Tail = "sha256:1234" },
		"other algo":  func(x *Index) { x.Chunks[0].Head = digest.Digest("sha512:" + strings.Repeat("ab", 64)) },
	} {
		x := big()
		mutate(x)
		if err := x.Validate(); !errors.Is(err, ErrInvalidIndex) {
			t.Errorf("%s: got %v, want ErrInvalidIndex", name, err)
		}
	}
}

// pushed pushes files (as testutil.WriteVolumeTree takes them) and opens the
// version.
func pushed(t *testing.T, p Params, files map[string][]byte) (content.Storage, *Version) {
	t.Helper()
	ctx := context.Background()
	src := t.TempDir()
	testutil.WriteVolumeTree(t, src, files)
	store := memory.New()
	res, err := Push(ctx, store, DirSource(src), PushOptions{Params: p})
	if err != nil {
		t.Fatal(err)
	}
	v, err := Open(ctx, store, res.Root)
	if err != nil {
		t.Fatal(err)
	}
	return store, v
}
