package statcache

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/bdnvol/bdnvol/internal/testutil"
	"github.com/bdnvol/bdnvol/pkg/layout"
)

// savedCache writes a cache of n records (every third with chunks, every
// fifth with extents) and returns its directory and the records.
func savedCache(t *testing.T, n int) (string, map[string]Record) {
	t.Helper()
	dir := t.TempDir()
	c := Open(dir, "/data", layout.DefaultParams)
	want := map[string]Record{}
	for i := range n {
		p := fmt.Sprintf("d%d/f%05d", i%7, i)
		f := Record{Stat: Key{Size: int64(i), Mtime: int64(-i), Ctime: int64(2 * i), Ino: uint64(i) << 40}, Digest: digest.FromString(p)}
		if i%3 == 0 {
			f.Chunks = []layout.Chunk{{Digest: digest.FromString(p + "c"), Size: int64(i), Head: digest.FromString("h"), Tail: digest.FromString("t")}}
		}
		if i%5 == 0 {
			f.Extents = []pulledExtent{{Digest: digest.FromString(p + "x"), Length: 3}, {Length: 4}}
			f.Unverified = i%2 == 0
		}
		want[p] = f
		c.data.Files[p] = f
	}
	c.data.Packs["sha256:"+strings.Repeat("ab", 32)] = layout.Chunk{Digest: emptyDigest, Size: 7}
	c.dirty = true
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	return dir, want
}

// TestRecFileLookup: records saved read back by path from the mapped file,
// each as it was, with none decoded into the map; a path never stored is
// not found.
func TestRecFileLookup(t *testing.T) {
	dir, want := savedCache(t, 2000)
	c := Open(dir, "/data", layout.DefaultParams)
	if c.disk == nil || len(c.data.Files) != 0 {
		t.Fatalf("opened with disk %v and %d records in memory; want the file mapped and none decoded", c.disk, len(c.data.Files))
	}
	for p, f := range want {
		c.mu.Lock()
		got, ok := c.get(p)
		c.mu.Unlock()
		if !ok || fmt.Sprint(got) != fmt.Sprint(f) {
			t.Fatalf("%s: read %+v (%v), wrote %+v", p, got, ok, f)
		}
		if _, ok := c.Lookup(p, f.Stat); ok == f.Unverified {
			t.Errorf("%s: Lookup trusted=%v for unverified=%v", p, ok, f.Unverified)
		}
	}
	for _, p := range []string{"", "d0", "d0/f00000x", "zzz"} {
		if f, ok := c.Lookup(p, Key{}); ok {
			t.Errorf("%q: found %+v, never stored", p, f)
		}
	}
	if len(c.data.Packs) != 1 {
		t.Errorf("packs read back: %v", c.data.Packs)
	}
	// A prune drops records on disk from lookups and from the next save.
	c.Prune(func(p string) bool { return !strings.HasPrefix(p, "d3/") })
	if _, ok := c.Lookup("d3/f00003", want["d3/f00003"].Stat); ok {
		t.Error("a pruned record on disk is still found")
	}
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	got := allRecords(Open(dir, "/data", layout.DefaultParams))
	for p := range want {
		if _, ok := got[p]; ok == strings.HasPrefix(p, "d3/") {
			t.Errorf("%s: after prune and save, found=%v", p, ok)
		}
	}
}

// TestRecFileTornRefused: a record file cut short or with a byte changed
// is refused (no record trusted), and the next save writes it anew.
func TestRecFileTornRefused(t *testing.T) {
	for _, damage := range []string{"cut", "flip", "empty"} {
		t.Run(damage, func(t *testing.T) {
			dir, want := savedCache(t, 100)
			c := Open(dir, "/data", layout.DefaultParams)
			path := c.path
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			switch damage {
			case "cut":
				b = b[:len(b)-10]
			case "flip":
				b[len(b)/2] ^= 1
			case "empty":
				b = nil
			}
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := openRecFile(path); !errors.Is(err, errRecFile) {
				t.Errorf("opening the damaged file: %v, want errRecFile", err)
			}
			c = Open(dir, "/data", layout.DefaultParams)
			for p, f := range want {
				if _, ok := c.Lookup(p, f.Stat); ok {
					t.Fatalf("%s: a record of the damaged file is trusted", p)
				}
			}
			if err := c.Save(); err != nil {
				t.Fatal(err)
			}
			if _, err := openRecFile(path); err != nil {
				t.Errorf("after a save, the file is still refused: %v", err)
			}
		})
	}
}

