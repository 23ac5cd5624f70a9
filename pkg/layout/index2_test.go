package layout

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"
)

// v2Index is a valid index of version 2 with several directories, files
// sharing a chunk, a file of two chunks and a symlink.
func v2Index() *Index {
	c0 := Chunk{Digest: digest.FromString("c0"), Size: 30}
	c1 := Chunk{Digest: digest.FromString("c1"), Size: 20}
	return &Index{Version: FormatVersion, Chunking: DefaultParams, Chunks: []Chunk{c0, c1}, Files: []File{
		{Path: "a", Type: TypeDir, Mode: 0o755},
		{Path: "a/1", Type: TypeFile, Mode: 0o644, Size: 10, Digest: digest.FromString("1"), Extents: []Extent{{0, 0, 10}}},
		{Path: "a/2", Type: TypeFile, Mode: 0o644, Size: 10, Digest: digest.FromString("2"), Extents: []Extent{{0, 10, 10}}},
		{Path: "b", Type: TypeDir, Mode: 0o755},
		{Path: "b/3", Type: TypeFile, Mode: 0o644, Size: 30, Digest: digest.FromString("3"), Extents: []Extent{{0, 20, 10}, {1, 0, 20}}},
		{Path: "b/l", Type: TypeSymlink, Mode: 0o777, Target: "3"},
		{Path: "c", Type: TypeDir, Mode: 0o700},
	}}
}

// smallPieces cut v2Index into pieces of two or three entries.
var smallPieces = PieceParams{Min: 2, Avg: 2, Max: 3, MaxBytes: 1 << 20}

