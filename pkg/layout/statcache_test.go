package layout

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/opencontainers/go-digest"
	"oras.land/oras-go/v2/content/memory"
)

// TestStatCacheEncodeRoundTrips: the cache written entry by entry reads
// back as it was.
func TestStatCacheEncodeRoundTrips(t *testing.T) {
	dir := t.TempDir()
	c := OpenStatCache(dir, "/data", DefaultParams)
	c.data.Files["a \"quoted\"/ü"] = CachedFile{Stat: StatKey{Size: 3, Mtime: 1, Ctime: 2, Ino: 9}, Digest: emptyDigest, Chunks: []Chunk{{Digest: emptyDigest, Size: 3}}}
	c.data.Files["b"] = CachedFile{Stat: StatKey{Size: 1}, Digest: emptyDigest, Extents: []pulledExtent{{Digest: emptyDigest, Length: 1}}}
	c.data.Packs["k"] = Chunk{Digest: emptyDigest, Size: 7}
	c.dirty = true
	want := fmt.Sprint(c.data.Files, c.data.Packs)
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	got := OpenStatCache(dir, "/data", DefaultParams)
	if fmt.Sprint(allRecords(got), got.data.Packs) != want {
		t.Errorf("read back %+v %v, wrote %s", allRecords(got), got.data.Packs, want)
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
	c.data.Files["d/b"] = CachedFile{Stat: StatKey{Size: 9}, Digest: emptyDigest} // an earlier pull's
	c.data.Files["gone"] = CachedFile{Stat: StatKey{Size: 1}, Digest: emptyDigest}
	ka, kb, ke := StatKey{Size: 4, Mtime: 10, Ctime: 11, Ino: 1}, StatKey{Size: 300 << 10, Mtime: 20, Ctime: 21, Ino: 2}, StatKey{Size: 1, Mtime: 30, Ctime: 31, Ino: 3}
	c.StorePulled(x, "d/a", ka, false, true)
	c.StorePulled(x, "d/b", kb, true, true)
	c.StorePulled(x, "e", ke, true, true)
	if len(c.data.Files) != 1 {
		t.Errorf("%d records in the map after storing three pulled, want only the other one", len(c.data.Files))
	}
	if _, ok := c.Lookup("d/a", ka); ok {
		t.Error("a record of this pull is trusted before Save")
	}
	c.prune(func(p string) bool { return p != "e" && p != "gone" })
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	if f, ok := c.Lookup("d/a", ka); !ok || f.Digest != digest.FromBytes(files["d/a"]) {
		t.Errorf("after Save, lookup d/a = %+v, %v", f, ok)
	}
	got := OpenStatCache(dir, "/pulled", DefaultParams)
	if len(allRecords(got)) != 2 {
		t.Fatalf("read back %d records, want d/a and d/b: %+v", len(allRecords(got)), allRecords(got))
	}
	a, b := allRecords(got)["d/a"], allRecords(got)["d/b"]
	if a.Stat != ka || a.Digest != digest.FromBytes(files["d/a"]) || a.Extents != nil || a.Racy {
		t.Errorf("d/a read back as %+v", a)
	}
	fb := x.File(mustFind(t, x, "d/b"))
	if b.Stat != kb || b.Digest != fb.Digest || fmt.Sprint(b.Extents) != fmt.Sprint(pulledExtents(&fb, x)) || len(b.Extents) < 2 {
		t.Errorf("d/b read back as %+v, want the extents of %d chunks", b, len(fb.Extents))
	}
	if _, ok := allRecords(got)["gone"]; ok {
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

// TestSettleDropsChangedRecords: a recent record whose file changed while
// settle waited is dropped; an unchanged one is saved not racy. A pull
// whose recent files are fewer bytes than the threshold does not wait.
func TestSettleDropsChangedRecords(t *testing.T) {
	ctx := context.Background()
	_, v1 := pushed(t, Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}, map[string][]byte{"big.bin": testutil.RandBytes(7, 1<<20), "d/same": testutil.RandBytes(8, 300<<10), "old": testutil.RandBytes(9, 100<<10), "small": []byte("s")}) // upgradeVersions' v1
	x := v1.Index
	statDir := t.TempDir()
	c := OpenStatCache(statDir, "/nowhere", Params{})
	c.settleBytes = 1
	now := time.Now().UnixNano()
	keys := map[string]StatKey{}
	for i := range x.Len() {
		if x.Kind(i) != TypeFile {
			continue
		}
		p := x.Path(i)
		keys[p] = StatKey{Size: x.size(i), Mtime: now, Ctime: now, Ino: uint64(i + 1)}
		c.StorePulled(x, p, keys[p], true, true)
	}
	start := time.Now()
	c.settle(ctx, func(p string) (StatKey, bool) {
		k := keys[p]
		if p == "big.bin" {
			k.Ctime++ // changed since
		}
		return k, true
	})
	if d := time.Since(start); d < racyMargin {
		t.Errorf("settle returned after %v, before the racy margin (%v) passed", d, racyMargin)
	}
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	saved := OpenStatCache(statDir, "/nowhere", Params{})
	for p := range keys {
		rec, ok := allRecords(saved)[p]
		switch {
		case p == "big.bin" && ok:
			t.Errorf("%s changed while settle waited, but its record was kept: %+v", p, rec)
		case p != "big.bin" && (!ok || rec.Racy || rec.Stat != keys[p] || rec.Digest == digest.Digest("")):
			t.Errorf("%s: saved %+v (found %v), want its key, not racy", p, rec, ok)
		}
	}

	// Below the threshold: no wait, records stay racy.
	c2 := OpenStatCache(filepath.Join(statDir, "2"), "/nowhere", Params{})
	c2.settleBytes = 1 << 40
	now = time.Now().UnixNano()
	for p, k := range keys {
		k.Mtime, k.Ctime = now, now
		c2.StorePulled(x, p, k, true, true)
	}
	start = time.Now()
	c2.settle(ctx, func(string) (StatKey, bool) {
		t.Error("stat called below the threshold")
		return StatKey{}, false
	})
	if d := time.Since(start); d >= racyMargin {
		t.Errorf("settle waited %v below the threshold", d)
	}
}

// emptyDigest is the SHA-256 of no bytes.
var emptyDigest = digest.FromBytes(nil)

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
	c.SetTestHooks(func() time.Time { return time.Now().Add(time.Hour) }, 0)
	kf, kg := StatKey{Size: 4, Mtime: 1, Ctime: 1, Ino: 1}, StatKey{Size: 1, Mtime: 1, Ctime: 1, Ino: 2}
	c.StorePulled(x, "f", kf, true, false)
	c.StorePulled(x, "g", kg, true, false)
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	got := OpenStatCache(dir, "/pulled", v1Params)
	if _, ok := got.Lookup("f", kf); ok {
		t.Error("lookup trusts an unchecked digest")
	}
	same := x.File(0)
	if !got.SameExtents("f", kf, &same, x) {
		t.Error("a file of the same chunks is not vouched for")
	}
	other := &Index{Version: FormatVersion1, Chunking: v1Params, Chunks: []Chunk{c1, {Digest: digest.FromString("c3"), Size: 2}}}
	if got.SameExtents("f", kf, &same, other) {
		t.Error("a file of other chunks is vouched for")
	}
	if got.SameExtents("f", StatKey{Size: 4, Mtime: 2, Ctime: 2, Ino: 1}, &same, x) {
		t.Error("a changed file is vouched for")
	}
	part := x.File(1)
	if got.SameExtents("g", kg, &part, x) {
		t.Error("a file of part of a chunk is vouched for")
	}
}

// allRecords returns every record c holds, from memory and from disk.
func allRecords(c *StatCache) map[string]CachedFile {
	out := map[string]CachedFile{}
	c.disk.each(func(p string, f CachedFile) bool {
		if c.kept(p) {
			out[p] = f
		}
		return true
	})
	for i, k := range c.pkind {
		if k != pulledNone {
			out[c.px.Path(i)] = c.pulledAt(i)
		}
	}
	for p, f := range c.data.Files {
		out[p] = f
	}
	return out
}

// TestPushRecordsFromItsResults: the stat records of a push are written
// from the push's own results when the cache is saved (not copied file by
// file as it goes): every file read gets its record, a large file's lists
// its chunks, and a second push with the cache opens no file and seals the
// same digest.
func TestPushRecordsFromItsResults(t *testing.T) {
	dir := memoTree(t, 300)
	cacheDir := t.TempDir()
	store := memory.New()
	push := func() (*PushResult, int64) {
		cache := OpenStatCache(cacheDir, dir, memoParams)
		cache.since = math.MaxInt64 // files just written count as settled
		src := &openCounter{Source: DirSource(dir), opens: map[string]int{}}
		res, err := Push(context.Background(), store, src, PushOptions{Params: memoParams, Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		return res, int64(len(src.opens))
	}
	first, opened := push()
	if opened < 300 {
		t.Fatalf("the first push opened %d files", opened)
	}
	cache := OpenStatCache(cacheDir, dir, memoParams)
	files := 0
	for _, f := range first.Index.AllFiles() {
		if f.Type != TypeFile {
			continue
		}
		files++
		rec, ok := cache.get(f.Path)
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
