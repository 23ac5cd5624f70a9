package pull

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/pathglob"
	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
	"github.com/bdnvol/bdnvol/pkg/statcache"
)

// selectTree is a model-shaped tree: two large weight files cut into
// several chunks each, small tokenizer files packed with other small
// files, a symlink and an empty directory.
func selectTree() map[string][]byte {
	files := map[string][]byte{
		"weights/a.bin":        testutil.RandBytes(1, 700<<10),
		"weights/b.bin":        testutil.RandBytes(2, 700<<10),
		"tok/tokenizer.json":   testutil.RandBytes(3, 3000),
		"tok/vocab.txt":        testutil.RandBytes(4, 2000),
		"README.md":            testutil.RandBytes(5, 900),
		"weights/current.bin@": []byte("a.bin"),
	}
	for i := range 20 {
		files["extra/f"+string(rune('a'+i))] = testutil.RandBytes(uint64(100+i), 1500)
	}
	return files
}

var selectParams = layout.Params{Min: 16 << 10, Avg: 64 << 10, Max: 256 << 10, Pack: 16 << 10}

// chunksOf returns the chunks the extents of the files sel accepts lie in.
func chunksOf(v *layout.Version, sel func(string) bool) map[digest.Digest]bool {
	x := v.Index
	out := map[digest.Digest]bool{}
	for i := range x.Len() {
		if x.Kind(i) != layout.TypeFile || !sel(x.Path(i)) {
			continue
		}
		for k := range x.NumExtents(i) {
			out[x.ChunkDigest(x.Extent(i, k).Chunk)] = true
		}
	}
	return out
}

// listTree lists the paths under dir, slash-separated.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// A partial pull fetches exactly the chunks of the selected files (a pack
// whole, once) and writes only them, with their directories: no other
// file, symlink or directory of the version, and a file of the user's
// already there is left alone. CompareDir with the same selection passes;
// without it, the unselected files are missing.
func TestPullSelectFetchesOnlySelected(t *testing.T) {
	ctx := context.Background()
	files := selectTree()
	store, v := pushed(t, selectParams, files)
	f, err := pathglob.New([]string{"weights/a.bin", "tok/"}, []string{"*.txt"})
	if err != nil {
		t.Fatal(err)
	}
	want := chunksOf(v, f.Match)
	if len(want) < 3 || len(want) >= v.NumChunks() {
		t.Fatalf("premise: the selection holds some of the %d chunks, got %d", v.NumChunks(), len(want))
	}
	dst := t.TempDir()
	if err := os.WriteFile(filepath.Join(dst, "mine.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := &testutil.CountingFetcher{Fetcher: store}
	res, err := Materialise(ctx, src, v, dst, Options{Jobs: 4, Select: f.Match})
	if err != nil {
		t.Fatal(err)
	}
	got := src.Counts()
	var wantBytes int64
	for d := range want {
		if got[d] != 1 {
			t.Errorf("chunk %s of the selection fetched %d times, want once", d, got[d])
		}
		for k := range v.NumChunks() {
			if v.Index.ChunkDigest(k) == d {
				wantBytes += v.Index.ChunkSize(k)
				break
			}
		}
	}
	for d, n := range got {
		if !want[d] {
			t.Errorf("chunk %s outside the selection fetched %d times", d, n)
		}
	}
	if res.BytesFetched != wantBytes || res.Files != 4 || res.Bytes != int64(700<<10+3000) {
		t.Errorf("result %+v: want %d bytes fetched, 4 entries (2 dirs, 2 files) of %d bytes", res, wantBytes, 700<<10+3000)
	}
	if names, want := strings.Join(listTree(t, dst), " "), "mine.txt tok tok/tokenizer.json weights weights/a.bin"; names != want {
		t.Errorf("destination holds %q, want %q", names, want)
	}
	checkPulled(t, dst, map[string][]byte{"weights/a.bin": files["weights/a.bin"], "tok/tokenizer.json": files["tok/tokenizer.json"], "mine.txt": []byte("mine")}, nil)
	diffs, err := layout.CompareDir(ctx, v, dst, f.Match)
	if err != nil || len(diffs) != 0 {
		t.Errorf("CompareDir of the selection: %v, %v", diffs, err)
	}
	if diffs, _ := layout.CompareDir(ctx, v, dst, nil); len(diffs) == 0 {
		t.Error("CompareDir of the whole version found nothing missing")
	}
}

// After a full pull, a partial pull of the next version changes only its
// selection: a file of the old version that the new one lacks, outside the
// selection, stays; one inside it goes.
func TestPullSelectLeavesOthersAlone(t *testing.T) {
	ctx := context.Background()
	files := selectTree()
	store, v1 := pushed(t, selectParams, files)
	dst, cacheDir := t.TempDir(), t.TempDir()
	sc := statcache.Open(cacheDir, dst, layout.Params{})
	if _, err := Materialise(ctx, store, v1, dst, Options{StatCache: sc}); err != nil {
		t.Fatal(err)
	}
	next := selectTree()
	delete(next, "weights/b.bin")
	delete(next, "tok/vocab.txt")
	next["tok/tokenizer.json"] = testutil.RandBytes(33, 3100)
	store2, v2 := pushed(t, selectParams, next)
	sel := func(p string) bool { return strings.HasPrefix(p, "tok/") }
	sc = statcache.Open(cacheDir, dst, layout.Params{})
	res, err := Materialise(ctx, store2, v2, dst, Options{StatCache: sc, Select: sel})
	if err != nil {
		t.Fatal(err)
	}
	if res.FilesRemoved != 1 {
		t.Errorf("removed %d stale files, want 1 (tok/vocab.txt)", res.FilesRemoved)
	}
	if _, err := os.Stat(filepath.Join(dst, "tok", "vocab.txt")); !os.IsNotExist(err) {
		t.Errorf("tok/vocab.txt, stale and selected, is still there: %v", err)
	}
	checkPulled(t, dst, map[string][]byte{"weights/b.bin": files["weights/b.bin"], "tok/tokenizer.json": next["tok/tokenizer.json"]}, nil)
}
