package layout

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content/memory"
	"oras.land/oras-go/v2/errdef"
)

// sealFiles stores chunks and a version 1 index of files over them, and
// opens the version.
func sealFiles(t *testing.T, store *memory.Store, files []File, chunks ...[]byte) *Version {
	t.Helper()
	ctx := context.Background()
	x := &Index{Version: FormatVersion1, Chunking: v1Params, Files: files}
	for _, data := range chunks {
		c := Chunk{Digest: digest.FromBytes(data), Size: int64(len(data))}
		if err := store.Push(ctx, chunkDescriptor(c), bytes.NewReader(data)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
			t.Fatal(err)
		}
		x.Chunks = append(x.Chunks, c)
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
	return v
}

// settledCache opens the stat cache of dst in dir with a clock an hour
// ahead, so that what a pull records is not racy, as after a while.
func settledCache(dir, dst string) *StatCache {
	c := OpenStatCache(dir, dst, v1Params)
	c.now = func() time.Time { return time.Now().Add(time.Hour) }
	return c
}

// TestPullClaimedDigestNotTrusted: a version whose file claims another
// file's digest (a part of a chunk, so no pull checks the claim unless
// asked) must not make the stat cache vouch for the claim: a later pull
// of the version whose file has that digest puts the right bytes there,
// and a push of the directory seals the bytes' own digest.
func TestPullClaimedDigestNotTrusted(t *testing.T) {
	ctx := context.Background()
	store := memory.New()
	honest, evil := []byte("honest bytes of a"), []byte("EVIL bytes of a, and more")
	claim := digest.FromBytes(honest)
	a := sealFiles(t, store, []File{{Path: "a", Type: TypeFile, Mode: 0o644, Size: 17, Digest: claim, Extents: []Extent{{0, 0, 17}}}}, evil)
	b := sealFiles(t, store, []File{{Path: "a", Type: TypeFile, Mode: 0o644, Size: 17, Digest: claim, Extents: []Extent{{0, 0, 17}}}}, append(honest, "!"...))

	dst, cdir := t.TempDir(), t.TempDir()
	if _, err := Pull(ctx, store, a, dst, PullOptions{Cache: settledCache(cdir, dst)}); err != nil {
		t.Fatalf("pull of the lying version: %v", err)
	}
	res, err := Push(ctx, memory.New(), DirSource(dst), PushOptions{Params: v1Params, Cache: OpenStatCache(cdir, dst, v1Params)})
	switch {
	case err != nil:
		t.Errorf("push after the pull: %v", err)
	case res.Index.File(0).Digest != digest.FromBytes(evil[:17]):
		t.Errorf("push after the pull sealed %s for %q, want its own digest", res.Index.File(0).Digest, evil[:17])
	}
	if _, err := Pull(ctx, store, b, dst, PullOptions{Cache: settledCache(cdir, dst)}); err != nil {
		t.Fatalf("pull of the honest version: %v", err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "a")); !bytes.Equal(got, honest) {
		t.Errorf("after the honest pull, a holds %q, want %q", got, honest)
	}
}

// TestPullPackedFileDigestChecked: a file written whole from a chunk that
// packs several files is checked against its digest, which the stat cache
// then records as its own, even without VerifyFiles.
func TestPullPackedFileDigestChecked(t *testing.T) {
	store := memory.New()
	data := []byte("0123456789")
	v := sealFiles(t, store, []File{
		{Path: "p", Type: TypeFile, Mode: 0o644, Size: 4, Digest: digest.FromString("not 0123"), Extents: []Extent{{0, 0, 4}}},
		{Path: "q", Type: TypeFile, Mode: 0o644, Size: 6, Digest: digest.FromBytes(data[4:]), Extents: []Extent{{0, 4, 6}}},
	}, data)
	dst := t.TempDir()
	_, err := Pull(context.Background(), store, v, dst, PullOptions{})
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("pull: %v, want %v", err, ErrDigestMismatch)
	}
	if _, err := os.Lstat(filepath.Join(dst, "p")); !os.IsNotExist(err) {
		t.Errorf("p is in place: %v", err)
	}
}

// TestStatCacheUnverified: a pulled file whose digest was not checked is
// no hit for lookup (which a push trusts), but vouches for a file of the
// same whole chunks, and for nothing else.
func TestStatCacheUnverified(t *testing.T) {
	c1, c2 := Chunk{Digest: digest.FromString("c1"), Size: 2}, Chunk{Digest: digest.FromString("c2"), Size: 2}
	x := &Index{Version: FormatVersion1, Chunking: v1Params, Chunks: []Chunk{c1, c2}, Files: []File{
		{Path: "f", Type: TypeFile, Mode: 0o644, Size: 4, Digest: digest.FromString("f"), Extents: []Extent{{0, 0, 2}, {1, 0, 2}}},
		{Path: "g", Type: TypeFile, Mode: 0o644, Size: 1, Digest: digest.FromString("g"), Extents: []Extent{{1, 0, 1}}},
	}}
	dir := t.TempDir()
	c := OpenStatCache(dir, "/pulled", v1Params)
	c.now = func() time.Time { return time.Now().Add(time.Hour) }
	kf, kg := StatKey{Size: 4, Mtime: 1, Ctime: 1, Ino: 1}, StatKey{Size: 1, Mtime: 1, Ctime: 1, Ino: 2}
	c.storePulled(x, "f", kf, true, false)
	c.storePulled(x, "g", kg, true, false)
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	got := OpenStatCache(dir, "/pulled", v1Params)
	if _, ok := got.lookup("f", kf); ok {
		t.Error("lookup trusts an unchecked digest")
	}
	same := x.File(0)
	if !got.sameExtents("f", kf, &same, x) {
		t.Error("a file of the same chunks is not vouched for")
	}
	other := &Index{Version: FormatVersion1, Chunking: v1Params, Chunks: []Chunk{c1, {Digest: digest.FromString("c3"), Size: 2}}}
	if got.sameExtents("f", kf, &same, other) {
		t.Error("a file of other chunks is vouched for")
	}
	if got.sameExtents("f", StatKey{Size: 4, Mtime: 2, Ctime: 2, Ino: 1}, &same, x) {
		t.Error("a changed file is vouched for")
	}
	part := x.File(1)
	if got.sameExtents("g", kg, &part, x) {
		t.Error("a file of part of a chunk is vouched for")
	}
}