// storeV2 stores the index blobs, chunks-free manifest and returns its root.
// The top-level index and pieces are given as bytes, so tests can break them.
func storeV2(t *testing.T, top []byte, pieces [][]byte, chunks []Chunk) (*memory.Store, ocispec.Descriptor) {
	t.Helper()
	ctx := context.Background()
	store := memory.New()
	var layers []ocispec.Descriptor
	add := func(mt string, b []byte) {
		bl := blobOf(mt, b)
		if err := store.Push(ctx, bl.Desc, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		layers = append(layers, bl.Desc)
	}
	add(MediaTypeIndexV2, top)
	for _, p := range pieces {
		add(MediaTypePiece, p)
	}
	for _, c := range chunks {
		layers = append(layers, c.Descriptor())
	}
	empty := ocispec.DescriptorEmptyJSON
	empty.Data = nil
	m, err := manifest(ArtifactTypeVolume, empty, layers, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Push(ctx, m.Desc, bytes.NewReader(m.Data)); err != nil {
		t.Fatal(err)
	}
	return store, m.Desc
}

// TestV2RoundTrip: an index sealed in several pieces opens as the same
// index, and DecodeIndexV2 reads the same blobs the same way.
func TestV2RoundTrip(t *testing.T) {
	x := v2Index()
	top, pieces, err := encodeV2(x, smallPieces)
	if err != nil {
		t.Fatal(err)
	}
	if len(pieces) < 3 {
		t.Fatalf("%d pieces, want at least 3", len(pieces))
	}
	store, root := storeV2(t, top, pieces, x.Chunks)
	v, err := Open(context.Background(), store, root)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := x.Encode()
	if got, err := v.Index.Encode(); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read back %s (%v), want %s", got, err, want)
	}
	if v.NumChunks() != 2 || len(v.Meta) != 3+len(pieces) {
		t.Fatalf("%d chunks, %d metadata blobs", v.NumChunks(), len(v.Meta))
	}
	y, err := DecodeIndexV2(top, pieces)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := y.Encode(); !bytes.Equal(got, want) {
		t.Fatalf("DecodeIndexV2 read %s", got)
	}
	// A piece holds its own chunk table: the piece with b/3 lists both
	// chunks, in order of first use, numbered from 0.
	found := false
	for _, p := range pieces {
		if bytes.Contains(p, []byte(`"b/3"`)) {
			found = bytes.Contains(p, []byte(`"extents":[[0,20,10],[1,0,20]]`))
		}
	}
	if !found {
		t.Fatal("the piece of b/3 does not number its chunks locally")
	}
}

// TestV2SameTreeSameDigest: sealing the same contents twice gives the same
// root digest, and a one-entry change leaves the other pieces as they were.
func TestV2SameTreeSameDigest(t *testing.T) {
	a, err := Seal(v2Index(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Seal(v2Index(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Root.Desc.Digest != b.Root.Desc.Digest {
		t.Fatalf("same index sealed to %s and %s", a.Root.Desc.Digest, b.Root.Desc.Digest)
	}
	x := v2Index()
	_, p1, _ := encodeV2(x, smallPieces)
	x.Files[5].Target = "../a/1"
	_, p2, err := encodeV2(x, smallPieces)
	if err != nil {
		t.Fatal(err)
	}
	same := 0
	for i := range min(len(p1), len(p2)) {
		if bytes.Equal(p1[i], p2[i]) {
			same++
		}
	}
	if len(p1) != len(p2) || same != len(p1)-1 {
		t.Fatalf("a changed symlink changed %d of %d pieces", len(p1)-same, len(p1))
	}
}

// TestV2Refused: hostile top-level indexes and pieces are refused with
// ErrInvalidIndex before their entries are used.
func TestV2Refused(t *testing.T) {
	x := v2Index()
	top, pieces, err := encodeV2(x, smallPieces)
	if err != nil {
		t.Fatal(err)
	}
	// retop re-encodes a changed top-level index; the pieces stay as they are.
	retop := func(f func(*topIndex)) []byte {
		tp, err := decodeTop(top)
		if err != nil {
			t.Fatal(err)
		}
		f(tp)
		b, err := canonicalJSON(tp)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// repiece changes piece i and fixes its digest and size in the top.
	repiece := func(i int, f func(string) string) ([]byte, [][]byte) {
		ps := append([][]byte{}, pieces...)
		ps[i] = []byte(f(string(ps[i])))
		return retop(func(tp *topIndex) {
			tp.Pieces[i].Digest, tp.Pieces[i].Size = digest.FromBytes(ps[i]), int64(len(ps[i]))
		}), ps
	}
	swapped := append([][]byte{}, pieces...)
	swapped[0], swapped[1] = swapped[1], swapped[0]
	type tc struct {
		top    []byte
		pieces [][]byte
		chunks []Chunk
	}
	cases := map[string]func() tc{
		"pieces out of order": func() tc {
			return tc{retop(func(tp *topIndex) { tp.Pieces[0], tp.Pieces[1] = tp.Pieces[1], tp.Pieces[0] }), swapped, x.Chunks}
		},
		"layers out of order": func() tc { return tc{top, swapped, x.Chunks} },
		"piece missing":       func() tc { return tc{top, pieces[:len(pieces)-1], x.Chunks} },
		"entries miscounted": func() tc {
			return tc{retop(func(tp *topIndex) { tp.Pieces[0].Entries++; tp.Entries++ }), pieces, x.Chunks}
		},
		"bytes miscounted":  func() tc { return tc{retop(func(tp *topIndex) { tp.Pieces[0].Bytes++; tp.Bytes++ }), pieces, x.Chunks} },
		"chunks miscounted": func() tc { return tc{retop(func(tp *topIndex) { tp.Chunks = 3 }), pieces, x.Chunks} },
		"first path wrong":  func() tc { return tc{retop(func(tp *topIndex) { tp.Pieces[1].First += "0" }), pieces, x.Chunks} },
		"huge piece": func() tc {
			return tc{retop(func(tp *topIndex) { tp.Pieces[0].Size = MaxPieceBytes + 1 }), pieces, x.Chunks}
		},
		"too many entries":  func() tc { return tc{retop(func(tp *topIndex) { tp.Entries = MaxEntries + 1 }), pieces, x.Chunks} },
		"version 1 top":     func() tc { return tc{retop(func(tp *topIndex) { tp.Version = 1 }), pieces, x.Chunks} },
		"top not canonical": func() tc { return tc{append([]byte(" "), top...), pieces, x.Chunks} },
		"top unknown field": func() tc {
			return tc{bytes.Replace(top, []byte(`{"version":2`), []byte(`{"x":1,"version":2`), 1), pieces, x.Chunks}
		},
		"piece not canonical": func() tc {
			t, p := repiece(0, func(s string) string { return strings.Replace(s, `"files":`, `"files": `, 1) })
			return tc{t, p, x.Chunks}
		},
		"unsafe path": func() tc {
			t, p := repiece(0, func(s string) string { return strings.Replace(s, `"a/1"`, `"a/../../1"`, 1) })
			return tc{t, p, x.Chunks}
		},
		"chunk out of range": func() tc {
			t, p := repiece(0, func(s string) string { return strings.Replace(s, `[[0,0,10]]`, `[[7,0,10]]`, 1) })
			return tc{t, p, x.Chunks}
		},
		"extent past chunk": func() tc {
			t, p := repiece(0, func(s string) string { return strings.Replace(s, `[[0,0,10]]`, `[[0,25,10]]`, 1) })
			return tc{t, p, x.Chunks}
		},
		"unused chunk": func() tc {
			extra := `{"digest":"` + digest.FromString("z").String() + `","size":5}`
			t, p := repiece(0, func(s string) string { return strings.Replace(s, `"chunks":[`, `"chunks":[`+extra+`,`, 1) })
			return tc{t, p, x.Chunks}
		},
		"overlapping pieces": func() tc {
			// The second piece starts with an entry the first one already had.
			t2, p := repiece(1, func(s string) string {
				return strings.Replace(s, `"files":[`, `"files":[{"path":"a/2","type":"dir","mode":493},`, 1)
			})
			var tp topIndex
			if err := strictDecode(t2, &tp, "t"); err != nil {
				panic(err)
			}
			tp.Pieces[1].First, tp.Pieces[1].Entries = "a/2", tp.Pieces[1].Entries+1
			tp.Entries++
			b, _ := canonicalJSON(tp)
			return tc{b, p, x.Chunks}
		},
		"chunk differs between pieces": func() tc {
			t, p := repiece(2, func(s string) string {
				return strings.Replace(s, `,"size":30}`, `,"size":31}`, 1)
			})
			return tc{t, p, x.Chunks}
		},
		"chunk layers do not match": func() tc { return tc{top, pieces, []Chunk{x.Chunks[1], x.Chunks[0]}} },
	}
	for name, mk := range cases {
		c := mk()
		store, root := storeV2(t, c.top, c.pieces, c.chunks)
		_, err := Open(context.Background(), store, root)
		if !errors.Is(err, ErrInvalidIndex) {
			t.Errorf("%s: got %v, want ErrInvalidIndex", name, err)
		}
	}
	if _, err := DecodeIndexV2(top, pieces[:1]); !errors.Is(err, ErrInvalidIndex) {
		t.Errorf("DecodeIndexV2 with a piece missing: %v", err)
	}
}

// TestV2ReadsV1: a version sealed in format version 1 still opens, and a
// version 1 blob claiming version 2 is refused.
func TestV2ReadsV1(t *testing.T) {
	x := validIndex()
	s, err := Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Blobs[0].Desc.MediaType != MediaTypeIndex {
		t.Fatalf("a version 1 index sealed as %s", s.Blobs[0].Desc.MediaType)
	}
	store := memory.New()
	ctx := context.Background()
	for _, b := range append(s.Blobs, s.Root) {
		if err := store.Push(ctx, b.Desc, bytes.NewReader(b.Data)); err != nil {
			t.Fatal(err)
		}
	}
	v, err := Open(ctx, store, s.Root.Desc)
	if err != nil {
		t.Fatal(err)
	}
	if v.Index.Version != FormatVersion1 || v.Index.Len() != 3 {
		t.Fatalf("read version %d, %d entries", v.Index.Version, v.Index.Len())
	}
	b, _ := x.Encode()
	if _, err := DecodeIndex(bytes.Replace(b, []byte(`"version":1`), []byte(`"version":2`), 1)); !errors.Is(err, ErrInvalidIndex) {
		t.Fatalf("a one-blob index of version 2: %v", err)
	}
}

// TestCompactEntries: an opened index holds its entries compactly, and
// reads back through Len, File, Path and Find exactly as built.
func TestCompactEntries(t *testing.T) {
	x := v2Index()
	x.Chunks = append(x.Chunks, Chunk{Digest: digest.FromString("big"), Size: MaxChunkBytes})
	x.Files = append(x.Files, File{Path: "d", Type: TypeFile, Mode: 0o600, Size: MaxChunkBytes - 1, Digest: digest.FromString("d"),
		Extents: []Extent{{2, 1, MaxChunkBytes - 1}}})
	want := append([]File{}, x.Files...)
	if err := x.compact(false); err != nil {
		t.Fatal(err)
	}
	if x.Files != nil || x.Len() != len(want) {
		t.Fatalf("compact index: Files %v, Len %d", x.Files, x.Len())
	}
	for i, f := range want {
		got := x.File(i)
		if got.Path != f.Path || got.Type != f.Type || got.Mode != f.Mode || got.Size != f.Size || got.Digest != f.Digest ||
			got.Target != f.Target || len(got.Extents) != len(f.Extents) {
			t.Fatalf("entry %d: %+v, want %+v", i, got, f)
		}
		for k := range f.Extents {
			if got.Extents[k] != f.Extents[k] {
				t.Fatalf("entry %d extent %d: %+v, want %+v", i, k, got.Extents[k], f.Extents[k])
			}
		}
		if j, ok := x.Find(f.Path); !ok || j != i || x.Path(i) != f.Path {
			t.Fatalf("Find(%q) = %d, %v", f.Path, j, ok)
		}
	}
	if _, ok := x.Find("b/4"); ok {
		t.Fatal("Find found a path the index lacks")
	}
	if err := x.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := x.Bytes(), int64(50+MaxChunkBytes-1); got != want {
		t.Fatalf("Bytes = %d, want %d", got, want)
	}
}

// TestStrictDecodeCanonical: an encoding other than the canonical one is
// refused, naming the first byte that differs from it (or the length of
// the shorter), however it differs.
func TestStrictDecodeCanonical(t *testing.T) {
	type doc struct {
		A int    `json:"a"`
		B string `json:"b"`
	}
	for _, in := range []string{
		`{"a":1,"b":"x"}`,
		`{"a":1,"b":"x"} `,
		`{"a":1, "b":"x"}`,
		`{"b":"x","a":1}`,
		`{"a":1,"b":"\u0078"}`,
		`{"A":1,"b":"x"}`,
		`{"a":1}`,
		`{"a":1,"b":"x","b":"x"}`,
	} {
		var d doc
		err := strictDecode([]byte(in), &d, "doc")
		canon, _ := canonicalJSON(d)
		at := 0
		for at < len(in) && at < len(canon) && in[at] == canon[at] {
			at++
		}
		switch {
		case string(canon) == in && err != nil:
			t.Errorf("%s: %v", in, err)
		case string(canon) != in && (err == nil || !strings.Contains(err.Error(), "differs at byte "+strconv.Itoa(at)+")")):
			t.Errorf("%s: %v, want a difference at byte %d", in, err, at)
		}
	}
}