// recordTree does with c what a push does with its stat cache: looks up
// each regular file of dir by its stat key, reads (and counts) those
// without a trusted record, hands the cache their fresh records in path
// order, and saves it. It returns the files read.
func recordTree(t *testing.T, c *Cache, dir string) map[string]int {
	t.Helper()
	read := map[string]int{}
	var fresh []FreshRecord
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		k := KeyOf(info)
		if _, ok := c.Lookup(rel, k); ok {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		read[rel]++
		fresh = append(fresh, FreshRecord{Path: rel, Stat: k, Sum: sha256.Sum256(b)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(fresh, func(a, b FreshRecord) int { return strings.Compare(a.Path, b.Path) })
	c.SetFresh(slices.Values(fresh))
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	return read
}

// TestLegacyRecordsRechecked: records of the JSON format are not trusted:
// a push after the upgrade reads each recorded file once again, saves the
// new format (the JSON file goes), and a push after that reads none.
func TestLegacyRecordsRechecked(t *testing.T) {
	files := map[string][]byte{"a.bin": testutil.RandBytes(1, 300<<10), "s.txt": []byte("small")}
	src, cacheDir := t.TempDir(), t.TempDir()
	testutil.WriteVolumeTree(t, src, files)
	p := layout.Params{Min: 16 << 10, Avg: 64 << 10, Max: 256 << 10, Pack: 16 << 10}
	push := func() map[string]int {
		cache := Open(cacheDir, src, p)
		cache.TrustRecent() // files just written count as settled
		return recordTree(t, cache, src)
	}
	if opens := push(); len(opens) != 2 {
		t.Fatalf("first push read %v; want both files", opens)
	}
	// What the format before wrote: the same records, as JSON.
	c := Open(cacheDir, src, p)
	legacy := strings.TrimSuffix(c.path, ".rec") + ".json"
	b, err := json.Marshal(statCacheData{Files: allRecords(c), Packs: c.data.Packs})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(legacy, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(c.path); err != nil {
		t.Fatal(err)
	}
	if opens := push(); opens["a.bin"] == 0 || opens["s.txt"] == 0 {
		t.Errorf("first push after the format bump opened %v; want every file re-checked", opens)
	}
	if _, err := os.Stat(legacy); !os.IsNotExist(err) {
		t.Errorf("the JSON records are still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cacheDir, "stat")); err != nil {
		t.Fatal(err)
	}
	if opens := push(); len(opens) != 0 {
		t.Errorf("second push after the format bump opened %v; want none", opens)
	}
}

// TestFreshRecordsSaved: the records a push gives the cache (setFresh, in
// path order) are not held in its map, and are saved merged with those on
// disk, a fresh one winning over an older record of its path and a racy one
// left out.
func TestFreshRecordsSaved(t *testing.T) {
	dir, want := savedCache(t, 50)
	c := Open(dir, "/data", layout.DefaultParams)
	k := Key{Size: 1, Mtime: 1, Ctime: 1, Ino: 1}
	racy := Key{Size: 1, Mtime: c.since, Ctime: c.since, Ino: 2}
	sum := func(s string) [sha256.Size]byte { b, _ := layout.SHA256Sum(digest.FromString(s)); return b }
	fresh := []FreshRecord{
		{Path: "a", Stat: k, Sum: sum("a")},
		{Path: "d1/f00001", Stat: k, Sum: sum("new"), Chunks: []layout.Chunk{}},
		{Path: "d1/racy", Stat: racy, Sum: sum("racy")},
		{Path: "zz", Stat: k, Sum: sum("z")},
	}
	c.SetFresh(slices.Values(fresh))
	if len(c.data.Files) != 0 {
		t.Fatalf("%d records in the map, want 0", len(c.data.Files))
	}
	if err := c.Save(); err != nil {
		t.Fatal(err)
	}
	want["d1/f00001"] = Record{Stat: k, Digest: digest.FromString("new"), Chunks: []layout.Chunk{}}
	want["zz"] = Record{Stat: k, Digest: digest.FromString("z")}
	want["a"] = Record{Stat: k, Digest: digest.FromString("a")}
	got := allRecords(Open(dir, "/data", layout.DefaultParams))
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("saved %v\nwant %v", got, want)
	}
	if f, ok := c.Lookup("a", k); !ok || f.Digest != digest.FromString("a") {
		t.Errorf("after Save, a fresh record is looked up as %+v, %v", f, ok)
	}
}
