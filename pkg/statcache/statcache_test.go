package statcache

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// TestStatCacheEncodeRoundTrips: the cache written entry by entry reads
// back as it was.
func TestStatCacheEncodeRoundTrips(t *testing.T) {
	dir := t.TempDir()
	c := Open(dir, "/data", layout.DefaultParams)
	c.data.Files["a \"quoted\"/ü"] = Record{Stat: Key{Size: 3, Mtime: 1, Ctime: 2, Ino: 9}, Digest: emptyDigest, Chunks: []layout.Chunk{{Digest: emptyDigest, Size: 3}}}
	c.data.Files["b"] = Record{Stat: Key{Size: 1}, Digest: emptyDigest, Extents: []pulledExtent{{Digest: emptyDigest, Length: 1}}}
	c.data.Packs["k"] = layout.Chunk{Digest: emptyDigest, Size: 7}
	c.dirty = true
	want := fmt.Sprint(c.data.Files, c.data.Packs)
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	got := Open(dir, "/data", layout.DefaultParams)
	if fmt.Sprint(allRecords(got), got.data.Packs) != want {
		t.Errorf("read back %+v %v, wrote %s", allRecords(got), got.data.Packs, want)
	}
}

// TestStatCachePulledRecordsCompact: a pull's records are held by entry
// of the index, not as a map of records, and read back after a Save as
// the records they stand for; prune drops them like others.
func TestStatCachePulledRecordsCompact(t *testing.T) {
	files := map[string][]byte{"d/a": []byte("aaaa"), "d/b": bytes.Repeat([]byte("b"), 300<<10), "e": []byte("e")}
	x := indexOf(t, layout.Params{Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}, files)
	dir := t.TempDir()
	c := Open(dir, "/pulled", layout.DefaultParams)
	c.data.Files["d/b"] = Record{Stat: Key{Size: 9}, Digest: emptyDigest} // an earlier pull's
	c.data.Files["gone"] = Record{Stat: Key{Size: 1}, Digest: emptyDigest}
	ka, kb, ke := Key{Size: 4, Mtime: 10, Ctime: 11, Ino: 1}, Key{Size: 300 << 10, Mtime: 20, Ctime: 21, Ino: 2}, Key{Size: 1, Mtime: 30, Ctime: 31, Ino: 3}
	c.StorePulled(x, "d/a", ka, false, true)
	c.StorePulled(x, "d/b", kb, true, true)
	c.StorePulled(x, "e", ke, true, true)
	if len(c.data.Files) != 1 {
		t.Errorf("%d records in the map after storing three pulled, want only the other one", len(c.data.Files))
	}
	if _, ok := c.Lookup("d/a", ka); ok {
		t.Error("a record of this pull is trusted before Save")
	}
	c.Prune(func(p string) bool { return p != "e" && p != "gone" })
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	if f, ok := c.Lookup("d/a", ka); !ok || f.Digest != digest.FromBytes(files["d/a"]) {
		t.Errorf("after Save, lookup d/a = %+v, %v", f, ok)
	}
	got := Open(dir, "/pulled", layout.DefaultParams)
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

func mustFind(t *testing.T, x *layout.Index, p string) int {
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
	x := indexOf(t, layout.Params{Min: 16 << 10, Avg: 32 << 10, Max: 64 << 10}, map[string][]byte{"big.bin": testutil.RandBytes(7, 1<<20), "d/same": testutil.RandBytes(8, 300<<10), "old": testutil.RandBytes(9, 100<<10), "small": []byte("s")})
	statDir := t.TempDir()
	c := Open(statDir, "/nowhere", layout.Params{})
	c.settleBytes = 1
	now := time.Now().UnixNano()
	keys := map[string]Key{}
	for i := range x.Len() {
		if x.Kind(i) != layout.TypeFile {
			continue
		}
		p := x.Path(i)
		keys[p] = Key{Size: x.Size(i), Mtime: now, Ctime: now, Ino: uint64(i + 1)}
		c.StorePulled(x, p, keys[p], true, true)
	}
	start := time.Now()
	c.settle(ctx, func(p string) (Key, bool) {
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
	saved := Open(statDir, "/nowhere", layout.Params{})
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
	c2 := Open(filepath.Join(statDir, "2"), "/nowhere", layout.Params{})
	c2.settleBytes = 1 << 40
	now = time.Now().UnixNano()
	for p, k := range keys {
		k.Mtime, k.Ctime = now, now
		c2.StorePulled(x, p, k, true, true)
	}
	start = time.Now()
	c2.settle(ctx, func(string) (Key, bool) {
		t.Error("stat called below the threshold")
		return Key{}, false
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
	c1, c2 := layout.Chunk{Digest: digest.FromString("c1"), Size: 2}, layout.Chunk{Digest: digest.FromString("c2"), Size: 2}
	x := &layout.Index{Version: layout.FormatVersion1, Chunking: layout.Params{Min: layout.DefaultParams.Min, Avg: layout.DefaultParams.Avg, Max: layout.DefaultParams.Max}, Chunks: []layout.Chunk{c1, c2}, Files: []layout.File{
		{Path: "f", Type: layout.TypeFile, Mode: 0o644, Size: 4, Digest: digest.FromString("f"), Extents: []layout.Extent{{Chunk: 0, Offset: 0, Length: 2}, {Chunk: 1, Offset: 0, Length: 2}}},
		{Path: "g", Type: layout.TypeFile, Mode: 0o644, Size: 1, Digest: digest.FromString("g"), Extents: []layout.Extent{{Chunk: 1, Offset: 0, Length: 1}}},
	}}
	dir := t.TempDir()
	c := Open(dir, "/pulled", layout.Params{Min: layout.DefaultParams.Min, Avg: layout.DefaultParams.Avg, Max: layout.DefaultParams.Max})
	c.SetTestHooks(func() time.Time { return time.Now().Add(time.Hour) }, 0)
	kf, kg := Key{Size: 4, Mtime: 1, Ctime: 1, Ino: 1}, Key{Size: 1, Mtime: 1, Ctime: 1, Ino: 2}
	c.StorePulled(x, "f", kf, true, false)
	c.StorePulled(x, "g", kg, true, false)
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	got := Open(dir, "/pulled", layout.Params{Min: layout.DefaultParams.Min, Avg: layout.DefaultParams.Avg, Max: layout.DefaultParams.Max})
	if _, ok := got.Lookup("f", kf); ok {
		t.Error("lookup trusts an unchecked digest")
	}
	same := x.File(0)
	if !got.SameExtents("f", kf, &same, x) {
		t.Error("a file of the same chunks is not vouched for")
	}
	other := &layout.Index{Version: layout.FormatVersion1, Chunking: layout.Params{Min: layout.DefaultParams.Min, Avg: layout.DefaultParams.Avg, Max: layout.DefaultParams.Max}, Chunks: []layout.Chunk{c1, {Digest: digest.FromString("c3"), Size: 2}}}
	if got.SameExtents("f", kf, &same, other) {
		t.Error("a file of other chunks is vouched for")
	}
	if got.SameExtents("f", Key{Size: 4, Mtime: 2, Ctime: 2, Ino: 1}, &same, x) {
		t.Error("a changed file is vouched for")
	}
	part := x.File(1)
	if got.SameExtents("g", kg, &part, x) {
		t.Error("a file of part of a chunk is vouched for")
	}
}

// allRecords returns every record c holds, from memory and from disk.
func allRecords(c *Cache) map[string]Record {
	out := map[string]Record{}
	c.disk.each(func(p string, f Record) bool {
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
