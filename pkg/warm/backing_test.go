package warm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/chunkcache"
	"github.com/bdnvol/bdnvol/pkg/lazy"
	"github.com/bdnvol/bdnvol/pkg/oci"
	"github.com/bdnvol/bdnvol/pkg/origin"
)

// TestWarmBuildsBackingFiles: warming makes the passthrough backing file
// of each large file, so that a mount opened afterwards (with its own
// cache handle, as another process) serves the first open of the file
// from it without copying any chunk into one; the backing file is served
// only to the warmed version's origin.
func TestWarmBuildsBackingFiles(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	big := testutil.RandBytes(11, 600<<10)
	testutil.WriteTree(t, filepath.Join(dir, "tree"), map[string][]byte{"big.bin": big, "small.txt": []byte("small\n")})
	ref, root := pushTree(t, filepath.Join(dir, "tree"), filepath.Join(dir, "repo"))
	cacheDir := filepath.Join(dir, "cache")
	cache, err := chunkcache.Open(cacheDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Warm(ctx, cache, []string{ref}, WarmOptions{}); err != nil {
		t.Fatal(err)
	}

	// A mount, later, in another process: its own cache handle.
	r, err := oci.ParseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	o, err := origin.Resolve(ctx, r, origin.Options{})
	if err != nil {
		t.Fatal(err)
	}
	later, err := chunkcache.Open(cacheDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	view := later.For(o.Name())
	v, err := lazy.Open(ctx, o.Fetcher, root, lazy.Options{Cache: view})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	fd := ocispec.Descriptor{Digest: digest.FromBytes(big), Size: int64(len(big))}
	if b, err := later.For("oci:" + filepath.Join(dir, "other")).OpenBacking(fd); err != nil || b != nil {
		t.Fatalf("another origin's view: backing %v, err %v; want none", b, err)
	}

	mnt := t.TempDir()
	srv, err := lazy.Mount(mnt, v, lazy.MountOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Unmount()
	got, err := os.ReadFile(filepath.Join(mnt, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, big) {
		t.Fatal("wrong bytes read through the mount")
	}
	s := view.Stats()
	if s.BackingsMade != 0 {
		t.Errorf("the first open after warming made %d backing files (copied the file's chunks), want 0", s.BackingsMade)
	}
	if s.BackingsOpened < 1 {
		t.Errorf("stats %+v: the first open did not open the backing file warming made", s)
	}
	if s.Fetches != 0 {
		t.Errorf("stats %+v: the mount fetched after a complete warm", s)
	}
}

// TestWarmTakesTheDiskOnce: after a warm, the chunks of a large file are
// folded into its backing file (chunkcache.Fold): the version's bytes
// take the disk once, not once as chunks and again as backing files, and
// the chunks still count as cached and load with the right bytes.
func TestWarmTakesTheDiskOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	files := map[string][]byte{"a.bin": testutil.RandBytes(21, 900<<10), "b.bin": testutil.RandBytes(22, 700<<10)}
	testutil.WriteTree(t, filepath.Join(dir, "tree"), files)
	ref, _ := pushTree(t, filepath.Join(dir, "tree"), filepath.Join(dir, "repo"))
	cacheDir := filepath.Join(dir, "cache")
	cache, err := chunkcache.Open(cacheDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := Warm(ctx, cache, []string{ref}, WarmOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tg := ts[0]
	var disk int64
	for _, d := range tg.Need {
		if st, err := os.Stat(filepath.Join(cacheDir, "sha256", d.Digest.Encoded())); err == nil {
			disk += st.Size()
		}
	}
	backings, _ := os.ReadDir(filepath.Join(cacheDir, "files"))
	for _, e := range backings {
		info, _ := e.Info()
		disk += info.Size()
	}
	if len(backings) != 2 {
		t.Fatalf("%d backing files after the warm, want 2", len(backings))
	}
	if max := tg.Bytes() + tg.Bytes()/20; disk > max {
		t.Errorf("the warm version takes %d bytes of disk (chunks and backing files) for %d bytes of chunks, want at most %d", disk, tg.Bytes(), max)
	}
	later, err := chunkcache.Open(cacheDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	view := later.For(tg.origin)
	if b, missing := Cached(view, tg.Need); missing != 0 || b != tg.Bytes() {
		t.Fatalf("after the warm: %d of %d bytes cached, %d chunks missing", b, tg.Bytes(), missing)
	}
	for _, d := range tg.Need {
		ch, err := view.Load(ctx, nothing{}, d)
		if err != nil {
			t.Fatalf("chunk %s: %v", d.Digest, err)
		}
		buf := make([]byte, d.Size)
		if _, err := ch.ReadAt(buf, 0); err != nil || digest.FromBytes(buf) != d.Digest {
			t.Fatalf("chunk %s: wrong bytes (%v)", d.Digest, err)
		}
		ch.Close()
	}
	if s := view.Stats(); s.Fetches != 0 {
		t.Errorf("stats %+v: chunks fetched after a warm", s)
	}
}

// nothing is a fetcher that has no blob.
type nothing struct{}

func (nothing) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return nil, errors.New("not there")
}
