package pull

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

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/push"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// sealFiles stores chunks and a version 1 index of files over them, and
// opens the version.
func sealFiles(t *testing.T, store *memory.Store, files []layout.File, chunks ...[]byte) *layout.Version {
	t.Helper()
	ctx := context.Background()
	x := &layout.Index{Version: layout.FormatVersion1, Chunking: v1Params, Files: files}
	for _, data := range chunks {
		c := layout.Chunk{Digest: digest.FromBytes(data), Size: int64(len(data))}
		if err := store.Push(ctx, chunkDescriptor(c), bytes.NewReader(data)); err != nil && !errors.Is(err, errdef.ErrAlreadyExists) {
			t.Fatal(err)
		}
		x.Chunks = append(x.Chunks, c)
	}
	s, err := layout.Seal(x, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store(ctx, store); err != nil {
		t.Fatal(err)
	}
	v, err := layout.Open(ctx, store, s.Root.Desc)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// settledCache opens the stat cache of dst in dir with a clock an hour
// ahead, so that what a pull records is not racy, as after a while.
func settledCache(dir, dst string) *statcache.Cache {
	c := statcache.Open(dir, dst, v1Params)
	c.SetTestHooks(func() time.Time { return time.Now().Add(time.Hour) }, 0)
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
	a := sealFiles(t, store, []layout.File{{Path: "a", Type: layout.TypeFile, Mode: 0o644, Size: 17, Digest: claim, Extents: []layout.Extent{{Chunk: 0, Offset: 0, Length: 17}}}}, evil)
	b := sealFiles(t, store, []layout.File{{Path: "a", Type: layout.TypeFile, Mode: 0o644, Size: 17, Digest: claim, Extents: []layout.Extent{{Chunk: 0, Offset: 0, Length: 17}}}}, append(honest, "!"...))

	dst, cdir := t.TempDir(), t.TempDir()
	if _, err := Materialise(ctx, store, a, dst, Options{StatCache: settledCache(cdir, dst)}); err != nil {
		t.Fatalf("pull of the lying version: %v", err)
	}
	res, err := push.Push(ctx, memory.New(), push.DirSource(dst), push.Options{Params: v1Params, Cache: statcache.Open(cdir, dst, v1Params)})
	switch {
	case err != nil:
		t.Errorf("push after the pull: %v", err)
	case res.Index.File(0).Digest != digest.FromBytes(evil[:17]):
		t.Errorf("push after the pull sealed %s for %q, want its own digest", res.Index.File(0).Digest, evil[:17])
	}
	if _, err := Materialise(ctx, store, b, dst, Options{StatCache: settledCache(cdir, dst)}); err != nil {
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
	v := sealFiles(t, store, []layout.File{
		{Path: "p", Type: layout.TypeFile, Mode: 0o644, Size: 4, Digest: digest.FromString("not 0123"), Extents: []layout.Extent{{Chunk: 0, Offset: 0, Length: 4}}},
		{Path: "q", Type: layout.TypeFile, Mode: 0o644, Size: 6, Digest: digest.FromBytes(data[4:]), Extents: []layout.Extent{{Chunk: 0, Offset: 4, Length: 6}}},
	}, data)
	dst := t.TempDir()
	_, err := Materialise(context.Background(), store, v, dst, Options{})
	if !errors.Is(err, layout.ErrDigestMismatch) {
		t.Fatalf("pull: %v, want %v", err, layout.ErrDigestMismatch)
	}
	if _, err := os.Lstat(filepath.Join(dst, "p")); !os.IsNotExist(err) {
		t.Errorf("p is in place: %v", err)
	}
}
