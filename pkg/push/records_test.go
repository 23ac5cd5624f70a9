package push

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"oras.land/oras-go/v2/content/memory"

	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// TestPushRecordsFromItsResults: the stat records of a push are written
// from the push's own results when the cache is saved (not copied file by
// file as it goes): every file read gets its record, a large file's lists
// its chunks, and a second push with the cache opens no file and seals the
// same digest.
func TestPushRecordsFromItsResults(t *testing.T) {
	dir := memoTree(t, 300)
	cacheDir := t.TempDir()
	store := memory.New()
	push := func() (*Result, int64) {
		cache := statcache.Open(cacheDir, dir, memoParams)
		cache.TrustRecent() // files just written count as settled
		src := &openCounter{Source: DirSource(dir), opens: map[string]int{}}
		res, err := Push(context.Background(), store, src, Options{Params: memoParams, Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		return res, int64(len(src.opens))
	}
	first, opened := push()
	if opened < 300 {
		t.Fatalf("the first push opened %d files", opened)
	}
	cache := statcache.Open(cacheDir, dir, memoParams)
	files := 0
	for _, f := range first.Index.AllFiles() {
		if f.Type != layout.TypeFile {
			continue
		}
		files++
		st, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f.Path)))
		if err != nil {
			t.Fatal(err)
		}
		rec, ok := cache.Lookup(f.Path, statcache.KeyOf(st))
		if !ok || rec.Digest != f.Digest {
			t.Fatalf("%s: record %+v, %v; want digest %s", f.Path, rec, ok, f.Digest)
		}
		if big := f.Size >= memoParams.Min; big != (rec.Chunks != nil) || (big && len(rec.Chunks) != len(f.Extents)) {
			t.Fatalf("%s (%d bytes): record lists %d chunks, the file has %d extents", f.Path, f.Size, len(rec.Chunks), len(f.Extents))
		}
	}
	if files < 300 {
		t.Fatalf("%d files checked", files)
	}
	second, opened := push()
	if opened != 0 || second.Root.Digest != first.Root.Digest {
		t.Fatalf("second push opened %d files and sealed %s (first %s)", opened, second.Root.Digest, first.Root.Digest)
	}
}
