package push

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"sync/atomic"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// genSource is a generated dataset-shaped tree held in no buffer: n files
// of size bytes in 100 directories; file i's bytes are a function of i and
// of changed[i] (its generation).
type genSource struct {
	n, size int
	changed map[int]int
}

func (g *genSource) name(i int) string { return fmt.Sprintf("d%02d/f%07d.bin", i%100, i) }

func (g *genSource) Walk(context.Context) ([]Entry, error) {
	out := make([]Entry, 0, g.n+100)
	for d := 0; d < 100; d++ {
		out = append(out, Entry{Path: fmt.Sprintf("d%02d", d), Type: layout.TypeDir, Mode: 0o755})
		for i := d; i < g.n; i += 100 {
			out = append(out, Entry{Path: g.name(i), Type: layout.TypeFile, Mode: 0o644, Size: int64(g.size)})
		}
	}
	return out, nil
}

func (g *genSource) data(i int) []byte {
	b := make([]byte, g.size)
	x := uint64(i)*0x9e3779b97f4a7c15 + uint64(g.changed[i])*0xbf58476d1ce4e5b9 + 1
	for k := 0; k+8 <= len(b); k += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[k:], x)
	}
	return b
}

func (g *genSource) Open(_ context.Context, p string) (ReadAtCloser, error) {
	var d, i int
	if _, err := fmt.Sscanf(p, "d%02d/f%07d.bin", &d, &i); err != nil {
		return nil, err
	}
	return nopCloser{bytes.NewReader(g.data(i))}, nil
}

func (g *genSource) String() string { return "generated" }

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }

// countingStore counts the bytes of the blobs pushed into a store.
type countingStore struct {
	content.Storage
	bytes, blobs atomic.Int64
	log          func(string, ...any)
}

func (c *countingStore) Push(ctx context.Context, d ocispec.Descriptor, r io.Reader) error {
	if c.log != nil {
		c.log("pushed %s %s %d", d.MediaType, d.Digest, d.Size)
	}
	c.bytes.Add(d.Size)
	c.blobs.Add(1)
	return c.Storage.Push(ctx, d, r)
}

// TestV2OneChangedFileUploadsLittle: in a 100,000-file volume, one changed
// file re-uploads the pack around it, the index piece around it and the
// small top-level blobs: at most 2 MB. The same tree gives the same digest.
func TestV2OneChangedFileUploadsLittle(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 files")
	}
	ctx := context.Background()
	g := &genSource{n: 100_000, size: 1 << 10, changed: map[int]int{}}
	st := &countingStore{Storage: memory.New()}
	first, err := Push(ctx, st, g, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first push: %d entries, %d chunks, %d blobs, %d bytes", first.Files, first.Chunks, st.blobs.Load(), st.bytes.Load())

	g.changed[54_321] = 1
	st.bytes.Store(0)
	st.blobs.Store(0)
	st.log = t.Logf
	second, err := Push(ctx, st, g, Options{Params: first.Index.Chunking})
	if err != nil {
		t.Fatal(err)
	}
	up := st.bytes.Load()
	t.Logf("one file changed: %d blobs, %d bytes uploaded (result says %d)", st.blobs.Load(), up, second.BytesUploaded)
	if second.Root.Digest == first.Root.Digest {
		t.Fatal("a changed file kept the digest")
	}
	if up > 2_000_000 || second.BytesUploaded != up {
		t.Fatalf("one changed 1 KiB file re-uploaded %d bytes (result %d), want at most 2 MB", up, second.BytesUploaded)
	}

	v, err := layout.Open(ctx, st, second.Root)
	if err != nil {
		t.Fatal(err)
	}
	if v.Index.Version != layout.FormatVersion || v.Index.Len() != first.Files {
		t.Fatalf("read back version %d with %d entries", v.Index.Version, v.Index.Len())
	}
	f := v.Index.File(0)
	for _, e := range v.Index.AllFiles() {
		if e.Path == g.name(54_321) {
			f = e
		}
	}
	if f.Path != g.name(54_321) || f.Digest != digest.FromBytes(g.data(54_321)) {
		t.Fatalf("the changed file reads back as %+v", f)
	}

	st.log = nil
	// The same tree seals to the same digest and uploads nothing.
	st.bytes.Store(0)
	again, err := Push(ctx, st, g, Options{Params: first.Index.Chunking})
	if err != nil {
		t.Fatal(err)
	}
	if again.Root.Digest != second.Root.Digest || st.bytes.Load() != 0 {
		t.Fatalf("the same tree sealed to %s (was %s) uploading %d bytes", again.Root.Digest, second.Root.Digest, st.bytes.Load())
	}
}

// TestPushSpillsIndexPieces: a push of more than spillEntries files keeps
// its encoded index pieces in a file, not in memory, and stores exactly
// the bytes an in-memory seal of the same index encodes.
func TestPushSpillsIndexPieces(t *testing.T) {
	if testing.Short() {
		t.Skip("70,000 files")
	}
	ctx := context.Background()
	g := &genSource{n: spillEntries + 4_000, size: 512, changed: map[int]int{}}
	st := memory.New()
	res, err := Push(ctx, st, g, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := layout.Seal(res.Index, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if mem.Root.Desc.Digest != res.Root.Digest {
		t.Fatalf("spilled push sealed %s, in-memory seal %s", res.Root.Digest, mem.Root.Desc.Digest)
	}
	pieces := 0
	for _, b := range mem.Blobs {
		if b.Desc.MediaType != layout.MediaTypePiece {
			continue
		}
		pieces++
		got, err := content.FetchAll(ctx, st, b.Desc)
		if err != nil {
			t.Fatalf("piece %s not stored: %v", b.Desc.Digest, err)
		}
		if !bytes.Equal(got, b.Data) {
			t.Fatalf("piece %s stored with other bytes", b.Desc.Digest)
		}
	}
	if pieces < 2 {
		t.Fatalf("%d pieces; the test needs several", pieces)
	}

	// With a destination, the push seals piece by piece, never building
	// the whole index: the same version, the same pieces.
	st2 := memory.New()
	pw, err := Push(ctx, st2, g, Options{Destination: "example/ds"})
	if err != nil {
		t.Fatal(err)
	}
	if pw.Root.Digest != res.Root.Digest || pw.Index != nil || pw.PiecesBuilt != pieces || pw.PiecesReused != 0 {
		t.Fatalf("piece by piece: %s, index held %v, %d pieces built, %d reused; want %s, no index, %d built",
			pw.Root.Digest, pw.Index != nil, pw.PiecesBuilt, pw.PiecesReused, res.Root.Digest, pieces)
	}
	for _, b := range mem.Blobs {
		if got, err := content.FetchAll(ctx, st2, b.Desc); err != nil || !bytes.Equal(got, b.Data) {
			t.Fatalf("blob %s %s: stored piece by piece as other bytes (%v)", b.Desc.MediaType, b.Desc.Digest, err)
		}
	}

	// The builder's own seal spilled them.
	b := &builder{}
	b.spill = b.spillFile()
	if b.spill == nil {
		t.Fatal("no spill file could be made in the temporary directory")
	}
	defer b.spill.Close()
	s, err := layout.SealSpill(res.Index, 0, nil, b.spill)
	if err != nil {
		t.Fatal(err)
	}
	for _, bl := range s.Blobs {
		if bl.Desc.MediaType == layout.MediaTypePiece && bl.Data != nil {
			t.Fatalf("piece %s held in memory", bl.Desc.Digest)
		}
	}
}
