package layout

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/errdef"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/tensorheader"
)

// cutAll returns the chunk lengths the Cutter gives for data.
func cutAll(p Params, data []byte) []int {
	c := NewCutter(p)
	var out []int
	cur := 0
	for len(data) > 0 {
		n, end := c.Next(data)
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
	ts := []tensorheader.Tensor{{Name: "a", Begin: 50, End: 60}, {Name: "b", Begin: 60, End: 155}, {Name: "c", Begin: 155, End: 1155}, {Name: "d", Begin: 1155, End: 1175}}
	got := tensorBoundaries(50, ts, 1175, p)
	want := []int64{50, 155, 555, 955, 1155}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("cuts %v, want %v", got, want)
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

// pushed stores a version of files (their parents as directories, a name
// ending in "@" a symlink to its bytes), each
// file cut with p into chunks of its own, and opens it: a version made
// with the format's API alone (the push engine imports this package).
func pushed(t *testing.T, p Params, files map[string][]byte) (content.Storage, *Version) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	kinds := map[string]string{}
	targets := map[string]string{}
	for f := range files {
		kinds[f] = TypeFile
		if l, ok := strings.CutSuffix(f, "@"); ok { // a symlink, as testutil.WriteVolumeTree
			delete(kinds, f)
			kinds[l], targets[l] = TypeSymlink, string(files[f])
		}
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			kinds[d] = TypeDir
		}
	}
	paths := slices.Sorted(maps.Keys(kinds))
	ib := NewIndexBuilder(FormatVersion, p, len(paths))
	for _, q := range paths {
		f := File{Path: q, Type: kinds[q], Mode: 0o755}
		if f.Type == TypeSymlink {
			f.Mode, f.Target = 0o777, targets[q]
		}
		if f.Type == TypeFile {
			data := files[q]
			f.Mode, f.Size, f.Digest = 0o644, int64(len(data)), digest.FromBytes(data)
			var offs []int64
			if err := CutFile(ctx, bytes.NewReader(data), q, f.Size, p, func(off int64, _ digest.Digest) { offs = append(offs, off) }); err != nil {
				t.Fatal(err)
			}
			for k, off := range offs {
				end := f.Size
				if k+1 < len(offs) {
					end = offs[k+1]
				}
				c := Chunk{Digest: digest.FromBytes(data[off:end]), Size: end - off}
				if c.Size >= EdgeMinChunk {
					c.Head, c.Tail = digest.FromBytes(data[off:off+EdgeBytes]), digest.FromBytes(data[end-EdgeBytes:end])
				}
				n, err := ib.ChunkNumber(c)
				if err != nil {
					t.Fatal(err)
				}
				if err := store.Push(ctx, c.Descriptor(), bytes.NewReader(data[off:end])); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
					t.Fatal(err)
				}
				f.Extents = append(f.Extents, Extent{Chunk: n, Length: end - off})
			}
		}
		if err := ib.Add(&f); err != nil {
			t.Fatal(err)
		}
	}
	x := ib.Index()
	if err := x.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, store); err != nil {
		t.Fatal(err)
	}
	v, err := Open(ctx, store, s.Root.Desc)
	if err != nil {
		t.Fatal(err)
	}
	return store, v
}
