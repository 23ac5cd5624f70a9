package layout

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
)

// smallFiles is a dataset-shaped tree: n files of size bytes in dirs
// directories.
func smallFiles(n, dirs, size int) map[string][]byte {
	files := map[string][]byte{}
	for i := range n {
		files[fmt.Sprintf("d%02d/f%05d", i%dirs, i)] = randBytes(uint64(7000+i), size)
	}
	return files
}

// TestPullPackedFewTemporaries pulls thousands of small files packed into
// a few chunks: temporary files exist for the files being written, about
// one per job, not for every file of the chunks in flight.
func TestPullPackedFewTemporaries(t *testing.T) {
	files := smallFiles(3000, 30, 700)
	store, v := pushed(t, Params{Min: 256 << 10, Avg: 512 << 10, Max: 1 << 20}, files)
	if v.NumChunks() < 2 || v.NumChunks() > 8 {
		t.Fatalf("premise: small files packed into a few chunks, got %d", v.NumChunks())
	}
	dst := t.TempDir()
	var most atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if names, err := filepath.Glob(filepath.Join(dst, pullDirName, "*.part")); err == nil && int64(len(names)) > most.Load() {
				most.Store(int64(len(names)))
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	_, err := Pull(context.Background(), store, v, dst, PullOptions{Jobs: 2})
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	// Per job: the file being written, and a file that continues into
	// another chunk.
	if got := most.Load(); got > 8 {
		t.Errorf("%d temporary files at once for %d files in %d chunks with 2 jobs", got, len(files), v.NumChunks())
	}
	t.Logf("at most %d temporary files at once", most.Load())
	checkPulled(t, dst, files, nil)
}

// TestPullPackedResumes: a pull of packed small files that fails on one
// chunk leaves the files of the other chunks in place; the next pull
// fetches only that chunk and ends with every file right and no
// temporary left.
func TestPullPackedResumes(t *testing.T) {
	ctx := context.Background()
	files := smallFiles(2000, 20, 600)
	store, v := pushed(t, Params{Min: 128 << 10, Avg: 256 << 10, Max: 512 << 10}, files)
	if v.NumChunks() < 3 {
		t.Fatalf("premise: several chunks, got %d", v.NumChunks())
	}
	dst := t.TempDir()
	missing := v.Index.Chunk(v.Index.NumChunks() / 2).Digest
	if _, err := Pull(ctx, failing{store, missing}, v, dst, PullOptions{Jobs: 2}); err == nil {
		t.Fatal("pull with a missing chunk succeeded")
	}
	var placed int
	for p := range files {
		if _, err := os.Lstat(filepath.Join(dst, p)); err == nil {
			placed++
		}
	}
	if placed == 0 || placed == len(files) {
		t.Errorf("premise: some files in place after the failed pull, got %d of %d", placed, len(files))
	}
	res, err := Pull(ctx, store, v, dst, PullOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.ChunksFetched > 3 {
		t.Errorf("resumed pull fetched %d chunks, want the missing one and at most the two it shares files with", res.ChunksFetched)
	}
	checkPulled(t, dst, files, nil)
	if _, err := os.Stat(filepath.Join(dst, pullDirName)); !os.IsNotExist(err) {
		t.Errorf("private directory left after success: %v", err)
	}
}

// TestStatCacheEncodeRoundTrips: the cache written entry by entry reads
// back as it was.
func TestStatCacheEncodeRoundTrips(t *testing.T) {
	dir := t.TempDir()
	c := OpenStatCache(dir, "/data", DefaultParams)
	c.data.Files["a \"quoted\"/ü"] = cachedFile{Stat: StatKey{Size: 3, Mtime: 1, Ctime: 2, Ino: 9}, Digest: emptyDigest, Chunks: []Chunk{{Digest: emptyDigest, Size: 3}}}
	c.data.Files["b"] = cachedFile{Stat: StatKey{Size: 1}, Digest: emptyDigest, Extents: []pulledExtent{{Digest: emptyDigest, Length: 1}}}
	c.data.Packs["k"] = Chunk{Digest: emptyDigest, Size: 7}
	c.dirty = true
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	got := OpenStatCache(dir, "/data", DefaultParams)
	if fmt.Sprint(got.data) != fmt.Sprint(c.data) {
		t.Errorf("read back %+v, wrote %+v", got.data, c.data)
	}
}

// TestStatCachePulledRecordsCompact: a pull's records are held by entry
// of the index, not as a map of records, and read back after a Save as
// the records they stand for; prune drops them like others.
func TestStatCachePulledRecordsCompact(t *testing.T) {
	files := map[string][]byte{"d/a": []byte("aaaa"), "d/b": bytes.Repeat([]byte("b"), 300<<10), "e": []byte("e")}
	_, v := pushed(t, Params{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}, files)
	x := v.Index
	dir := t.TempDir()
	c := OpenStatCache(dir, "/pulled", DefaultParams)
	c.data.Files["d/b"] = cachedFile{Stat: StatKey{Size: 9}, Digest: emptyDigest} // an earlier pull's
	c.data.Files["gone"] = cachedFile{Stat: StatKey{Size: 1}, Digest: emptyDigest}
	ka, kb, ke := StatKey{Size: 4, Mtime: 10, Ctime: 11, Ino: 1}, StatKey{Size: 300 << 10, Mtime: 20, Ctime: 21, Ino: 2}, StatKey{Size: 1, Mtime: 30, Ctime: 31, Ino: 3}
	c.storePulled(x, "d/a", ka, false, true)
	c.storePulled(x, "d/b", kb, true, true)
	c.storePulled(x, "e", ke, true, true)
	if len(c.data.Files) != 1 {
		t.Errorf("%d records in the map after storing three pulled, want only the other one", len(c.data.Files))
	}
	if _, ok := c.lookup("d/a", ka); ok {
		t.Error("a record of this pull is trusted before Save")
	}
	c.prune(func(p string) bool { return p != "e" && p != "gone" })
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	if f, ok := c.lookup("d/a", ka); !ok || f.Digest != digest.FromBytes(files["d/a"]) {
		t.Errorf("after Save, lookup d/a = %+v, %v", f, ok)
	}
	got := OpenStatCache(dir, "/pulled", DefaultParams)
	if len(got.data.Files) != 2 {
		t.Fatalf("read back %d records, want d/a and d/b: %+v", len(got.data.Files), got.data.Files)
	}
	a, b := got.data.Files["d/a"], got.data.Files["d/b"]
	if a.Stat != ka || a.Digest != digest.FromBytes(files["d/a"]) || a.Extents != nil || a.Racy {
		t.Errorf("d/a read back as %+v", a)
	}
	fb := x.File(mustFind(t, x, "d/b"))
	if b.Stat != kb || b.Digest != fb.Digest || fmt.Sprint(b.Extents) != fmt.Sprint(pulledExtents(&fb, x)) || len(b.Extents) < 2 {
		t.Errorf("d/b read back as %+v, want the extents of %d chunks", b, len(fb.Extents))
	}
	if _, ok := got.data.Files["gone"]; ok {
		t.Error("pruned record read back")
	}
}

func mustFind(t *testing.T, x *Index, p string) int {
	t.Helper()
	i, ok := x.Find(p)
	if !ok {
		t.Fatalf("no entry %q", p)
	}
	return i
}
