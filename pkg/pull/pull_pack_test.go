package pull

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// smallFiles is a dataset-shaped tree: n files of size bytes in dirs
// directories.
func smallFiles(n, dirs, size int) map[string][]byte {
	files := map[string][]byte{}
	for i := range n {
		files[fmt.Sprintf("d%02d/f%05d", i%dirs, i)] = testutil.RandBytes(uint64(7000+i), size)
	}
	return files
}

// TestPullPackedFewTemporaries pulls thousands of small files packed into
// a few chunks: temporary files exist for the files being written, about
// one per job, not for every file of the chunks in flight.
func TestPullPackedFewTemporaries(t *testing.T) {
	files := smallFiles(3000, 30, 700)
	store, v := pushed(t, layout.Params{Min: 256 << 10, Avg: 512 << 10, Max: 1 << 20}, files)
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
	_, err := Materialise(context.Background(), store, v, dst, Options{Jobs: 2})
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
	store, v := pushed(t, layout.Params{Min: 128 << 10, Avg: 256 << 10, Max: 512 << 10}, files)
	if v.NumChunks() < 3 {
		t.Fatalf("premise: several chunks, got %d", v.NumChunks())
	}
	dst := t.TempDir()
	missing := v.Index.Chunk(v.Index.NumChunks() / 2).Digest
	if _, err := Materialise(ctx, failing{store, missing}, v, dst, Options{Jobs: 2}); err == nil {
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
	res, err := Materialise(ctx, store, v, dst, Options{Jobs: 2})
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
