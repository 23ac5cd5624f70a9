package chunkcache

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
)

// pushChunks stores n chunks of size bytes in a memory store behind a
// counting fetcher.
func pushChunks(t *testing.T, n, size int) (*fakeFetcher, []ocispec.Descriptor, [][]byte) {
	t.Helper()
	f := &fakeFetcher{src: memory.New(), fetches: map[digest.Digest]int{}}
	var descs []ocispec.Descriptor
	var datas [][]byte
	for i := range n {
		data := randBytes(uint64(100+i), size)
		desc := ocispec.Descriptor{MediaType: layout.MediaTypeChunk, Digest: digest.FromBytes(data), Size: int64(len(data))}
		if err := f.src.Push(context.Background(), desc, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		descs, datas = append(descs, desc), append(datas, data)
	}
	return f, descs, datas
}

// loadCheck loads desc through c and checks the bytes are want.
func loadCheck(t *testing.T, c *Cache, f *fakeFetcher, desc ocispec.Descriptor, want []byte) {
	t.Helper()
	ch, err := c.Load(context.Background(), f, desc)
	if err != nil {
		t.Fatalf("load %s: %v", desc.Digest, err)
	}
	defer ch.Close()
	got := make([]byte, len(want))
	if _, err := ch.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("chunk %s: wrong bytes served (%v)", desc.Digest, err)
	}
}

// After a crash, entries torn on disk (cut short, emptied, a byte flipped)
// are found when a new process opens the cache: each is dropped, fetched
// again and served with its right bytes; an intact entry is served from
// disk without a fetch.
func TestTornEntriesRefetchedAfterRestart(t *testing.T) {
	dir := t.TempDir()
	f, descs, datas := pushChunks(t, 4, 64<<10)
	c1, err := Open(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	for i := range descs {
		loadCheck(t, c1, f, descs[i], datas[i])
	}
	damage := []func(p string) error{
		func(p string) error { return os.Truncate(p, int64(len(datas[0])/2)) },
		func(p string) error { return os.Truncate(p, 0) },
		func(p string) error {
			b := append([]byte(nil), datas[2]...)
			b[len(b)/3] ^= 0x10
			return os.WriteFile(p, b, 0o644)
		},
	}
	for i, d := range damage {
		if err := d(c1.path(descs[i].Digest)); err != nil {
			t.Fatal(err)
		}
	}
	f.reset()
	c2, err := Open(dir, 1<<30) // the process after the crash
	if err != nil {
		t.Fatal(err)
	}
	for i := range descs {
		loadCheck(t, c2, f, descs[i], datas[i])
	}
	for i, d := range descs {
		want := 0
		if i < len(damage) {
			want = 1
		}
		if got := f.fetches[d.Digest]; got != want {
			t.Errorf("chunk %d fetched %d times after the restart, want %d", i, got, want)
		}
	}
	if c2.Stats().Corrupt != int64(len(damage)) {
		t.Errorf("corrupt count %d, want %d", c2.Stats().Corrupt, len(damage))
	}
	// The refetched entries are whole again: a third process reads them from disk.
	f.reset()
	c3, err := Open(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	for i := range descs {
		loadCheck(t, c3, f, descs[i], datas[i])
	}
	if n, _ := f.total(); n != 0 {
		t.Errorf("%d fetches from the third process, want every entry served from disk", n)
	}
}

// The cache keeps no index file: its LRU order is rebuilt at Open from the
// entries' files (modification times, refreshed on use). A directory over
// the bound (a smaller bound after a restart) is evicted oldest-used first
// and the rest are served without a fetch.
func TestLRURebuiltFromFiles(t *testing.T) {
	dir := t.TempDir()
	const size = 32 << 10
	f, descs, datas := pushChunks(t, 6, size)
	c1, err := Open(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour)
	for i := range descs {
		loadCheck(t, c1, f, descs[i], datas[i])
		// Used in order 0, 1, ..., 5: chunk 5 last.
		at := base.Add(time.Duration(i) * time.Minute)
		if err := os.Chtimes(c1.path(descs[i].Digest), at, at); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"index", "lru", "state"} { // no such files to lose
		if _, err := os.Stat(dir + "/" + name); err == nil {
			t.Fatalf("the cache keeps a %s file; this test assumes its state is the entries alone", name)
		}
	}
	f.reset()
	c2, err := Open(dir, 3*size)
	if err != nil {
		t.Fatal(err)
	}
	if c2.Size() > 3*size {
		t.Fatalf("size %d after reopening with bound %d", c2.Size(), 3*size)
	}
	for i := range descs {
		if kept, want := c2.Contains(descs[i].Digest), i >= 3; kept != want {
			t.Errorf("chunk %d kept=%v, want %v (the three most recently used stay)", i, kept, want)
		}
	}
	for i := 3; i < len(descs); i++ {
		loadCheck(t, c2, f, descs[i], datas[i])
	}
	if n, _ := f.total(); n != 0 {
		t.Errorf("%d fetches for entries that stayed on disk", n)
	}
	// Serving evicted chunks keeps the bound.
	for i := range 3 {
		loadCheck(t, c2, f, descs[i], datas[i])
	}
	if c2.Size() > 3*size {
		t.Errorf("size %d over the bound %d after serving evicted chunks", c2.Size(), 3*size)
	}
}

// A power loss can leave an entry's bytes torn under the size and time its
// vouch recorded. After a reboot the mark no longer vouches for it: the entry
// is hashed, found wrong, dropped and fetched again.
func TestVouchVoidAfterReboot(t *testing.T) {
	dir := t.TempDir()
	f, descs, datas := pushChunks(t, 1, 64<<10)
	c1, err := Open(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	loadCheck(t, c1, f, descs[0], datas[0])
	p := c1.path(descs[0].Digest)
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	b := append([]byte(nil), datas[0]...)
	b[100] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(p, st.ModTime(), st.ModTime()); err != nil { // as if the write never reached the inode
		t.Fatal(err)
	}
	defer func(id string) { bootID = id }(bootID)
	bootID = "another-boot"
	f.reset()
	c2, err := Open(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	loadCheck(t, c2, f, descs[0], datas[0])
	if f.fetches[descs[0].Digest] != 1 || c2.Stats().Corrupt != 1 {
		t.Errorf("fetches %d, corrupt %d; want the torn entry dropped and fetched once", f.fetches[descs[0].Digest], c2.Stats().Corrupt)
	}
}
