package chunkcache

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/verify"
)

// assembleFrom returns a write function for Assemble that writes the
// chunks descs, loaded through c, in order.
func assembleFrom(c *Cache, f *fakeFetcher, descs []ocispec.Descriptor) func(io.Writer) error {
	return func(w io.Writer) error {
		for _, d := range descs {
			ch, err := c.Load(context.Background(), f, d)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, io.NewSectionReader(ch, 0, d.Size))
			ch.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// fileOf returns the descriptor and bytes of the file made of datas.
func fileOf(datas ...[]byte) (ocispec.Descriptor, []byte) {
	b := bytes.Join(datas, nil)
	return ocispec.Descriptor{Digest: digest.FromBytes(b), Size: int64(len(b))}, b
}

func readAll(t *testing.T, b *Backing) []byte {
	t.Helper()
	got, err := io.ReadAll(io.NewSectionReader(b.File(), 0, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A backing file is assembled from chunks and verified against the file's
// digest: the right bytes are served and found again by a new process;
// bytes that do not hash to the digest are refused and leave nothing; a
// backing file damaged on disk is not used.
func TestAssembleVerified(t *testing.T) {
	f, descs, datas := pushChunks(t, 3, 4096)
	dir := t.TempDir()
	c := mustOpenCache(t, dir)
	desc, want := fileOf(datas...)

	b, err := c.Assemble(context.Background(), desc, assembleFrom(c, f, descs))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, b); !bytes.Equal(got, want) {
		t.Fatal("backing file holds the wrong bytes")
	}
	b.Close()
	if s := c.Stats(); s.BackingsMade != 1 || s.BackingsOpened != 1 {
		t.Fatalf("stats %+v, want one backing file made and opened", s)
	}

	// Another process finds it, vouched, without assembling it again.
	c2 := mustOpenCache(t, dir)
	if c2.Size() != c.Size() {
		t.Fatalf("reopened cache accounts %d bytes, want %d", c2.Size(), c.Size())
	}
	b2, err := c2.OpenBacking(desc)
	if err != nil || b2 == nil {
		t.Fatalf("OpenBacking = %v, %v; want the backing file", b2, err)
	}
	if got := readAll(t, b2); !bytes.Equal(got, want) {
		t.Fatal("reopened backing file holds the wrong bytes")
	}
	b2.Close()

	// Wrong bytes (chunks in the wrong order) are refused.
	other, _ := fileOf(datas[1], datas[0])
	_, err = c.Assemble(context.Background(), other, assembleFrom(c, f, descs[:2]))
	if !errors.Is(err, verify.ErrDigestMismatch) {
		t.Fatalf("Assemble of wrong bytes: %v, want a digest mismatch", err)
	}
	if b, _ := c.OpenBacking(other); b != nil {
		t.Fatal("a refused backing file was kept")
	}

	// A byte flipped on disk: the mark is void (mtime), the hash fails.
	p := c.backingPath(desc.Digest)
	raw, _ := os.ReadFile(p)
	raw[100] ^= 0xff
	if err := os.WriteFile(p, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	c3 := mustOpenCache(t, dir)
	if b, err := c3.OpenBacking(desc); b != nil || err != nil {
		t.Fatalf("OpenBacking of a damaged file = %v, %v; want none", b, err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatal("damaged backing file left on disk")
	}
}

// A backing file counts in the bound: it is refused when it does not fit
// beside protected chunks, it evicts unprotected chunks to fit, it stays
// while open even when the cache is over its bound, and it is evicted once
// closed.
func TestAssembleBound(t *testing.T) {
	f, descs, datas := pushChunks(t, 4, 4096)
	c := mustOpenCache(t, t.TempDir())
	c.max = 4 * 4096
	for i, d := range descs {
		loadCheck(t, c, f, d, datas[i])
	}
	// Chunks 0 and 1 protected: a file of 3 chunks does not fit beside them.
	c.Protect("mount:a", descs[:2])
	big, _ := fileOf(datas[0], datas[1], datas[2])
	if _, err := c.Assemble(context.Background(), big, assembleFrom(c, f, descs[:3])); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("Assemble past the bound: %v, want ErrNoRoom", err)
	}
	// A file of 2 chunks fits: unprotected chunks 2 and 3 go.
	desc, _ := fileOf(datas[0], datas[1])
	b, err := c.Assemble(context.Background(), desc, assembleFrom(c, f, descs[:2]))
	if err != nil {
		t.Fatal(err)
	}
	if c.Contains(descs[2].Digest) || c.Contains(descs[3].Digest) || !c.Contains(descs[0].Digest) {
		t.Fatal("want the unprotected chunks evicted for the backing file, the protected kept")
	}
	if c.Size() > c.Max() {
		t.Fatalf("size %d past the bound %d", c.Size(), c.Max())
	}
	// With a smaller bound, a load evicts every chunk it may, protected
	// ones too, but the open backing file stays.
	c.Unprotect("mount:a")
	c.max = 4096
	loadCheck(t, c, f, descs[3], datas[3])
	if _, err := os.Stat(c.backingPath(desc.Digest)); err != nil {
		t.Fatal("an open backing file was evicted")
	}
	if c.Contains(descs[0].Digest) || c.Size() != desc.Size+4096 {
		t.Fatalf("size %d, want only the backing file and the last chunk", c.Size())
	}
	b.Close()
	if _, err := os.Stat(c.backingPath(desc.Digest)); !os.IsNotExist(err) {
		t.Fatal("a closed backing file over the bound was not evicted")
	}
	if c.Size() > c.Max() {
		t.Fatalf("size %d past the bound %d after the close", c.Size(), c.Max())
	}
}

// The mark of an entry of ten million bytes or more (a backing file, a
// large chunk) is 65 bytes or longer; it must still be read back, or every
// open of such an entry hashes it again.
func TestVouchLargeEntry(t *testing.T) {
	p := t.TempDir() + "/big"
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(12_345_678_901); err != nil {
		t.Skipf("sparse file: %v", err)
	}
	vouchEntry(p)
	st, _ := f.Stat()
	if !vouchedEntry(f, st) {
		t.Fatal("the mark of a large entry is not recognised")
	}
}
