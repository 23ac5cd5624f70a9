package lazy

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fileChunks returns the chunks of the volume's file at path, in file order.
func fileChunks(t *testing.T, v *Volume, path string) []int {
	t.Helper()
	i, ok := v.ver.Index.Find(path)
	if !ok {
		t.Fatalf("%s not in the index", path)
	}
	var ks []int
	for _, x := range v.ver.Index.File(i).Extents {
		ks = append(ks, x.Chunk)
	}
	return ks
}

// A replay's chunks go into the page cache of the files open through the
// mount, and of a file opened after they were loaded: reading them then
// costs no FUSE READ request, and the bytes are the file's.
func TestReplayStoresPageCache(t *testing.T) {
	needFUSE(t)
	fx := newFixture(t)
	v := fx.open(t, t.TempDir(), Options{})
	mnt := t.TempDir()
	srv, err := Mount(mnt, v, MountOptions{NoPassthrough: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Unmount() })
	ctx := context.Background()

	// Open before the replay loads its chunks.
	p := filepath.Join(mnt, "big.bin")
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ks := fileChunks(t, v, "big.bin")
	if err := v.LoadChunks(ctx, ks); err != nil {
		t.Fatal(err)
	}
	if v.stored.Load() == 0 {
		t.Fatal("nothing stored in the open file's page cache")
	}
	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, fx.files["big.bin"]) {
		t.Fatalf("wrong bytes read through the filled page cache (%v)", err)
	}
	// Every page, those two chunks share too once both are cached.
	if n := fuseReads(t, p); n != 0 {
		t.Fatalf("%d FUSE READ requests for a file of %d chunks the replay loaded while it was open, want 0", n, len(ks))
	}

	// Opened after the replay loaded its chunks: filled at its first open.
	name := "model-00001-of-00001.safetensors"
	if err := v.LoadChunks(ctx, fileChunks(t, v, name)); err != nil {
		t.Fatal(err)
	}
	before := v.stored.Load()
	p = filepath.Join(mnt, name)
	g, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// The fill the open started stores every page of the file (a page
	// two chunks share, twice).
	want := int64(len(fx.files[name]))
	for deadline := time.Now().Add(10 * time.Second); v.stored.Load()-before < want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes stored at the first open of a file of %d the replay had loaded", v.stored.Load()-before, want)
		}
	}
	got, err = io.ReadAll(g)
	if err != nil || !bytes.Equal(got, fx.files[name]) {
		t.Fatalf("wrong bytes read through the filled page cache (%v)", err)
	}
	if n := fuseReads(t, p); n != 0 {
		t.Fatalf("%d FUSE READ requests for a file the replay loaded before its open, want 0", n)
	}
}
